"""The advisor's input limits: safe JSON, the snapshot and Alertmanager schemas.

A snapshot as GET /v1/snapshot serves it passes: tests/test_advisor_api.py posts one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.advisor import bounds
from exporter.advisor.bounds import Invalid, check_alertmanager, check_snapshot, nesting_depth, parse_json
from exporter.snapshot import Node
from tests.test_advisor_api import alertmanager_payload, node


def snapshot(**fields):
    return {"taken_at": 1_760_000_000, "nodes": [node()], **fields}


def reason(check, payload) -> str:
    with pytest.raises(Invalid) as info:
        check(payload)
    text = str(info.value)
    assert "\n" not in text and len(text) < 300
    return text


@pytest.mark.parametrize(("body", "depth"), [
    (b"", 0), (b"1", 0), (b"{}", 1), (b'[[1], {"a": [2]}]', 3),
    (b'["[[[[", "{{"]', 1),  # brackets in strings do not count
    (b'["\\"[[[", 1]', 1),  # nor after an escaped quote
    (b'["\\\\", [[1]]]', 3),  # an escaped backslash ends its string's escape
    (b'["\\u005B"]', 1),
])
def test_nesting_depth(body, depth):
    assert nesting_depth(body) == depth


def test_nesting_depth_is_exact_across_chunks():
    inner = b"[" * 40 + b"]" * 40
    body = b'["' + b"x" * (2 << 20) + b'", ' + inner + b"]"
    assert nesting_depth(body) == 41


@pytest.mark.parametrize(("body", "expected"), [
    (b"[" * (bounds.MAX_DEPTH + 1) + b"]" * (bounds.MAX_DEPTH + 1), "nested deeper than 32"),
    (b"1" * 21, "integer of 21 digits"),
    (b"-" + b"1" * 21, "integer of 21 digits"),
    (b"[NaN]", "NaN is not a JSON number"),
    (b"[-Infinity]", "-Infinity is not a JSON number"),
    (b"[1e400]", "1e400 is out of range"),
    (b'{"a": 1', "not valid JSON"),
    (b'"\xff"', "not UTF-8 at byte 1"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),  # a byte-order mark is not JSON text
])
def test_parse_json_refuses(body, expected):
    assert expected in reason(parse_json, body)


def test_parse_json_accepts_the_limits():
    assert parse_json(b"[" * 32 + b"]" * 32) is not None
    assert parse_json(b"[-99999999999999999999, 1.5e300]") == [-99999999999999999999, 1.5e300]


def test_the_schema_names_every_snapshot_field():
    """A field added to the snapshot without a rule here would be refused as unknown."""
    for cls, rules in bounds.SNAPSHOT_FIELDS.items():
        assert set(rules) == {f.name for f in dataclasses.fields(cls)}, cls.__name__


@pytest.mark.parametrize(("payload", "expected"), [
    (snapshot(nodes=[node()] * (bounds.MAX_NODES + 1)), "nodes: 100001 items (at most 100000)"),
    (snapshot(allocations=[{"job": "j", "placements": []}] * (bounds.MAX_ALLOCATIONS + 1)),
     "allocations: 1000001 items (at most 1000000)"),
    (snapshot(allocations=[{"job": "j", "placements": [
        {"node": "gpu-001", "gpus": [0], "gpu_share": 1, "cpus": 1}] * 1001}] * 1000),
     "allocations[999].placements: more than 1000000"),
    (snapshot(gpus=[{"node": f"n{i}", "index": 0, "uuid": "u", "model": "m", "pool": "p"}
                    for i in range(bounds.MAX_NODES)]),
     "gpus[99999].node: more than 100000 nodes"),
    (snapshot(nodes=[node(gpu_count=True)]), "nodes[0].gpu_count: must be an integer"),
    (snapshot(nodes=[node(cpu_cores=-1)]), "nodes[0].cpu_cores: must be a number from 0"),
    (snapshot(taken_at=-5), "taken_at: must be a number from 0"),
    (snapshot(gpus=[{"node": "gpu-001", "index": 0, "uuid": "u", "model": "m", "pool": "p",
                     "up": 1}]), "gpus[0].up: must be true or false"),
    (snapshot(gpus=[{"node": "gpu-001", "index": 0, "uuid": "u", "model": "m", "pool": "p",
                     "mig": [{"instance_id": 1, "profile": "1g", "memory_total_bytes": -1}]}]),
     "gpus[0].mig[0].memory_total_bytes"),
    (snapshot(allocations=[{"job": "j", "placements": [
        {"node": "gpu-001", "gpus": list(range(65)), "gpu_share": 1, "cpus": 1}]}]),
     "allocations[0].placements[0].gpus: 65 items (at most 64)"),
    (snapshot(pending=[{"job": "j", "gpu_count": 8, "node_count": -1}]), "pending[0].node_count"),
    (snapshot(allocations=[{"job": "j", "placements": [
        {"node": "gpu-001", "gpus": [0], "gpu_share": 0, "cpus": 1}]}]),
     "allocations[0].placements[0].gpu_share: must be a number above 0 and at most 1, got 0"),
    (snapshot(allocations=[{"placements": []}]), "allocations[0].job: required"),
    (snapshot(nodes=[node(name="x" * 2000)]), "nodes[0].name: a string of 2000 characters"),
    ([], "body: must be an object"),
])
def test_snapshot_limits(payload, expected):
    assert expected in reason(check_snapshot, payload)


def test_a_value_is_quoted_short():
    text = reason(check_snapshot, snapshot(nodes=[node(gpu_count="x" * 100_000)]))
    assert text.endswith('got "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...')


@pytest.mark.parametrize(("change", "expected"), [
    (lambda p: p["alerts"][0]["labels"].update(alertname=7), "alerts[0].labels.alertname: must be a string"),
    (lambda p: p["alerts"][0]["labels"].update(x="v" * 5000), "alerts[0].labels.x: a string of 5000"),
    (lambda p: p["alerts"][0].update(annotations=[]), "alerts[0].annotations: must be an object"),
    (lambda p: p.update(alerts=[p["alerts"][0]] * (bounds.MAX_ALERTS + 1)), "alerts: 100001 items"),
    (lambda p: p.update(groupKey=""), "groupKey: must be a non-empty string"),
    (lambda p: p.update(groupKey=["g"]), "groupKey: must be a string"),
    (lambda p: p.update(truncatedAlerts=-1), "truncatedAlerts: must be an integer"),
    (lambda p: p.pop("alerts"), "alerts: required"),
    (lambda p: p["commonLabels"].update(n=None), "commonLabels.n: must be a string"),
])
def test_alertmanager_limits(change, expected):
    payload = alertmanager_payload()
    change(payload)
    assert expected in reason(check_alertmanager, payload)


def test_alertmanager_fields_it_does_not_know_pass():
    payload = alertmanager_payload()
    payload["newField"] = {"from": ["a", "later", "Alertmanager"]}
    check_alertmanager(payload)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
NODE_FIELDS = sorted(f.name for f in dataclasses.fields(Node))


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(NODE_FIELDS), JSON), st.binary(max_size=40))
def test_any_body_is_a_snapshot_or_invalid_never_an_error(fields, noise):
    """Whatever the body, the parser and the schema answer Invalid or a snapshot: never another
    exception (a 500), and what passes builds (from_json cannot fail after the check)."""
    payloads = [json.dumps({"taken_at": 1, "nodes": [{**node(), **fields}]}).encode(),
                json.dumps(fields).encode(), noise, b'{"taken_at": 1, "nodes": [' + noise + b"]}"]
    for body in payloads:
        with contextlib.suppress(Invalid):
            bounds.snapshot_from_body(body)
