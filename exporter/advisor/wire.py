"""The advisor's JSON: the one place its typed values become wire data, and a plan comes back.

Called only where advice leaves the process: the HTTP API (:mod:`api`: ``GET /v1/advice``,
``POST /v1/plan``), the webhook body the outbox stores (:meth:`webhook.Deliverer.enqueue_plan`)
and ``gpufleet plan`` (:mod:`exporter.cli.plan`, which reads a plan back with
:func:`plan_from_json`). Field names and order are the documented format
(docs/advisor.md, docs/advisor-plan.schema.json, :mod:`openapi`); write them nowhere else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from exporter.advisor.advice import Advice, HeldGpus, NvlinkMixed, Reclaim, RightSizing, WhatIf
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction, TierMisplacement

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
        data["scaling"] = list(advice.scaling)
    return data


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
        gpu_hours_waiting_saved=float(data.get("gpu_hours_waiting_saved", 0.0)))
    orders = sorted(m["order"] for m in data["migrations"])
    if orders != list(range(1, len(orders) + 1)):
        raise PlanFormatError(f"migrations: orders must be 1..{len(orders)}, each once")
    if plan.plan_id != data["plan_id"]:
        raise PlanFormatError(f"plan_id {data['plan_id']} does not match the plan's content "
                              f"({plan.plan_id}): the moves were edited")
    return plan
