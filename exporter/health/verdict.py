"""A health verdict for every GPU and node: healthy, degraded, failing or unknown (issue 31).

:class:`HealthTracker` is fed successive snapshots with their timestamps. Each GPU's
signals are read from the snapshot's ``up``, ``stale``, :class:`GpuHealth` and clock-event
reasons; counters are lifetime counts kept by the driver, so their rates need the GPU's
previous reading (XIDs are events the exporter saw, counted since it started).

Signals and the level each raises:

==================  ========  ===========================================================
signal              level     raised when
==================  ========  ===========================================================
``xid``             failing   a critical XID (the threshold table's ``critical_xids``) was
                              seen since the previous snapshot (its count rose, or its
                              ``last_xid_time`` moved on; on the first snapshot, within
                              ``xid_recent_seconds``)
``ecc``             failing   the uncorrectable (double-bit) ECC or uncorrectable
                              remapped-row count rose
``remap_failure``   failing   a row remap failed (the GPU needs service)
``gpu_lost``        failing   the GPU is not ``up`` for ``lost_for_seconds``
``nvlink``          degraded  NVLink replays or recoveries, or CRC errors over their rate
``pcie``            degraded  PCIe replays over their rate
``thermal``         degraded  a thermal or power-brake clock-event reason is active for
                              ``thermal_for_seconds``
``remap_pending``   degraded  a row remap or page retirement waits for a GPU reset, for
                              ``pending_for_seconds``
``stale``           unknown   the readings are the last good ones, for ``stale_for_seconds``
``no_counters``     unknown   the source reads no health counters for the GPU
==================  ========  ===========================================================

Hysteresis: a verdict rises at once to the highest level whose signal has held its time,
and falls only after ``clean_window_seconds`` with every signal of its level gone. While
readings are stale a failing or degraded verdict is kept and its clean window does not
run: gpufleet cannot tell a repaired GPU from one it cannot see. A node's verdict is the
worst of its GPUs' (failing > degraded > unknown > healthy); a node without any GPU
reading is unknown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from exporter.snapshot import FleetSnapshot, Gpu, GpuHealth
from exporter.thresholds.health import HealthSettings as HealthSettings  # the table's health.verdicts


class Verdict(StrEnum):
    HEALTHY = "healthy"
    UNKNOWN = "unknown"
    DEGRADED = "degraded"
    FAILING = "failing"

    @property
    def rank(self) -> int:
        """Worse is higher: a node's verdict is its worst GPU's."""
        return _RANK[self]


_RANK = {Verdict.HEALTHY: 0, Verdict.UNKNOWN: 1, Verdict.DEGRADED: 2, Verdict.FAILING: 3}

# The signals that turn a GPU failing, the causes a fault is counted by
# (gpufleet_health_faults_total's ``cause``); tests/test_health_verdict.py pins this list
# against the signals _signals raises.
FAILING_SIGNALS = ("xid", "ecc", "remap_failure", "gpu_lost")


@dataclass(frozen=True, slots=True)
class Reason:
    """One signal behind a verdict, in words an operator (and a drain reason) can read."""

    # xid, ecc, remap_failure, gpu_lost, nvlink, pcie, thermal, remap_pending, stale, no_counters
    signal: str
    level: Verdict
    text: str  # e.g. "XID 79 on GPU 3"
    gpu: int | None
    since: float  # unix seconds the signal was first seen (continuously)


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    node: str
    gpu: int
    pool: str
    verdict: Verdict
    since: float  # unix seconds the verdict took its level
    reasons: tuple[Reason, ...]  # of the verdict's level; kept while the verdict is held
    clean_since: float | None = None  # the clean window runs from here (a held verdict)
    # watched for a clean window at least: a healthy verdict then means "clean that long",
    # not "a tracker just (re)started and has seen nothing yet"
    settled: bool = True


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    pool: str
    verdict: Verdict
    since: float
    reasons: tuple[Reason, ...]  # its worst GPUs' reasons
    gpus: tuple[GpuVerdict, ...]
    settled: bool = True  # every GPU settled (see GpuVerdict.settled)


@dataclass(frozen=True, slots=True)
class Transition:
    node: str
    gpu: int | None  # None: the node's verdict
    at: float
    before: Verdict | None  # None: first seen
    after: Verdict
    reasons: tuple[Reason, ...]


@dataclass(frozen=True, slots=True)
class FleetHealth:
    taken_at: float
    nodes: tuple[NodeVerdict, ...]
    transitions: tuple[Transition, ...] = ()  # the changes this snapshot made

    def node(self, name: str) -> NodeVerdict | None:
        for verdict in self.nodes:
            if verdict.node == name:
                return verdict
        return None

    def gpu_counts(self) -> dict[Verdict, int]:
        """GPUs per verdict (the count of working GPUs dcgm-exporter's users ask for)."""
        counts = dict.fromkeys(Verdict, 0)
        for node in self.nodes:
            for gpu in node.gpus:
                counts[gpu.verdict] += 1
        return counts


@dataclass(frozen=True, slots=True)
class _Signal:
    signal: str
    level: Verdict
    text: str
    hold_seconds: float  # how long it must be raised before it counts


@dataclass
class _GpuState:
    verdict: Verdict = Verdict.HEALTHY
    since: float = 0.0
    reasons: tuple[Reason, ...] = ()
    clean_since: float | None = None
    raised: dict[str, float] = field(default_factory=dict)  # signal text -> first seen
    previous: GpuHealth | None = None
    previous_at: float | None = None
    seen: bool = False
    first_seen: float = 0.0
    quiet: tuple | None = None  # the signal fields of the last fresh reading (see _quiet_key)
    cached: GpuVerdict | None = None  # the last verdict made, reused while nothing changes


def _increase(now: int | None, before: int | None) -> int:
    """A driver counter's rise; 0 when unknown or reset (driver reload, GPU reset)."""
    if now is None or before is None or now < before:
        return 0
    return now - before


def _sum(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _quiet_key(health: GpuHealth, slowdown_mask: int) -> tuple | None:
    """Every field a signal reads, or None when a level signal is raised by the reading itself
    (a slowdown reason, a pending or failed remap). Two equal keys in a row raise nothing: no
    counter rose (no ECC error, no link error rate, no new XID) and no level is set. The
    tracker skips :func:`_signals` for a healthy GPU whose key did not change: at 108,800
    GPUs that is most of them, every snapshot."""
    reasons = health.clock_event_reasons
    if (reasons is not None and reasons & slowdown_mask) or health.remapped_rows_failure \
            or health.remapped_rows_pending or health.retired_pages_pending:
        return None
    return (health.xid_counts, health.last_xid, health.last_xid_time,
            health.ecc_double_bit_volatile, health.ecc_double_bit_aggregate,
            health.remapped_rows_uncorrectable, health.nvlink_replay_errors,
            health.nvlink_recovery_errors, health.nvlink_crc_flit_errors,
            health.nvlink_crc_data_errors, health.pcie_replay_errors)


def _new_xids(health: GpuHealth, before: GpuHealth | None, now: float,
              settings: HealthSettings, critical: frozenset[int]) -> list[int]:
    """Critical XIDs seen since ``before`` (or recently, without one)."""
    codes: set[int] = set()
    before_counts = {x.xid: x.count for x in before.xid_counts} if before else {}
    for entry in health.xid_counts:
        if entry.xid in critical and before is not None and entry.count > before_counts.get(entry.xid, 0):
            codes.add(entry.xid)
    last = health.last_xid
    if last in critical and last is not None:
        when = health.last_xid_time
        if before is None:
            if when is not None and now - when <= settings.xid_recent_seconds:
                codes.add(last)
        elif when is not None:
            if before.last_xid_time is None or when > before.last_xid_time:
                codes.add(last)
        elif before.last_xid != last:  # dcgm relays the last XID only, without its time
            codes.add(last)
    return sorted(codes)


def _signals(gpu: Gpu, state: _GpuState, now: float, settings: HealthSettings,
             critical: frozenset[int], slowdown_mask: int) -> list[_Signal]:
    name = f"GPU {gpu.index}"
    if not gpu.up:
        return [_Signal("gpu_lost", Verdict.FAILING, f"{name} lost", settings.lost_for_seconds)]
    if gpu.stale:
        # last good values repeat: no rate or event can be read from them
        return [_Signal("stale", Verdict.UNKNOWN, f"{name} readings stale",
                        settings.stale_for_seconds)]
    health = gpu.health
    if health is None:  # the source reads no counters: "healthy" would be a guess
        return [_Signal("no_counters", Verdict.UNKNOWN, f"{name} health not read", 0.0)]
    out: list[_Signal] = []
    before = state.previous
    if health.xid_counts or health.last_xid is not None:  # most GPUs never had one
        out += [_Signal("xid", Verdict.FAILING, f"XID {code} on {name}", 0.0)
                for code in _new_xids(health, before, now, settings, critical)]
    if before is not None and (
            _increase(health.ecc_double_bit_volatile, before.ecc_double_bit_volatile)
            or _increase(health.ecc_double_bit_aggregate, before.ecc_double_bit_aggregate)
            or _increase(health.remapped_rows_uncorrectable, before.remapped_rows_uncorrectable)):
        out.append(_Signal("ecc", Verdict.FAILING, f"uncorrectable ECC error on {name}", 0.0))
    if health.remapped_rows_failure:
        out.append(_Signal("remap_failure", Verdict.FAILING, f"row remap failed on {name}", 0.0))
    if health.remapped_rows_pending or health.retired_pages_pending:
        out.append(_Signal("remap_pending", Verdict.DEGRADED,
                           f"memory repair pending a reset on {name}", settings.pending_for_seconds))
    if before is not None and state.previous_at is not None and now > state.previous_at:
        elapsed = now - state.previous_at
        links = _increase(_sum(health.nvlink_replay_errors, health.nvlink_recovery_errors),
                          _sum(before.nvlink_replay_errors, before.nvlink_recovery_errors))
        crc = _increase(_sum(health.nvlink_crc_flit_errors, health.nvlink_crc_data_errors),
                        _sum(before.nvlink_crc_flit_errors, before.nvlink_crc_data_errors))
        pcie = _increase(health.pcie_replay_errors, before.pcie_replay_errors)
        if links / elapsed > settings.nvlink_link_errors_per_second:
            out.append(_Signal("nvlink", Verdict.DEGRADED,
                               f"NVLink replays/recoveries on {name}", 0.0))
        if crc / elapsed > settings.nvlink_crc_errors_per_second:
            out.append(_Signal("nvlink", Verdict.DEGRADED, f"NVLink CRC errors on {name}", 0.0))
        if pcie / elapsed > settings.pcie_replays_per_second:
            out.append(_Signal("pcie", Verdict.DEGRADED, f"PCIe replays on {name}", 0.0))
    reasons = health.clock_event_reasons
    if reasons is not None and reasons & slowdown_mask:
        out.append(_Signal("thermal", Verdict.DEGRADED, f"clocks slowed down on {name}",
                           settings.thermal_for_seconds))
    return out


def _step(state: _GpuState, signals: Iterable[_Signal], gpu: Gpu, now: float,
          settings: HealthSettings) -> None:
    """Move one GPU's verdict on by one reading (the hysteresis)."""
    raised: dict[str, float] = {}
    effective: list[Reason] = []
    for s in signals:
        first = state.raised.get(s.text, now)
        raised[s.text] = first
        if now - first >= s.hold_seconds:
            effective.append(Reason(s.signal, s.level, s.text, gpu.index, first))
    state.raised = raised
    raw = max((r.level for r in effective), key=lambda v: v.rank, default=Verdict.HEALTHY)
    at_raw = tuple(r for r in effective if r.level == raw)
    if not state.seen:
        state.seen, state.first_seen = True, now
        state.verdict, state.since, state.reasons = raw, now, at_raw
        return
    current = state.verdict
    if raw.rank >= current.rank:
        if raw != current:
            state.verdict, state.since = raw, now
        state.reasons, state.clean_since = at_raw, None
    elif raw == Verdict.UNKNOWN and current.rank > Verdict.UNKNOWN.rank:
        state.clean_since = None  # blind: the clean window waits for fresh readings
    else:
        if state.clean_since is None:
            state.clean_since = now
        if now - state.clean_since >= settings.clean_window_seconds:
            state.verdict, state.since, state.reasons, state.clean_since = raw, now, at_raw, None


class HealthTracker:
    """Verdicts over successive snapshots; feed it every snapshot, oldest first."""

    def __init__(self, settings: HealthSettings | None = None) -> None:
        self.settings = settings or HealthSettings()
        self._gpus: dict[tuple[str, int], _GpuState] = {}
        self._nodes: dict[str, tuple[Verdict, float]] = {}
        self.retable(self.settings)

    def retable(self, settings: HealthSettings) -> None:
        """New settings (a reloaded threshold table); every GPU's state and clock stays."""
        self.settings = settings
        self._critical = frozenset(settings.critical_xids)
        self._slowdown_mask = settings.slowdown_mask()

    def observe(self, snapshot: FleetSnapshot, now: float | None = None) -> FleetHealth:
        now = snapshot.taken_at if now is None else now
        transitions: list[Transition] = []
        by_node: dict[str, list[GpuVerdict]] = {}
        pools = {n.name: n.pool for n in snapshot.nodes}
        window = self.settings.clean_window_seconds
        for gpu in snapshot.gpus:
            state = self._gpus.get(gpu.key)
            if state is None:
                state = self._gpus[gpu.key] = _GpuState()
            pool = pools.get(gpu.node, gpu.pool)
            fresh = gpu.up and not gpu.stale and gpu.health is not None
            quiet = _quiet_key(gpu.health, self._slowdown_mask) if fresh and gpu.health else None
            cached = state.cached
            if quiet is not None and quiet == state.quiet and state.verdict == Verdict.HEALTHY \
                    and not state.raised and cached is not None and cached.pool == pool:
                # nothing changed on a healthy GPU: its verdict stands (see _quiet_key)
                state.previous, state.previous_at = gpu.health, now
                if not cached.settled and now - state.first_seen >= window:
                    cached = state.cached = dataclasses.replace(cached, settled=True)
                by_node.setdefault(gpu.node, []).append(cached)
                continue
            before = state.verdict if state.seen else None
            signals = _signals(gpu, state, now, self.settings, self._critical, self._slowdown_mask)
            _step(state, signals, gpu, now, self.settings)
            state.quiet = quiet
            if fresh:
                state.previous, state.previous_at = gpu.health, now
            if before != state.verdict:
                transitions.append(Transition(gpu.node, gpu.index, now, before, state.verdict,
                                              state.reasons))
            state.cached = GpuVerdict(gpu.node, gpu.index, pool, state.verdict, state.since,
                                      state.reasons, state.clean_since,
                                      now - state.first_seen >= window)
            by_node.setdefault(gpu.node, []).append(state.cached)
        names = sorted(set(pools) | set(by_node))
        nodes: list[NodeVerdict] = []
        for name in names:
            gpus = tuple(sorted(by_node.get(name, ()), key=lambda g: g.gpu))
            if gpus:
                verdict = max((g.verdict for g in gpus), key=lambda v: v.rank)
                reasons = tuple(r for g in gpus if g.verdict == verdict for r in g.reasons)
            else:
                verdict = Verdict.UNKNOWN
                reasons = (Reason("stale", Verdict.UNKNOWN, "no GPU readings", None, now),)
            pool = pools.get(name) or (gpus[0].pool if gpus else "")
            previous = self._nodes.get(name)
            since = previous[1] if previous and previous[0] == verdict else now
            if previous is None or previous[0] != verdict:
                transitions.append(Transition(name, None, now, previous[0] if previous else None,
                                              verdict, reasons))
            self._nodes[name] = (verdict, since)
            settled = bool(gpus) and all(g.settled for g in gpus)
            nodes.append(NodeVerdict(name, pool, verdict, since, reasons, gpus, settled))
        return FleetHealth(now, tuple(nodes), tuple(transitions))


__all__ = ["FAILING_SIGNALS", "FleetHealth", "GpuVerdict", "HealthSettings", "HealthTracker",
           "NodeVerdict", "Reason", "Transition", "Verdict"]
