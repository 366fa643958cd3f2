"""The OpenAPI document of /v1/*: valid OpenAPI 3.1, one operation per registered route,
the limits of bounds.py, the plan schema of docs/, and the handlers' real answers."""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from schemathesis.specs.openapi.definitions import OPENAPI_31

from exporter import validate
from exporter.advisor import bounds, openapi
from exporter.advisor.api import ADVISOR_API, AdvisorApi, add_routes
from tests.helpers.data import REPO
from tests.helpers.servers import start_exporter, stop
from tests.test_advisor_api import TOKEN, alertmanager_payload, auth
from tests.test_advisor_api import advisor_client as advisor_client  # the fixture, reused
from tests.test_webconfig import HASH
from tests.test_webconfig import _app as _webconfig_app

DOC = openapi.document()


def test_the_document_is_valid_openapi_31():
    # the OpenAPI Initiative's 3.1 schema, as schemathesis ships it; it leaves the inner
    # schemas to their dialect, so each is checked as JSON Schema 2020-12 too
    assert sorted(e.message for e in Draft202012Validator(OPENAPI_31).iter_errors(DOC)) == []
    schemas = [*DOC["components"]["schemas"].values(), *_inline_schemas(DOC["paths"]),
               *_inline_schemas(DOC["webhooks"])]
    for schema in schemas:
        Draft202012Validator.check_schema(schema)  # raises SchemaError naming the keyword
    # the components, then every schema written in place (paths, then the two webhooks)
    assert len(schemas) == 13 + 47 + 8 + 2 * 5  # 8 written in place for /v1/admission
    assert DOC["openapi"] == "3.1.0"


def _inline_schemas(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [schema for key, item in value.items()
                for schema in ([item] if key == "schema" else _inline_schemas(item))]
    return [schema for item in value for schema in _inline_schemas(item)] if isinstance(value, list) else []


def _refs(value: Any) -> set[str]:
    if isinstance(value, dict):
        return {value["$ref"]} if "$ref" in value else set().union(*map(_refs, value.values()), set())
    if isinstance(value, list):
        return set().union(*map(_refs, value), set())
    return set()


def test_every_reference_resolves_and_every_schema_is_used():
    names = {f"#/components/schemas/{name}" for name in DOC["components"]["schemas"]}
    assert _refs(DOC) == names


def test_every_v1_route_is_documented_and_nothing_else(advisor_client):
    routes = {(route.method.lower(), route.resource.canonical)
              for route in advisor_client.app.router.routes()
              if route.resource is not None and route.resource.canonical.startswith("/v1/")
              and route.method != "HEAD"}  # add_get adds HEAD; aiohttp answers it, undocumented
    documented = {(method, path) for path, item in DOC["paths"].items() for method in item}
    assert routes == documented
    assert documented == {("get", "/v1/openapi.json"), ("get", "/v1/snapshot"), ("get", "/v1/advice"),
                          ("post", "/v1/plan"), ("post", "/v1/alerts"), ("post", "/v1/admission")}


def test_only_the_posts_require_the_token():
    security = {(path, method): op["security"] for path, item in DOC["paths"].items()
                for method, op in item.items()}
    assert security == {
        ("/v1/openapi.json", "get"): [],
        ("/v1/snapshot", "get"): [{}, {"bearer": []}],
        ("/v1/advice", "get"): [{}, {"bearer": []}],
        ("/v1/plan", "post"): [{"bearer": []}],
        ("/v1/alerts", "post"): [{"bearer": []}],
        ("/v1/admission", "post"): [],  # the apiserver presents no token; it only ever admits
    }
    assert DOC["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_the_limits_are_bounds_own():
    snapshot = DOC["components"]["schemas"]["Snapshot"]["properties"]
    node = snapshot["nodes"]["items"]["properties"]
    assert node["gpu_count"] == {"type": "integer", "minimum": 0, "maximum": bounds.MAX_GPUS_PER_NODE}
    assert snapshot["nodes"]["maxItems"] == bounds.MAX_NODES == 100_000
    assert snapshot["allocations"]["maxItems"] == bounds.MAX_ALLOCATIONS == 1_000_000
    assert node["name"] == {"type": "string", "maxLength": bounds.MAX_STRING}
    assert snapshot["taken_at"] == {"type": "number", "minimum": 0, "maximum": bounds.MAX_TIME}
    placement = snapshot["allocations"]["items"]["properties"]["placements"]["items"]["properties"]
    assert placement["gpu_share"] == {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    assert placement["gpus"]["items"]["maximum"] == bounds.MAX_GPUS_PER_NODE - 1
    alerts = DOC["components"]["schemas"]["AlertmanagerWebhook"]
    assert alerts["properties"]["alerts"]["maxItems"] == bounds.MAX_ALERTS
    assert alerts["required"] == ["version", "groupKey", "status", "alerts"]
    assert alerts["properties"]["version"] == {"const": "4"}


def test_docs_plan_schema_is_the_served_one():
    """docs/advisor-plan.schema.json is generated from openapi.plan_schema(); on a difference:
    .venv/bin/python -m exporter.advisor.openapi --plan-schema > docs/advisor-plan.schema.json"""
    assert json.loads((REPO / "docs" / "advisor-plan.schema.json").read_text()) == openapi.plan_schema()
    served = DOC["components"]["schemas"]
    assert served["Plan"]["required"] == openapi.plan_schema()["required"]
    assert served["PlanMigration"]["properties"]["from"] == {"$ref": "#/components/schemas/PlanEndpoint"}


@pytest.mark.parametrize(("body", "accepted"), [
    ({"taken_at": 0}, True),
    ({"taken_at": 0, "nodes": [{"name": "n", "model": "H100", "cpu_cores": 1, "pool": "p",
                                "generation": "hopper", "gpu_count": 65}]}, False),
    ({"taken_at": 0, "nodes": [1]}, False),
    ({"taken_at": -1}, False),
    ({"taken_at": 0, "extra": 1}, False),
    ({}, False),
    ({"taken_at": 0, "gpus": [{"node": "n", "index": 64, "uuid": "u", "model": "m", "pool": "p"}]}, False),
    ({"taken_at": 0, "gpus": [{"node": "n", "index": 63, "uuid": "u", "model": "m", "pool": "p",
                               "utilization_ratio": None, "mig": []}]}, True),
])
def test_the_schema_and_the_check_agree(body, accepted):
    schema = Draft202012Validator(DOC["components"]["schemas"]["Snapshot"]).is_valid(body)
    try:
        bounds.check_snapshot(body)
        checked = True
    except bounds.Invalid:
        checked = False
    assert (schema, checked) == (accepted, accepted)


def _validate(doc: dict[str, Any], path: str, method: str, status: int, content_type: str,
              body: bytes) -> None:
    """``body`` answers ``method path`` with ``status`` as the document says."""
    responses = doc["paths"][path][method]["responses"]
    assert str(status) in responses, f"{method} {path}: {status} is not documented"
    content = responses[str(status)]["content"]
    assert content_type in content, f"{method} {path} {status}: {content_type} is not documented"
    if content_type == "application/json":
        # the referenced schemas resolve against the root: hand the validator the components too
        schema = {**content[content_type]["schema"], "components": doc["components"]}
        errors = [f"{list(e.absolute_path)}: {e.message[:200]}"
                  for e in Draft202012Validator(schema).iter_errors(json.loads(body))]
        assert errors == []


async def _check(client, method: str, path: str, expect: int, **kwargs) -> bytes:
    resp = await client.request(method, path, **kwargs)
    body = await resp.read()
    assert resp.status == expect, body[:300]
    _validate(DOC, path, method.lower(), resp.status, resp.content_type, body)
    return body


async def test_the_served_document_is_public_and_the_same(advisor_client):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        body = await _check(advisor_client, "GET", "/v1/openapi.json", 200, headers=headers)
        assert json.loads(body) == DOC


async def test_real_answers_of_every_handler_validate(advisor_client):
    snapshot = json.loads(await _check(advisor_client, "GET", "/v1/snapshot", 200))
    assert len(snapshot["gpus"]) == 1088  # the simulated fleet, in full
    advice = json.loads(await _check(advisor_client, "GET", "/v1/advice", 200))
    assert advice["decision"] == "compact"
    # serve's advisor stage steers: every GPU node of the fleet once, in the level of its weight
    steering = advice["steering"]
    assert steering["snapshot_time"] == advice["snapshot_time"]
    assert steering["gpu_hours_waiting_saved"] is None
    steered = [n for level in steering["levels"] for n in level["nodes"]]
    assert sorted(steered) == sorted(n["name"] for n in snapshot["nodes"] if n["gpu_count"] > 0)
    weights = [level["weight"] for level in steering["levels"]]
    assert weights[0] == 1 and weights == sorted(set(weights))
    what_if = json.loads(await _check(advisor_client, "POST", "/v1/plan", 200, json=snapshot,
                                      headers=auth()))
    assert what_if["what_if"] is True
    await _check(advisor_client, "POST", "/v1/plan", 400, json={"taken_at": "yesterday"}, headers=auth())
    await _check(advisor_client, "POST", "/v1/plan", 401, json=snapshot)
    await _check(advisor_client, "POST", "/v1/alerts", 401, json=alertmanager_payload(),
                 headers=auth(TOKEN + "x"))
    await _check(advisor_client, "POST", "/v1/alerts", 400, json={"version": "4"}, headers=auth())
    await _check(advisor_client, "POST", "/v1/alerts", 202, json=alertmanager_payload(), headers=auth())
    reply = await _check(advisor_client, "POST", "/v1/alerts", 200, json=alertmanager_payload(),
                         headers=auth())
    assert json.loads(reply) == {"accepted": True, "duplicate": True, "evaluation": "none"}
    await _check(advisor_client, "POST", "/v1/alerts", 200, json=alertmanager_payload("resolved"),
                 headers=auth())
    api = advisor_client.app[ADVISOR_API]
    api.max_body_bytes = 1024
    for path in ("/v1/plan", "/v1/alerts"):
        await _check(advisor_client, "POST", path, 413, data=b" " * 1025, headers=auth())
    api.what_if_busy = True  # another what-if holds the slot
    await _check(advisor_client, "POST", "/v1/plan", 503, data=b"{}", headers=auth())
    # the admission webhook, from the frame the cycle analysed: a GPU pod on the simulated
    # fleet gets a preferred affinity naming fleet nodes; a pod without GPUs none; no token
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "operation": "CREATE", "object": pod}}
    answer = json.loads(await _check(advisor_client, "POST", "/v1/admission", 200, json=review))
    assert answer["response"]["uid"] == "u-1" and answer["response"]["allowed"] is True
    (op,) = json.loads(base64.b64decode(answer["response"]["patch"]))
    term = op["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    names = {n["name"] for n in snapshot["nodes"]}
    assert 0 < len(term["preference"]["matchFields"][0]["values"]) <= 16
    assert set(term["preference"]["matchFields"][0]["values"]) <= names
    pod["spec"]["containers"][0]["resources"] = {}
    answer = json.loads(await _check(advisor_client, "POST", "/v1/admission", 200, json=review))
    assert answer["response"] == {"uid": "u-1", "allowed": True}
    await _check(advisor_client, "POST", "/v1/admission", 400, json={"kind": "AdmissionReview"})
    await _check(advisor_client, "POST", "/v1/admission", 413, data=b" " * (1024 * 1024 + 1))


def test_checking_bodies_leaves_no_schema_behind():
    # each check registers its schema when made; one made per call once grew the table per label
    body = json.dumps(alertmanager_payload()).encode()
    bounds.alertmanager_from_body(body)
    before = len(validate.SCHEMAS)
    for _ in range(100):
        bounds.alertmanager_from_body(body)
    assert len(validate.SCHEMAS) == before


async def test_the_web_configs_answers_are_documented(aiohttp_client, tmp_path):
    # a web config with basic auth and a rate limit of one request a minute: what answers
    # before any handler is plain text, and documented on every operation
    app = _webconfig_app(tmp_path, f"basic_auth_users:\n  alice: {HASH}\n"
                                   "rate_limit:\n  interval: 1m\n  burst: 1\n")
    add_routes(app, AdvisorApi(evaluate=None, what_if=None, current=lambda: None,  # type: ignore[arg-type]
                               token=TOKEN.encode(), max_body_bytes=1024))
    client = await aiohttp_client(app)
    await _check(client, "GET", "/v1/openapi.json", 401)
    await _check(client, "GET", "/v1/advice", 429)
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            assert {"403", "429"} <= set(operation["responses"]), (method, path)


def test_every_operation_with_a_body_documents_the_body_deadline():
    # web.body_timeout's 408 (exporter/web/connection_gate.py) answers before any handler
    with_body = {(method, path) for path, item in DOC["paths"].items()
                 for method, operation in item.items() if "requestBody" in operation}
    assert with_body == {("post", "/v1/plan"), ("post", "/v1/alerts"), ("post", "/v1/admission")}
    for method, path in with_body:
        assert set(DOC["paths"][path][method]["responses"]["408"]["content"]) == {"text/plain"}


@pytest.mark.slow
def test_without_the_advisor_the_document_is_served_and_names_only_what_is(tmp_path):
    served = start_exporter(tmp_path, config="advisor: {enabled: false}\n", fleet="small")
    try:
        with urllib.request.urlopen(f"{served.url}/v1/openapi.json", timeout=10) as resp:
            doc = json.loads(resp.read())
        with urllib.request.urlopen(f"{served.url}/v1/snapshot", timeout=10) as resp:
            assert resp.status == 200
    finally:
        stop(served.proc)
    assert doc == openapi.document(advisor=False)
    assert set(doc["paths"]) == {"/v1/openapi.json", "/v1/snapshot"}
