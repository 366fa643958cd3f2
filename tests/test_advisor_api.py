"""The advisor's HTTP API: auth, limits, schema errors, Alertmanager dedupe, what-if."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import threading
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.advisor.advice import WhatIf
from exporter.advisor.advise import advise
from exporter.advisor.api import validate_alertmanager
from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction
from exporter.advisor.service import AdvisorService, install, load_receivers, load_token
from exporter.advisor.store import Store
from exporter.advisor.wire import what_if_json
from exporter.analysis.analyzer import LiveAnalyzer
from exporter.collect import Collector
from exporter.config import AdvisorConfig, AnalysisConfig, Config, ConfigError, ReceiverConfig
from exporter.cycle.serving import ServingCycle, advisor_stage
from exporter.cycle.stages import AnalysisStage, HealthStage, LoadStage
from exporter.health.monitor import HealthMonitor
from exporter.pool_load.tracker import LoadTracker
from exporter.snapshot import to_json
from exporter.sources.sim.options import SimSource
from exporter.sources.sim.source import build as sim_source
from exporter.web.server import ServingState, make_app

START = 1_760_000_000.0
TOKEN = "t0ken-for-tests"
NO_WHAT_IF = WhatIf(START, START, {}, "none", ("stub",))  # a stub what-if's answer


def alertmanager_payload(status="firing", group="{}:{alertname=\"GpuClusterFragmentationHigh\"}"):
    """The shape of Alertmanager 0.25's webhook body (payload version 4)."""
    return {
        "receiver": "gpufleet-advisor", "status": status, "version": "4", "groupKey": group,
        "truncatedAlerts": 0, "externalURL": "http://alertmanager:9093",
        "groupLabels": {"alertname": "GpuClusterFragmentationHigh"},
        "commonLabels": {"alertname": "GpuClusterFragmentationHigh", "action": "compact"},
        "commonAnnotations": {},
        "alerts": [{"status": status, "labels": {"alertname": "GpuClusterFragmentationHigh",
                                                 "action": "compact", "severity": "warning"},
                    "annotations": {"summary": "fragmented"}, "startsAt": "2026-11-29T10:00:00Z",
                    "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prom/graph",
                    "fingerprint": "abc"}],
    }


def stub_planner(calls):
    def planner(snapshot, report, scope, now):
        calls.append(scope)
        moves = (Migration("job-1", "ns", "pod-1", Endpoint("gpu-033", (2,)), Endpoint("gpu-034", (5,)),
                           "checkpoint_then_migrate", None, 120.0),)
        return CompactionPlan(scope, snapshot.taken_at, now + 900, "compact", ("stub",),
                              Prediction(60, 10), Prediction(40, 8), {"gpu-h100": 1}, moves)
    return planner


@pytest.fixture
async def advisor_client(aiohttp_client, tmp_path):
    calls: list[str] = []
    sim = sim_source(SimSource(seed=1), lambda: START)
    config = Config(collect_interval=60)
    state = ServingState()
    analyzer = LiveAnalyzer.from_config(AnalysisConfig())
    settings = DecisionSettings(trigger=0.0, clear_below=-1.0, dwell_seconds=0, cooldown_seconds=0)
    from exporter.advisor.webhook import Deliverer

    monitor = HealthMonitor()  # issue 31: /v1/advice's health, checked too
    service = AdvisorService(Advisor(settings, clock=lambda: START), analyzer,
                             Deliverer(Store(tmp_path / "o.sqlite"), ()), TOKEN.encode(),
                             max_body_bytes=64 * 1024 * 1024, planner=stub_planner(calls),
                             health=monitor)
    # serve's stages (exporter/cli/serve.py): the pools' scaling hints and the health ride along
    load = LoadTracker.from_table(AnalysisConfig().window_snapshots)
    stage = advisor_stage(service, load)
    state.cycle = ServingCycle([AnalysisStage(analyzer), LoadStage(load), HealthStage(monitor), stage],
                               advisor=service)
    app = make_app(config, Collector([sim], 10, clock=lambda: START), state)
    install(app, service)
    client = await aiohttp_client(app)
    await asyncio.wait_for(state.ready.wait(), 30)  # collected, evaluated and rendered
    client.calls = calls
    client.service = service
    client.stage = stage
    return client


def auth(token=TOKEN):
    return {"Authorization": f"Bearer {token}"}


async def test_advice_is_served(advisor_client):
    resp = await advisor_client.get("/v1/advice")
    advice = await resp.json()
    assert resp.status == 200
    assert advice["decision"] == "compact"
    assert advice["plan"]["plan_id"].startswith("plan-")
    assert advice["plan"]["migrations"][0]["to"] == {"node": "gpu-034", "gpus": [5]}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}])
async def test_posts_need_the_bearer_token(advisor_client, headers):
    for path in ("/v1/alerts", "/v1/plan"):
        resp = await advisor_client.post(path, json=alertmanager_payload(), headers=headers)
        assert resp.status == 401
        assert "token" in (await resp.json())["error"]
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "not valid JSON"),
    (b"[]", "body must be a JSON object"),
    (json.dumps({**alertmanager_payload(), "version": "3"}).encode(), "unsupported payload version"),
    (json.dumps({**alertmanager_payload(), "status": "maybe"}).encode(), "status: must be"),
    (json.dumps({**alertmanager_payload(), "alerts": [{"labels": []}]}).encode(), "alerts[0]"),
    (b"\xff\xfe", "not valid JSON"),
])
async def test_bad_alert_payloads_get_400_with_a_reason(advisor_client, body, reason):
    resp = await advisor_client.post("/v1/alerts", data=body, headers=auth())
    assert resp.status == 400
    assert reason in (await resp.json())["error"]


async def test_oversized_bodies_get_413(advisor_client):
    huge = b"x" * (64 * 1024 * 1024 + 1)
    resp = await advisor_client.post("/v1/plan", data=huge, headers=auth())
    assert resp.status == 413

    async def chunks():  # no Content-Length: the limit still holds while reading
        for _ in range(65):
            yield b"y" * (1024 * 1024)

    resp = await advisor_client.post("/v1/alerts", data=chunks(), headers=auth())
    assert resp.status == 413
    assert (await advisor_client.get("/-/healthy")).status == 200  # and the server lives on


async def test_alertmanager_firing_triggers_one_evaluation_and_dedupes(advisor_client):
    service = advisor_client.service
    before = service.evaluations
    first = await advisor_client.post("/v1/alerts", json=alertmanager_payload(), headers=auth())
    assert first.status == 202 and (await first.json())["evaluation"] == "scheduled"
    for _ in range(100):
        if service.evaluations > before:
            break
        await asyncio.sleep(0.02)
    assert service.evaluations == before + 1
    assert service.advisor.advice.trigger == "alertmanager: GpuClusterFragmentationHigh firing"
    again = await advisor_client.post("/v1/alerts", json=alertmanager_payload(), headers=auth())
    assert (await again.json()) == {"accepted": True, "duplicate": True, "evaluation": "none"}
    resolved = await advisor_client.post("/v1/alerts", json=alertmanager_payload("resolved"),
                                         headers=auth())
    assert (await resolved.json())["evaluation"] == "none"
    await asyncio.sleep(0.1)
    assert service.evaluations == before + 1  # duplicate and resolved did not evaluate


async def test_every_accepted_notification_is_logged_with_its_group_key(advisor_client, caplog):
    caplog.set_level(logging.INFO, logger="exporter.advisor.api")
    group = '{}:{alertname="GpuClusterFragmentationHigh", pool="gpu-h100"}'
    resp = await advisor_client.post("/v1/alerts", json=alertmanager_payload(group=group),
                                     headers=auth())
    assert resp.status == 202
    (record,) = [r for r in caplog.records if r.getMessage() == "alertmanager notification accepted"]
    assert record.levelno == logging.INFO
    assert (record.group, record.status, record.alerts) == (group, "firing", 1)


async def test_what_if_has_no_side_effects(advisor_client):
    service = advisor_client.service
    live_advice = service.advisor.advice
    snapshot = advisor_client.stage.last.snapshot
    evaluations = service.evaluations
    resp = await advisor_client.post("/v1/plan", json=to_json(snapshot), headers=auth())
    body = await resp.json()
    assert resp.status == 200 and body["what_if"] is True
    assert body["decision"] == "compact" and body["plan"]["plan_id"].startswith("plan-")
    assert service.advisor.advice is live_advice and service.evaluations == evaluations
    bad = await advisor_client.post("/v1/plan", json={"gpus": [{"nope": 1}]}, headers=auth())
    assert bad.status == 400 and "not a snapshot" in (await bad.json())["error"]


async def test_advisor_metrics_are_exported(advisor_client):
    text = (await (await advisor_client.get("/metrics")).read()).decode()
    assert 'gpufleet_advisor_compaction_recommended{scope="cluster"} 1.0' in text
    assert "gpufleet_advisor_plan_migrations 1.0" in text
    assert 'gpufleet_advisor_plan_nodes_freed{pool="gpu-h100"} 1.0' in text
    assert "gpufleet_advisor_outbox_pending 0.0" in text


def test_validate_accepts_the_real_shape():
    assert validate_alertmanager(alertmanager_payload()) is None
    assert validate_alertmanager(alertmanager_payload("resolved")) is None


def test_token_and_secrets_come_from_env_or_files(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    config = AdvisorConfig(token_file=str(token_file))
    assert load_token(config, {})() == b"from-file"  # a TokenFile: read again on change
    assert load_token(config, {"GPUFLEET_ADVISOR_TOKEN": "from-env"}) == b"from-env"
    assert load_token(AdvisorConfig(), {}) is None
    with pytest.raises(ConfigError, match="token_file"):
        load_token(AdvisorConfig(token_file=str(tmp_path / "missing")), {})
    receivers = (ReceiverConfig("slurm", "http://x/hook", secret_env="HOOK_SECRET"),)
    assert load_receivers(AdvisorConfig(receivers=receivers), {"HOOK_SECRET": "k"})[0].secret == b"k"
    with pytest.raises(ConfigError, match=r"no HMAC secret: set HOOK_SECRET"):
        load_receivers(AdvisorConfig(receivers=receivers), {})


async def test_shutdown_lets_a_scheduled_evaluation_queue_its_plan_before_the_outbox_closes(
        tmp_path):
    """/v1/alerts schedules an evaluation. The server stops while it is still running:
    the stop waits for it, and its plan lands in the outbox, not in a closed one."""
    from aiohttp.test_utils import TestClient, TestServer

    from exporter.advisor.webhook import Deliverer, Receiver
    from tests.helpers import free_port

    calls: list[str] = []
    stub = stub_planner(calls)
    planning = threading.Event()

    def planner(snapshot, report, scope, now):
        plan = stub(snapshot, report, scope, now)
        if len(calls) == 1:  # the first collection's evaluation
            return plan
        planning.set()
        time.sleep(0.5)  # the alert's evaluation is still running when the server stops
        moved = dataclasses.replace(plan.migrations[0], job="job-from-alert")
        return dataclasses.replace(plan, migrations=(moved,))

    path = tmp_path / "outbox.sqlite"
    receiver = Receiver("sched", f"http://127.0.0.1:{free_port()}/plan", b"k", timeout=1)
    settings = DecisionSettings(trigger=0.0, clear_below=-1.0, dwell_seconds=0, cooldown_seconds=0)
    analyzer = LiveAnalyzer.from_config(AnalysisConfig())
    service = AdvisorService(Advisor(settings, clock=lambda: START), analyzer,
                             Deliverer(Store(path), (receiver,)), TOKEN.encode(),
                             max_body_bytes=1024 * 1024, planner=planner)
    state = ServingState()
    state.cycle = ServingCycle([AnalysisStage(analyzer), advisor_stage(service)], advisor=service)
    sim = sim_source(SimSource(seed=1), lambda: START)
    app = make_app(Config(collect_interval=60), Collector([sim], 10, clock=lambda: START), state)
    install(app, service)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        await asyncio.wait_for(state.ready.wait(), 30)
        resp = await client.post("/v1/alerts", json=alertmanager_payload(), headers=auth())
        assert resp.status == 202
        assert await asyncio.to_thread(planning.wait, 10)
    finally:
        await client.close()  # the app's cleanup: the deliverer stops, the outbox closes
    assert service.evaluations_by_trigger["alertmanager"] == 1  # finished before the close
    plan = service.advisor.plan
    assert plan is not None and plan.migrations[0].job == "job-from-alert"
    reopened = Store(path)
    try:
        assert reopened.status_of("sched", plan.plan_id) is not None  # queued, not lost
    finally:
        reopened.close()


# Hardening (issue 14): hostile bodies, blank tokens, a rotated token file, one what-if at a time.

def _refuse_constant(name):
    raise AssertionError(f"the reply holds {name}, which is not JSON")


def strict_json(text: str):
    """The reply parsed as strict JSON: NaN and Infinity are not JSON (RFC 8259)."""
    return json.loads(text, parse_constant=_refuse_constant)


def node(name="gpu-001", gpu_count=8, **fields):
    return {"name": name, "model": "h100-sxm-80gb", "cpu_cores": 64, "pool": "gpu-h100",
            "generation": "hopper", "gpu_count": gpu_count, **fields}


def snapshot_body(**fields) -> bytes:
    return json.dumps({"taken_at": START, "nodes": [node()], **fields}).encode()


async def test_a_billion_gpus_is_refused_before_anything_is_allocated(advisor_client):
    """Defect 1: ``gpu_count: 1000000000`` ran ``set(range(gpu_count))`` and dense
    nodes x GPUs arrays until the kernel killed the server. Now the schema refuses it first."""
    body = snapshot_body(nodes=[node(gpu_count=1_000_000_000)])
    tracemalloc.start()
    try:
        resp = await advisor_client.post("/v1/plan", data=body, headers=auth())
        text = await resp.text()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert resp.status == 400, text
    assert "nodes[0].gpu_count" in strict_json(text)["error"]
    assert peak < 8 * 1024 * 1024  # the body, its parse and the reply; no per-GPU anything


DEEP = b'{"taken_at": 1, "nodes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(("body", "reason"), [
    (snapshot_body(nodes=[1]), "nodes[0]: must be an object"),
    (snapshot_body(nodes=[node(gpu_count="eight")]), "nodes[0].gpu_count: must be an integer"),
    (snapshot_body(nodes=[node(gpu_count=1e9)]), "nodes[0].gpu_count: must be an integer"),
    (snapshot_body(nodes=[node(gpu_count=-1)]), "nodes[0].gpu_count"),
    (snapshot_body(nodes=[node(gpu_count=65)]), "nodes[0].gpu_count"),
    (b'{"taken_at": ' + b"7" * 5000 + b"}", "digits"),
    (DEEP, "nested deeper than"),
    (snapshot_body(nodes=[node(cpu_cores=float("nan"))]), "NaN"),
    (snapshot_body(taken_at="yesterday"), "taken_at: must be a number"),
    (b'{"taken_at": 1e400}', "1e400"),
    (b'{"taken_at": -Infinity}', "Infinity"),
    (snapshot_body(nodes=[node(name="n" * 5000)]), "nodes[0].name"),
    (snapshot_body(allocations=[{"job": "j", "placements": [
        {"node": "gpu-001", "gpus": [0], "gpu_share": 1.5, "cpus": 1}]}]),
     "allocations[0].placements[0].gpu_share"),
    (snapshot_body(gpus=[{"node": "gpu-001", "index": 64, "uuid": "u", "model": "m", "pool": "p"}]),
     "gpus[0].index"),
    (snapshot_body(nodes=[node(), node()]), "nodes[1].name: duplicate"),
    (snapshot_body(nodes=[node(extra=1)]), "nodes[0].extra: unknown field"),
    (b'{"nodes": []}', "taken_at: required"),
])
async def test_bad_snapshots_get_400_naming_the_field(advisor_client, body, reason):
    """Defect 7: these gave 500 (types, huge integers, deep nesting), 200 with nonsense
    (negative GPUs, NaN CPUs, "yesterday") or a reply holding ``Infinity``."""
    resp = await advisor_client.post("/v1/plan", data=body, headers=auth())
    text = await resp.text()
    assert resp.status == 400, text[:300]
    error = strict_json(text)["error"]
    assert reason in error and "\n" not in error and len(error) < 400


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"taken_at": 1, "taken_at": 2}', 'body: key "taken_at" given twice in one object; keep one'),
    (snapshot_body(nodes=[node()]).replace(b'"gpu_count": 8', b'"gpu_count": 8, "gpu_count": 64'),
     'body: key "gpu_count" given twice in one object; keep one'),
])
async def test_a_key_given_twice_is_refused_as_the_config_refuses_it(advisor_client, body, reason):
    """The last of two keys won silently, while the config file refuses a key given twice:
    a body that means two things gets 400, not a what-if on one of them."""
    resp = await advisor_client.post("/v1/plan", data=body, headers=auth())
    text = await resp.text()
    assert resp.status == 400, text[:300]
    assert strict_json(text)["error"] == reason


async def test_what_if_replies_are_strict_json(advisor_client):
    resp = await advisor_client.post("/v1/plan", data=snapshot_body(), headers=auth())
    assert resp.status == 200
    assert strict_json(await resp.text())["what_if"] is True


async def test_a_bad_alert_is_not_remembered_so_its_retry_is_processed(advisor_client):
    """Defect 7: a non-string alertname gave 500 after the group was marked as seen, so
    Alertmanager's retry was answered as a duplicate and never evaluated."""
    group = '{}:{alertname="Retried"}'
    bad = alertmanager_payload(group=group)
    bad["alerts"][0]["labels"]["alertname"] = 7
    resp = await advisor_client.post("/v1/alerts", json=bad, headers=auth())
    assert resp.status == 400
    assert "alerts[0].labels.alertname" in (await resp.json())["error"]
    retry = await advisor_client.post("/v1/alerts", json=alertmanager_payload(group=group),
                                      headers=auth())
    assert retry.status == 202
    assert await retry.json() == {"accepted": True, "duplicate": False, "evaluation": "scheduled"}


async def light_client(aiohttp_client, *, token: bytes | None = TOKEN.encode(), what_if=None,
                       evaluate=None, **settings):
    """The API alone, with stub engine callables: no collection, no analysis."""
    from aiohttp import web

    from exporter.advisor.api import AdvisorApi, add_routes

    async def no_evaluation(reason):
        return None

    api = AdvisorApi(evaluate=evaluate or no_evaluation,
                     what_if=what_if or (lambda snapshot: NO_WHAT_IF),
                     current=lambda: None, token=token, max_body_bytes=1024 * 1024, **settings)
    app = web.Application()
    add_routes(app, api)
    client = await aiohttp_client(app)
    client.api = api
    return client


async def test_a_failed_evaluation_forgets_the_group(aiohttp_client):
    """The group is remembered once processed: an evaluation that raised is not processed,
    so Alertmanager's next notification of the group evaluates again."""
    calls = []

    async def failing(reason):
        calls.append(reason)
        raise RuntimeError("planner broke")

    client = await light_client(aiohttp_client, evaluate=failing)
    first = await client.post("/v1/alerts", json=alertmanager_payload(), headers=auth())
    assert first.status == 202
    await client.api.finish_evaluations()
    again = await client.post("/v1/alerts", json=alertmanager_payload(), headers=auth())
    assert (await again.json())["duplicate"] is False
    await client.api.finish_evaluations()
    assert len(calls) == 2


@pytest.mark.parametrize("value", ["   ", "\u00a0", "\t\n"])
def test_a_blank_token_refuses_to_start(tmp_path, value):
    """Defect 6: GPUFLEET_ADVISOR_TOKEN="   " became an empty token, without a warning."""
    with pytest.raises(ConfigError, match=r"^GPUFLEET_ADVISOR_TOKEN: .*empty"):
        load_token(AdvisorConfig(), {"GPUFLEET_ADVISOR_TOKEN": value})
    token_file = tmp_path / "token"
    token_file.write_text(value)
    with pytest.raises(ConfigError, match=r"^advisor.token_file: .*empty"):
        load_token(AdvisorConfig(token_file=str(token_file)), {})
    assert load_token(AdvisorConfig(), {"GPUFLEET_ADVISOR_TOKEN": f"{value}tok{value}"}) == b"tok"


def test_serve_with_a_blank_token_exits_2_with_one_line(exporter_factory):
    exporter = exporter_factory(env={"GPUFLEET_ADVISOR_TOKEN": "   "}, ready=False)
    assert exporter.proc.wait(timeout=60) == 2
    lines = exporter.log.read_text().strip().splitlines()
    assert lines == ["gpufleet: GPUFLEET_ADVISOR_TOKEN: empty after stripping whitespace"]


@pytest.mark.parametrize("presented", ["\u00a0", "\u00a0\u00a0", "\t"])
async def test_a_blank_bearer_gets_401_even_against_an_empty_token(aiohttp_client, presented):
    """Defect 6: ``Bearer <U+00A0>`` matched the empty token and got 202."""
    for token in (b"", TOKEN.encode()):
        client = await light_client(aiohttp_client, token=token)
        resp = await client.post("/v1/alerts", json=alertmanager_payload(),
                                 headers={"Authorization": f"Bearer {presented}"})
        assert resp.status == 401


async def test_the_bearer_token_is_compared_stripped(aiohttp_client):
    client = await light_client(aiohttp_client)
    resp = await client.post("/v1/alerts", json=alertmanager_payload(),
                             headers={"Authorization": f"Bearer  {TOKEN}\u00a0"})
    assert resp.status == 202


async def test_a_rotated_token_file_is_read_again(aiohttp_client, tmp_path):
    """Defect 6: the token file was read once, so a rotated token waited for a restart."""
    import os

    from aiohttp import web

    from exporter.advisor.api import add_routes
    from exporter.advisor.service import build_service

    path = tmp_path / "token"
    path.write_text("old-token\n")
    config = AdvisorConfig(token_file=str(path), outbox=str(tmp_path / "outbox.sqlite"))
    service = build_service(config, LiveAnalyzer.from_config(AnalysisConfig()), environ={})
    app = web.Application()
    add_routes(app, service.api())
    client = await aiohttp_client(app)

    def rotate(text: str, step: int) -> None:
        path.write_text(text)
        # the same length within one clock tick keeps the mtime: move it on explicitly
        mtime = path.stat().st_mtime_ns + step * 1_000_000_000
        os.utime(path, ns=(mtime, mtime))

    async def post(token: str, group: str) -> int:
        resp = await client.post("/v1/alerts", json=alertmanager_payload(group=group),
                                 headers=auth(token))
        return resp.status

    try:
        assert await post("old-token", "g1") == 202
        rotate("new-token\n", 1)
        assert await post("old-token", "g2") == 401
        assert await post("new-token", "g3") == 202
        rotate("  \n", 2)  # emptied: nothing is accepted until a token is back
        assert await post("new-token", "g4") == 401
        rotate("third-token", 3)
        assert await post("third-token", "g5") == 202
    finally:
        await service.api().finish_evaluations()
        service.deliverer.store.close()


async def test_one_what_if_at_a_time_and_503_when_busy(aiohttp_client):
    entered, release = threading.Event(), threading.Event()

    def what_if(snapshot):
        entered.set()
        release.wait(30)
        return NO_WHAT_IF

    client = await light_client(aiohttp_client, what_if=what_if)
    first = asyncio.create_task(client.post("/v1/plan", data=snapshot_body(), headers=auth()))
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        busy = await client.post("/v1/plan", data=snapshot_body(), headers=auth())
        assert busy.status == 503
        assert int(busy.headers["Retry-After"]) >= 1
        assert "busy" in (await busy.json())["error"]
    finally:
        release.set()
    assert (await first).status == 200
    assert (await client.post("/v1/plan", data=snapshot_body(), headers=auth())).status == 200


async def test_a_what_if_past_its_time_limit_gets_503_and_holds_the_slot(aiohttp_client):
    """The thread cannot be stopped, so the slot stays taken until it ends: never two at once."""
    release = threading.Event()

    def what_if(snapshot):
        release.wait(30)
        return NO_WHAT_IF

    client = await light_client(aiohttp_client, what_if=what_if, what_if_timeout=0.05)
    try:
        late = await client.post("/v1/plan", data=snapshot_body(), headers=auth())
        assert late.status == 503 and "time limit" in (await late.json())["error"]
        assert "Retry-After" in late.headers
        busy = await client.post("/v1/plan", data=snapshot_body(), headers=auth())
        assert busy.status == 503 and "busy" in (await busy.json())["error"]
    finally:
        release.set()
    for _ in range(3000):  # the slot frees when the thread ends (a loaded machine: up to 30 s)
        if not client.api.what_if_busy:
            break
        await asyncio.sleep(0.01)
    client.api.what_if_timeout = 30.0
    assert (await client.post("/v1/plan", data=snapshot_body(), headers=auth())).status == 200


NAMES = st.sampled_from(["gpu-001", "gpu-002", "gpu-003", "ghost"])  # "ghost" has no node record
MODELS = st.sampled_from(["h100-sxm-80gb", "a100-sxm-80gb", "no-such-model", ""])
SHARE = st.floats(0, 1, exclude_min=True)
CPUS = st.floats(0, 256)


@st.composite
def hostile_snapshots(draw):
    """Snapshots the schema accepts but no source would send: over-committed GPUs, placements
    on nodes without records, GPUs past a node's count, unknown models, zero CPUs."""
    names = draw(st.lists(NAMES.filter(lambda n: n != "ghost"), unique=True, max_size=3))
    nodes = [{"name": n, "model": draw(MODELS), "cpu_cores": draw(CPUS), "pool": draw(NAMES),
              "generation": "hopper", "gpu_count": draw(st.integers(0, 64))} for n in names]
    gpus = [{"node": draw(NAMES), "index": draw(st.integers(0, 63)), "uuid": "u", "model": draw(MODELS),
             "pool": "p", "up": draw(st.booleans())} for _ in range(draw(st.integers(0, 6)))]
    allocations = [{"job": f"job-{i}", "priority": draw(st.integers(-5, 5000)),
                    "gpu_memory_need_bytes": draw(st.none() | st.integers(0, 2 ** 40)),
                    "start_time": draw(st.none() | st.floats(0, 2e9)),
                    "placements": [{"node": draw(NAMES), "gpu_share": draw(SHARE), "cpus": draw(CPUS),
                                    "gpus": draw(st.lists(st.integers(0, 63), max_size=4))}
                                   for _ in range(draw(st.integers(0, 3)))]}
                   for i in range(draw(st.integers(0, 6)))]
    pending = [{"job": "p", "gpu_count": draw(st.integers(0, 64)), "node_count": draw(st.integers(0, 3)),
                "pool": draw(NAMES)} for _ in range(draw(st.integers(0, 2)))]
    return {"taken_at": draw(st.floats(0, 2e9)), "nodes": nodes, "gpus": gpus,
            "allocations": allocations, "pending": pending}


@pytest.fixture(scope="module")
def what_if_service(tmp_path_factory):
    from exporter.advisor.planner import PlanSettings, plan_compaction
    from exporter.advisor.webhook import Deliverer
    from exporter.snapshot import FleetSnapshot

    analyzer = LiveAnalyzer.from_config(AnalysisConfig())  # measured once: the live workload
    reading = asyncio.run(sim_source(SimSource(seed=1), lambda: START).read())
    analyzer.analyze(FleetSnapshot(START, reading.nodes, reading.gpus, reading.allocations, reading.pending))
    settings = DecisionSettings(trigger=0.0, clear_below=-1.0, dwell_seconds=0, cooldown_seconds=0)
    planner = functools.partial(plan_compaction, settings=PlanSettings())
    store = Store(tmp_path_factory.mktemp("outbox") / "o.sqlite")
    service = AdvisorService(Advisor(settings, clock=lambda: START), analyzer,
                             Deliverer(store, ()), TOKEN.encode(), max_body_bytes=1 << 20,
                             planner=planner)
    yield service
    store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_snapshots())
def test_a_what_if_on_any_accepted_snapshot_answers_strict_json(what_if_service, payload):
    """What the schema lets through, the what-if must handle: no exception (a 500), no NaN."""
    from exporter.advisor import bounds

    snapshot = bounds.snapshot_from_body(json.dumps(payload).encode())
    advice = what_if_json(what_if_service.what_if(snapshot))
    json.dumps(advice, allow_nan=False)


def test_the_what_if_time_limit_comes_from_api_what_if_timeout(tmp_path):
    from exporter.cli.serve import assemble
    from exporter.config import build

    config = build(Config, {"api": {"what_if_timeout": "2500ms"},
                            "advisor": {"outbox": str(tmp_path / "outbox.sqlite")}})
    _, _, service = assemble(config, ["sim"])
    assert service is not None
    try:
        assert service.api().what_if_timeout == 2.5
    finally:
        service.deliverer.store.close()


async def test_v1_advice_serves_the_plan_through_its_cooldown_until_it_expires(aiohttp_client):
    """The service's own wiring (AdvisorService.api: current=Advisor.current), the real
    handler, and each answer valid against the served OpenAPI document's Advice."""
    from types import SimpleNamespace

    from aiohttp import web
    from jsonschema import Draft202012Validator

    from exporter.advisor import openapi
    from exporter.advisor.api import add_routes
    from exporter.snapshot import FleetSnapshot

    def report(index: float) -> SimpleNamespace:  # what the advisor reads of an analysis
        return SimpleNamespace(cluster=SimpleNamespace(index=index, allocated_ratio=0.97), pools=[])

    clock = [START]
    advisor = Advisor(DecisionSettings(dwell_seconds=0, cooldown_seconds=1800), clock=lambda: clock[0])
    # the API's wiring only: no analyzer or deliverer is reached by GET /v1/advice
    service = AdvisorService(advisor, None, None, TOKEN.encode(), 1024)  # type: ignore[arg-type]
    app = web.Application()
    add_routes(app, service.api())
    client = await aiohttp_client(app)
    doc = openapi.document()
    advice_schema = Draft202012Validator({**doc["components"]["schemas"]["Advice"],
                                          "components": doc["components"]})

    async def served(at: float, index: float | None = None) -> dict:
        clock[0] = at
        if index is not None:
            advise(advisor, FleetSnapshot(at), report(index), stub_planner([]))
        resp = await client.get("/v1/advice")
        body = await resp.json()
        assert resp.status == 200
        assert [e.message for e in advice_schema.iter_errors(body)] == []
        return body

    made = await served(START, 70)
    plan_id = made["plan"]["plan_id"]
    assert (made["decision"], made["plan_proposed_at"], made["plan"]["expires_at"]) == (
        "compact", START, START + 900)
    later = await served(START + 300, 70)
    assert (later["decision"], later["plan"], later["plan_proposed_at"]) == (
        "cooldown", made["plan"], START)
    assert later["reasons"][-1] == (f"plan {plan_id} proposed 5 min ago stays valid until "
                                    "09:08:20 UTC; this evaluation proposes no new one")
    # no evaluation since, and the plan's expiry has passed: the answer drops it
    gone = await served(START + 900)
    assert (gone["decision"], gone["plan"], gone["plan_proposed_at"]) == ("cooldown", None, None)
    assert gone["reasons"][-1] == f"plan {plan_id} expired at 09:08:20 UTC, after this evaluation"
    after = await served(START + 960, 70)
    assert (after["decision"], after["plan"], after["plan_proposed_at"]) == ("cooldown", None, None)
