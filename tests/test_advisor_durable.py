"""Issue 32, findings 5, 6, 7 and 11: clocks, restarts, full disks and alert floods."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import subprocess
import sys

import aiohttp
import pytest
from aiohttp import web

from exporter.advisor.api import AdvisorApi, add_routes
from exporter.advisor.store import Store
from exporter.advisor.webhook import Deliverer, Receiver
from exporter.snapshot import FleetSnapshot
from tests.test_advisor_api import alertmanager_payload
from tests.test_advisor_store import START, Clock, FullDisk, full_disk_store, service_with
from tests.test_advisor_webhook import SECRET, Scheduler, _run_until


def failing_updates_store(path) -> tuple[Store, FullDisk]:
    """A disk that fills after the rows are in: INSERTs fit, every UPDATE fails."""
    return full_disk_store(path, failing=("UPDATE",))


def _body(plan_id: str, expires_at: float) -> bytes:
    return json.dumps({"plan_id": plan_id, "expires_at": expires_at}).encode()


async def test_a_wall_clock_stepped_back_an_hour_neither_stalls_nor_forward_bursts(aiohttp_server, tmp_path):
    scheduler = Scheduler(fail_first=1)
    server = await aiohttp_server(scheduler.app())
    wall, mono = Clock(START), Clock(1000.0)
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(Store(tmp_path / "outbox.sqlite"), (receiver,), base_delay=10,
                          max_delay=10, clock=wall, monotonic=mono)
    async with aiohttp.ClientSession() as session:
        assert deliverer.enqueue("plan-a", _body("plan-a", START + 900), START + 900) == 1
        await deliverer.deliver_due(session)
        assert deliverer.results[("slurm", "retry")] == 1
        next_due = deliverer.next_due()
        assert next_due is not None and 1005.0 <= next_due <= 1010.0  # the backoff, monotonic

        wall.now -= 3600  # the wall clock steps back an hour; the backoff passes
        mono.now += 10
        await deliverer.deliver_due(session)
        assert deliverer.results[("slurm", "delivered")] == 1  # within its backoff, not an hour
        assert len(scheduler.requests) == 2

        # stepped forward an hour: a retry not yet due by the monotonic clock stays put
        scheduler.fail_first = 3
        far = START + 10 * 86400
        assert deliverer.enqueue("plan-b", _body("plan-b", far), far) == 1
        await deliverer.deliver_due(session)
        assert len(scheduler.requests) == 3 and deliverer.results[("slurm", "retry")] == 2
        wall.now += 2 * 3600
        await deliverer.deliver_due(session)
        assert len(scheduler.requests) == 3  # no burst
        mono.now += 10
        await deliverer.deliver_due(session)
        assert len(scheduler.requests) == 4


async def test_a_restart_reads_the_written_schedule_bounded_by_max_delay(aiohttp_server, tmp_path):
    """A row written by a process whose wall clock ran an hour ahead is due within max_delay."""
    scheduler = Scheduler()
    server = await aiohttp_server(scheduler.app())
    store = Store(tmp_path / "outbox.sqlite")
    far = START + 10 * 86400
    key = store.enqueue("slurm", "plan-a", _body("plan-a", far), START, far)
    assert key is not None
    store.retry_at(key, START + 3600 + 5, "HTTP 503")  # written under a clock an hour ahead
    wall, mono = Clock(START), Clock(50.0)
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(store, (receiver,), base_delay=1, max_delay=30, clock=wall, monotonic=mono)
    async with aiohttp.ClientSession() as session:
        await deliverer.deliver_due(session)
        assert scheduler.requests == [] and deliverer.next_due() == 80.0
        mono.now += 30
        await deliverer.deliver_due(session)
    assert store.status_of("slurm", "plan-a") == ("delivered", 2, "HTTP 503")


async def test_an_outcome_that_cannot_be_written_is_never_posted_again(aiohttp_server, tmp_path):
    scheduler = Scheduler()
    server = await aiohttp_server(scheduler.app())
    store, conn = failing_updates_store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(store, (receiver,), base_delay=0.05, max_delay=0.4)
    far = START + 10 * 86400
    plan_id, body = "plan-a", _body("plan-a", far)
    deliverer.enqueue(plan_id, body, None)
    conn.full = True  # the disk fills after the row is in: the `delivered` UPDATE fails
    await _run_until(deliverer, lambda: False, timeout=1.5)
    assert len(scheduler.requests) == 1  # before the fix: a POST per round, 29 in 15 s
    assert deliverer.held_outcomes() == 1
    # the write is retried, backing off: 0.05 s doubling to 0.4 s gives about 6 tries in 1.5 s
    assert 2 <= store.errors["update"] <= 10
    conn.full = False
    await _run_until(deliverer, lambda: deliverer.held_outcomes() == 0, timeout=3)
    assert len(scheduler.requests) == 1
    assert store.status_of("slurm", plan_id) == ("delivered", 1, "")
    assert store.pending_count() == 0


async def test_failures_whose_retry_cannot_be_written_still_back_off(aiohttp_server, tmp_path):
    scheduler = Scheduler(fail_first=1000)
    server = await aiohttp_server(scheduler.app())
    store, conn = failing_updates_store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(store, (receiver,), base_delay=0.1, max_delay=1.0)
    deliverer.enqueue("plan-a", _body("plan-a", START + 10 * 86400), None)
    conn.full = True
    await _run_until(deliverer, lambda: False, timeout=1.5)
    # backoff 0.05-0.1, 0.1-0.2, 0.2-0.4, 0.4-0.8 s...: 6 POSTs at most in 1.5 s
    # (before the fix: the failed UPDATE ended the round, and a retry came every 0.1 s)
    assert 2 <= len(scheduler.requests) <= 6
    assert store.errors["update"] == len(scheduler.requests)


async def test_an_alert_flood_queues_a_bounded_number_of_evaluations(aiohttp_client, caplog):
    """500 notifications over 500 groups, while evaluations take 50 ms: merged, not queued."""
    reasons: list[str] = []

    async def evaluate(reason: str):
        reasons.append(reason)
        await asyncio.sleep(0.05)

    api = AdvisorApi(evaluate=evaluate, what_if=lambda s: None, current=lambda: None,  # type: ignore[arg-type,return-value]
                     token=b"t0ken", max_body_bytes=1 << 20)
    app = web.Application()
    add_routes(app, api)
    client = await aiohttp_client(app)
    headers = {"Authorization": "Bearer t0ken"}
    caplog.set_level(logging.INFO, logger="exporter.advisor.api")

    async def notify(i: int) -> int:
        payload = alertmanager_payload(group=f"group-{i}")
        payload["alerts"][0]["labels"]["alertname"] = f"Alert{i % 3}"
        resp = await client.post("/v1/alerts", json=payload, headers=headers)
        return resp.status

    statuses = await asyncio.gather(*(notify(i) for i in range(500)))
    await api.finish_evaluations()
    assert statuses == [202] * 500
    assert api.notifications["accepted"] == 500
    # before the fix: 500 evaluations, one per notification
    assert 1 <= len(reasons) <= 20
    assert len(reasons) + api.merged == 500
    assert any("Alert0, Alert1, Alert2" in r for r in reasons)  # merged names are all evaluated
    lines = [r for r in caplog.records if r.getMessage() == "alertmanager notification accepted"]
    assert len(lines) == 1  # rate-limited: one line per 10 s, the rest counted


async def test_a_restart_inside_the_cooldown_proposes_no_new_plan(tmp_path):
    path = tmp_path / "outbox.sqlite"
    clock = Clock()
    first = service_with(Deliverer(Store(path), ()), clock)
    advice = await first.evaluate("snapshot")
    assert advice is not None and advice.decision == "compact"
    first.deliverer.store.close()

    clock.now += 9.4  # the restart: a second plan 9.4 s after the first
    second = service_with(Deliverer(Store(path), ()), clock)
    second.restore_state()
    assert second.advisor.last_plan_at == START
    again = await second.evaluate("snapshot")
    assert again is not None and again.decision == "cooldown"
    assert again.plan is not None and again.plan.plan_id == advice.plan.plan_id  # carried, as before
    assert second.advisor.scopes["cluster"].recommended  # the dwell clock came back too
    clock.now += 1800  # the cooldown ends: a plan again
    later = await second.evaluate("snapshot")
    assert later is not None and later.decision == "compact"
    second.deliverer.store.close()


def _corrupt_half_the_pages(path) -> None:
    """Zero every other page of the file, the header page kept: it still opens."""
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for start in range(page, len(data), 2 * page):
        data[start:start + page] = bytes(min(page, len(data) - start))
    path.write_bytes(bytes(data))


def _filled_store(path) -> None:
    store = Store(path)
    for i in range(200):
        store.enqueue("slurm", f"plan-{i}", b"x" * 2000, START, None)
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()


def test_an_outbox_failing_its_integrity_check_is_refused_with_exit_2_and_one_line(tmp_path):
    path = tmp_path / "outbox.sqlite"
    _filled_store(path)
    _corrupt_half_the_pages(path)
    with pytest.raises(sqlite3.DatabaseError, match="integrity check failed"):
        Store(path)
    config = tmp_path / "gpufleet.yaml"
    config.write_text(f"advisor: {{outbox: {path}}}\n")
    done = subprocess.run([sys.executable, "-m", "exporter", "serve", "--config", str(config),
                           "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("ts=")]
    assert len(lines) == 1 and lines[0].startswith("gpufleet: advisor.outbox: cannot open")
    assert "integrity check failed" in lines[0] or "malformed" in lines[0]


def test_an_outbox_that_fails_later_keeps_the_advisor_families_and_counts_the_error(tmp_path):
    path = tmp_path / "outbox.sqlite"
    _filled_store(path)
    service = service_with(Deliverer(Store(path), ()), Clock())
    before = {f.name for f in service.families(FleetSnapshot(START))}
    _corrupt_half_the_pages(path)  # under the running process
    with contextlib.suppress(sqlite3.Error):  # drop the pages cached in this connection
        service.deliverer.store._db.execute("PRAGMA shrink_memory")
    families = {f.name: f for f in service.families(FleetSnapshot(START))}
    assert set(families) == before  # before the fix: 17 families gone from /metrics
    errors = {labels: value for labels, value in families["gpufleet_advisor_outbox_errors_total"].samples}
    assert errors[(("operation", "select"),)] >= 1
    assert families["gpufleet_advisor_outbox_pending"].samples[0][1] == 200  # the last count read
    service.deliverer.store.close()
