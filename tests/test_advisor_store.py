"""The outbox keeps every plan: a full disk, an expired plan proposed again, retention.

The full disk is simulated at the SQLite boundary: the outbox takes a ``connect``
function, and the test's connection raises SQLite's own "database or disk is
full" on INSERT while its ``full`` flag is set.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from types import SimpleNamespace

from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction
from exporter.advisor.service import AdvisorService, build_service
from exporter.advisor.store import Store
from exporter.advisor.webhook import DELIVERY_HEADER, IDEMPOTENCY_HEADER, Deliverer, Receiver
from exporter.advisor.wire import plan_json
from exporter.analysis.analyzer import LiveAnalyzer
from exporter.config import AdvisorConfig, AnalysisConfig
from exporter.cycle import Frame
from exporter.cycle.serving import advisor_stage
from exporter.options import Duration
from exporter.snapshot import FleetSnapshot
from tests.test_advisor_webhook import SECRET, Scheduler, _run_until

START = 1_760_000_000.0
DAY = 86400.0


class Clock:
    """``now``, moved by the test; a running clock also moves with real time (retries come due)."""

    def __init__(self, now: float = START, running: bool = False) -> None:
        self.now = now
        self._started = time.monotonic() if running else None

    def __call__(self) -> float:
        return self.now + (0.0 if self._started is None else time.monotonic() - self._started)


class FullDisk(sqlite3.Connection):
    """SQLite's answer to an INSERT (or the statements in ``failing``) on a full disk, while
    ``full`` is set."""

    full = False
    failing: tuple[str, ...] = ("INSERT",)

    def execute(self, sql, parameters=(), /):
        if self.full and sql.lstrip().upper().startswith(self.failing):
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, parameters)


def full_disk_store(path, clock=time.time, failing=("INSERT",)) -> tuple[Store, FullDisk]:
    connections: list[FullDisk] = []

    def connect(where: str) -> sqlite3.Connection:
        conn = sqlite3.connect(where, check_same_thread=False, isolation_level=None, factory=FullDisk)
        conn.failing = failing
        connections.append(conn)
        return conn

    store = Store(path, connect=connect)
    return store, connections[0]


def planner(snapshot, report, scope, now):
    moves = (Migration("job-1", "ns", "pod-1", Endpoint("gpu-033", (2,)), Endpoint("gpu-034", (5,)),
                       "checkpoint_then_migrate", None, 120.0),)
    return CompactionPlan(scope, snapshot.taken_at, now + 900, "compact", ("stub",),
                          Prediction(60, 10), Prediction(40, 8), {"gpu-h100": 1}, moves)


def service_with(deliverer: Deliverer, clock: Clock) -> AdvisorService:
    settings = DecisionSettings(trigger=50.0, clear_below=40.0, dwell_seconds=0,
                                cooldown_seconds=1800)
    # of the analyzer, evaluate reads only its load tracker (issue 20's scaling): none here
    analyzer = SimpleNamespace(load=None)
    service = AdvisorService(Advisor(settings, clock=clock), analyzer, deliverer,  # type: ignore[arg-type]
                             b"token", max_body_bytes=1024, clock=clock, planner=planner)
    # the frame the advisor stage evaluates again on each service.evaluate: an empty snapshot
    # (the stub planner reads only its time) and a report of one fragmented cluster
    stage = advisor_stage(service)
    stage.steerer = None  # the stub report below has no fleet to steer
    stage.last = Frame(FleetSnapshot(START), report=SimpleNamespace(  # type: ignore[arg-type]
        cluster=SimpleNamespace(index=80.0, allocated_ratio=0.5), pools=()))
    return service


def served(service: AdvisorService, name: str) -> dict[tuple, float]:
    for family in service.families(FleetSnapshot(START)):
        if family.name == name:
            return {labels: value for labels, value in family.samples}
    raise KeyError(name)


async def run_until(deliverer: Deliverer, done, linger: float = 0.0, timeout: float = 10.0) -> None:
    """The webhook tests' runner (stops on the deliverer's own state), then ``done()`` must hold."""
    await _run_until(deliverer, done, timeout=timeout, linger=linger)
    assert done()


async def test_a_full_disk_keeps_the_plan_holds_the_cooldown_and_delivers_once_space_returns(
        aiohttp_server, tmp_path):
    scheduler = Scheduler()
    server = await aiohttp_server(scheduler.app())
    clock = Clock()
    store, conn = full_disk_store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    deliverer = Deliverer(store, (receiver,), base_delay=0.01, max_delay=0.05,
                          clock=Clock(running=True))
    service = service_with(deliverer, clock)

    conn.full = True
    advice = await service.evaluate("snapshot")
    assert advice is not None and advice.decision == "compact"
    plan_id = advice.plan.plan_id
    assert store.status_of("slurm", plan_id) is None  # nothing written...
    assert deliverer.unwritten_plans() == 1  # ...but kept, not dropped
    assert store.errors["insert"] == 1
    errors = served(service, "gpufleet_advisor_outbox_errors_total")
    assert errors[(("operation", "insert"),)] == 1.0
    assert errors[(("operation", "update"),)] == 0.0  # every operation is served from zero
    assert service.advisor.last_plan_at is None  # no cooldown for a plan nobody can receive

    clock.now += 60  # the next snapshot, the disk still full: the plan is proposed again
    advice = await service.evaluate("snapshot")
    assert advice is not None and advice.decision == "compact"
    assert advice.plan.plan_id == plan_id  # the same plan (the same moves)
    newer = advice.plan
    assert deliverer.unwritten_plans() == 1  # the newer copy replaced the older one
    assert store.errors["insert"] == 3  # the retry of the kept plan, then the new one

    conn.full = False  # space returns: the deliverer's next round writes and delivers it
    await run_until(deliverer, lambda: deliverer.results[("slurm", "delivered")] == 1, linger=0.2)
    assert deliverer.unwritten_plans() == 0
    assert len(scheduler.accepted) == 1 and scheduler.bad_signatures == 0
    assert scheduler.accepted[0]["plan_id"] == plan_id
    assert scheduler.accepted[0] == plan_json(newer)  # the newer copy
    assert store.status_of("slurm", plan_id) == ("delivered", 1, "")

    clock.now += 60  # now that the plan is durable, the cooldown runs
    advice = await service.evaluate("snapshot")
    assert advice is not None and advice.decision == "cooldown"
    assert service.advisor.last_plan_at is not None
    assert len(scheduler.accepted) == 1


async def test_space_returning_before_the_next_evaluation_writes_the_plan_then(tmp_path):
    clock = Clock()
    store, conn = full_disk_store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", "http://127.0.0.1:9/gpufleet", SECRET)
    deliverer = Deliverer(store, (receiver,), clock=clock)
    service = service_with(deliverer, clock)
    conn.full = True
    advice = await service.evaluate("snapshot")
    assert advice is not None
    conn.full = False
    clock.now += 60
    advice = await service.evaluate("snapshot")
    # the kept plan is written first, which starts the cooldown: no second plan
    assert advice is not None and advice.decision == "cooldown"
    assert deliverer.unwritten_plans() == 0
    assert store.pending_count() == 1
    assert service.advisor.last_plan_at == START + 60


async def test_an_expired_plan_proposed_again_is_delivered(aiohttp_server, tmp_path):
    scheduler = Scheduler(fail_first=2)  # down for the first proposal, and once for the second
    server = await aiohttp_server(scheduler.app())
    clock = Clock(running=True)
    store = Store(tmp_path / "outbox.sqlite")
    receiver = Receiver("slurm", str(server.make_url("/gpufleet")), SECRET, timeout=2)
    # a retry a minute or more away: the first proposal is tried once before it expires
    deliverer = Deliverer(store, (receiver,), base_delay=100, max_delay=100, clock=clock)

    def body(expires_at: float) -> bytes:
        return json.dumps({"plan_id": "plan-same", "expires_at": expires_at}).encode()

    assert deliverer.enqueue("plan-same", body(START + 900), START + 900) == 1
    await run_until(deliverer, lambda: deliverer.results[("slurm", "retry")] == 1)
    clock.now += 1000  # the receiver is still down when the plan expires
    deliverer.wake()
    await run_until(deliverer, lambda: deliverer.results[("slurm", "expired")] == 1)
    assert store.status_of("slurm", "plan-same")[0] == "expired"

    # the advisor proposes the identical plan again: a new proposal, delivered
    deliverer.base_delay, deliverer.max_delay = 0.01, 0.02
    expires = clock() + 900
    assert deliverer.enqueue("plan-same", body(expires), expires) == 1
    assert deliverer.enqueue("plan-same", body(expires), expires) == 0  # pending: queued once
    await run_until(deliverer, lambda: deliverer.results[("slurm", "delivered")] == 1, linger=0.2)
    assert [p["expires_at"] for p in scheduler.accepted] == [expires]
    first, retried, accepted = (headers for headers, _ in scheduler.requests)
    # a retry of the same proposal is the same delivery with the same key; a new one is not
    assert retried[IDEMPOTENCY_HEADER] == accepted[IDEMPOTENCY_HEADER]
    assert retried[DELIVERY_HEADER] == accepted[DELIVERY_HEADER]
    assert first[IDEMPOTENCY_HEADER] == "plan-same"  # the first proposal's key is the plan id
    assert accepted[IDEMPOTENCY_HEADER] != first[IDEMPOTENCY_HEADER]
    assert store.status_of("slurm", "plan-same") == ("delivered", 2, "HTTP 503")
    # delivered and still valid: the scheduler has it, so the same plan is not sent again
    assert deliverer.enqueue("plan-same", body(expires), expires) == 0


def test_a_rejected_or_delivered_and_expired_plan_may_be_proposed_again(tmp_path):
    store = Store(tmp_path / "outbox.sqlite")
    first = store.enqueue("slurm", "plan-r", b"{}", START, START + 900)
    assert first is not None
    store.rejected(first, START + 1, "HTTP 400")
    assert store.enqueue("slurm", "plan-r", b"{}", START + 2, START + 902) is not None
    delivered = store.enqueue("slurm", "plan-d", b"{}", START, START + 900)
    assert delivered is not None
    store.delivered(delivered, START + 1)
    assert store.enqueue("slurm", "plan-d", b"{}", START + 2, START + 902) is None  # still valid
    assert store.enqueue("slurm", "plan-d", b"{}", START + 901, START + 1801) is not None


def test_an_outbox_from_before_proposals_is_migrated(tmp_path):
    """A file written by the previous schema (UNIQUE (receiver, plan_id)) keeps its rows."""
    path = tmp_path / "outbox.sqlite"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE deliveries (
            delivery_id TEXT PRIMARY KEY, receiver TEXT NOT NULL, plan_id TEXT NOT NULL,
            body BLOB NOT NULL, created_at REAL NOT NULL, expires_at REAL,
            attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending', last_error TEXT NOT NULL DEFAULT '',
            finished_at REAL, UNIQUE (receiver, plan_id));
        INSERT INTO deliveries (delivery_id, receiver, plan_id, body, created_at, expires_at,
                                next_attempt_at, status, finished_at)
        VALUES ('d1', 'slurm', 'plan-old', X'7B7D', 1, 2, 1, 'expired', 3),
               ('d2', 'slurm', 'plan-new', X'7B7D', 1, NULL, 1, 'pending', NULL);
    """)
    old.close()
    store = Store(path)
    assert store.status_of("slurm", "plan-new") == ("pending", 0, "")
    assert [d.delivery_id for d in store.due(START)] == ["d2"]
    assert store.enqueue("slurm", "plan-old", b"{}", START, START + 900) is not None


def test_finished_rows_are_pruned_after_the_retention(tmp_path):
    store = Store(tmp_path / "outbox.sqlite")
    delivered = store.enqueue("slurm", "plan-1", b"{}", START, START + 900)
    expired = store.enqueue("slurm", "plan-2", b"{}", START, START + 900)
    store.enqueue("slurm", "plan-3", b"{}", START, None)  # pending: never pruned
    assert delivered is not None and expired is not None
    store.delivered(delivered, START + 10)
    store.expired(expired, START + 1000)
    assert store.prune(before=START + 10) == 0  # kept for exactly the retention, not less
    assert store.prune(before=START + 11) == 1
    assert store.status_of("slurm", "plan-1") is None
    assert store.status_of("slurm", "plan-2")[0] == "expired"
    assert store.prune(before=START + 9 * DAY) == 1
    assert store.status_of("slurm", "plan-3")[0] == "pending"


async def test_the_deliverer_prunes_with_its_retention(tmp_path):
    clock = Clock(START + 8 * DAY)
    store = Store(tmp_path / "outbox.sqlite")
    old = store.enqueue("slurm", "plan-old", b"{}", START, START + 900)
    recent = store.enqueue("slurm", "plan-recent", b"{}", START, START + 900)
    assert old is not None and recent is not None
    store.delivered(old, START)
    store.delivered(recent, START + 2 * DAY)
    deliverer = Deliverer(store, (), clock=clock, retention=7 * DAY)
    await run_until(deliverer, lambda: store.status_of("slurm", "plan-old") is None)
    assert store.status_of("slurm", "plan-recent")[0] == "delivered"


def test_retention_is_an_advisor_option(tmp_path):
    assert AdvisorConfig().outbox_retention == 7 * DAY
    config = AdvisorConfig(outbox=str(tmp_path / "o.sqlite"), outbox_retention=Duration(3600))
    service = build_service(config, LiveAnalyzer.from_config(AnalysisConfig()), environ={})
    try:
        assert service.deliverer.retention == 3600
    finally:
        service.deliverer.store.close()


async def test_shutdown_gives_a_kept_plan_a_last_write(tmp_path):
    clock = Clock()
    path = tmp_path / "outbox.sqlite"
    store, conn = full_disk_store(path)
    receiver = Receiver("slurm", "http://127.0.0.1:9/gpufleet", SECRET)
    # the deliverer's own retry is a second or more away (base_delay 1 s): the close writes it
    deliverer = Deliverer(store, (receiver,), clock=clock)
    service = service_with(deliverer, clock)
    lifecycle = service.background(None)  # type: ignore[arg-type]
    await lifecycle.__anext__()  # started: the deliverer runs
    conn.full = True
    advice = await service.evaluate("snapshot")
    assert advice is not None and deliverer.unwritten_plans() == 1
    conn.full = False
    with contextlib.suppress(StopAsyncIteration):
        await lifecycle.__anext__()  # the app's cleanup
    reopened = Store(path)
    try:
        assert reopened.status_of("slurm", advice.plan.plan_id)[0] == "pending"
    finally:
        reopened.close()
