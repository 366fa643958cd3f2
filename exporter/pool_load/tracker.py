"""Per-pool load in the running exporter: statistics, change points and the scaling hint.

:class:`LoadTracker` reads each served snapshot once (the analyzer calls
:meth:`LoadTracker.observe`), per pool:

- capacity: the GPUs the snapshot lists in the pool (down ones included, as the
  recording rules count them); allocated: the GPU shares jobs hold there;
  pending: what waiting jobs ask of the pool; demand ratio = (allocated +
  pending) / capacity;
- utilisation: the mean ``utilization_ratio`` of the pool's GPUs that report one;
- the trailing-window statistics of both over the analyzer's window
  (``analysis.window_snapshots`` samples), defined as the recording rules'
  (:func:`~.stats.window_stats`);
- the CUSUM detector (:class:`~.changepoint.Cusum`, the better of the two in
  bench/changepoints.py) on the demand ratio;
- the scaling hint (:class:`~.scaling.Scaler`) on the demand in GPUs, with the
  threshold table's ``scaling:`` settings for the pool and the pool's node size
  (the most common GPU count of its nodes), and the pool's mean utilisation and memory
  use beside it (an allocated yet idle pool holds rather than scaling up). In
  ``mode: predictive`` the rule reads the demand now plus the forecast rise over the
  hours until a node started now serves (:class:`~.forecast.HourlyHistory`: hourly
  means of the last 14 days, the forecast ``gpufleet load`` replays); until a day of
  history exists it is reactive.

The hint starts from the pool's node count and follows it when the fleet's node
count changes (someone acted, on the hint or not); otherwise it keeps its own
recommendation, so an "up" that nobody followed stays up while the demand (against the
GPUs the pool has) stays above the band, and goes back to the pool's size once the demand
has stayed inside the band for the table's ``dwell`` (or at once below it). No hint
differs from the pool's size before the pool's window holds ``min_samples`` samples (or
the whole window, if it is shorter).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter import metrics
from exporter.metrics import Family
from exporter.pool_load.changepoint import DIRECTIONS, Cusum
from exporter.pool_load.forecast import DAY, HourlyHistory
from exporter.pool_load.scaling import REASONS, Hint, Scaler
from exporter.pool_load.stats import WindowStats, window_stats
from exporter.snapshot import FleetSnapshot
from exporter.thresholds import ScalingSettings, ScalingTable, Thresholds, load_thresholds
from exporter.thresholds.scaling import DEFAULT

MAX_POOLS = 4096  # pools tracked at once; a snapshot with more is bounded upstream too


@dataclass(frozen=True, slots=True)
class PoolSample:
    capacity_gpus: float
    allocated_gpus: float
    pending_gpus: float
    utilization: float | None  # mean over the GPUs that report one
    nodes: int
    node_gpus: int
    memory_used: float | None = None  # mean used / total over the GPUs that report both

    @property
    def demand_gpus(self) -> float:
        return self.allocated_gpus + self.pending_gpus

    @property
    def demand_ratio(self) -> float | None:
        return self.demand_gpus / self.capacity_gpus if self.capacity_gpus > 0 else None


def pool_samples(snapshot: FleetSnapshot) -> dict[str, PoolSample]:
    """Per pool: what one snapshot says about its load (pools that have GPUs or waiting jobs)."""
    # one pass over the GPUs doing as little as it can: at 108,800 GPUs each microsecond
    # per GPU is 0.1 s per snapshot; the held shares are looked up per held GPU instead
    gpus = snapshot.gpus
    capacity: Counter[str] = Counter(gpu.pool for gpu in gpus)
    util_sum: dict[str, float] = {}
    util_n: Counter[str] = Counter()
    mem_sum: dict[str, float] = {}
    mem_n: Counter[str] = Counter()
    pool_of: dict[tuple[str, int], str] = {}
    held, _ = snapshot.held()
    for gpu in gpus:
        if gpu.key in held:
            pool_of[gpu.key] = gpu.pool
        u = gpu.utilization_ratio
        if u is not None and math.isfinite(u):
            util_sum[gpu.pool] = util_sum.get(gpu.pool, 0.0) + u
            util_n[gpu.pool] += 1
        used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
        if used is not None and total:
            mem_sum[gpu.pool] = mem_sum.get(gpu.pool, 0.0) + min(1.0, used / total)
            mem_n[gpu.pool] += 1
    allocated: dict[str, float] = {}
    for key, share in held.items():
        pool = pool_of.get(key)
        if pool is not None:  # a share on a GPU the snapshot does not list counts nowhere
            allocated[pool] = allocated.get(pool, 0.0) + min(share, 1.0)
    pending: dict[str, float] = {}
    for request in snapshot.pending:
        if request.pool:
            pending[request.pool] = pending.get(request.pool, 0.0) + request.gpu_count * request.gpu_share
    sizes: dict[str, Counter[int]] = {}
    for (pool, gpu_count), n in Counter((node.pool, node.gpu_count) for node in snapshot.nodes).items():
        sizes.setdefault(pool, Counter())[gpu_count] = n
    out: dict[str, PoolSample] = {}
    for pool in sorted(set(capacity) | set(pending)):
        counts = sizes.get(pool, Counter())
        # the most common node size, the larger on a tie (what a scale-up would most likely add)
        node_gpus = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0] if counts else 0
        out[pool] = PoolSample(
            float(capacity[pool]), round(allocated.get(pool, 0.0), 9), round(pending.get(pool, 0.0), 9),
            util_sum[pool] / util_n[pool] if util_n[pool] else None,
            sum(counts.values()), node_gpus,
            mem_sum[pool] / mem_n[pool] if mem_n[pool] else None)
    return out


@dataclass
class PoolLoad:
    scaler: Scaler
    ratio: deque[float]
    utilization: deque[float]
    detector: Cusum = field(default_factory=Cusum)
    changes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIRECTIONS, 0))
    last_change: float | None = None  # unix seconds of the last detected change
    hint: Hint | None = None
    nodes_seen: int = 0  # the pool's node count in the last snapshot
    sample: PoolSample | None = None
    history: HourlyHistory = field(default_factory=HourlyHistory)  # demand GPUs, hourly
    forecast_peak: float | None = None  # predictive mode: the signal the rule read


@dataclass(frozen=True, slots=True)
class PoolAdvice:
    """One pool's scaling hint and the load it read: an entry of ``/v1/advice``'s ``scaling``
    (written by :func:`exporter.advisor.wire.scaling_json`)."""

    pool: str
    nodes: int
    recommended_nodes: int
    reason: str
    demand_ratio: float | None
    demand: WindowStats | None
    utilization: WindowStats | None
    window_samples: int  # samples the statistics hold now (up to the analyzer's window)
    changes: Mapping[str, int]  # change points per direction
    last_change: float | None
    mode: str  # the scaling table's mode, reactive or predictive
    forecast_peak: float | None = None
    utilization_now: float | None = None  # the pool's mean utilisation now
    memory_used_now: float | None = None  # the pool's mean memory use now
    idle: bool = False  # above the band, but idle: held rather than scaled up

    @property
    def action(self) -> str:
        """scale_up, scale_down or hold: the hint against the nodes the pool has."""
        if self.recommended_nodes > self.nodes:
            return "scale_up"
        return "scale_down" if self.recommended_nodes < self.nodes else "hold"


@dataclass
class LoadTracker:
    window: int  # samples of the statistics (the analyzer's window)
    table: ScalingTable = DEFAULT
    pools: dict[str, PoolLoad] = field(default_factory=dict)
    _seen: FleetSnapshot | None = None

    def observe(self, snapshot: FleetSnapshot) -> None:
        """Read one snapshot; a second call with the same snapshot changes nothing."""
        if snapshot is self._seen:
            return
        self._seen = snapshot
        now = snapshot.taken_at
        samples = pool_samples(snapshot)
        # a pool the fleet no longer has (no GPUs, no waiting job) is forgotten: its hint
        # would be stale, and MAX_POOLS counts the pools there are, not every name ever seen
        for gone in [pool for pool in self.pools if pool not in samples]:
            del self.pools[gone]
        for pool, sample in samples.items():
            state = self.pools.get(pool)
            if state is None:
                if len(self.pools) >= MAX_POOLS:
                    continue
                settings = self._settings(pool, sample.node_gpus or None)
                state = PoolLoad(Scaler(settings, sample.nodes), deque(maxlen=self.window),
                                 deque(maxlen=self.window), nodes_seen=sample.nodes)
                self.pools[pool] = state
            elif sample.nodes != state.nodes_seen:
                # the fleet changed size: the hint starts again from what is there (not
                # clamped: the bounds clamp only a size the rule chose)
                state.scaler.nodes = sample.nodes
                state.nodes_seen = sample.nodes
            state.sample = sample
            ratio = sample.demand_ratio
            if ratio is not None:
                state.ratio.append(ratio)
                direction = state.detector.step(ratio)
                if direction is not None:
                    state.changes[direction] += 1
                    state.last_change = now
            if sample.utilization is not None:
                state.utilization.append(sample.utilization)
            state.history.add(now, sample.demand_gpus)
            signal = sample.demand_gpus
            state.forecast_peak = None
            if self.table.mode == "predictive":
                horizon = min(DAY, math.ceil(state.scaler.settings.startup_s / 3600 - 1e-9) + 1)
                rise = state.history.rise(horizon)
                if rise is not None:  # before a day of history: reactive
                    signal = state.forecast_peak = max(0.0, sample.demand_gpus + rise)
            # against the size the pool has: an earlier hint nobody followed holds while the
            # pool stays out of the band on its side, and goes after `dwell` inside it
            hint = state.scaler.step(now, signal, sample.utilization, sample.memory_used,
                                     pool_nodes=sample.nodes, pool_gpus=sample.capacity_gpus)
            if hint.reason == "hold" and hint.nodes != sample.nodes:
                # a recommendation nobody followed yet: its reason is the action's, so the
                # reason and the action agree (no "hold" beside a scale-up)
                hint = dataclasses.replace(hint, reason=state.scaler.acted)
            state.hint = hint

    def advice(self) -> list[PoolAdvice]:
        """Per pool with a hint, by name: the hint, the load statistics and the changes."""
        out = []
        for pool, state in sorted(self.pools.items()):
            if state.hint is None or state.sample is None:
                continue
            out.append(PoolAdvice(
                pool, state.sample.nodes, state.hint.nodes, state.hint.reason,
                state.sample.demand_ratio,
                window_stats(state.ratio) if state.ratio else None,
                window_stats(state.utilization) if state.utilization else None,
                len(state.ratio), dict(state.changes), state.last_change, self.table.mode,
                state.forecast_peak, state.sample.utilization, state.sample.memory_used,
                state.hint.idle))
        return out

    def families(self) -> list[Family]:
        pools = sorted(self.pools.items())
        labelled = [((("pool", p),), s) for p, s in pools if s.hint is not None]
        return [
            metrics.POOL_LOAD_CHANGE_TOTAL.family(
                [((("direction", d), ("pool", p)), float(s.changes[d]))
                 for p, s in pools for d in DIRECTIONS]),
            metrics.POOL_LOAD_LAST_CHANGE_TIMESTAMP_SECONDS.family(
                [((("pool", p),), s.last_change) for p, s in pools if s.last_change is not None]),
            metrics.POOL_RECOMMENDED_NODES.family(
                [(labels, float(s.hint.nodes)) for labels, s in labelled if s.hint is not None]),
            metrics.POOL_SCALING_REASON.family(
                [((("pool", p), ("reason", r)), 1.0 if s.hint.reason == r else 0.0)
                 for p, s in pools if s.hint is not None for r in REASONS]),
        ]

    @classmethod
    def from_table(cls, window: int, table: Thresholds | None = None) -> LoadTracker:
        """A tracker with the ``scaling:`` settings of ``table`` (the one ``serve`` runs on),
        else of the packaged threshold table."""
        return cls(window, (table or load_thresholds()).scaling or DEFAULT)

    def retable(self, table: ScalingTable) -> None:
        """A reloaded threshold table's ``scaling:``: new pools and every known pool's scaler
        take its settings; what the scalers hold (the recommendation, the hysteresis counts,
        the cooldown clocks) and the load windows stay."""
        self.table = table
        for pool, state in self.pools.items():
            node_gpus = state.sample.node_gpus if state.sample is not None else None
            state.scaler.settings = self._settings(pool, node_gpus or None)

    def _settings(self, pool: str, node_gpus: int | None) -> ScalingSettings:
        """The table's settings for ``pool``; a window shorter than ``min_samples`` is
        enough once full (its statistics are all the tracker will ever read)."""
        settings = self.table.for_pool(pool, node_gpus)
        if settings.min_samples > self.window:
            return dataclasses.replace(settings, min_samples=max(1, self.window))
        return settings
