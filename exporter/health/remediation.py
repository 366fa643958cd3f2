"""Remediation decided from health verdicts, within budgets (issue 31, Build 2 and 3).

Four actions, typed so the store, the renderers and ``gpufleet act`` read one shape:

- :class:`Drain` a failing node, with its reasons ("XID 79 on GPU 3");
- :class:`ResetGpu` a failing GPU once no job holds it (a reset clears what a critical XID,
  an uncorrectable ECC error or a pending remap leaves; not what needs service);
- :class:`Resume` a node gpufleet drained, once its verdict is healthy again (the tracker's
  clean window; after a restart, once the tracker has watched it that long) and it has been
  drained for ``min_drain_seconds``;
- :class:`Replace` a node with ``replace_after_faults`` faults in ``replace_window_seconds``.

Budgets bound what gpufleet drains: at most ``max_drained_nodes`` of the fleet and
``max_drained_pool_ratio`` of a pool (at least one node) at once, at most
``max_drains_per_window`` in ``drain_window_seconds``, and never a drain that leaves a pool
with fewer than ``min_healthy_nodes`` healthy nodes in service. More failing nodes in a pool
than the budget allows (an XID storm: a driver bug, a rack power event) is not a reason
to drain the pool: gpufleet drains none of them and yields one :class:`Page` for the pool,
until the pool's failing nodes fit the budget again.

The state (what gpufleet drained, fault times, resets advised, storms paged) is saved as
JSON, so a restarted advisor neither repeats an action nor forgets one it owes.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable
from pathlib import Path

import msgspec

from exporter.health.verdict import FleetHealth, NodeVerdict, Reason, Verdict
from exporter.node_names import is_node_name
from exporter.snapshot import FleetSnapshot
from exporter.thresholds.health import (
    RemediationSettings as RemediationSettings,  # the table's health.remediation
)

MAX_REASON_CHARS = 200  # Slurm keeps the reason whole; a node with 8 failing GPUs stays legible


class Drain(msgspec.Struct, frozen=True, tag="drain"):
    node: str
    pool: str
    reason: str  # "XID 79 on GPU 3; uncorrectable ECC error on GPU 5"
    at: float


class ResetGpu(msgspec.Struct, frozen=True, tag="reset_gpu"):
    node: str
    pool: str
    gpu: int
    reason: str
    at: float


class Resume(msgspec.Struct, frozen=True, tag="resume"):
    node: str
    pool: str
    drained_at: float
    at: float


class Replace(msgspec.Struct, frozen=True, tag="replace"):
    node: str
    pool: str
    faults: int  # in the window
    window_seconds: float
    at: float


class Page(msgspec.Struct, frozen=True, tag="page"):
    """More failing nodes than the budget: gpufleet stops draining the pool and asks a human."""

    pool: str
    nodes: tuple[str, ...]  # the failing nodes it did not drain
    reason: str
    at: float


Action = Drain | ResetGpu | Resume | Replace
Event = Drain | ResetGpu | Resume | Replace | Page


def event_id(event: Event) -> str:
    """Stable across restarts: ``gpufleet act`` skips an id its audit log already has.

    A node or pool name holding a control character (a newline) is escaped, so an id stays
    one line in every message and audit record; a real name has none and reads as it is."""
    target = event.pool if isinstance(event, Page) else event.node
    if not target.isprintable():
        target = target.encode("unicode_escape").decode("ascii")
    gpu = f"/{event.gpu}" if isinstance(event, ResetGpu) else ""
    return f"{type(event).__struct_config__.tag}:{target}{gpu}:{round(event.at * 1000)}"


_EVENT_DECODER = msgspec.json.Decoder(Event)


def decode_event(line: str | bytes) -> Event:
    """One event from its JSON; :class:`ValueError` naming the key when it is wrong."""
    try:
        return _EVENT_DECODER.decode(line)
    except msgspec.ValidationError as exc:
        raise ValueError(f"remediation event: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"remediation event: not JSON ({exc})") from None


def encode_event(event: Event) -> bytes:
    return msgspec.json.encode(event)


class DrainRecord(msgspec.Struct):
    pool: str
    reason: str
    at: float


class RemediationState(msgspec.Struct):
    """What survives a restart; every key is a node name unless said otherwise."""

    drained: dict[str, DrainRecord] = {}  # by gpufleet, not yet resumed
    drain_times: list[float] = []  # for the rate limit
    faults: dict[str, list[float]] = {}  # times each node turned failing, within the window
    failing: list[str] = []  # failing at the last decision (a fault is counted once)
    resets: list[str] = []  # "node/gpu" reset advised while the GPU stays failing
    replaced: dict[str, float] = {}  # replacement advised at
    storms: dict[str, float] = {}  # pool -> paged at, while its failing nodes exceed the budget


def save_state(state: RemediationState, path: str | Path) -> None:
    """Atomically: a crash mid-write leaves the previous state, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(state))
    os.replace(tmp, path)


def load_state(path: str | Path) -> RemediationState:
    """The saved state, or an empty one when there is none yet; ValueError naming the key."""
    path = Path(path)
    if not path.exists():
        return RemediationState()
    try:
        return msgspec.json.decode(path.read_bytes(), type=RemediationState)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"{path}: remediation state: {exc}") from None


def _reason(reasons: Iterable[Reason]) -> str:
    text = "; ".join(dict.fromkeys(r.text for r in reasons))
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def _resettable(reasons: Iterable[Reason], settings: RemediationSettings) -> bool:
    service = {f"XID {code} " for code in settings.service_xids}
    return not any(r.signal == "remap_failure" or any(r.text.startswith(s) for s in service)
                   for r in reasons)


class Remediator:
    """Turns each :class:`FleetHealth` into actions; feed it every one, oldest first."""

    def __init__(self, settings: RemediationSettings | None = None,
                 state: RemediationState | None = None) -> None:
        self.settings = settings or RemediationSettings()
        self.state = state or RemediationState()
        # names of the last decision that no command may carry (see _actionable)
        self.refused: tuple[str, ...] = ()

    def decide(self, health: FleetHealth, snapshot: FleetSnapshot | None = None) -> list[Event]:
        now = health.taken_at
        health = self._actionable(health)
        events: list[Event] = []
        self._count_faults(health, now)
        events += self._replacements(health, now)
        events += self._resumes(health, now)
        events += self._drains(health, now)  # before the resets: drain, then reset
        events += self._resets(health, snapshot, now)
        return events

    def _actionable(self, health: FleetHealth) -> FleetHealth:
        """``health`` less the nodes whose name is no single node's (``ALL``, a hostlist, a
        newline): no event is built for them, and they count in no pool or budget, so such a
        name can neither be drained nor spend the budget of the nodes beside it. A name saved
        in the state by an older version is dropped from it too."""
        bad = {n.node for n in health.nodes if not is_node_name(n.node)}
        state = self.state
        saved = [name for names in (state.drained, state.faults, state.replaced)
                 for name in names if not is_node_name(name)]
        saved += [name for name in state.failing if not is_node_name(name)]
        for name in saved:
            state.drained.pop(name, None)
            state.faults.pop(name, None)
            state.replaced.pop(name, None)
        if saved:
            state.failing = [name for name in state.failing if is_node_name(name)]
        state.resets = [key for key in state.resets if is_node_name(key.rpartition("/")[0])]
        self.refused = tuple(sorted(bad | set(saved)))
        if not bad:
            return health
        return dataclasses.replace(health, nodes=tuple(n for n in health.nodes if n.node not in bad),
                                   transitions=tuple(t for t in health.transitions
                                                     if t.node not in bad))

    def _count_faults(self, health: FleetHealth, now: float) -> None:
        s, state = self.settings, self.state
        failing_now = {n.node for n in health.nodes if n.verdict == Verdict.FAILING}
        seen = {n.node for n in health.nodes}
        for node in sorted(failing_now - set(state.failing)):
            state.faults.setdefault(node, []).append(now)
        # a node missing from this snapshot keeps its mark: its return is not a new fault
        state.failing = sorted(failing_now | (set(state.failing) - seen))
        for node in list(state.faults):
            kept = [t for t in state.faults[node] if now - t < s.replace_window_seconds]
            if kept:
                state.faults[node] = kept
            else:
                del state.faults[node]
        state.drain_times = [t for t in state.drain_times if now - t < s.drain_window_seconds]

    def _replacements(self, health: FleetHealth, now: float) -> list[Event]:
        s, state = self.settings, self.state
        out: list[Event] = []
        pools = {n.node: n.pool for n in health.nodes}
        for node, times in sorted(state.faults.items()):
            advised = state.replaced.get(node)
            if len(times) >= s.replace_after_faults and (
                    advised is None or now - advised >= s.replace_window_seconds):
                state.replaced[node] = now
                out.append(Replace(node, pools.get(node, ""), len(times), s.replace_window_seconds,
                                   now))
        return out

    def _resumes(self, health: FleetHealth, now: float) -> list[Event]:
        out: list[Event] = []
        for node, record in sorted(self.state.drained.items()):
            verdict = health.node(node)
            # settled: a restarted tracker has watched the node for a clean window first
            if verdict is not None and verdict.verdict == Verdict.HEALTHY and verdict.settled and \
                    now - record.at >= self.settings.min_drain_seconds:
                del self.state.drained[node]
                out.append(Resume(node, record.pool, record.at, now))
        return out

    def _resets(self, health: FleetHealth, snapshot: FleetSnapshot | None,
                now: float) -> list[Event]:
        held: dict | None = None  # read only when a GPU is a candidate: it walks every allocation
        out: list[Event] = []
        failing: set[str] = set()
        for node in health.nodes:
            if node.verdict not in (Verdict.FAILING, Verdict.DEGRADED):
                continue  # its worst GPU is neither failing nor waiting on a repair
            for gpu in node.gpus:
                key = f"{gpu.node}/{gpu.gpu}"
                pending = any(r.signal == "remap_pending" for r in gpu.reasons)
                if gpu.verdict != Verdict.FAILING and not pending:
                    continue
                failing.add(key)
                if key in self.state.resets or not _resettable(gpu.reasons, self.settings):
                    continue
                if held is None:
                    held = snapshot.gpu_allocations() if snapshot is not None else {}
                if (gpu.node, gpu.gpu) in held:
                    continue
                self.state.resets.append(key)
                out.append(ResetGpu(gpu.node, node.pool, gpu.gpu, _reason(gpu.reasons), now))
        if self.state.resets:
            seen = {f"{g.node}/{g.gpu}" for n in health.nodes for g in n.gpus}
            self.state.resets = sorted(k for k in self.state.resets if k in failing or k not in seen)
        return out

    def _drains(self, health: FleetHealth, now: float) -> list[Event]:
        s, state = self.settings, self.state
        fleet_left = s.max_drained_nodes - len(state.drained)
        rate_left = s.max_drains_per_window - len(state.drain_times)
        pools: dict[str, list[NodeVerdict]] = {}
        for node in health.nodes:
            pools.setdefault(node.pool, []).append(node)
        out: list[Event] = []
        for pool, nodes in sorted(pools.items()):
            candidates = [n for n in nodes if n.verdict == Verdict.FAILING
                          and n.node not in state.drained]
            if not candidates:
                state.storms.pop(pool, None)
                continue
            drained_here = sum(1 for n in nodes if n.node in state.drained)
            pool_left = max(1, math.floor(s.max_drained_pool_ratio * len(nodes))) - drained_here
            healthy = sum(1 for n in nodes if n.verdict == Verdict.HEALTHY
                          and n.node not in state.drained)
            allowed = min(fleet_left, rate_left, pool_left) if healthy >= s.min_healthy_nodes else 0
            if len(candidates) > allowed:
                if pool not in state.storms:
                    state.storms[pool] = now
                    out.append(Page(pool, tuple(n.node for n in candidates), self._storm_reason(
                        len(candidates), allowed, healthy), now))
                continue
            state.storms.pop(pool, None)
            for node in candidates:
                reason = _reason(node.reasons)
                state.drained[node.node] = DrainRecord(pool, reason, now)
                state.drain_times.append(now)
                out.append(Drain(node.node, pool, reason, now))
            fleet_left -= len(candidates)
            rate_left -= len(candidates)
        return out

    def _storm_reason(self, failing: int, allowed: int, healthy: int) -> str:
        if healthy < self.settings.min_healthy_nodes:
            return (f"{failing} failing node(s) and {healthy} healthy in service: draining would "
                    f"leave fewer than {self.settings.min_healthy_nodes} healthy; not draining")
        return (f"{failing} failing node(s), over the drain budget of {max(allowed, 0)}; not "
                f"draining (an XID storm, a driver bug or a power event?)")


__all__ = ["Action", "Drain", "DrainRecord", "Event", "Page", "RemediationSettings",
           "RemediationState", "Remediator", "Replace", "ResetGpu", "Resume", "decode_event",
           "encode_event", "event_id", "load_state", "save_state"]
