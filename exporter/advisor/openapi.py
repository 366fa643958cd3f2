"""The OpenAPI 3.1 document of the ``/v1/*`` API, served at ``GET /v1/openapi.json``.

Built from what the handlers check, not written beside them:

- request bodies are :mod:`bounds`' schemas (:func:`bounds.snapshot_schema`,
  :func:`bounds.alertmanager_schema`), made from the same numbers as the checks,
  so a limit is written once;
- the plan is :func:`plan_schema`, which ``docs/advisor-plan.schema.json`` is
  generated from (``python -m exporter.advisor.openapi --plan-schema``; a test
  fails when the two differ).

OpenAPI 3.1 takes JSON Schema 2020-12 as it is, so these schemas go in
unchanged; only the plan's ``$defs`` move under ``components`` (tools resolve
``#/components/...`` against the document, not against the plan's ``$id``).
Error bodies are ``{"error": reason}``; the concurrency limit's 503
(:mod:`exporter.web.connection_gate`) and the web config's 401, 403 and 429
(:mod:`exporter.web.webconfig`) answer before any handler, in plain text.
"""

from __future__ import annotations

import argparse
import copy
import json
from types import MappingProxyType
from typing import Any

from exporter import __version__
from exporter.advisor import bounds


def plan_schema() -> dict[str, Any]:
    """The plan format a receiver gets (and advice.plan). Edit here, then regenerate the docs file."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://gpufleet.example/schemas/advisor-plan.json",
        "title": "gpufleet compaction plan",
        "description": "What the gpufleet advisor POSTs to a scheduler (and serves as advice.plan at "
                       "GET /v1/advice until it expires). See docs/advisor.md.",
        "type": "object",
        "required": ["plan_id", "scope", "snapshot_time", "expires_at", "decision", "reasons", "before",
                     "after", "nodes_freed", "migrations", "tier_misplacements", "fragmented_gpus_recovered"],
        "properties": {
            "plan_id": {"type": "string", "pattern": "^plan-[0-9a-f]{24}$",
                        "description": "Content hash of the scope and the ordered migrations: the same "
                                       "plan has the same id. Also sent as Idempotency-Key."},
            "scope": {"type": "string", "pattern": "^(cluster|pool:.+)$"},
            "snapshot_time": {"type": "number",
                              "description": "Unix time of the snapshot the plan was made on."},
            "expires_at": {"type": "number",
                           "description": "Unix time after which the plan must not be acted on."},
            "decision": {"const": "compact"},
            "reasons": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "before": {"$ref": "#/$defs/prediction"},
            "after": {"$ref": "#/$defs/prediction"},
            "fragmented_gpus_recovered": {"type": "number", "minimum": 0},
            "nodes_freed": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                            "description": "Pool -> whole nodes left with every GPU free, for 8-GPU jobs."},
            "rejected_moves": {"type": "integer", "minimum": 0},
            "migrations": {"type": "array", "items": {"$ref": "#/$defs/migration"}},
            "tier_misplacements": {"type": "array", "items": {"$ref": "#/$defs/misplacement"}},
            "lets_start": {"type": "array", "items": {"type": "string"},
                           "description": "Pending jobs the plan lets start, together (those listed first "
                                          "first): the gain in jobs."},
            "gpu_hours_waiting_saved": {"type": "number", "minimum": 0,
                                        "description": "GPU-hours of waiting the plan is expected to save: "
                                                       "each job it lets start, its GPUs times the wait so "
                                                       "far (taken as the wait to come; no forecast, and no "
                                                       "source reads the scheduler's expected start)."},
            "oracle_gpu_hours_waiting_saved": {
                "type": ["number", "null"], "minimum": 0,
                "description": "An upper bound on what any repack could save on the plan's snapshot, in the "
                               "same units: the blocked pending jobs packed fractionally into their pools' "
                               "free GPUs, most GPU-hours per GPU first (docs/advisor.md, Expected and "
                               "realised saving). Null where not computed."},
            "share_of_oracle_saving": {
                "type": ["number", "null"], "minimum": 0,
                "description": "gpu_hours_waiting_saved over oracle_gpu_hours_waiting_saved; null without a "
                               "bound above zero."},
        },
        "$defs": {
            "prediction": {
                "type": "object", "required": ["index", "fragmented_gpus"],
                "properties": {"index": {"type": "number", "minimum": 0, "maximum": 100},
                               "fragmented_gpus": {"type": "number", "minimum": 0}},
            },
            "endpoint": {
                "type": "object", "required": ["node", "gpus"],
                # no GPU for a CPU-only job, which a plan for a pending GPU job may move off a
                # node whose CPUs that job needs (since schema v1's 2026-12-05 revision)
                "properties": {"node": {"type": "string"},
                               "gpus": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
            },
            "migration": {
                "type": "object",
                "required": ["order", "job", "namespace", "pod", "from", "to", "gpu_share", "cpus", "action",
                             "wait_until", "cost", "reason"],
                "properties": {
                    "order": {"type": "integer", "minimum": 1},
                    "job": {"type": "string"}, "namespace": {"type": "string"}, "pod": {"type": "string"},
                    "from": {"$ref": "#/$defs/endpoint"}, "to": {"$ref": "#/$defs/endpoint"},
                    "gpu_share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    "cpus": {"type": "number", "minimum": 0},
                    "action": {"enum": ["checkpoint_then_migrate", "migrate", "wait_until"]},
                    "wait_until": {"type": ["number", "null"],
                                   "description": "Unix time; set only for action wait_until."},
                    "cost": {"type": "object", "required": ["gpu_seconds_since_checkpoint"],
                             "properties": {"gpu_seconds_since_checkpoint": {"type": "number",
                                                                             "minimum": 0}}},
                    "reason": {"type": "string"},
                },
            },
            "misplacement": {
                "type": "object",
                "required": ["job", "namespace", "node", "model", "memory_need_gb", "suitable_models",
                             "reason"],
                "properties": {"job": {"type": "string"}, "namespace": {"type": "string"},
                               "node": {"type": "string"}, "model": {"type": "string"},
                               "memory_need_gb": {"type": ["number", "null"]},
                               "suitable_models": {"type": "array", "items": {"type": "string"}},
                               "reason": {"type": "string"}},
            },
        },
    }

_REF = "#/components/schemas/"
# the plan's $defs under components, named Plan + the def's name: PlanPrediction, PlanMigration...
_PLAN_DEFS = MappingProxyType({name: f"Plan{name.capitalize()}" for name in plan_schema()["$defs"]})


def _rebased(schema: Any) -> Any:
    """``schema`` with ``#/$defs/x`` references pointing at ``#/components/schemas/PlanX``."""
    if isinstance(schema, dict):
        return {k: (_REF + _PLAN_DEFS[v.removeprefix("#/$defs/")] if k == "$ref" else _rebased(v))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rebased(v) for v in schema]
    return schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


_DECISIONS = ("none", "cooldown", "hold", "compact")

def advice_schema() -> dict[str, Any]:
    return {
        "type": "object", "title": "Advice",
        "description": "A decision with its reasons, per-scope state and the plan if any (docs/advisor.md). "
                       "Before the first evaluation only decision none and one reason.",
        "required": ["decision", "reasons"],
        "properties": {
            "decision": {"enum": list(_DECISIONS)},
            "reasons": {"type": "array", "items": {"type": "string"}},
            "plan": {"anyOf": [_ref("Plan"), {"type": "null"}],
                     "description": "the plan in force: this evaluation's (decision compact) or, until "
                                    "its expires_at, the last one proposed (then plan_proposed_at is "
                                    "before evaluated_at and a reason says so); never an expired plan"},
            "plan_proposed_at": {"type": ["number", "null"],
                                 "description": "unix time of the evaluation that proposed plan; null "
                                                "without a plan"},
            "scope": {"type": "string"},
            "evaluated_at": {"type": "number"},
            "snapshot_time": {"type": "number"},
            "trigger": {"type": "string",
                        "description": "snapshot, or the Alertmanager notification's alerts"},
            "what_if": {"const": True, "description": "set on POST /v1/plan's answer"},
            "scopes": {"type": "object", "additionalProperties": {
                "type": "object", "required": ["index"],
                "properties": {"index": {"type": "number"}, "recommended": {"type": "boolean"},
                               "above_since": {"type": ["number", "null"]}}}},
            "reclaim": {"type": "array", "description": "held-but-idle jobs, costliest models first; "
                        "never acted on (docs/advisor.md)", "items": {
                "type": "object",
                "required": ["job", "namespace", "account", "pool", "model", "gpus", "utilization_ratio",
                             "idle_since", "gpu_hours_wasted", "action", "reason"],
                "properties": {"job": {"type": "string"}, "namespace": {"type": "string"},
                               "account": {"type": "string"}, "pool": {"type": "string"},
                               "model": {"type": "string"}, "gpus": {"type": "number", "minimum": 0},
                               "utilization_ratio": {"type": "number", "minimum": 0},
                               "idle_since": {"type": "number"},
                               "gpu_hours_wasted": {"type": "number", "minimum": 0},
                               "action": {"const": "reclaim"}, "reason": {"type": "string"}}}},
            "right_sizing": {"type": "array", "description": "jobs on a higher memory tier than their "
                             "need (declared, raised to the measured peak) in a pool under pressure, most "
                             "GPU-hours first; never acted on (docs/advisor.md)", "items": {
                "type": "object",
                "required": ["job", "namespace", "account", "pool", "model", "gpus", "declared_need_gb",
                             "measured_peak_gb", "suitable_models", "gpu_hours_held", "action", "reason"],
                "properties": {"job": {"type": "string"}, "namespace": {"type": "string"},
                               "account": {"type": "string"}, "pool": {"type": "string"},
                               "model": {"type": "string"}, "gpus": {"type": "number", "minimum": 0},
                               "declared_need_gb": {"type": "number", "minimum": 0},
                               "measured_peak_gb": {"type": ["number", "null"], "minimum": 0},
                               "suitable_models": {"type": "array", "items": {"type": "string"}},
                               "gpu_hours_held": {"type": "number", "minimum": 0},
                               "action": {"const": "right_size"}, "reason": {"type": "string"}}}},
            "scaling": {"type": "array", "description": "per pool: the scaling hint from the demand ratio, "
                        "the load statistics over the analyzer's window and the detected load changes; "
                        "never acted on (docs/load.md)", "items": {
                "type": "object",
                "required": ["pool", "nodes", "recommended_nodes", "action", "reason", "demand_ratio",
                             "demand_ratio_stats", "utilization_stats", "window_samples", "changes",
                             "last_change", "mode", "forecast_peak_gpus"],
                "properties": {"pool": {"type": "string"}, "nodes": {"type": "integer", "minimum": 0},
                               "recommended_nodes": {"type": "integer", "minimum": 0},
                               "action": {"enum": ["scale_up", "scale_down", "hold"]},
                               "reason": {"enum": ["hold", "up", "down", "min_nodes", "max_nodes"]},
                               "demand_ratio": {"type": ["number", "null"], "minimum": 0},
                               "demand_ratio_stats": {"anyOf": [_ref("WindowStats"), {"type": "null"}]},
                               "utilization_stats": {"anyOf": [_ref("WindowStats"), {"type": "null"}]},
                               "window_samples": {"type": "integer", "minimum": 1},
                               "changes": {"type": "object", "required": ["up", "down"], "properties": {
                                   "up": {"type": "integer", "minimum": 0},
                                   "down": {"type": "integer", "minimum": 0}}},
                               "last_change": {"type": ["number", "null"]},
                               "mode": {"enum": ["reactive", "predictive"]},
                               "forecast_peak_gpus": {"type": ["number", "null"], "minimum": 0,
                                                      "description": "predictive mode: the demand the "
                                                      "rule read (null before a day of history)"}}}},
            "steering": _steering_schema(),
            "saving": _saving_schema(),
            "preemption": _preemption_schema(),
            "health": {**_ref("Health"), "description": "issue 31: verdicts, remediation, stragglers"},
            "nvlink_mixed": {"type": "array", "description": "multi-node jobs over NVLink generations",
                             "items": {
                "type": "object", "required": ["job", "namespace", "nodes", "nvlink_generations", "reason"],
                "properties": {"job": {"type": "string"}, "namespace": {"type": "string"},
                               "nodes": {"type": "array", "items": {"type": "string"}},
                               "nvlink_generations": {"type": "array", "items": {"type": "integer"}},
                               "reason": {"type": "string"}}}},
        },
    }

def _preemption_schema() -> dict[str, Any]:
    from exporter.preemption.advice import schema

    return schema()


def _steering_schema() -> dict[str, Any]:
    growth = {"type": ["number", "null"]}
    return {
        "type": "object",
        "description": "where the next GPU job should go (docs/advisor.md, Steering): every node with "
                       "GPUs once, in the level of its Slurm Weight (lowest allocated first), levels by "
                       "weight ascending and only those with nodes; computed at most every 300 s and "
                       "carried between. Absent where steering is off. A node's name and 4 bytes "
                       "a node: 294 KB at 13,600 nodes of 17-character names (bench/steer.py)",
        "required": ["computed_at", "snapshot_time", "default_weight", "levels",
                     "gpu_hours_waiting_saved"],
        "properties": {
            "computed_at": {"type": "number", "description": "unix time of the computation"},
            "snapshot_time": {"type": "number", "description": "the snapshot it was computed from"},
            "default_weight": {"const": 1, "description": "Slurm's default Weight, and the best level"},
            "levels": {"type": "array", "maxItems": 10, "items": {
                "type": "object", "required": ["weight", "nodes", "expected_growth"],
                "properties": {
                    "weight": {"type": "integer", "minimum": 1, "maximum": 10},
                    "nodes": {"type": "array", "items": {"type": "string"}},
                    "expected_growth": {
                        "type": "object", "required": ["min", "max"],
                        "description": "the range over the level's nodes of the expected growth of "
                                       "fragmented GPUs (FGD) if the typical next job landed there "
                                       "(negative: it fills a gap that fragmented GPUs); null where "
                                       "no typical job fits any of them",
                        "properties": {"min": growth, "max": growth}}}}},
            "gpu_hours_waiting_saved": {
                "type": ["number", "null"], "minimum": 0,
                "description": "the GPU-hours of waiting the steering is expected to save: null. No "
                               "defensible estimate exists yet: the FGD growth a weight avoids is in "
                               "fragmented GPUs, not waiting, and gpufleet simulate's steer strategy "
                               "measured no saving beyond the noise (docs/advisor.md, Steering)"},
        },
    }

def _saving_schema() -> dict[str, Any]:
    hours = {"type": "number", "minimum": 0}
    maybe = {"type": ["number", "null"], "minimum": 0}
    job = {
        "type": "object",
        "required": ["job", "gpus", "waited_seconds", "expected_gpu_hours", "started_at",
                     "realised_gpu_hours"],
        "properties": {
            "job": {"type": "string"}, "gpus": hours,
            "waited_seconds": {**hours, "description": "its wait when the plan was proposed"},
            "expected_gpu_hours": {**hours, "description": "gpus x waited_seconds / 3600"},
            "started_at": {"type": ["number", "null"],
                           "description": "when it was seen running (its allocation's start time where "
                                          "the source states one); null: not seen running"},
            "realised_gpu_hours": {**maybe, "description": "gpus x (waited_seconds less the delay from "
                                   "the plan's proposal to its start, at least 0) / 3600; 0 for a job "
                                   "never seen running by the close; null while it waits"}}}
    return {
        "type": "object",
        "description": "the delivered plans' expected and realised GPU-hours of waiting saved "
                       "(docs/advisor.md, Expected and realised saving): the newest 32, each watched "
                       "until its jobs started or until closes_at",
        "required": ["basis", "plans", "totals"],
        "properties": {
            "basis": {"const": "wait_so_far",
                      "description": "what a job would have waited otherwise: as long again as it had "
                                     "waited (no source reads the scheduler's expected start)"},
            "plans": {"type": "array", "maxItems": 32, "items": {
                "type": "object",
                "required": ["plan_id", "proposed_at", "closes_at", "closed", "expected_gpu_hours",
                             "oracle_gpu_hours", "share_of_oracle_saving", "realised_gpu_hours", "jobs"],
                "properties": {
                    "plan_id": {"type": "string", "pattern": "^plan-[0-9a-f]{24}$"},
                    "proposed_at": {"type": "number"}, "closes_at": {"type": "number"},
                    "closed": {"type": "boolean"},
                    "expected_gpu_hours": hours, "oracle_gpu_hours": maybe, "share_of_oracle_saving": maybe,
                    "realised_gpu_hours": {**maybe, "description": "null while one of its jobs waits"},
                    "jobs": {"type": "array", "items": job}}}},
            "totals": {
                "type": "object", "description": "every plan closed since the process started",
                "required": ["plans", "jobs", "started", "expected_gpu_hours", "realised_gpu_hours",
                             "realised_ratio"],
                "properties": {
                    "plans": {"type": "integer", "minimum": 0}, "jobs": {"type": "integer", "minimum": 0},
                    "started": {"type": "integer", "minimum": 0},
                    "expected_gpu_hours": hours, "realised_gpu_hours": hours,
                    "realised_ratio": {**maybe, "description": "realised over expected; null with nothing "
                                       "expected"}}},
        },
    }

def _verdict_counts() -> dict[str, Any]:
    return {"type": "object", "required": ["healthy", "unknown", "degraded", "failing"],
            "properties": {v: {"type": "integer", "minimum": 0}
                           for v in ("healthy", "unknown", "degraded", "failing")}}

def remediation_event_schema() -> dict[str, Any]:
    """Issue 31: a remediation event, as /v1/advice lists it and as the webhook POSTs it (the
    body adds "event" and "schema_version"). Written by exporter/advisor/wire.py's event_body."""
    return {
        "type": "object", "title": "RemediationEvent",
        "description": "drain: take the node out of scheduling (reason given); reset_gpu: reset the GPU "
                       "once idle; resume: put a node gpufleet drained back; replace: a node with "
                       "`faults` faults in `window_seconds`; page: more failing nodes in `pool` than "
                       "the drain budget, none drained (docs/health.md). `gpufleet act` carries out "
                       "drain and resume on Slurm or Kubernetes.",
        "required": ["type", "id", "pool", "at"],
        "properties": {
            "type": {"enum": ["drain", "reset_gpu", "resume", "replace", "page"]},
            "id": {"type": "string", "pattern": "^[a-z_]+:[^:]+:[0-9]+$",
                   "description": "<type>:<node or pool>[/<gpu>]:<unix ms>, stable across restarts; "
                                  "the Idempotency-Key of its delivery"},
            "event": {"const": "remediation", "description": "set on the webhook body"},
            "schema_version": {"const": 1, "description": "set on the webhook body"},
            "node": {"type": "string"}, "pool": {"type": "string"},
            "gpu": {"type": "integer", "minimum": 0, "description": "reset_gpu"},
            "reason": {"type": "string", "description": "drain, reset_gpu, page"},
            "drained_at": {"type": "number", "description": "resume"},
            "faults": {"type": "integer", "minimum": 1, "description": "replace"},
            "window_seconds": {"type": "number", "description": "replace"},
            "nodes": {"type": "array", "items": {"type": "string"}, "description": "page"},
            "at": {"type": "number", "description": "unix time it was decided"},
        },
    }

def health_schema() -> dict[str, Any]:
    return {
        "type": "object", "title": "Health",
        "description": "GPU and node health verdicts, remediation and stragglers (docs/health.md); "
                       "lists hold at most 100 entries, worst first",
        "required": ["evaluated_at", "nodes", "gpus", "unhealthy_nodes", "drained", "remediation",
                     "recent_remediation", "storms", "stragglers"],
        "properties": {
            "evaluated_at": {"type": "number"},
            "nodes": _verdict_counts(), "gpus": _verdict_counts(),
            "unhealthy_nodes": {"type": "array", "items": {
                "type": "object", "required": ["node", "pool", "verdict", "since", "reasons"],
                "properties": {
                    "node": {"type": "string"}, "pool": {"type": "string"},
                    "verdict": {"enum": ["unknown", "degraded", "failing"]},
                    "since": {"type": "number"},
                    "reasons": {"type": "array", "items": {
                        "type": "object", "required": ["signal", "level", "text", "gpu", "since"],
                        "properties": {"signal": {"type": "string"},
                                       "level": {"enum": ["healthy", "unknown", "degraded", "failing"]},
                                       "text": {"type": "string"},
                                       "gpu": {"type": ["integer", "null"]},
                                       "since": {"type": "number"}}}}}}},
            "drained": {"type": "array", "description": "nodes gpufleet advised draining, not yet resumed; "
                        "`confirmed`: the scheduler's own state shows the node drained (Slurm's DRAIN flag), "
                        "false while the drain is only advised or the source does not read that state",
                        "items": {"type": "object", "required": ["node", "pool", "reason", "at", "confirmed"],
                                  "properties": {"node": {"type": "string"}, "pool": {"type": "string"},
                                                 "reason": {"type": "string"}, "at": {"type": "number"},
                                                 "confirmed": {"type": "boolean"}}}},
            "remediation": {"type": "array", "description": "the events of the last snapshot",
                            "items": _ref("RemediationEvent")},
            "recent_remediation": {"type": "array", "description": "the last 100 events, newest first",
                                   "items": _ref("RemediationEvent")},
            "storms": {"type": "array", "description": "pools paged: failing nodes over the budget",
                       "items": {"type": "object", "required": ["pool", "paged_at"],
                                 "properties": {"pool": {"type": "string"}, "paged_at": {"type": "number"}}}},
            "stragglers": {"type": "array", "items": {
                "type": "object",
                "required": ["job", "user", "account", "node", "gpu", "metric", "value", "median", "since"],
                "properties": {"job": {"type": "string"}, "user": {"type": "string"},
                               "account": {"type": "string"}, "node": {"type": "string"},
                               "gpu": {"type": "integer", "minimum": 0},
                               "metric": {"enum": ["sm_active", "utilization", "power", "sm_clock"]},
                               "value": {"type": "number"}, "median": {"type": "number"},
                               "since": {"type": "number"}}}},
        },
    }

def alerts_reply_schema() -> dict[str, Any]:
    return {
        "type": "object", "title": "AlertsReply", "required": ["accepted", "duplicate", "evaluation"],
        "additionalProperties": False,
        "properties": {"accepted": {"const": True}, "duplicate": {"type": "boolean"},
                       "evaluation": {"enum": ["none", "scheduled"]}},
    }

def error_schema() -> dict[str, Any]:
    return {
        "type": "object", "title": "Error", "required": ["error"], "additionalProperties": False,
        "properties": {"error": {"type": "string",
                                 "description": "one line: what is wrong, e.g. the JSON path"}},
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


# what the middlewares answer before any handler (web.max_requests, the web config): plain text
def _text() -> dict[str, Any]:
    return {"text/plain": {"schema": {"type": "string"}}}


def _busy(description: str | None = None, json_too: bool = True) -> dict[str, Any]:
    content: dict[str, Any] = _text()
    if json_too:
        content["application/json"] = {"schema": _ref("Error")}
    text = "web.max_requests requests to this endpoint already in flight (text/plain)"
    return {"description": f"{description}; or {text}" if description else text, "content": content}


def _unauthorized() -> dict[str, Any]:
    return {
        "description": "missing, blank or wrong bearer token, or no token configured",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
        "content": {"application/json": {"schema": _ref("Error")}},
    }


# the web config file (exporter/web/webconfig.py) answers before the handler, in plain text
_BASIC_TEXT = "the web config's basic_auth_users and no or a wrong password (text/plain)"


def _read_unauthorized() -> dict[str, Any]:
    unauthorized = _unauthorized()
    return {**unauthorized,
            "description": "api.require_token_for_reads is on and the bearer token is "
                           f"missing or wrong; or {_BASIC_TEXT}",
            "content": {**unauthorized["content"], **_text()}}


def _basic_unauthorized() -> dict[str, Any]:
    return {"description": _BASIC_TEXT, "content": _text(), "headers": _unauthorized()["headers"]}


def _web_config() -> dict[str, Any]:
    return {
        "403": {"description": "the web config's client_allowed_sans refused the client certificate",
                "content": _text()},
        "429": {"description": "the web config's rate_limit", "content": _text()},
    }


def _retry() -> dict[str, Any]:
    return {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}


def _too_large() -> dict[str, Any]:
    return _error("body over advisor.max_body_bytes (by Content-Length, or while read)")


def _body_late() -> dict[str, Any]:
    """exporter/web/connection_gate.py answers it before the handler, for any request with a body."""
    return {"description": "web.body_timeout: the body had not arrived whole in time of the "
                           "headers; the connection is closed (text/plain)",
            "content": _text()}


def _bug() -> dict[str, Any]:
    return _error("an exception in the handler, logged; the server keeps serving (never expected)")


def _body_400() -> dict[str, Any]:
    return _error("not UTF-8 JSON, nested deeper than bounds.MAX_DEPTH, an integer of more than "
                  "bounds.MAX_INT_DIGITS digits, or outside the body's schema; the reason names the path")


def _read_security() -> list[dict[str, list[str]]]:
    """GET /v1/* but openapi.json: open by default, the token when api.require_token_for_reads is on."""
    return [{}, {"bearer": []}]


def _post_security() -> list[dict[str, list[str]]]:
    return [{"bearer": []}]


def document(advisor: bool = True) -> dict[str, Any]:
    """The OpenAPI 3.1 document, as served at ``GET /v1/openapi.json``. Without the advisor
    (``advisor.enabled: false``, or analysis off) only the snapshot and this document are
    served, and the document says no more than that."""
    plan = {k: v for k, v in _rebased(plan_schema()).items() if k not in ("$schema", "$id", "$defs")}
    schemas: dict[str, Any] = {
        "Snapshot": bounds.snapshot_schema(),
        "AlertmanagerWebhook": bounds.alertmanager_schema(),
        "Advice": advice_schema(),
        "WindowStats": {"type": "object", "title": "WindowStats", "required": ["mean", "stddev", "p95"],
                        "description": "avg_over_time, stddev_over_time (population) and "
                                       "quantile_over_time(0.95) over the analyzer's window",
                        "properties": {k: {"type": "number"} for k in ("mean", "stddev", "p95")}},
        "AlertsReply": alerts_reply_schema(),
        "Health": health_schema(),
        "RemediationEvent": remediation_event_schema(),
        "Error": error_schema(),
        "Plan": plan,
        **{_PLAN_DEFS[name]: _rebased(schema) for name, schema in plan_schema()["$defs"].items()},
    }
    paths: dict[str, Any] = {
        "/v1/openapi.json": {"get": {
            "operationId": "getOpenApi", "summary": "This document", "security": [],
            "responses": {
                "200": _json({"type": "object", "required": ["openapi", "info", "paths"]},
                             "the OpenAPI 3.1 document of /v1/*"),
                "503": _busy(json_too=False)}}},
        "/v1/snapshot": {"get": {
            "operationId": "getSnapshot", "summary": "The current fleet snapshot (what POST /v1/plan takes)",
            "security": _read_security(),
            "responses": {
                "200": _json(_ref("Snapshot"), "the snapshot of the last collection"),
                "401": _read_unauthorized(),
                "500": _error("encoding the snapshot raised, logged; the next request tries again"),
                "503": _busy("no snapshot collected yet (JSON)")}}},
        "/v1/advice": {"get": {
            "operationId": "getAdvice", "summary": "The current decision, its reasons and the plan if any",
            "security": _read_security(),
            "responses": {
                "200": _json(_ref("Advice"), "the advisor's last decision"),
                "401": _read_unauthorized(),
                "503": _busy(json_too=False)}}},
        "/v1/plan": {"post": {
            "operationId": "postPlan",
            "summary": "What-if: the plan for the snapshot in the body; changes nothing",
            "security": _post_security(),
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": _ref("Snapshot")}}},
            "responses": {
                "200": _json(_ref("Advice"), "the what-if's decision (what_if: true) and its plan"),
                "400": _body_400(),
                "401": _unauthorized(),
                "413": _too_large(),
                "500": _bug(),
                "503": {**_busy("another what-if is running, or this one passed its time limit "
                                "(JSON, with Retry-After)"), "headers": _retry()}}}},
        "/v1/alerts": {"post": {
            "operationId": "postAlerts",
            "summary": "Alertmanager's webhook (payload version 4)",
            "description": "Deduplicated on groupKey + status. firing schedules an evaluation (202); "
                           "resolved and duplicates change nothing (200).",
            "security": _post_security(),
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": _ref("AlertmanagerWebhook")}}},
            "responses": {
                "200": _json(_ref("AlertsReply"), "a duplicate, or resolved: nothing to evaluate"),
                "202": _json(_ref("AlertsReply"), "firing: an evaluation is scheduled"),
                "400": _body_400(),
                "401": _unauthorized(),
                "413": _too_large(),
                "500": _bug(),
                "503": _busy(json_too=False)}}},
        "/v1/admission": {"post": {
            "operationId": "postAdmission",
            "summary": "Kubernetes' mutating admission webhook (AdmissionReview v1): steers GPU pods",
            "description": "Always admits. A GPU pod gets a JSON patch adding a preferred node "
                           "affinity for the nodes where its ask grows fragmentation least; any "
                           "other pod, or no fleet analysed yet, none. No token: the apiserver "
                           "presents none (docs/advisor.md, Steering).",
            "security": [],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["apiVersion", "kind", "request"],
                "properties": {"apiVersion": {"const": "admission.k8s.io/v1"},
                               "kind": {"const": "AdmissionReview"},
                               "request": {"type": "object", "required": ["uid"],
                                           "properties": {"uid": {"type": "string", "minLength": 1,
                                                                  "maxLength": 128}}}}}}}},
            "responses": {
                "200": _json({"type": "object", "required": ["apiVersion", "kind", "response"],
                              "properties": {"response": {
                                  "type": "object", "required": ["uid", "allowed"],
                                  "properties": {"uid": {"type": "string"}, "allowed": {"const": True},
                                                 "patchType": {"const": "JSONPatch"},
                                                 "patch": {"type": "string"}}}}},
                             "the AdmissionReview answered: allowed, with a patch for a GPU pod"),
                "400": _error("not JSON, or not an AdmissionReview of admission.k8s.io/v1 with a "
                              "request uid"),
                "413": _error("body over the server's 1 MiB request limit"),
                "503": _busy(json_too=False)}}},
    }
    if not advisor:
        paths = {path: paths[path] for path in ("/v1/openapi.json", "/v1/snapshot")}
    for item in paths.values():
        for operation in item.values():
            operation["responses"].update(_web_config())
            if "requestBody" in operation:
                operation["responses"]["408"] = _body_late()
    paths["/v1/openapi.json"]["get"]["responses"]["401"] = _basic_unauthorized()
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {"title": "gpufleet advisor API", "version": __version__,
                 "description": "The exporter's /v1 API: snapshot, advice, what-if and Alertmanager's "
                                "webhook. See docs/advisor.md."},
        "paths": paths,
        **({"webhooks": _webhooks()} if advisor else {}),
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "GPUFLEET_ADVISOR_TOKEN or advisor.token_file; every POST needs it"}},
        },
    })


def _webhooks() -> dict[str, Any]:
    """What the advisor POSTs to each receiver: signed, retried from the store (docs/advisor.md)."""
    headers = {
        "X-Gpufleet-Signature": {"required": True,
                                 "schema": {"type": "string", "pattern": "^sha256=[0-9a-f]{64}$"},
                                 "description": "HMAC-SHA256 of the body with the receiver's secret"},
        "X-Gpufleet-Delivery": {"required": True, "schema": {"type": "string"}},
        "Idempotency-Key": {"required": True, "schema": {"type": "string"},
                            "description": "the plan id (plan-...[.n]) or the event id"},
    }

    def hook(event: str, schema: str, summary: str) -> dict[str, Any]:
        params = [{"name": name, "in": "header", **spec} for name, spec in headers.items()]
        params.append({"name": "X-Gpufleet-Event", "in": "header", "required": True,
                       "schema": {"const": event}})
        return {"post": {
            "operationId": f"{event}Webhook", "summary": summary, "parameters": params,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(schema)}}},
            "responses": {"2XX": {"description": "taken: the delivery is done"},
                          "429": {"description": "retried, after Retry-After"},
                          "4XX": {"description": "refused: not retried"},
                          "5XX": {"description": "retried with backoff"}}}}

    return {"plan": hook("plan", "Plan", "A compaction plan"),
            "remediation": hook("remediation", "RemediationEvent",
                                "A remediation event: drain, reset_gpu, resume, replace, page")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporter.advisor.openapi",
                                     description="Print the OpenAPI document, or the plan's JSON Schema.")
    parser.add_argument("--plan-schema", action="store_true",
                        help="print docs/advisor-plan.schema.json's content instead")
    args = parser.parse_args(argv)
    print(json.dumps(plan_schema() if args.plan_schema else document(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
