"""From per-node fragments to a 0-100 index per pool and for the cluster.

``index = min(100, 100 * F / (I + S) + tier penalties)`` where F is the
fragmented GPUs, I the idle GPUs and S a slack of one node's GPUs: a nearly
full pool with two idle GPUs that no job can use is full, not "100%
fragmented". The tier penalty is the seeds' rule, generalised: for every pair
of pools where the higher tier (from the GPU catalogue: B200 > H200 > H100 >
A100 > older) is idle while a lower one is busy, jobs sit on the wrong GPUs.

:class:`Totals` holds the sums, :class:`Scorer` turns them into indices, and
:func:`evaluate` builds the full report. The placement engine keeps per-node
F up to date itself as it places (``Placer.node_fragmented``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exporter.analysis import fgd
from exporter.analysis.fgd import FRAGMENT_REASONS, REASONS, CompiledWorkload
from exporter.analysis.state import FleetState
from exporter.gpu_catalogue import Catalogue, default_catalogue


@dataclass(frozen=True, slots=True)
class IndexSettings:
    slack_nodes: float = 1.0  # S, in GPUs of the widest node in scope
    tier_penalty: float = 30.0
    idle_at_most: float = 0.0  # the upper tier counts as idle at or below this allocation
    busy_above: float = 0.5  # the lower tier counts as busy above this allocation
    compaction_threshold: float = 50.0  # compaction is due when the cluster index exceeds it


def fragmentation_index(fragmented: float, idle: float, slack_gpus: float,
                        penalty: float = 0.0) -> float:
    denominator = idle + slack_gpus
    base = 100.0 * fragmented / denominator if denominator > 0 else 0.0
    return float(min(100.0, max(0.0, base + penalty)))


@dataclass(frozen=True, eq=False)
class Totals:
    """Fragmented and idle GPUs per node, per pool and for the cluster."""

    node_fragmented: np.ndarray  # [N]
    node_idle: np.ndarray  # [N]
    pool_fragmented: np.ndarray  # [P]
    pool_idle: np.ndarray  # [P]
    cluster_fragmented: float
    cluster_idle: float


def totals(state: FleetState, cw: CompiledWorkload,
           node_fragmented: np.ndarray | None = None) -> Totals:
    frag = fgd.node_fragmentation(state, cw) if node_fragmented is None else node_fragmented
    idle = state.gpu_free.sum(axis=1)
    pools = len(state.pool_names)
    return Totals(
        node_fragmented=frag,
        node_idle=idle,
        pool_fragmented=np.bincount(state.pool, weights=frag, minlength=pools),
        pool_idle=np.bincount(state.pool, weights=idle, minlength=pools),
        cluster_fragmented=float(frag.sum()),
        cluster_idle=float(idle.sum()),
    )


def pool_models(state: FleetState) -> list[str]:
    """The model of each pool: the one most of its GPUs have ("" for a pool without GPUs)."""
    out = []
    for p in range(len(state.pool_names)):
        in_pool = state.pool == p
        gpus = np.bincount(state.model[in_pool], weights=state.gpu_count[in_pool],
                           minlength=len(state.model_names))
        out.append(state.model_names[int(np.argmax(gpus))] if gpus.sum() > 0 else "")
    return out


@dataclass(frozen=True, eq=False)
class Scorer:
    """What the index needs besides the totals: fixed for a fleet's layout."""

    settings: IndexSettings
    pool_models: tuple[str, ...]
    pool_total: np.ndarray  # [P] usable GPUs
    pool_inverse_total: np.ndarray  # [P] 1 / pool_total, 0 for a pool without GPUs
    pool_slack: np.ndarray  # [P] GPUs
    cluster_slack: float
    above: np.ndarray  # [P, P] bool: pool u is a higher known tier than pool l

    def scores(self, tot: Totals) -> tuple[float, np.ndarray, np.ndarray]:
        """(cluster index, [P] pool indices, [P, P] inverted pairs upper x lower)."""
        s = self.settings
        allocated = 1.0 - tot.pool_idle * self.pool_inverse_total
        inverted = (allocated <= s.idle_at_most + 1e-12)[:, None] & (allocated > s.busy_above)
        inverted &= self.above
        # the idle upper pool holds the GPUs the busy lower pool's jobs should be on
        pool_penalty = inverted.sum(axis=1) * s.tier_penalty
        # fragments are zero wherever idle is, so the tiny floor only guards 0 / 0
        pool_index = tot.pool_fragmented * 100.0
        pool_index /= np.maximum(tot.pool_idle + self.pool_slack, 1e-12)
        pool_index += pool_penalty
        np.clip(pool_index, 0.0, 100.0, out=pool_index)
        cluster = fragmentation_index(tot.cluster_fragmented, tot.cluster_idle,
                                      self.cluster_slack, s.tier_penalty * int(inverted.sum()))
        return cluster, pool_index, inverted

    def allocated(self, tot: Totals) -> np.ndarray:
        """Allocated share of each pool's GPUs; a pool without GPUs has no tier, so never counts."""
        return 1.0 - tot.pool_idle * self.pool_inverse_total


def scorer(state: FleetState, settings: IndexSettings = IndexSettings(),
           catalogue: Catalogue | None = None) -> Scorer:
    catalogue = catalogue or default_catalogue()
    pools = len(state.pool_names)
    count = state.gpu_count.astype(float)
    width = np.zeros(pools)
    np.maximum.at(width, state.pool, count)
    models = pool_models(state)
    # an unknown model, or "" (a pool without GPUs), has no tier
    tiers = np.array([spec.tier if m and (spec := catalogue.find(m)) else None for m in models],
                     dtype=object)
    known = np.array([t is not None for t in tiers], dtype=bool)
    tier = np.array([t if t is not None else -1 for t in tiers], dtype=float)
    above = (tier[:, None] > tier[None, :]) & known[:, None] & known[None, :]
    pool_total = np.bincount(state.pool, weights=count, minlength=pools)
    return Scorer(
        settings=settings,
        pool_models=tuple(models),
        pool_total=pool_total,
        pool_inverse_total=np.divide(1.0, pool_total, out=np.zeros(pools), where=pool_total > 0),
        pool_slack=settings.slack_nodes * width,
        cluster_slack=settings.slack_nodes * (float(count.max()) if len(count) else 0.0),
        above=above,
    )


@dataclass
class KeptScorer:
    """:func:`scorer` of the last layout it was asked for: a fleet's layout (pools, models,
    GPUs per node) stays the same between evaluations, and its scorer is rebuilt only when
    it changes. One per caller that evaluates again and again (an analyzer, a simulation)."""

    # (everything scorer() reads, by value, and its scorer): one attribute, so a reader on
    # another thread never pairs one layout's key with another's scorer
    last: tuple[tuple[object, ...], Scorer] | None = None

    def __call__(self, state: FleetState, settings: IndexSettings,
                 catalogue: Catalogue | None = None) -> Scorer:
        # the arrays by their bytes: a state's arrays are shared and may change in place
        key = (state.pool_names, state.model_names, state.pool.tobytes(), state.model.tobytes(),
               state.gpu_count.tobytes(), settings, catalogue)
        last = self.last
        if last is None or last[0] != key:
            last = self.last = (key, scorer(state, settings, catalogue))
        return last[1]


@dataclass(frozen=True, slots=True)
class Scope:
    """Fragmentation of a set of nodes: a pool or the cluster."""

    name: str
    model: str
    total_gpus: float
    idle_gpus: float
    fragmented_gpus: float
    slack_gpus: float
    penalty: float
    index: float
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def fragmentation_ratio(self) -> float:
        return self.fragmented_gpus / self.idle_gpus if self.idle_gpus > 1e-12 else 0.0

    @property
    def allocated_ratio(self) -> float:
        return 1.0 - self.idle_gpus / self.total_gpus if self.total_gpus > 0 else 0.0


@dataclass(frozen=True, slots=True)
class TierInversion:
    upper: str  # pool of the higher tier
    lower: str
    upper_allocated: float
    lower_allocated: float
    inverted: bool


@dataclass(frozen=True, eq=False)
class Report:
    cluster: Scope
    pools: tuple[Scope, ...]
    inversions: tuple[TierInversion, ...]
    totals: Totals
    state: FleetState
    workload: CompiledWorkload
    settings: IndexSettings

    @property
    def compaction_due(self) -> bool:
        return self.cluster.index > self.settings.compaction_threshold

    def worst_nodes(self, count: int = 10) -> list[tuple[str, float, float]]:
        """(node, fragmented GPUs, idle GPUs), most fragmented first."""
        frag = self.totals.node_fragmented
        order = np.argsort(-frag, kind="stable")[:count]
        return [(self.state.names[i], float(frag[i]), float(self.totals.node_idle[i]))
                for i in order if frag[i] > 1e-12]


def evaluate(state: FleetState, cw: CompiledWorkload, settings: IndexSettings = IndexSettings(),
             catalogue: Catalogue | None = None, kept: KeptScorer | None = None) -> Report:
    """Node, pool and cluster fragmentation with its breakdown, tier inversions and indices.
    ``kept``: the caller's scorer of the fleet's layout, rebuilt only when the layout changes."""
    reasons = fgd.breakdown(state, cw)
    tot = totals(state, cw, node_fragmented=reasons[:, 1:].sum(axis=1))
    score = scorer(state, settings, catalogue) if kept is None else kept(state, settings, catalogue)
    cluster_index, pool_index, inverted = score.scores(tot)
    allocated = score.allocated(tot)

    def split(rows: np.ndarray) -> dict[str, float]:
        return {r: float(v) for r, v in zip(REASONS, rows.sum(axis=0), strict=True)}

    pools = tuple(
        Scope(name=name, model=score.pool_models[p], total_gpus=float(score.pool_total[p]),
              idle_gpus=float(tot.pool_idle[p]), fragmented_gpus=float(tot.pool_fragmented[p]),
              slack_gpus=float(score.pool_slack[p]),
              penalty=settings.tier_penalty * float(inverted[p].sum()),
              index=float(pool_index[p]), breakdown=split(reasons[state.pool == p]))
        for p, name in enumerate(state.pool_names)
    )
    cluster = Scope(
        name="cluster", model="", total_gpus=float(score.pool_total.sum()),
        idle_gpus=tot.cluster_idle, fragmented_gpus=tot.cluster_fragmented,
        slack_gpus=score.cluster_slack, penalty=settings.tier_penalty * float(inverted.sum()),
        index=cluster_index, breakdown=split(reasons),
    )
    inversions = tuple(
        TierInversion(state.pool_names[u], state.pool_names[lo], float(allocated[u]),
                      float(allocated[lo]), bool(inverted[u, lo]))
        for u, lo in zip(*np.nonzero(score.above), strict=True)
    )
    return Report(cluster, pools, inversions, tot, state, cw, settings)


__all__ = ["FRAGMENT_REASONS", "REASONS", "IndexSettings", "KeptScorer", "Report", "Scope", "Scorer",
           "Totals", "evaluate", "fragmentation_index", "scorer", "totals"]
