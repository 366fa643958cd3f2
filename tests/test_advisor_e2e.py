"""The advisor end to end: a real exporter process, a real scheduler (aiohttp), a real Alertmanager.

The simulated fleet's fragmented-pool scenario pushes the gpu-h100 index above
50; the advisor recommends compaction and POSTs a signed plan to the test
scheduler, which verifies the HMAC. The scheduler is down for the first
attempts, the exporter is restarted with a delivery pending, and a real
Alertmanager posts to /v1/alerts.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from deploy.examples.receiver import signature_ok
from tests.helpers import free_port, http_get, stop, wait_until
from tests.helpers.alerting import ADVISOR_TOKEN, routed_config, start_alertmanager

pytestmark = pytest.mark.slow  # exporter processes, a real Alertmanager, schedulers

SECRET = "scheduler-shared-secret"
ENV = {"GPUFLEET_ADVISOR_TOKEN": ADVISOR_TOKEN, "GPUFLEET_WEBHOOK_SECRET": SECRET}


def config(outbox: Path, scheduler_port: int, *, plans: bool = True) -> str:
    # plans: False makes a process that never proposes (index can't exceed 100) but delivers
    trigger = "trigger: 50\n  clear_below: 40" if plans else "trigger: 100\n  clear_below: 99"
    return f"""
collect_interval: 1s
advisor:
  {trigger}
  dwell: 0s
  cooldown: 1h
  outbox: {outbox}
  retry_initial: 300ms
  retry_max: 600ms
  receivers:
    - {{name: scheduler, url: "http://127.0.0.1:{scheduler_port}/gpufleet/plan", timeout: 2s}}
sources:
  sim:
    seed: 42
    scenarios:
      - {{kind: fragmented_pool, pool: gpu-h100}}
"""


class Scheduler:
    """A real aiohttp scheduler in a thread: verifies the signature, records plans."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.accepted: list[dict] = []
        self.bad_signatures = 0
        self._ready = threading.Event()
        self._stop: object = None
        self._thread: threading.Thread | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append((dict(request.headers), body))
        if not signature_ok(body, SECRET.encode(), request.headers.get("X-Gpufleet-Signature", "")):
            self.bad_signatures += 1
            return web.Response(status=401)
        self.accepted.append(json.loads(body))
        return web.json_response({"status": "accepted"})

    def start(self) -> Scheduler:
        import asyncio

        def serve() -> None:
            loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_post("/gpufleet/plan", self.handle)
            runner = web.AppRunner(app)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
            stop = asyncio.Event()
            self._stop = (loop, stop)
            self._ready.set()
            loop.run_until_complete(stop.wait())
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="scheduler", daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def close(self) -> None:
        """Stop serving and wait until the port is closed and the thread is gone."""
        if self._stop is not None:
            loop, stop = self._stop
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10)
            assert not self._thread.is_alive(), "the scheduler did not stop"


def metric(url: str, name: str, **labels: str) -> float:
    text = http_get(f"{url}/metrics").decode()
    total = 0.0
    for line in text.splitlines():
        if (line.startswith((name + "{", name + " "))
                and all(f'{k}="{v}"' in line for k, v in labels.items())):
            total += float(line.rsplit(" ", 1)[1])
    return total


def evaluated_again(url: str, times: int = 3) -> None:
    """Wait until the advisor has evaluated ``times`` more snapshots: each evaluation is where
    a plan could be queued again, and the deliverer sends what is queued within its retry
    delay (300 ms here), so a duplicate, if any, has been sent by then. A count of the
    exporter's own work, not a span of time: on a loaded machine it waits longer."""
    seen = metric(url, "gpufleet_advisor_evaluations_total", trigger="snapshot")
    wait_until(f"{times} more evaluations", lambda: metric(
        url, "gpufleet_advisor_evaluations_total", trigger="snapshot") >= seen + times)


def advice(url: str) -> dict:
    return json.loads(http_get(f"{url}/v1/advice"))


def test_fragmented_pool_plan_reaches_a_scheduler_down_for_its_first_attempts(
        exporter_factory, tmp_path):
    port = free_port()  # nothing listens here yet: the scheduler is down
    # a compaction plan needs the scattered H100 pool's index above 50: 32 nodes, not 4
    exporter = exporter_factory(config=config(tmp_path / "outbox.sqlite", port), env=ENV,
                                fleet="medium")
    compact = wait_until("a compaction plan", lambda: (a := advice(exporter.url))["decision"]
                         == "compact" and a)
    assert compact["scopes"]["pool:gpu-h100"]["index"] > 50
    assert compact["scope"] in ("pool:gpu-h100", "cluster")
    assert re.match(r"pool gpu-h100 index \d+ > 50 for \d+ s; plan frees .* with \d+ migrations?",
                    compact["reasons"][0]), compact["reasons"]
    plan = compact["plan"]
    assert plan["migrations"] and plan["after"]["fragmented_gpus"] < plan["before"]["fragmented_gpus"]
    assert metric(exporter.url, "gpufleet_advisor_compaction_recommended", scope="pool:gpu-h100") == 1
    wait_until("three failed attempts",
               lambda: metric(exporter.url, "gpufleet_advisor_webhook_deliveries_total",
                              result="retry") >= 3)
    assert metric(exporter.url, "gpufleet_advisor_outbox_pending") == 1

    scheduler = Scheduler(port).start()  # the scheduler comes back
    try:
        # the exporter's own record of the delivery (the scheduler has the plan before the
        # exporter has its answer, and /metrics is rendered once per collection)
        wait_until("the delivery recorded in /metrics",
                   lambda: metric(exporter.url, "gpufleet_advisor_outbox_pending") == 0
                   and metric(exporter.url, "gpufleet_advisor_webhook_deliveries_total",
                              result="delivered") >= 1)
        evaluated_again(exporter.url)
        assert len(scheduler.accepted) == 1 and scheduler.bad_signatures == 0
        assert scheduler.accepted[0] == plan
        headers = scheduler.requests[0][0]
        assert headers["Idempotency-Key"] == plan["plan_id"]
        assert headers["X-Gpufleet-Delivery"]
        assert metric(exporter.url, "gpufleet_advisor_outbox_pending") == 0
        assert metric(exporter.url, "gpufleet_advisor_webhook_deliveries_total",
                      result="delivered") == 1
    finally:
        scheduler.close()


def test_pending_delivery_survives_an_exporter_restart(exporter_factory, tmp_path):
    outbox = tmp_path / "outbox.sqlite"
    port = free_port()
    first = exporter_factory(config=config(outbox, port), env=ENV, fleet="medium")  # a plan
    plan = wait_until("a compaction plan",
                      lambda: (a := advice(first.url))["decision"] == "compact" and a["plan"])
    wait_until("a queued delivery", lambda: metric(first.url, "gpufleet_advisor_outbox_pending") == 1)
    first.proc.terminate()
    assert first.proc.wait(15) == 0

    scheduler = Scheduler(port).start()
    try:
        # the new process never plans (trigger 100): whatever arrives, the old one queued
        second = exporter_factory(config=config(outbox, port, plans=False), env=ENV,
                                  fleet="medium")
        wait_until("the old plan delivered, as the new exporter records it",
                   lambda: metric(second.url, "gpufleet_advisor_outbox_pending") == 0)
        evaluated_again(second.url)
        assert [p["plan_id"] for p in scheduler.accepted] == [plan["plan_id"]]
        assert advice(second.url)["decision"] == "none"
        assert metric(second.url, "gpufleet_advisor_outbox_pending") == 0
    finally:
        scheduler.close()


def _post(url: str, body: bytes, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_real_alertmanager_payload_is_accepted_and_bad_requests_refused(exporter_factory, tmp_path):
    exporter = exporter_factory(config=config(tmp_path / "outbox.sqlite", free_port()), env=ENV)
    am_config = routed_config("http://127.0.0.1:9", fast=True)
    for receiver in am_config["receivers"]:
        if receiver["name"] == "gpufleet-advisor":
            receiver["webhook_configs"][0]["url"] = f"{exporter.url}/v1/alerts"
    manager = start_alertmanager(tmp_path / "alertmanager", am_config)
    try:
        manager.post([{"labels": {"alertname": "GpuClusterFragmentationHigh", "action": "compact",
                                  "severity": "warning", "pool": "gpu-h100", "model": "H100"},
                       "annotations": {"summary": "fragmented"}}])
        wait_until("Alertmanager's notification at the advisor",
                   lambda: metric(exporter.url, "gpufleet_advisor_alertmanager_notifications_total",
                                  result="accepted") >= 1, timeout=30)
        wait_until("an evaluation triggered by it", lambda: metric(
            exporter.url, "gpufleet_advisor_evaluations_total", trigger="alertmanager") == 1,
            timeout=30)
    finally:
        stop(manager.proc)

    url = f"{exporter.url}/v1/alerts"
    status, body = _post(url, b'{"version": "4"', ADVISOR_TOKEN)
    assert status == 400 and "not valid JSON" in body["error"]
    status, body = _post(url, json.dumps({"version": "4", "groupKey": "g", "status": "firing",
                                          "alerts": "nope"}).encode(), ADVISOR_TOKEN)
    assert status == 400 and "alerts: must be an array" in body["error"]
    status, body = _post(url, b"{}", "wrong-token")
    assert status == 401 and body["error"] == "wrong bearer token"
    status, body = _post(url, b"{}", None)
    assert status == 401 and body["error"] == "missing bearer token"
    status, body = _post(f"{exporter.url}/v1/plan", b"x" * (17 * 1024 * 1024), ADVISOR_TOKEN)
    assert status == 413 and "limit" in body["error"]
    # metrics are rendered once per collection (1 s here)
    wait_until("the refused notifications counted", lambda: metric(
        exporter.url, "gpufleet_advisor_alertmanager_notifications_total", result="unauthorized") == 2)
    assert http_get(f"{exporter.url}/-/healthy")  # and it is still serving
