"""Where the next GPU job should go: per-node placement preferences, so fragments do not form.

Compaction cures fragments after they form; steering prevents them. For each node
the expected growth of fragmentation if the typical next job landed there is
FGD's score (Weng et al., USENIX ATC'23): how much the node's F_n(M) grows,
against the live workload, averaged over the workload's GPU shapes by their
popularity. A node where the typical job fits a gap scores low; an empty node
that a small job would break open scores high, since whole-node jobs lose it.

The scheduler keeps its own policy; the preferences only order its choices, in
forms schedulers already honour:

- Slurm: node ``Weight``; Slurm allocates the lowest weight first among the
  nodes that satisfy a job (``slurm.conf(5)``, ``Weight``). Weights run from
  :data:`WEIGHT_BEST` to :data:`WEIGHT_WORST` in :data:`WEIGHT_LEVELS` levels,
  so a small change of growth does not rewrite every node's weight.
- Kubernetes: a preferred node affinity on a GPU pod (see
  :mod:`exporter.advisor.admission`): the nodes where that pod's own ask grows
  fragmentation least.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from exporter.analysis.fgd import CompiledWorkload, rows_fragmentation
from exporter.analysis.state import EPS, FleetState
from exporter.node_names import is_node_name
from exporter.placement import policies
from exporter.placement.task import Ask

WEIGHT_BEST = 1  # Slurm's default Weight; lowest allocated first
WEIGHT_LEVELS = 10
WEIGHT_WORST = WEIGHT_BEST + WEIGHT_LEVELS - 1  # also nodes where no typical job fits
PREFERRED_NODES = 16  # nodes named in one pod's preferred affinity: a short list keeps the patch small


@dataclass(frozen=True, slots=True)
class NodePreference:
    node: str
    pool: str
    model: str
    growth: float  # expected growth of F_n, in GPUs, for the typical next job; inf: none fits
    weight: int  # Slurm Weight, WEIGHT_BEST (place here first) .. WEIGHT_WORST


def _view(state: FleetState, cw: CompiledWorkload) -> policies.NodeView:
    finite = state.cpu_total[np.isfinite(state.cpu_total)]
    norms = (float(finite.max()) if len(finite) and finite.max() > 0 else 1.0,
             float(max(1, int(state.gpu_count.max(initial=1)))))
    node_fragmented = rows_fragmentation(state.cpu_free, state.gpu_free, state.model, cw)
    return policies.NodeView(state.cpu_free, state.gpu_free, state.gpu_count, state.model, norms,
                             cw, node_fragmented, "fuller")


def _ask(cpus: float, gpus: int, share: float) -> Ask:
    if share >= 1.0 - EPS:
        return Ask("whole", cpus, gpus, 1.0)
    return Ask("frac1" if gpus == 1 else "fracn", cpus, gpus, share)


def growth(state: FleetState, cw: CompiledWorkload, cpus: float, gpus: int, share: float = 1.0,
           models: tuple[str, ...] = (), view: policies.NodeView | None = None) -> np.ndarray:
    """Per node, how much F_n grows if a task of ``gpus`` GPUs (``share`` of each) and
    ``cpus`` cores lands there; inf where it does not fit or its model is not allowed.
    ``view``: :func:`node_view` of this state and workload, when the caller asks for several
    tasks against one state (its F_n per node is the costly part)."""
    if gpus <= 0:
        return np.full(len(state), np.inf)
    nodes = np.arange(len(state), dtype=np.intp)
    key = policies.evaluate("fgd", view if view is not None else _view(state, cw), nodes,
                            _ask(cpus, gpus, share)).key
    if models:
        allowed = np.array([m in models for m in state.model_names], dtype=bool)
        key = np.where(allowed[state.model], key, np.inf)
    return key


def expected_growth(state: FleetState, cw: CompiledWorkload) -> np.ndarray:
    """Per node, F_n's growth for the typical next job: the popularity-weighted mean over the
    workload's GPU shapes that fit there and may run on its model; inf where none fits."""
    n = len(state)
    total = np.zeros(n)
    weight = np.zeros(n)
    view = _view(state, cw)
    nodes = np.arange(n, dtype=np.intp)
    shapes = [s for s in cw.workload.shapes if not s.cpu_only]
    for j, shape in enumerate(shapes):
        key = policies.evaluate("fgd", view, nodes, _ask(shape.cpus, shape.gpus, shape.gpu_share)).key
        key = np.where(cw.access[state.model, j], key, np.inf)
        fits = np.isfinite(key)
        total[fits] += cw.weight[j] * key[fits]
        weight[fits] += cw.weight[j]
    return np.where(weight > 0, total / np.maximum(weight, 1e-12), np.inf)


def weights(expected: np.ndarray) -> np.ndarray:
    """Slurm weights from expected growth: the least growth WEIGHT_BEST, the most WEIGHT_WORST,
    in equal steps of the finite range; nodes where nothing fits WEIGHT_WORST."""
    out = np.full(len(expected), WEIGHT_WORST, dtype=np.int64)
    finite = np.isfinite(expected)
    if not finite.any():
        return out
    low, high = float(expected[finite].min()), float(expected[finite].max())
    span = high - low
    if span <= 1e-9:
        out[finite] = WEIGHT_BEST
        return out
    step = np.floor((expected[finite] - low) / span * (WEIGHT_LEVELS - 1) + 1e-9).astype(np.int64)
    out[finite] = WEIGHT_BEST + np.clip(step, 0, WEIGHT_LEVELS - 1)
    return out


def preferences(state: FleetState, cw: CompiledWorkload) -> tuple[NodePreference, ...]:
    """Every node's preference, in the state's node order."""
    expected = expected_growth(state, cw)
    levels = weights(expected)
    return tuple(NodePreference(name, state.pool_names[state.pool[i]], state.model_names[state.model[i]],
                                float(expected[i]), int(levels[i]))
                 for i, name in enumerate(state.names))


def preferred_order(state: FleetState, cw: CompiledWorkload, cpus: float, gpus: int, share: float = 1.0,
                    models: tuple[str, ...] = (), limit: int = PREFERRED_NODES,
                    view: policies.NodeView | None = None) -> np.ndarray:
    """Indices of the nodes where this task grows fragmentation least, by growth alone (ties:
    the fuller node, then node order), at most ``limit``; empty when it fits nowhere now. The
    webhook's one-term list before :func:`fgd_order` (``simulate``'s ``steer-pod-flat``)."""
    key = growth(state, cw, cpus, gpus, share, models, view)
    fits = np.flatnonzero(np.isfinite(key))
    if len(fits) == 0:
        return fits
    fuller = state.gpu_free[fits].sum(axis=1)
    order = np.lexsort((fits, fuller, np.round(key[fits], 9)))
    return fits[order[: max(0, limit)]]


def fgd_order(state: FleetState, cw: CompiledWorkload, cpus: float, gpus: int, share: float = 1.0,
              models: tuple[str, ...] = (), limit: int = PREFERRED_NODES,
              view: policies.NodeView | None = None,
              ties: policies.FgdTies = policies.FGD_TIES) -> np.ndarray:
    """Indices of the nodes where this task fits, in fgd's own order, at most ``limit``: the
    nodes whose growth of F is a near-tie with the least (``ties``), the fuller first, as the
    ``fgd`` policy picks; then the others by growth. The first is where ``fgd`` would place
    it. Empty when it fits nowhere now."""
    key = growth(state, cw, cpus, gpus, share, models, view)
    fits = np.flatnonzero(np.isfinite(key))
    if len(fits) == 0:
        return fits
    least = float(key[fits].min())
    near = key[fits] <= least + max(ties.band(least), 1e-9)
    free_after = state.gpu_free[fits].sum(axis=1)  # the same ask comes off every node: fuller first
    order = np.lexsort((fits, free_after, np.where(near, 0.0, np.round(key[fits], 9)), ~near))
    return fits[order[: max(0, limit)]]


def preferred_nodes(state: FleetState, cw: CompiledWorkload, cpus: float, gpus: int, share: float = 1.0,
                    models: tuple[str, ...] = (), limit: int = PREFERRED_NODES) -> list[str]:
    """The names of :func:`fgd_order`'s nodes, fgd's choice first: what the admission webhook
    names in a pod's preferred node affinity."""
    return [state.names[i] for i in fgd_order(state, cw, cpus, gpus, share, models, limit)]


def node_view(state: FleetState, cw: CompiledWorkload) -> policies.NodeView:
    """FGD's view of ``state``: every node's F_n against ``cw``, computed once for the many
    tasks scored against one state (:func:`growth`'s ``view``)."""
    return _view(state, cw)


def slurm_commands(prefs: tuple[NodePreference, ...], current: dict[str, int] | None = None,
                   budget: int | None = None) -> list[str]:
    """``scontrol update NodeName=… Weight=…`` for each node whose weight differs from
    ``current`` (all when unknown), the biggest change first, at most ``budget``."""
    current = current or {}
    # a node name a source gave is checked again here: a name like ALL would update every node
    changed = [p for p in prefs if current.get(p.node) != p.weight and is_node_name(p.node)]
    changed.sort(key=lambda p: (-abs(p.weight - current.get(p.node, WEIGHT_BEST)), p.node))
    if budget is not None:
        changed = changed[: max(0, budget)]
    return [f"scontrol update NodeName={p.node} Weight={p.weight}" for p in changed]


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


__all__ = [
    "PREFERRED_NODES",
    "WEIGHT_BEST",
    "WEIGHT_LEVELS",
    "WEIGHT_WORST",
    "NodePreference",
    "expected_growth",
    "fgd_order",
    "finite_or_none",
    "growth",
    "node_view",
    "preferences",
    "preferred_nodes",
    "preferred_order",
    "slurm_commands",
    "weights",
]
