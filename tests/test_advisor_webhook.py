"""Plans reach a real aiohttp scheduler: signed, retried, exactly once, durable across restarts."""

from __future__ import annotations

import asyncio
import json
import random
import time

from aiohttp import web

from exporter.advisor.store import Store
from exporter.advisor.webhook import (
    DELIVERY_HEADER,
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    Deliverer,
    Receiver,
    backoff,
    retry_after_seconds,
    sign,
    verify,
)

SECRET = b"s3cret-shared-with-the-scheduler"


class Scheduler:
    """A test scheduler: fails the first ``fail_first`` requests with ``fail_status``."""

    def __init__(self, fail_first: int = 0, fail_status: int = 503, headers=None):
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.headers = headers or {}
        self.requests: list[tuple[dict, bytes]] = []
        self.accepted: list[dict] = []
        self.bad_signatures = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append((dict(request.headers), body))
        if len(self.requests) <= self.fail_first:
            return web.Response(status=self.fail_status, headers=self.headers)
        if not verify(body, SECRET, request.headers.get(SIGNATURE_HEADER, "")):
            self.bad_signatures += 1
            return web.Response(status=401)
        self.accepted.append(json.loads(body))
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/gpufleet", self.handle)
        return app


def _plan(plan_id: str = "plan-abc", expires_in: float = 600) -> tuple[str, bytes, float]:
    expires = time.time() + expires_in
    body = json.dumps({"plan_id": plan_id, "expires_at": expires, "migrations": []}).encode()
    return plan_id, body, expires


async def _run_until(deliverer: Deliverer, done, timeout: float = 10.0,
                     linger: float = 0.0) -> None:
    """Run the deliverer until ``done()`` (then ``linger`` seconds more), and stop it.

    ``done`` must watch the deliverer's own state (its outbox, its counters), not the
    receiver's: a receiver has a request before the deliverer has its answer, and a
    deliverer stopped in between has nothing to record.
    """
    task = asyncio.create_task(deliverer.run())
    try:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(linger)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_signature_round_trip():
    body = b'{"plan_id": "x"}'
    header = sign(body, SECRET)
    assert header.startswith("sha256=") and len(header) == 7 + 64
    assert verify(body, SECRET, header)
    assert not verify(body + b" ", SECRET, header)
    assert not verify(body, b"other", header)


def test_backoff_grows_with_jitter_and_is_capped():
    rng = random.Random(1)
    delays = [backoff(a, 1.0, 60.0, rng) for a in range(10)]
    assert 0.5 <= delays[0] <= 1.0
    assert 4.0 <= delays[3] <= 8.0
    assert all(30.0 <= d <= 60.0 for d in delays[6:])
    assert len({round(backoff(3, 1.0, 60.0, rng), 6) for _ in range(20)}) > 1  # jittered


def test_retry_after_forms():
    assert retry_after_seconds("7", 0) == 7.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470) == 10.0
    assert retry_after_seconds("soon", 0) is None
    assert retry_after_seconds("999999", 0) == 3600.0


async def test_down_three_times_then_delivered_exactly_once(aiohttp_server, tmp_path):
    scheduler = Scheduler(fail_first=3)
    server = await aiohttp_server(scheduler.app())
    store = Store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(store, (receiver,), base_delay=0.01, max_delay=0.05)
    plan_id, body, expires = _plan()
    assert deliverer.enqueue(plan_id, body, expires) == 1
    assert deliverer.enqueue(plan_id, body, expires) == 0  # the same plan is queued once
    # until the deliverer has its answer; then 0.2 s more: would a duplicate follow? it must not
    await _run_until(deliverer, lambda: store.pending_count() == 0, linger=0.2)
    assert len(scheduler.requests) == 4
    assert len(scheduler.accepted) == 1 and scheduler.accepted[0]["plan_id"] == plan_id
    assert scheduler.bad_signatures == 0
    delivery_ids = {h[DELIVERY_HEADER] for h, _ in scheduler.requests}
    assert len(delivery_ids) == 1  # retries of one delivery keep its id
    assert {h[IDEMPOTENCY_HEADER] for h, _ in scheduler.requests} == {plan_id}
    assert store.status_of("slurm", plan_id) == ("delivered", 4, "HTTP 503")
    assert store.pending_count() == 0
    assert deliverer.results[("slurm", "retry")] == 3
    assert deliverer.results[("slurm", "delivered")] == 1


async def test_client_errors_are_final_but_429_is_retried(aiohttp_server, tmp_path):
    rejecting = Scheduler(fail_first=100, fail_status=400)
    throttling = Scheduler(fail_first=1, fail_status=429, headers={"Retry-After": "1"})
    s1 = await aiohttp_server(rejecting.app())
    s2 = await aiohttp_server(throttling.app())
    store = Store(tmp_path / "outbox.sqlite")
    receivers = (Receiver("reject", str(s1.make_url("/gpufleet")), SECRET),
                 Receiver("throttle", str(s2.make_url("/gpufleet")), SECRET))
    deliverer = Deliverer(store, receivers, base_delay=0.01, max_delay=0.05)
    plan_id, body, expires = _plan()
    deliverer.enqueue(plan_id, body, expires)
    started = time.monotonic()
    await _run_until(deliverer, lambda: store.pending_count() == 0)
    assert time.monotonic() - started >= 0.9  # waited for Retry-After, not the 10 ms backoff
    assert len(rejecting.requests) == 1  # 400: never repeated
    assert store.status_of("reject", plan_id)[0] == "rejected"
    assert store.status_of("throttle", plan_id) == ("delivered", 2, "HTTP 429")


async def test_connection_refused_is_retried(tmp_path, aiohttp_server):
    from tests.helpers import free_port

    store = Store(tmp_path / "outbox.sqlite")
    receiver = Receiver("gone", f"http://127.0.0.1:{free_port()}/gpufleet", SECRET, timeout=1)
    deliverer = Deliverer(store, (receiver,), base_delay=0.01, max_delay=0.02)
    plan_id, body, expires = _plan()
    deliverer.enqueue(plan_id, body, expires)
    await _run_until(deliverer, lambda: deliverer.results[("gone", "retry")] >= 3)
    status, attempts, error = store.status_of("gone", plan_id)
    assert status == "pending" and attempts >= 3 and "Connect" in error
    assert store.pending_count() == 1  # kept for later, not dropped


async def test_a_new_process_delivers_what_the_old_one_queued(aiohttp_server, tmp_path):
    path = tmp_path / "outbox.sqlite"
    first = Store(path)
    plan_id, body, expires = _plan("plan-survives")
    first.enqueue("slurm", plan_id, body, time.time(), expires)
    first.close()  # the old process is gone

    scheduler = Scheduler()
    server = await aiohttp_server(scheduler.app())
    second = Store(path)
    deliverer = Deliverer(second, (Receiver("slurm", str(server.make_url("/gpufleet")), SECRET),),
                          base_delay=0.01)
    deliverer.wake()
    await _run_until(deliverer, lambda: second.pending_count() == 0)
    assert [p["plan_id"] for p in scheduler.accepted] == ["plan-survives"]
    assert second.status_of("slurm", plan_id)[0] == "delivered"


async def test_expired_plans_are_not_delivered(aiohttp_server, tmp_path):
    scheduler = Scheduler()
    server = await aiohttp_server(scheduler.app())
    store = Store(tmp_path / "outbox.sqlite")
    deliverer = Deliverer(store, (Receiver("slurm", str(server.make_url("/gpufleet")), SECRET),),
                          base_delay=0.01)
    plan_id, body, _ = _plan("old-plan")
    deliverer.enqueue(plan_id, body, expires_at=time.time() - 1)
    await _run_until(deliverer, lambda: store.pending_count() == 0)
    assert scheduler.requests == []
    assert store.status_of("slurm", plan_id)[0] == "expired"
    assert deliverer.results[("slurm", "expired")] == 1
