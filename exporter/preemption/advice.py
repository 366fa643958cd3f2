"""The preemption advice: which running spot jobs to preempt for the blocked high-priority head,
with the work each would lose, and the spot quota per pool; as ``/v1/advice`` carries them and
as ``gpufleet plan`` renders them for Slurm and Kubernetes.

The head: the highest-priority pending single-node job (then the oldest) that fits no node's
free GPUs now. Its victims, by the simulator's ``advisor`` rule (docs/simulate.md,
"Preemption"): on each node of the head's pool and models, the running jobs of lower priority
past the exemption (``exempt`` seconds of run since their start; a job whose start is unknown
is never proposed) are all taken out, then taken back largest loss first while the head
still fits; the node whose victims lose the fewest GPU-hours, then the fewest victims, then
the first by name. A victim's loss is the run since its last checkpoint: the one it states
(:attr:`exporter.snapshot.Allocation.last_checkpoint_time`), else the time since the last whole
``checkpoint_interval`` of its run, or its whole run where the site assumes no checkpointing
(``checkpoint_interval`` None), times all the GPUs it holds (a gang loses every worker's).

Rendered (:func:`slurm_lines`, :func:`evictions`): Slurm, per victim ``scontrol requeue JOB``
or ``scontrol suspend JOB`` as the site's ``PreemptMode`` says (``REQUEUE``, ``SUSPEND``; a
suspended job keeps its memory and loses nothing, a requeued one restarts from its
checkpoint); Kubernetes, a ``policy/v1`` Eviction of each victim's pod (it honours
PodDisruptionBudgets; the scheduler then places the head where the victims were).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.pool_load.forecast import HourlyHistory
from exporter.preemption.quota import QuotaSettings, SpotQuota, spot_quota
from exporter.slurm_command import is_job_id
from exporter.snapshot import Allocation, FleetSnapshot, JobRequest

EXEMPT = 1800.0  # PreemptExemptTime: seconds of run before a job may be preempted
CHECKPOINT_INTERVAL = 900.0
MODES = ("requeue", "suspend")  # Slurm's PreemptMode words that leave a job to resume
SPOT_QOS = ("spot", "preemptible", "scavenger", "low")
MAX_VICTIMS = 64  # a head needs one node: more victims than that is not advice
HEADS = 100  # pending jobs tried for the head, highest priority first (Slurm's default_queue_depth)
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class AdviceSettings:
    exempt: float = EXEMPT
    checkpoint_interval: float | None = CHECKPOINT_INTERVAL
    spot_qos: tuple[str, ...] = SPOT_QOS  # a job of these QOS is spot whatever its priority
    spot_priority_max: int = 0  # ... and so is one of this priority or lower
    quota: QuotaSettings = field(default_factory=QuotaSettings)


@dataclass(frozen=True, slots=True)
class Victim:
    job: str
    namespace: str
    pod: str
    node: str
    gpus: float  # all the GPUs it holds (a gang's on every node)
    priority: int
    ran_seconds: float
    lost_seconds: float  # run since its last checkpoint
    lost_gpu_hours: float


@dataclass(frozen=True, slots=True)
class Preemption:
    """Victims for one blocked head, all on ``node``."""

    head: str
    pool: str
    head_gpus: int
    head_priority: int
    node: str
    victims: tuple[Victim, ...]
    lost_gpu_hours: float
    reason: str


@dataclass(frozen=True, slots=True)
class PreemptionAdvice:
    computed_at: float
    preempt: Preemption | None
    spot_quota: tuple[SpotQuota, ...]  # by pool


def is_spot(priority: int, qos: str, settings: AdviceSettings) -> bool:
    return qos.lower() in settings.spot_qos or priority <= settings.spot_priority_max


def lost_seconds(alloc: Allocation, now: float, interval: float | None) -> float:
    """The run a preemption now would lose (0 for a job whose start is unknown)."""
    if alloc.start_time is None:
        return 0.0
    ran = max(0.0, now - alloc.start_time)
    checkpoint = alloc.last_checkpoint_time
    if checkpoint is not None and alloc.start_time <= checkpoint <= now:
        return now - checkpoint
    if interval is None or interval <= 0:
        return ran
    return ran - math.floor(ran / interval) * interval


def _free(snapshot: FleetSnapshot) -> dict[str, dict[int, float]]:
    """Free share per GPU, by node (GPUs that are down are never free)."""
    held, _ = snapshot.held()
    free: dict[str, dict[int, float]] = {}
    for gpu in snapshot.gpus:
        if gpu.up:
            free.setdefault(gpu.node, {})[gpu.index] = max(0.0, 1.0 - held.get((gpu.node, gpu.index), 0.0))
    return free


def _fits(row: Mapping[int, float], head: JobRequest) -> bool:
    need = 1.0 if head.gpu_share >= 1.0 - EPS else head.gpu_share
    return sum(1 for share in row.values() if share >= need - EPS) >= head.gpu_count


def _without(row: Mapping[int, float], node: str, gone: Iterable[Allocation]) -> dict[int, float]:
    out = dict(row)
    for alloc in gone:
        for part in alloc.placements:
            if part.node == node:
                for index in part.gpus:
                    if index in out:
                        out[index] = min(1.0, out[index] + part.gpu_share)
    return out


def choose(snapshot: FleetSnapshot, now: float, settings: AdviceSettings | None = None) -> Preemption | None:
    """The victims for the blocked head, or None (nothing blocked, or nothing to preempt)."""
    settings = settings or AdviceSettings()
    free = _free(snapshot)
    nodes = {n.name: n for n in snapshot.nodes}
    pending = sorted((r for r in snapshot.pending if r.node_count == 1 and r.gpu_count > 0
                      and not is_spot(r.priority, "", settings)),
                     key=lambda r: (-r.priority, math.inf if r.submit_time is None else r.submit_time, r.job))
    for head in pending[:HEADS]:
        eligible = [name for name, node in sorted(nodes.items())
                    if (not head.pool or node.pool == head.pool)
                    and (not head.models or node.model in head.models)]
        if any(_fits(free.get(name, {}), head) for name in eligible):
            continue  # it fits now: the scheduler starts it, nothing to preempt
        return _victims(snapshot, head, eligible, free, now, settings)
    return None


def _victims(snapshot: FleetSnapshot, head: JobRequest, eligible: list[str],
             free: dict[str, dict[int, float]], now: float, settings: AdviceSettings) -> Preemption | None:
    by_node: dict[str, list[Allocation]] = {}
    for alloc in snapshot.allocations:
        if alloc.priority >= head.priority or alloc.start_time is None or alloc.interrupted is not None:
            continue
        if now - alloc.start_time < settings.exempt:
            continue
        for node in dict.fromkeys(alloc.nodes):
            by_node.setdefault(node, []).append(alloc)
    gpus_of = {a.job: float(sum(len(p.gpus) * p.gpu_share for p in a.placements))
               for a in snapshot.allocations}

    def loss(a: Allocation) -> float:
        return lost_seconds(a, now, settings.checkpoint_interval) * gpus_of[a.job]

    best: tuple | None = None
    chosen_node, chosen = "", []
    for node in eligible:
        jobs = by_node.get(node, [])
        row = free.get(node, {})
        if not jobs or not _fits(_without(row, node, jobs), head):
            continue
        kept: list[Allocation] = []
        order = sorted(jobs, key=lambda a: (-loss(a), a.job))
        for alloc in order:
            gone = [a for a in order if a is not alloc and a not in kept]
            if _fits(_without(row, node, gone), head):
                kept.append(alloc)
        victims = [a for a in order if a not in kept]
        key = (sum(loss(a) for a in victims), len(victims), node)
        if len(victims) <= MAX_VICTIMS and (best is None or key < best):
            best, chosen_node, chosen = key, node, victims
    if best is None:
        return None
    listed = tuple(
        Victim(a.job, a.namespace, a.pod, chosen_node, gpus_of[a.job], a.priority,
               max(0.0, now - a.start_time) if a.start_time is not None else 0.0,
               lost_seconds(a, now, settings.checkpoint_interval), loss(a) / 3600)
        for a in sorted(chosen, key=lambda a: a.job))
    total = sum(v.lost_gpu_hours for v in listed)
    reason = (f"{head.job} (priority {head.priority}, {head.gpu_count} GPU(s)) fits no node of its pool; "
              f"preempting {len(listed)} job(s) on {chosen_node} loses {total:.2f} GPU-hours, the fewest "
              f"of any node")
    return Preemption(head.job, head.pool, head.gpu_count, head.priority, chosen_node, listed, total, reason)


# -- the quota in the running exporter ------------------------------------------------


@dataclass
class QuotaTracker:
    """Per pool, the hourly high-priority demand of the snapshots (GPUs held and asked by jobs
    that are not spot), and each pool's quota from it."""

    settings: AdviceSettings = field(default_factory=AdviceSettings)
    history: dict[str, HourlyHistory] = field(default_factory=dict)
    capacity: dict[str, float] = field(default_factory=dict)

    def observe(self, snapshot: FleetSnapshot) -> None:
        pool_of = {(g.node, g.index): g.pool for g in snapshot.gpus}
        capacity: dict[str, float] = {}
        for gpu in snapshot.gpus:
            capacity[gpu.pool] = capacity.get(gpu.pool, 0.0) + 1.0
        high = dict.fromkeys(capacity, 0.0)
        for alloc in snapshot.allocations:
            if is_spot(alloc.priority, alloc.qos, self.settings):
                continue
            for part in alloc.placements:
                for index in part.gpus:
                    pool = pool_of.get((part.node, index))
                    if pool is not None:
                        high[pool] += min(part.gpu_share, 1.0)
        for request in snapshot.pending:
            if request.pool in high and not is_spot(request.priority, "", self.settings):
                high[request.pool] += request.gpu_count * request.gpu_share * request.node_count
        self.capacity = capacity
        days = self.settings.quota.days + 1
        for pool, gpus in high.items():
            self.history.setdefault(pool, HourlyHistory(days=days)).add(snapshot.taken_at, gpus)
        for pool in list(self.history):
            if pool not in capacity:
                del self.history[pool]

    def quotas(self) -> tuple[SpotQuota, ...]:
        return tuple(spot_quota(pool, self.capacity.get(pool, 0.0), list(self.history[pool].hours),
                                self.settings.quota) for pool in sorted(self.history))


def advise(snapshot: FleetSnapshot, now: float, tracker: QuotaTracker | None = None,
           settings: AdviceSettings | None = None) -> PreemptionAdvice:
    settings = settings or (tracker.settings if tracker is not None else AdviceSettings())
    if tracker is not None:
        tracker.observe(snapshot)
    return PreemptionAdvice(now, choose(snapshot, now, settings),
                            tracker.quotas() if tracker is not None else ())


@dataclass
class Adviser:
    """What the advisor stage calls on each evaluation (``AdvisorStage.preemption``): the quota
    tracker sees every snapshot evaluated; the advice is computed for that snapshot's time."""

    tracker: QuotaTracker = field(default_factory=QuotaTracker)

    def __call__(self, snapshot: FleetSnapshot) -> PreemptionAdvice:
        return advise(snapshot, snapshot.taken_at, self.tracker)


# -- the wire ---------------------------------------------------------------------------


def _r(x: float | None, places: int = 3) -> float | None:
    return None if x is None else round(x, places)


def to_json(advice: PreemptionAdvice) -> dict[str, Any]:
    """``/v1/advice``'s ``preemption`` section."""
    p = advice.preempt
    return {
        "computed_at": advice.computed_at,
        "preempt": None if p is None else {
            "head": p.head, "pool": p.pool, "head_gpus": p.head_gpus, "head_priority": p.head_priority,
            "node": p.node, "lost_gpu_hours": _r(p.lost_gpu_hours), "reason": p.reason,
            "victims": [{"job": v.job, "namespace": v.namespace, "pod": v.pod, "node": v.node,
                         "gpus": _r(v.gpus), "priority": v.priority, "ran_seconds": _r(v.ran_seconds, 1),
                         "lost_seconds": _r(v.lost_seconds, 1), "lost_gpu_hours": _r(v.lost_gpu_hours)}
                        for v in p.victims]},
        "spot_quota": [{"pool": q.pool, "capacity_gpus": _r(q.capacity_gpus), "quota_gpus": _r(q.quota_gpus),
                        "high_now_gpus": _r(q.high_now_gpus), "high_forecast_gpus": _r(q.high_forecast_gpus),
                        "margin_gpus": _r(q.margin_gpus), "horizon_hours": q.horizon_hours,
                        "forecasts_checked": q.forecasts_checked, "error_mae_gpus": _r(q.error_mae_gpus),
                        "error_mae_pct": _r(q.error_mae_pct, 2)}
                       for q in advice.spot_quota],
    }


def schema() -> dict[str, Any]:
    """The openapi schema of ``/v1/advice``'s ``preemption`` section."""
    num = {"type": "number"}
    maybe = {"type": ["number", "null"]}
    victim = {"type": "object",
              "required": ["job", "namespace", "pod", "node", "gpus", "priority", "ran_seconds",
                           "lost_seconds", "lost_gpu_hours"],
              "properties": {"job": {"type": "string"}, "namespace": {"type": "string"},
                             "pod": {"type": "string"}, "node": {"type": "string"}, "gpus": num,
                             "priority": {"type": "integer"}, "ran_seconds": num, "lost_seconds": num,
                             "lost_gpu_hours": num}}
    quota = {"type": "object",
             "required": ["pool", "capacity_gpus", "quota_gpus", "high_now_gpus", "high_forecast_gpus",
                          "margin_gpus", "horizon_hours", "forecasts_checked", "error_mae_gpus",
                          "error_mae_pct"],
             "properties": {"pool": {"type": "string"}, "capacity_gpus": num, "quota_gpus": num,
                            "high_now_gpus": num, "high_forecast_gpus": num, "margin_gpus": num,
                            "horizon_hours": {"type": "integer"}, "forecasts_checked": {"type": "integer"},
                            "error_mae_gpus": maybe, "error_mae_pct": maybe}}
    return {
        "type": "object",
        "description": "the preemption advice (docs/advisor.md, Preemption): the victims for the "
                       "blocked high-priority head with the work each would lose, and the spot quota "
                       "per pool with its forecast's error",
        "required": ["computed_at", "preempt", "spot_quota"],
        "properties": {
            "computed_at": num,
            "preempt": {"anyOf": [{"type": "null"}, {
                "type": "object",
                "required": ["head", "pool", "head_gpus", "head_priority", "node", "lost_gpu_hours",
                             "reason", "victims"],
                "properties": {"head": {"type": "string"}, "pool": {"type": "string"},
                               "head_gpus": {"type": "integer"}, "head_priority": {"type": "integer"},
                               "node": {"type": "string"}, "lost_gpu_hours": num,
                               "reason": {"type": "string"},
                               "victims": {"type": "array", "maxItems": MAX_VICTIMS, "items": victim}}}]},
            "spot_quota": {"type": "array", "items": quota},
        },
    }


class AdviceFormatError(ValueError):
    pass


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _name(value: Any, where: str, empty: bool = False) -> str:
    """A job, pod, namespace or node name safe to put on a command line: letters, digits and
    ``-_.``, at most 253 characters."""
    if not isinstance(value, str) or (not value and not empty) or len(value) > 253 \
            or not set(value) <= _NAME_CHARS or value.startswith("-"):
        shown = repr(value)[:60]
        raise AdviceFormatError(f"{where}: {shown} is not a job, pod or node name")
    return value


def victims_from_json(section: Any) -> list[dict[str, str]]:
    """The victims of a ``preemption`` section as read back (job, namespace, pod, node), each
    name checked: what a renderer puts on a command line comes from here."""
    if section is None:
        return []
    if not isinstance(section, dict):
        raise AdviceFormatError("preemption: expected an object")
    preempt = section.get("preempt")
    if preempt is None:
        return []
    if not isinstance(preempt, dict) or not isinstance(preempt.get("victims"), list):
        raise AdviceFormatError("preemption.preempt.victims: expected a list")
    victims = preempt["victims"]
    if len(victims) > MAX_VICTIMS:
        raise AdviceFormatError(f"preemption.preempt.victims: {len(victims)}, over the limit of "
                                f"{MAX_VICTIMS}")
    out = []
    for i, v in enumerate(victims):
        where = f"preemption.preempt.victims[{i}]"
        if not isinstance(v, dict):
            raise AdviceFormatError(f"{where}: expected an object")
        out.append({"job": _name(v.get("job"), f"{where}.job"),
                    "namespace": _name(v.get("namespace", ""), f"{where}.namespace", empty=True),
                    "pod": _name(v.get("pod", ""), f"{where}.pod", empty=True),
                    "node": _name(v.get("node"), f"{where}.node")})
    return out


# -- rendering --------------------------------------------------------------------------


def slurm_lines(section: Any, mode: str = "requeue") -> list[str]:
    """One ``scontrol requeue|suspend JOB`` per victim (``mode``: the site's PreemptMode)."""
    if mode not in MODES:
        raise AdviceFormatError(f"PreemptMode {mode!r}: one of {', '.join(MODES)}")
    victims = victims_from_json(section)
    if not victims:
        return []
    odd = [v["job"] for v in victims if not is_job_id(v["job"])]
    if odd:  # a name scontrol expands ("ALL") would preempt jobs nobody chose
        raise AdviceFormatError(f"preemption.preempt.victims: {odd[0][:60]!r} is not a Slurm job id")
    head = section["preempt"].get("head", "")
    lines = [f"# preemption for {_name(head, 'preemption.preempt.head')}: {len(victims)} job(s), "
             f"PreemptMode={mode.upper()}"]
    return lines + [f"scontrol {mode} {v['job']}" for v in victims]


def evictions(section: Any) -> list[dict[str, Any]]:
    """A ``policy/v1`` Eviction per victim's pod (``kubectl create --raw
    /api/v1/namespaces/NS/pods/POD/eviction -f -``)."""
    out = []
    for v in victims_from_json(section):
        pod = v["pod"] or v["job"]
        namespace = v["namespace"] or "default"
        out.append({"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod, "namespace": namespace,
                                 "annotations": {"gpufleet.io/reason": "preemption"}}})
    return out


__all__ = ["EXEMPT", "MODES", "AdviceFormatError", "AdviceSettings", "Adviser", "Preemption",
           "PreemptionAdvice", "QuotaTracker", "Victim", "advise", "choose", "evictions", "is_spot",
           "lost_seconds", "schema", "slurm_lines", "to_json", "victims_from_json"]
