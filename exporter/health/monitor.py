"""Health inside ``gpufleet serve`` (issue 31): the verdict tracker, the remediator and the
straggler tracker fed every collected snapshot, and what leaves them.

:meth:`HealthMonitor.observe` runs on each snapshot (the cycle's health stage); it returns
the remediation events the durable store delivers. :meth:`families` are the ``/metrics``
families, :meth:`advice` the ``health`` part of ``/v1/advice`` as a typed value
(:class:`HealthAdvice`; :mod:`exporter.advisor.wire` writes it, the events' webhook bodies
and the remediator's kept state as JSON).

At 108,800 GPUs the exposition must stay small, so every per-node and per-GPU family holds
only the degraded and failing ones; healthy and unknown are per-pool counts. The advice
lists at most :data:`MAX_LISTED` nodes and events, worst first, with the totals beside them.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass

from exporter import metrics
from exporter.health.remediation import (
    Drain,
    DrainRecord,
    Event,
    RemediationSettings,
    RemediationState,
    Remediator,
    Resume,
)
from exporter.health.stragglers import Straggler, StragglerReport, StragglerSettings, StragglerTracker
from exporter.health.verdict import (
    FAILING_SIGNALS,
    FleetHealth,
    HealthSettings,
    HealthTracker,
    NodeVerdict,
    Verdict,
)
from exporter.metrics import Family
from exporter.node_names import shown
from exporter.snapshot import FleetSnapshot

log = logging.getLogger(__name__)

EVENT_TYPES = ("drain", "reset_gpu", "resume", "replace", "page")
VERDICTS = tuple(Verdict)  # healthy, unknown, degraded, failing
LISTED = (Verdict.FAILING, Verdict.DEGRADED)  # the per-node and per-GPU series
MAX_LISTED = 100  # nodes, events and stragglers in /v1/advice; the counts say how many in all


@dataclass(frozen=True, slots=True)
class HealthView:
    """What one snapshot gave: verdicts, the events decided on them, the stragglers."""

    health: FleetHealth
    events: tuple[Event, ...]
    stragglers: StragglerReport


@dataclass(frozen=True, slots=True)
class HealthAdvice:
    """``/v1/advice``'s ``health`` (openapi ``Health``): the last snapshot's verdicts counted,
    its unhealthy nodes worst first, what gpufleet keeps drained and paged, the events."""

    evaluated_at: float
    nodes: Mapping[Verdict, int]  # every verdict, in VERDICTS order
    gpus: Mapping[Verdict, int]
    unhealthy_nodes: tuple[NodeVerdict, ...]  # worst first, at most MAX_LISTED
    drained: tuple[tuple[str, DrainRecord], ...]  # (node, its drain) by node
    remediation: tuple[Event, ...]  # decided on the last snapshot, at most MAX_LISTED
    recent_remediation: tuple[Event, ...]  # newest first, at most MAX_LISTED
    storms: tuple[tuple[str, float], ...]  # (pool, paged at) by pool
    stragglers: tuple[Straggler, ...]  # at most MAX_LISTED
    # the drained nodes the scheduler's own state shows drained (Slurm's DRAIN flag); the
    # others were only advised, or their source does not read the scheduler's state
    confirmed: frozenset[str] = frozenset()


class HealthMonitor:
    """Feed it every snapshot, oldest first; read its families and advice after each."""

    def __init__(self, health: HealthSettings | None = None,
                 remediation: RemediationSettings | None = None,
                 stragglers: StragglerSettings | None = None,
                 state: RemediationState | None = None) -> None:
        self.tracker = HealthTracker(health)
        self.remediator = Remediator(remediation, state)
        self.stragglers = StragglerTracker(stragglers)
        self.latest: HealthView | None = None
        # every action and every (pool, cause) is exported at 0 before its first event or fault
        self.events_total: Counter[str] = Counter({t: 0 for t in EVENT_TYPES})
        self.faults_total: Counter[tuple[str, str]] = Counter()  # (pool, cause)
        self.fault_to_drain: defaultdict[str, float] = defaultdict(float)  # pool -> s, over drains
        self.drain_to_resume: defaultdict[str, float] = defaultdict(float)  # pool -> s, over resumes
        self.recent: deque[Event] = deque(maxlen=MAX_LISTED)
        self._namespaces: dict[str, str] = {}
        self._refused: tuple[str, ...] = ()  # as last logged
        self._scheduler_drained: frozenset[str] = frozenset()  # as the last snapshot says

    def retable(self, health: HealthSettings, remediation: RemediationSettings,
                stragglers: StragglerSettings) -> None:
        """New settings (a reloaded threshold table): the verdicts, what gpufleet drained and
        each straggler's clock stay; only the settings change."""
        self.tracker.retable(health)
        self.remediator.settings = remediation
        self.stragglers.settings = stragglers

    def observe(self, snapshot: FleetSnapshot) -> HealthView:
        health = self.tracker.observe(snapshot)
        events = tuple(self.remediator.decide(health, snapshot))
        refused = self.remediator.refused
        if refused and refused != self._refused:  # once per change, not every snapshot
            log.warning("nodes whose name is no single node's: no remediation for them",
                        extra={"nodes": [shown(name) for name in refused[:MAX_LISTED]],
                               "count": len(refused)})
        self._refused = refused
        stragglers = self.stragglers.observe(snapshot)
        pools = {n.node: n.pool for n in health.nodes}
        for change in health.transitions:
            if change.gpu is not None and change.after == Verdict.FAILING and change.reasons:
                self.faults_total[(pools.get(change.node, ""), change.reasons[0].signal)] += 1
        for event in events:
            self.events_total[str(type(event).__struct_config__.tag)] += 1
            self.recent.append(event)
            if isinstance(event, Drain):
                node = health.node(event.node)
                self.fault_to_drain[event.pool] += max(0.0, event.at - node.since) if node else 0.0
            elif isinstance(event, Resume):
                self.drain_to_resume[event.pool] += max(0.0, event.at - event.drained_at)
        self._namespaces = {a.job: a.namespace for a in snapshot.allocations}
        self._scheduler_drained = frozenset(n.name for n in snapshot.nodes if n.drained)
        self.latest = HealthView(health, events, stragglers)
        return self.latest

    def families(self) -> list[Family]:
        view = self.latest
        nodes: Counter[tuple[str, Verdict]] = Counter()
        gpus: Counter[tuple[str, Verdict]] = Counter()
        node_samples: list[tuple[metrics.Labels, float]] = []
        gpu_samples: list[tuple[metrics.Labels, float]] = []
        pools: set[str] = set()
        blocked: Counter[str] = Counter()
        state = self.remediator.state
        for node in view.health.nodes if view else ():
            pools.add(node.pool)
            nodes[(node.pool, node.verdict)] += 1
            if node.verdict in LISTED:
                node_samples.append(((("node", node.node), ("pool", node.pool),
                                      ("verdict", node.verdict.value)), 1.0))
                if node.verdict == Verdict.FAILING and node.node not in state.drained \
                        and node.pool in state.storms:
                    blocked[node.pool] += 1
            if node.verdict == Verdict.HEALTHY:  # every GPU healthy: most nodes, not walked
                gpus[(node.pool, Verdict.HEALTHY)] += len(node.gpus)
                continue
            for g in node.gpus:
                gpus[(node.pool, g.verdict)] += 1
                if g.verdict in LISTED:
                    signal = g.reasons[0].signal if g.reasons else ""
                    gpu_samples.append(((("node", g.node), ("gpu", str(g.gpu)), ("pool", node.pool),
                                         ("verdict", g.verdict.value), ("signal", signal)), 1.0))
        drained = Counter(record.pool for record in state.drained.values())
        pools |= set(drained)
        per_job: Counter[tuple[str, str]] = Counter()
        for s in view.stragglers.stragglers if view else ():
            per_job[(s.job, s.account)] += 1
        return [
            metrics.HEALTH_NODES.family([((("pool", p), ("verdict", v.value)), float(nodes[(p, v)]))
                                         for p in sorted(pools) for v in VERDICTS]),
            metrics.HEALTH_GPUS.family([((("pool", p), ("verdict", v.value)), float(gpus[(p, v)]))
                                        for p in sorted(pools) for v in VERDICTS]),
            metrics.NODE_HEALTH_VERDICT.family(node_samples),
            metrics.GPU_HEALTH_VERDICT.family(gpu_samples),
            # every (pool, cause) from the first collection, at 0 until its first fault: a
            # counter series born at 1 is a fault Prometheus' increase() never counts
            metrics.HEALTH_FAULTS_TOTAL.family(
                [((("pool", p), ("cause", c)), float(self.faults_total[(p, c)]))
                 for p, c in sorted({(p, c) for p in pools for c in FAILING_SIGNALS}
                                    | set(self.faults_total))]),
            metrics.NODE_FAULTS.family(
                [((("node", node), ("pool", _pool_of(view, node))), float(len(times)))
                 for node, times in sorted(state.faults.items())]),
            metrics.REMEDIATION_EVENTS_TOTAL.family(
                [((("action", t),), float(self.events_total[t])) for t in EVENT_TYPES]),
            metrics.REMEDIATION_DRAINED_NODES.family(
                [((("pool", p),), float(drained[p])) for p in sorted(pools)]),
            metrics.REMEDIATION_BUDGET_BLOCKED_NODES.family(
                [((("pool", p),), float(blocked[p])) for p in sorted(pools)]),
            metrics.REMEDIATION_FAULT_TO_DRAIN_SECONDS_TOTAL.family(
                [((("pool", p),), self.fault_to_drain.get(p, 0.0))
                 for p in sorted(pools | set(self.fault_to_drain))]),
            metrics.REMEDIATION_DRAIN_TO_RESUME_SECONDS_TOTAL.family(
                [((("pool", p),), self.drain_to_resume.get(p, 0.0))
                 for p in sorted(pools | set(self.drain_to_resume))]),
            metrics.JOB_STRAGGLER_GPUS.family(
                [((("job", job), ("namespace", self._namespaces.get(job, "")), ("account", account)),
                  float(n)) for (job, account), n in sorted(per_job.items())]),
        ]

    def advice(self) -> HealthAdvice | None:
        """``/v1/advice``'s ``health``; None before the first snapshot."""
        view = self.latest
        if view is None:
            return None
        counts = dict.fromkeys(VERDICTS, 0)
        gpu_counts = dict.fromkeys(VERDICTS, 0)
        for node in view.health.nodes:
            counts[node.verdict] += 1
            if node.verdict == Verdict.HEALTHY:
                gpu_counts[Verdict.HEALTHY] += len(node.gpus)
                continue
            for g in node.gpus:
                gpu_counts[g.verdict] += 1
        unhealthy = sorted((n for n in view.health.nodes if n.verdict != Verdict.HEALTHY),
                           key=lambda n: (-n.verdict.rank, n.node))
        state = self.remediator.state
        return HealthAdvice(
            view.health.taken_at, counts, gpu_counts, tuple(unhealthy[:MAX_LISTED]),
            tuple(sorted(state.drained.items())), view.events[:MAX_LISTED],
            tuple(reversed(self.recent)), tuple(sorted(state.storms.items())),
            view.stragglers.stragglers[:MAX_LISTED],
            frozenset(state.drained) & self._scheduler_drained)


def _pool_of(view: HealthView | None, node: str) -> str:
    found = view.health.node(node) if view else None
    return found.pool if found else ""


__all__ = ["EVENT_TYPES", "HealthAdvice", "HealthMonitor", "HealthView"]
