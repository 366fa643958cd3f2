"""What the advisor's POSTs accept: safe JSON, and schemas with limits, checked before any work.

A posted snapshot drives dense nodes x GPUs arrays and ``range(gpu_count)`` per
node (:mod:`exporter.analysis.state`), so one ``gpu_count: 1000000000`` once
took the host's memory. Every number here bounds such a cost:

- GPUs per node <= 64 (``MAX_GPUS_PER_NODE``; the largest HGX/NVL chassis hold 8-72
  and the analysis pads every node to the widest), and a GPU index below it;
- nodes <= 100,000 and allocations <= 1,000,000 (``MAX_NODES``, ``MAX_ALLOCATIONS``);
  at the limits the state's arrays are 100,000 x 64 x 8 bytes = 51 MB;
- strings <= 1,024 characters (4,096 for free text: a source's error, a label value);
- JSON nested <= 32 levels, integers <= 20 digits, numbers finite.

Every failure is :class:`Invalid` with one line naming the JSON path, e.g.
``nodes[3].gpu_count: must be an integer from 0 to 64, got 1000000000``.

Each check also knows its JSON Schema (:func:`json_schema`), made from the same
numbers, for the OpenAPI document (:mod:`exporter.advisor.openapi`): a limit is
written once, here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from exporter import metrics
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    GpuHealth,
    GpuPerformance,
    GpuProcesses,
    Interruption,
    JobRequest,
    MigInstance,
    Node,
    OwnerUse,
    Placement,
    SourceStatus,
    TargetCount,
    UnattributedProcesses,
    UnmatchedGpus,
    XidCount,
    from_json,
)
from exporter.validate import (
    MAX_STRING,
    Check,
    Invalid,
    array,
    boolean,
    described,
    integer,
    json_schema,
    number,
    optional,
    record,
    show,
    string,
)

MAX_GPUS_PER_NODE = 64
MAX_NODES = 100_000
MAX_ALLOCATIONS = 1_000_000
MAX_PLACEMENTS = 1_000_000  # over all allocations: each one is a row the planner reads
MAX_PENDING = 1_000_000
MAX_TEXT = 4096
MAX_DEPTH = 32  # a snapshot is 5 levels deep, an Alertmanager body 4
MAX_INT_DIGITS = 20  # 2**64 has 20 digits; Python's own cap (4,300) raised a bare ValueError
MAX_TIME = 1e11  # unix seconds, the year 5138
MAX_CPUS = 1e6
MAX_BYTES = 2 ** 60
MAX_ALERTS = 100_000
MAX_LABELS = 1024


# -- safe JSON --------------------------------------------------------------------------

# Escapes first (so an escaped quote is not a quote), then only quotes and brackets are kept:
# two C-speed passes, and numpy reads what is left (1.0 s became 0.05 s for a 10 MB snapshot
# against one regex over every string).
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_CHUNK = 1 << 20  # a megabyte at a time: a few MB of int32, not 4x the body


def nesting_depth(body: bytes) -> int:
    """How deeply ``body``'s arrays and objects nest, brackets inside strings not counted.

    Checked before parsing: the parser recurses once per level and Python's stack
    ends near 1,000 (100k levels raised RecursionError, a 500).
    """
    skeleton = np.frombuffer(_ESCAPE.sub(b"", body).translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    depth = deepest = quoted = 0
    for start in range(0, len(skeleton), _CHUNK):
        chunk = skeleton[start:start + _CHUNK]
        quote = chunk == ord('"')
        inside = (np.cumsum(quote, dtype=np.int32) + quoted) & 1  # odd quotes so far: in a string
        # "[" 0x5B and "{" 0x7B have bit 0x02 set, "]" 0x5D and "}" 0x7D do not: +1 and -1
        steps = np.where(quote | (inside == 1), 0, (chunk & 2).astype(np.int32) - 1)
        levels = np.cumsum(steps, dtype=np.int32) + depth
        deepest = max(deepest, int(levels.max()))
        depth, quoted = int(levels[-1]), int(inside[-1])
        if deepest > MAX_DEPTH:
            break
    return deepest


def _parse_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise Invalid(f"body: an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Invalid(f"body: the number {text[:40]} is out of range")
    return value


def _parse_constant(name: str) -> Any:
    raise Invalid(f"body: {name} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice: json.loads keeps the last one silently,
    which the config file refuses (exporter/yamlfile.py), so a body would mean two things."""
    out = dict(pairs)
    if len(out) != len(pairs):  # the rare case: find which key, for the reason
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise Invalid(f"body: key {show(key)} given twice in one object; keep one")
            seen.add(key)
    return out


def parse_json(body: bytes) -> Any:
    """``body`` as UTF-8 JSON (RFC 8259), refusing deep nesting, huge integers, non-finite
    numbers and a key given twice in one object."""
    if nesting_depth(body) > MAX_DEPTH:
        raise Invalid(f"body: JSON nested deeper than {MAX_DEPTH} levels")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Invalid(f"body is not valid JSON: not UTF-8 at byte {exc.start}") from None
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant, object_pairs_hook=_object)
    except Invalid:
        raise
    except json.JSONDecodeError as exc:
        raise Invalid(f"body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # belt and braces: the checks above come first
        raise Invalid(f"body is not valid JSON: {type(exc).__name__}") from None


# -- checks: each takes the value and its path, and raises Invalid ------------------------
# They live in exporter.validate, the one validator (the config and the snapshot's JSON form
# use it too); imported here under the names this module and its callers have always used.

_show, _described = show, described


# -- the snapshot ---------------------------------------------------------------------------

_TIME = number(0, MAX_TIME)
_BYTES = optional(integer(0, MAX_BYTES))
_PRIORITY = integer(-(2 ** 63), 2 ** 63 - 1)
_GPU_INDEX = integer(0, MAX_GPUS_PER_NODE - 1)
_MODELS = array(string(), 1024)
_SHARE = number(0, 1, above=True)  # a share of 0 holds nothing, and placement.Task refuses it


def _bounded(bound: metrics.Bound) -> Check:
    """The check of a catalogue family's snapshot field (``FamilySpec.bound``)."""
    inner = (boolean if bound.type == "boolean"
             else integer(int(bound.low), int(bound.high)) if bound.type == "integer"
             else number(bound.low, bound.high))
    return optional(inner) if bound.optional else inner


def _family_fields() -> dict[str, dict[str, Check]]:
    """Per part of a Gpu ("" the Gpu itself, "health", "performance"), the check of each field a
    per-GPU family of the catalogue reads: a family and its snapshot field are bounded by their
    one record (exporter/metrics.py)."""
    fields: dict[str, dict[str, Check]] = {"": {}, "health": {}, "performance": {},
                                           "processes": {}}
    for spec in metrics.CATALOGUE.values():
        if spec.bound is not None:
            for path in spec.fields:
                part, _, name = path.rpartition(".")
                fields[part][name] = _bounded(spec.bound)
    return fields


def _snapshot_fields() -> dict[type, dict[str, Check]]:
    """The check of each field of each record of a snapshot, per record type."""
    family = _family_fields()
    interruption = {"cause": string(), "time": optional(_TIME), "count": integer(0, 2 ** 31)}
    fields: dict[type, dict[str, Check]] = {
        Interruption: interruption,
        Node: {
            "name": string(), "model": string(), "cpu_cores": number(0, MAX_CPUS), "pool": string(),
            "generation": string(), "gpu_count": integer(0, MAX_GPUS_PER_NODE),
            "drained": optional(boolean),
        },
        MigInstance: {
            "instance_id": integer(0, 2 ** 31), "profile": string(), "memory_total_bytes": _BYTES,
            "memory_used_bytes": _BYTES,
        },
        # identity and firmware here; the telemetry fields from the catalogue
        Gpu: {
            "node": string(), "index": _GPU_INDEX, "uuid": string(), "model": string(), "pool": string(),
            "pci_bus_id": optional(string()), "driver_version": optional(string()),
            "vbios_version": optional(string()), "serial": optional(string()), **family[""],
        },
        XidCount: {"xid": integer(0, 2 ** 31), "count": integer(0, 2 ** 63 - 1)},
        GpuHealth: family["health"],
        GpuPerformance: family["performance"],
        Placement: {
            "node": string(), "gpus": array(_GPU_INDEX, MAX_GPUS_PER_NODE),
            "gpu_share": _SHARE, "cpus": number(0, MAX_CPUS),
        },
        Allocation: {
            "job": string(), "namespace": string(), "pod": string(), "priority": _PRIORITY,
            "qos": string(), "user": string(), "account": string(), "start_time": optional(_TIME),
            "last_checkpoint_time": optional(_TIME), "gpu_memory_need_bytes": _BYTES,
            "allowed_models": _MODELS, "interrupted": optional(record(Interruption, interruption)),
        },
        JobRequest: {
            "job": string(), "gpu_count": integer(0, MAX_NODES * MAX_GPUS_PER_NODE),
            "gpu_share": _SHARE, "cpus": number(0, MAX_CPUS * MAX_NODES),
            "node_count": integer(0, MAX_NODES), "models": _MODELS, "pool": string(),
            "priority": _PRIORITY, "submit_time": optional(_TIME),
            "last_checkpoint_time": optional(_TIME),
            "interrupted": optional(record(Interruption, interruption)),
        },
        SourceStatus: {
            "source": string(), "up": boolean, "duration_seconds": number(0, 1e9),
            "last_success_time": optional(_TIME), "target": string(), "error": string(MAX_TEXT),
            "parse_errors": integer(0, 2 ** 63 - 1),
            "series_refused": array(record(TargetCount, {
                "target": string(), "count": integer(0, 2 ** 63 - 1)}), 10_000),
        },
        UnmatchedGpus: {"side": string(), "count": integer(0, 2 ** 63 - 1)},
    }
    fields[Gpu]["mig"] = array(record(MigInstance, fields[MigInstance]), 64)
    fields[GpuHealth]["xid_counts"] = array(record(XidCount, fields[XidCount]), 1024)
    fields[Gpu]["health"] = optional(record(GpuHealth, fields[GpuHealth]))
    fields[Gpu]["performance"] = optional(record(GpuPerformance, fields[GpuPerformance]))
    # per-owner use of a GPU (exporter.attribution): capped per GPU by the NVML source
    fields[OwnerUse] = {
        "kind": string(), "job": string(), "container": string(), "step": string(),
        "rank": string(), "processes": integer(0, 2 ** 31), "memory_used_bytes": _BYTES,
        "sm_utilization_ratio": optional(number(0, 1e3)),
    }
    fields[UnattributedProcesses] = {"reason": string(), "count": integer(0, 2 ** 31)}
    fields[GpuProcesses] = {
        "owners": array(record(OwnerUse, fields[OwnerUse]), 1024),
        "unattributed": array(record(UnattributedProcesses, fields[UnattributedProcesses]), 16),
        **family["processes"],
    }
    fields[Gpu]["processes"] = optional(record(GpuProcesses, fields[GpuProcesses]))
    fields[Allocation]["placements"] = array(record(Placement, fields[Placement]), MAX_NODES)
    fields[FleetSnapshot] = {
        "taken_at": _TIME,
        "nodes": array(record(Node, fields[Node]), MAX_NODES),
        "gpus": array(record(Gpu, fields[Gpu]), MAX_NODES * MAX_GPUS_PER_NODE),
        "allocations": array(record(Allocation, fields[Allocation]), MAX_ALLOCATIONS),
        "pending": array(record(JobRequest, fields[JobRequest]), MAX_PENDING),
        "sources": array(record(SourceStatus, fields[SourceStatus]), 10_000),
        "unmatched": array(record(UnmatchedGpus, fields[UnmatchedGpus]), 16),
    }
    return fields


# per record type, the check of each of its fields; read-only, as every check made from them
SNAPSHOT_FIELDS: Mapping[type, Mapping[str, Check]] = MappingProxyType(
    {cls: MappingProxyType(checks) for cls, checks in _snapshot_fields().items()})
_SNAPSHOT = record(FleetSnapshot, dict(SNAPSHOT_FIELDS[FleetSnapshot]))


def snapshot_schema() -> dict[str, Any]:
    """The JSON Schema of a ``POST /v1/plan`` body (and of what ``GET /v1/snapshot`` serves)."""
    return json_schema(_SNAPSHOT)


def check_snapshot(payload: Any) -> None:
    """Raise :class:`Invalid` unless ``payload`` is a snapshot within every limit."""
    _SNAPSHOT(payload, "")
    # What the fields alone cannot say. A GPU without a node record still makes a node
    # (analysis.state.from_snapshot), so the node limit counts those too.
    names: set[str] = set()
    for i, node in enumerate(payload.get("nodes", ())):
        if node["name"] in names:
            raise Invalid(f"nodes[{i}].name: duplicate node {_show(node['name'])}")
        names.add(node["name"])
    for i, gpu in enumerate(payload.get("gpus", ())):
        names.add(gpu["node"])
        if len(names) > MAX_NODES:
            raise Invalid(f"gpus[{i}].node: more than {MAX_NODES} nodes")
    placements = 0
    for i, alloc in enumerate(payload.get("allocations", ())):
        placements += len(alloc.get("placements", ()))
        if placements > MAX_PLACEMENTS:
            raise Invalid(f"allocations[{i}].placements: more than {MAX_PLACEMENTS} in all allocations")


def snapshot_from_body(body: bytes) -> FleetSnapshot:
    """The snapshot a ``POST /v1/plan`` body holds; :class:`Invalid` says why it is not one."""
    payload = parse_json(body)
    if not isinstance(payload, dict):
        raise Invalid("body must be a JSON object: a snapshot as served by GET /v1/snapshot")
    try:
        check_snapshot(payload)
    except Invalid as exc:
        raise Invalid(f"body is not a snapshot: {exc}") from None
    return from_json(payload)


# -- Alertmanager's webhook body (payload version 4) -----------------------------------------

_STATUS = ("firing", "resolved")


def _status(value: Any, path: str) -> None:
    if value not in _STATUS:
        raise Invalid(f'{path}: must be "firing" or "resolved", got {_show(value)}')


_described(_status, lambda: {"enum": list(_STATUS)})


def _labels(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise Invalid(f"{path}: must be an object of strings, got {_show(value)}")
    if len(value) > MAX_LABELS:
        raise Invalid(f"{path}: {len(value)} labels (at most {MAX_LABELS})")
    for name, text in value.items():
        _LABEL_NAME(name, f"{path} name")
        _LABEL_VALUE(text, f"{path}.{name[:40]}")


_LABEL_NAME, _LABEL_VALUE = string(MAX_STRING), string(MAX_TEXT)
_described(_labels, lambda: {"type": "object", "maxProperties": MAX_LABELS,
                             "propertyNames": json_schema(_LABEL_NAME),
                             "additionalProperties": json_schema(_LABEL_VALUE)})


# Alertmanager adds fields over time, so unknown ones pass; the known ones are checked.
_ALERT: Mapping[str, Check] = MappingProxyType({
    "status": _status, "labels": _labels, "annotations": _labels, "startsAt": string(),
    "endsAt": string(), "generatorURL": string(MAX_TEXT), "fingerprint": string(),
})
_ALERTMANAGER: Mapping[str, Check] = MappingProxyType({
    "receiver": string(), "status": _status, "groupKey": string(MAX_TEXT),
    "truncatedAlerts": integer(0, 2 ** 63 - 1), "externalURL": string(MAX_TEXT),
    "groupLabels": _labels, "commonLabels": _labels, "commonAnnotations": _labels,
})


def _alert(value: Any, path: str) -> None:
    if not isinstance(value, dict) or "labels" not in value or "status" not in value:
        raise Invalid(f"{path}: must be an object with labels and status")
    for name, rule in _ALERT.items():
        if name in value:
            rule(value[name], f"{path}.{name}")


_described(_alert, lambda: {"type": "object", "required": ["labels", "status"],
                            "properties": {k: json_schema(v) for k, v in _ALERT.items()}})
_ALERTS = array(_alert, MAX_ALERTS)
_REQUIRED = ("groupKey", "status", "alerts")


def check_alertmanager(payload: Any) -> None:
    """Raise :class:`Invalid` unless ``payload`` is an Alertmanager webhook body (version 4)."""
    if not isinstance(payload, dict):
        raise Invalid("body must be a JSON object")
    if payload.get("version") != "4":
        raise Invalid(f'version: unsupported payload version {_show(payload.get("version"))} '
                      '(expected "4")')
    for name in _REQUIRED:
        if name not in payload:
            raise Invalid(f"{name}: required")
    if not payload["groupKey"]:
        raise Invalid("groupKey: must be a non-empty string")
    for name, rule in _ALERTMANAGER.items():
        if name in payload:
            rule(payload[name], name)
    _ALERTS(payload["alerts"], "alerts")


def alertmanager_schema() -> dict[str, Any]:
    """The JSON Schema of a ``POST /v1/alerts`` body; unknown fields pass, as in the check."""
    properties = {name: json_schema(rule) for name, rule in _ALERTMANAGER.items()}
    properties["groupKey"]["minLength"] = 1
    return {"type": "object", "title": "AlertmanagerWebhook", "required": ["version", *_REQUIRED],
            "properties": {"version": {"const": "4"}, **properties, "alerts": json_schema(_ALERTS)}}


def alertmanager_from_body(body: bytes) -> dict[str, Any]:
    payload = parse_json(body)
    check_alertmanager(payload)
    return payload


__all__ = [  # the checks are exporter.validate's, importable from here as before
    "MAX_ALERTS", "MAX_ALLOCATIONS", "MAX_BYTES", "MAX_CPUS", "MAX_DEPTH", "MAX_GPUS_PER_NODE",
    "MAX_INT_DIGITS", "MAX_LABELS", "MAX_NODES", "MAX_PENDING", "MAX_PLACEMENTS", "MAX_STRING",
    "MAX_TEXT", "MAX_TIME", "SNAPSHOT_FIELDS", "Check", "Invalid", "alertmanager_from_body",
    "alertmanager_schema", "array", "boolean", "check_alertmanager", "check_snapshot", "integer",
    "json_schema", "nesting_depth", "number", "optional", "parse_json", "record", "snapshot_from_body",
    "snapshot_schema", "string",
]
