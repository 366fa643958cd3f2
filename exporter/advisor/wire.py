"""The advisor's JSON: the one place typed values become wire data, and come back.

Called only where they leave the process or come back into it: the HTTP API (:mod:`api`:
``GET /v1/advice`` with the pools' scaling hints and the fleet's health, ``POST /v1/plan``),
the webhook bodies the durable store keeps (a plan's, :func:`plan_body`; a remediation
event's, :func:`event_body`), the states it keeps over a restart (the advisor's,
:func:`advisor_state_text`; the remediator's, :func:`remediation_state_text`) and ``gpufleet
plan`` (:mod:`exporter.cli.plan`, which reads a plan back with :func:`plan_from_json`). Field
names and order are the documented format (docs/advisor.md, docs/advisor-plan.schema.json,
:mod:`openapi`); write them nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from exporter.advisor.advice import (
    Advice,
    AdvisorState,
    HeldGpus,
    NvlinkMixed,
    Reclaim,
    RightSizing,
    ScopeStatus,
    Steering,
    WhatIf,
)
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction, TierMisplacement
from exporter.advisor.saving import JobOutcome, Saving, share
from exporter.advisor.steer import WEIGHT_BEST, WEIGHT_WORST
from exporter.health.monitor import HealthAdvice
from exporter.health.remediation import Event, RemediationState, encode_event, event_id
from exporter.health.verdict import NodeVerdict
from exporter.pool_load.stats import WindowStats
from exporter.pool_load.tracker import PoolAdvice

JSON = dict[str, Any]


class PlanFormatError(ValueError):
    """A plan's JSON does not hold together (its id, its orders); the message says which."""


def _prediction(p: Prediction) -> JSON:
    return {"index": p.index, "fragmented_gpus": p.fragmented_gpus}


def _endpoint(e: Endpoint) -> JSON:
    return {"node": e.node, "gpus": list(e.gpus)}


def migration_json(order: int, m: Migration) -> JSON:
    return {
        "order": order, "job": m.job, "namespace": m.namespace, "pod": m.pod,
        "from": _endpoint(m.source), "to": _endpoint(m.destination),
        "gpu_share": m.gpu_share, "cpus": m.cpus,
        "action": m.action, "wait_until": m.wait_until,
        "cost": {"gpu_seconds_since_checkpoint": round(m.cost_gpu_seconds, 3)},
        "reason": m.reason,
    }


def _misplacement(t: TierMisplacement) -> JSON:
    return {"job": t.job, "namespace": t.namespace, "node": t.node, "model": t.model,
            "memory_need_gb": t.memory_need_gb, "suitable_models": list(t.suitable_models),
            "reason": t.reason}


def plan_json(plan: CompactionPlan) -> JSON:
    """The plan a receiver gets (docs/advisor-plan.schema.json)."""
    return {
        "scope": plan.scope, "snapshot_time": plan.snapshot_time, "expires_at": plan.expires_at,
        "decision": plan.decision, "reasons": list(plan.reasons),
        "before": _prediction(plan.before), "after": _prediction(plan.after),
        "nodes_freed": dict(plan.nodes_freed),
        "migrations": [migration_json(i, m) for i, m in enumerate(plan.migrations, start=1)],
        "tier_misplacements": [_misplacement(t) for t in plan.tier_misplacements],
        "rejected_moves": plan.rejected_moves,
        "plan_id": plan.plan_id,
        "fragmented_gpus_recovered": round(plan.fragmented_gpus_recovered, 6),
        "lets_start": list(plan.lets_start),
        "gpu_hours_waiting_saved": plan.gpu_hours_waiting_saved,
        "oracle_gpu_hours_waiting_saved": plan.oracle_gpu_hours_waiting_saved,
        "share_of_oracle_saving": share(plan.gpu_hours_waiting_saved, plan.oracle_gpu_hours_waiting_saved),
    }


def plan_body(plan: CompactionPlan) -> bytes:
    """The webhook body: the plan's JSON with sorted keys, so its HMAC signature is stable."""
    return json.dumps(plan_json(plan), sort_keys=True).encode()


def _held(h: HeldGpus) -> JSON:
    return {"job": h.job, "namespace": h.namespace, "account": h.account, "pool": h.pool,
            "model": h.model, "gpus": h.gpus}


def reclaim_json(r: Reclaim) -> JSON:
    return {**_held(r), "utilization_ratio": r.utilization_ratio, "idle_since": r.idle_since,
            "gpu_hours_wasted": r.gpu_hours_wasted, "action": Reclaim.ACTION, "reason": r.reason}


def right_sizing_json(r: RightSizing) -> JSON:
    return {**_held(r), "declared_need_gb": r.declared_need_gb,
            "measured_peak_gb": r.measured_peak_gb, "suitable_models": list(r.suitable_models),
            "gpu_hours_held": r.gpu_hours_held, "action": RightSizing.ACTION, "reason": r.reason}


def nvlink_mixed_json(n: NvlinkMixed) -> JSON:
    return {"job": n.job, "namespace": n.namespace, "nodes": list(n.nodes),
            "nvlink_generations": list(n.nvlink_generations), "reason": n.reason}


def _scoped(data: JSON, scope: str | None) -> JSON:
    """``scope`` after ``decision``, and only when one is due (decision none has none)."""
    return {**data, "scope": scope} if scope is not None else data


def advice_json(advice: Advice) -> JSON:
    """``GET /v1/advice``'s answer (openapi ``Advice``)."""
    data: JSON = {
        "evaluated_at": advice.evaluated_at, "snapshot_time": advice.snapshot_time,
        "trigger": advice.trigger,
        "scopes": {k: {"index": s.index, "recommended": s.recommended, "above_since": s.above_since}
                   for k, s in advice.scopes.items()},
        "decision": advice.decision,
    }
    data = _scoped(data, advice.scope)
    data.update({
        "reasons": list(advice.reasons),
        "plan": None if advice.plan is None else plan_json(advice.plan),
        "plan_proposed_at": advice.plan_proposed_at,
        "reclaim": [reclaim_json(r) for r in advice.reclaim],
        "right_sizing": [right_sizing_json(r) for r in advice.right_sizing],
        "nvlink_mixed": [nvlink_mixed_json(n) for n in advice.nvlink_mixed],
    })
    if advice.scaling is not None:
        data["scaling"] = [scaling_json(a) for a in advice.scaling]
    if advice.steering is not None:
        data["steering"] = steering_json(advice.steering)
    if advice.saving is not None:
        data["saving"] = saving_json(advice.saving)
    if advice.preemption is not None:
        from exporter.preemption.advice import to_json

        data["preemption"] = to_json(advice.preemption)
    return data


def _job_outcome(j: JobOutcome) -> JSON:
    return {"job": j.job, "gpus": j.gpus, "waited_seconds": round(j.waited, 3),
            "expected_gpu_hours": j.expected, "started_at": j.started_at, "realised_gpu_hours": j.realised}


def saving_json(s: Saving) -> JSON:
    """``/v1/advice``'s ``saving`` (openapi ``Advice.saving``): the delivered plans watched,
    oldest first, each with what it was expected to save and what it saved, and the totals
    over every plan closed."""
    t = s.totals
    return {
        "basis": s.basis,
        "plans": [{"plan_id": p.plan_id, "proposed_at": p.proposed_at, "closes_at": p.closes_at,
                   "closed": p.closed, "expected_gpu_hours": p.expected,
                   "oracle_gpu_hours": p.oracle, "share_of_oracle_saving": share(p.expected, p.oracle),
                   "realised_gpu_hours": p.realised, "jobs": [_job_outcome(j) for j in p.jobs]}
                  for p in s.plans],
        "totals": {"plans": t.plans, "jobs": t.jobs, "started": t.started,
                   "expected_gpu_hours": t.expected, "realised_gpu_hours": t.realised,
                   "realised_ratio": t.ratio},
    }


def steering_json(s: Steering) -> JSON:
    """``/v1/advice``'s ``steering`` (openapi ``Advice.steering``): every GPU node once, in
    the level of its Slurm weight, weight ascending."""
    return {
        "computed_at": s.computed_at, "snapshot_time": s.snapshot_time,
        "default_weight": WEIGHT_BEST,
        "levels": [{"weight": level.weight, "nodes": list(level.nodes),
                    "expected_growth": {"min": level.growth_min, "max": level.growth_max}}
                   for level in s.levels],
        "gpu_hours_waiting_saved": s.gpu_hours_waiting_saved,
    }


def steering_weights(data: Any) -> dict[str, int]:
    """Each node's weight from a ``steering`` section (:func:`steering_json`, as read back from
    a /v1/advice answer); ValueError naming the field for one that does not hold together: a
    weight out of range, a node that is no node name, or a node in two levels."""
    from exporter.node_names import node_name_problem, shown

    if not isinstance(data, dict) or not isinstance(data.get("levels"), list):
        raise ValueError("steering.levels: expected a list")
    weights: dict[str, int] = {}
    for i, level in enumerate(data["levels"]):
        weight = level.get("weight") if isinstance(level, dict) else None
        if not isinstance(weight, int) or isinstance(weight, bool) \
                or not WEIGHT_BEST <= weight <= WEIGHT_WORST:
            raise ValueError(f"steering.levels[{i}].weight: expected an integer "
                             f"{WEIGHT_BEST}..{WEIGHT_WORST}")
        nodes = level.get("nodes")
        if not isinstance(nodes, list):
            raise ValueError(f"steering.levels[{i}].nodes: expected a list")
        for node in nodes:
            if problem := node_name_problem(node):
                raise ValueError(f"steering.levels[{i}].nodes: {shown(node)} {problem}")
            if node in weights:
                raise ValueError(f"steering.levels[{i}].nodes: {node} is in two levels")
            weights[node] = weight
    return weights


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _window_stats(s: WindowStats | None) -> dict[str, float] | None:
    if s is None:
        return None
    return {"mean": round(s.mean, 6), "stddev": round(s.stddev, 6), "p95": round(s.p95, 6)}


def scaling_json(a: PoolAdvice) -> JSON:
    """One entry of ``/v1/advice``'s ``scaling``: a pool's hint, its load statistics and changes."""
    return {
        "pool": a.pool, "nodes": a.nodes, "recommended_nodes": a.recommended_nodes,
        "action": a.action, "reason": a.reason, "demand_ratio": _rounded(a.demand_ratio),
        "demand_ratio_stats": _window_stats(a.demand),
        "utilization_stats": _window_stats(a.utilization),
        "window_samples": a.window_samples, "changes": dict(a.changes),
        "last_change": a.last_change, "mode": a.mode,
        "forecast_peak_gpus": _rounded(a.forecast_peak),
        # what the rule read beside demand, and whether it held an idle pool
        "utilization": _rounded(a.utilization_now),
        "memory_used_ratio": _rounded(a.memory_used_now),
        "idle": a.idle,
    }


EVENT_KIND = "remediation"  # a remediation event's webhook body's "event" (a plan's has none)
EVENT_SCHEMA_VERSION = 1


def event_json(event: Event) -> JSON:
    """A remediation event as ``/v1/advice`` lists it: its own fields, ``type`` and ``id``."""
    data: JSON = json.loads(encode_event(event))
    data["id"] = event_id(event)
    return data


def event_body(event: Event) -> bytes:
    """The webhook body of a remediation event (openapi ``RemediationEvent``): the event's
    own fields and ``type``, its stable ``id``, ``event`` and ``schema_version``; sorted keys,
    so its HMAC signature is stable. ``gpufleet act`` reads it as it reads an event line."""
    data = json.loads(encode_event(event))
    data.update({"event": EVENT_KIND, "schema_version": EVENT_SCHEMA_VERSION, "id": event_id(event)})
    return json.dumps(data, sort_keys=True).encode()


def _node_verdict(node: NodeVerdict) -> JSON:
    return {"node": node.node, "pool": node.pool, "verdict": node.verdict.value,
            "since": node.since,
            "reasons": [{"signal": r.signal, "level": r.level.value, "text": r.text, "gpu": r.gpu,
                         "since": r.since} for r in node.reasons]}


def health_json(h: HealthAdvice) -> JSON:
    """``/v1/advice``'s ``health`` (openapi ``Health``)."""
    return {
        "evaluated_at": h.evaluated_at,
        "nodes": {v.value: n for v, n in h.nodes.items()},
        "gpus": {v.value: n for v, n in h.gpus.items()},
        "unhealthy_nodes": [_node_verdict(n) for n in h.unhealthy_nodes],
        "drained": [{"node": node, "pool": r.pool, "reason": r.reason, "at": r.at,
                     "confirmed": node in h.confirmed} for node, r in h.drained],
        "remediation": [event_json(e) for e in h.remediation],
        "recent_remediation": [event_json(e) for e in h.recent_remediation],
        "storms": [{"pool": pool, "paged_at": at} for pool, at in h.storms],
        "stragglers": [{"job": s.job, "user": s.user, "account": s.account, "node": s.node,
                        "gpu": s.gpu, "metric": s.metric, "value": s.value, "median": s.median,
                        "since": s.since} for s in h.stragglers],
    }


def advisor_state_text(state: AdvisorState) -> str:
    """The advisor's kept state as the durable store holds it: JSON with sorted keys, so an
    unchanged state is the same text (only a changed one is written)."""
    carried = state.carried
    return json.dumps({
        "last_plan_at": state.last_plan_at,
        "carried": None if carried is None else plan_json(carried),
        "carried_at": state.carried_at,
        "scopes": {k: {"index": s.index, "above_since": s.above_since, "recommended": s.recommended}
                   for k, s in state.scopes.items()},
    }, sort_keys=True)


def _time(value: Any) -> float | None:
    return None if value is None else float(value)


def advisor_state_from_text(text: str) -> AdvisorState | None:
    """The state :func:`advisor_state_text` wrote, by this process or an earlier one; None for
    JSON ``null`` (none kept). A plan in force is taken back only with the time it was
    proposed. ``ValueError``, ``KeyError`` or ``TypeError`` when it does not hold together."""
    data = json.loads(text)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"advisor state: a JSON object expected, got {type(data).__name__}")
    carried, carried_at = data.get("carried"), data.get("carried_at")
    plan = None
    if carried is not None and carried_at is not None:
        plan, carried_at = plan_from_json(carried), float(carried_at)
    else:
        carried_at = None
    return AdvisorState(
        last_plan_at=_time(data.get("last_plan_at")), carried=plan, carried_at=carried_at,
        scopes={str(k): ScopeStatus(float(v["index"]), bool(v["recommended"]),
                                    _time(v["above_since"]))
                for k, v in (data.get("scopes") or {}).items()})


def remediation_state_text(state: RemediationState) -> str:
    """The remediator's state as the durable store holds it (what gpufleet drained, its fault
    history): JSON with sorted keys, so an unchanged state is the same text."""
    return json.dumps(json.loads(msgspec.json.encode(state)), sort_keys=True)


def remediation_state_from_text(text: str) -> RemediationState | None:
    """The state :func:`remediation_state_text` wrote; None for JSON ``null`` (none kept)."""
    if text.strip() == "null":
        return None
    try:
        return msgspec.json.decode(text, type=RemediationState)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"remediation state: {exc}") from None


def what_if_json(what_if: WhatIf) -> JSON:
    """``POST /v1/plan``'s answer: an ``Advice`` with ``what_if`` true and only the indices."""
    data: JSON = {
        "evaluated_at": what_if.evaluated_at, "snapshot_time": what_if.snapshot_time,
        "what_if": True, "scopes": {k: {"index": v} for k, v in what_if.scopes.items()},
        "decision": what_if.decision,
    }
    data = _scoped(data, what_if.scope)
    data.update({"reasons": list(what_if.reasons),
                 "plan": None if what_if.plan is None else plan_json(what_if.plan)})
    return data


def plan_from_json(data: Mapping[str, Any]) -> CompactionPlan:
    """A plan as :func:`plan_json` wrote it (and the plan schema checked) back as the
    dataclass. Its ``plan_id`` must be the hash of its content: an edited move under the
    old id would be acted on as the plan that was reviewed."""
    migrations = tuple(
        Migration(job=m["job"], namespace=m["namespace"], pod=m["pod"],
                  source=Endpoint(m["from"]["node"], tuple(m["from"]["gpus"])),
                  destination=Endpoint(m["to"]["node"], tuple(m["to"]["gpus"])),
                  action=m["action"], wait_until=m["wait_until"],
                  cost_gpu_seconds=float(m["cost"]["gpu_seconds_since_checkpoint"]),
                  gpu_share=float(m["gpu_share"]), cpus=float(m["cpus"]), reason=m["reason"])
        for m in sorted(data["migrations"], key=lambda m: m["order"]))
    plan = CompactionPlan(
        scope=data["scope"], snapshot_time=float(data["snapshot_time"]),
        expires_at=float(data["expires_at"]), decision=data["decision"],
        reasons=tuple(data["reasons"]),
        before=Prediction(**data["before"]), after=Prediction(**data["after"]),
        nodes_freed=dict(data["nodes_freed"]), migrations=migrations,
        tier_misplacements=tuple(TierMisplacement(**{**t, "suitable_models": tuple(t["suitable_models"])})
                                 for t in data["tier_misplacements"]),
        rejected_moves=int(data.get("rejected_moves", 0)),
        lets_start=tuple(str(j) for j in data.get("lets_start", ())),
        gpu_hours_waiting_saved=float(data.get("gpu_hours_waiting_saved", 0.0)),
        oracle_gpu_hours_waiting_saved=None if (oracle := data.get("oracle_gpu_hours_waiting_saved")) is None
        else float(oracle))
    orders = sorted(m["order"] for m in data["migrations"])
    if orders != list(range(1, len(orders) + 1)):
        raise PlanFormatError(f"migrations: orders must be 1..{len(orders)}, each once")
    if plan.plan_id != data["plan_id"]:
        raise PlanFormatError(f"plan_id {data['plan_id']} does not match the plan's content "
                              f"({plan.plan_id}): the moves were edited")
    return plan
