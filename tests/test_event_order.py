"""Remediation events apply in order, and ``gpufleet act`` reads bounded input.

Per node, a later event is never delivered before an earlier one (the outbox hands out
only the oldest pending row of a node's line; the deliverer tries the next once the first
is finished), and ``gpufleet act`` refuses an event decided before the newest drain or
resume it has taken for that node (its audit log is the record): either alone keeps a
drain retried through a receiver's outage from undoing the resume decided after it.

``act`` reads its events a bounded line at a time (``/dev/zero``, a FIFO fed an endless
line, a huge line: one line, exit 2), its token file with the bounded reader (regular
files only), its audit log only if it is a regular file, and acts on Slurm only when
``scontrol show node -o NAME`` answers exactly that node.

The last tests run on a real Slurm: the real Deliverer and outbox deliver a drain through
a receiver's outage and then its resume to a receiver that runs ``gpufleet act --slurm
--mode act`` on each body as it arrives, and the node ends resumed.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from exporter.advisor.store import Store
from exporter.advisor.webhook import Deliverer, Receiver, verify
from exporter.advisor.wire import event_body
from exporter.cli import main
from exporter.health.act import MAX_EVENT_BYTES, ActError, Actor
from exporter.health.remediation import Drain, Event, ResetGpu, Resume, encode_event, event_id
from tests.helpers import REPO
from tests.helpers.slurm_cluster import SlurmCluster, running_cluster
from tests.test_advisor_webhook import SECRET

T0 = 1_764_547_200.0
NODE = "gpu-node-1"
DRAIN = Drain(NODE, "a", "XID 79 on GPU 3", T0)
RESET = ResetGpu(NODE, "a", 3, "XID 79 on GPU 3", T0)
RESUME = Resume(NODE, "a", T0, T0 + 3600)


# -- the outbox and the deliverer ------------------------------------------------------------


def enqueue_event(store: Store, receiver: str, event: Event) -> str | None:
    node = None if not hasattr(event, "node") else event.node
    return store.enqueue(receiver, event_id(event), event_body(event), T0, None, node)


def test_the_outbox_hands_out_only_the_oldest_pending_event_of_a_node(tmp_path):
    store = Store(tmp_path / "outbox.sqlite")
    other = Drain("gpu-node-2", "a", "XID 79 on GPU 0", T0 + 10)
    ids = {e: enqueue_event(store, "r1", e) for e in (DRAIN, RESET, RESUME, other)}
    plan = store.enqueue("r1", "plan-abc", b"{}", T0, T0 + 900)
    second = enqueue_event(store, "r2", RESUME)  # another receiver's line is its own
    assert {d.delivery_id for d in store.pending()} == {ids[DRAIN], ids[other], plan, second}
    assert {d.delivery_id for d in store.due(T0 + 1)} == {ids[DRAIN], ids[other], plan, second}
    store.retry_at(ids[DRAIN], T0 + 60, "HTTP 503")  # the drain keeps its backoff
    assert ids[RESET] not in {d.delivery_id for d in store.due(T0 + 61)}
    store.delivered(ids[DRAIN], T0 + 61)
    assert {d.delivery_id for d in store.pending()} == {ids[RESET], ids[other], plan, second}
    store.rejected(ids[RESET], T0 + 62, "HTTP 400")  # finished either way: the next goes
    assert [d.delivery_id for d in store.pending() if d.order_key == NODE] == [ids[RESUME], second]
    assert store.pending_count() == 5 - 2 + 1


def test_pending_events_of_an_outbox_from_before_the_order_are_ordered(tmp_path):
    """A file of the previous schema (no order_key) is given the column, and its pending
    events their node, so the drain still goes before the resume queued behind it."""
    path = tmp_path / "outbox.sqlite"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE deliveries (
            delivery_id TEXT PRIMARY KEY, receiver TEXT NOT NULL, plan_id TEXT NOT NULL,
            proposal INTEGER NOT NULL DEFAULT 1, body BLOB NOT NULL, created_at REAL NOT NULL,
            expires_at REAL, attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending', last_error TEXT NOT NULL DEFAULT '',
            finished_at REAL, UNIQUE (receiver, plan_id, proposal));
        CREATE TABLE advisor_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """)
    rows = [("d1", DRAIN, T0 + 300), ("d2", RESUME, T0), ("d3", Drain("n2", "a", "x", T0), T0)]
    old.executemany("INSERT INTO deliveries (delivery_id, receiver, plan_id, body, created_at,"
                    " next_attempt_at) VALUES (?, 'r', ?, ?, ?, ?)",
                    [(d, event_id(e), event_body(e), T0, due) for d, e, due in rows])
    old.commit()
    old.close()
    store = Store(path)
    assert sorted(d.delivery_id for d in store.pending()) == ["d1", "d3"]
    store.delivered("d1", T0 + 301)
    assert sorted(d.delivery_id for d in store.pending()) == ["d2", "d3"]


class Receiver503:
    """A receiver that answers 503 while ``down``, else records each verified body, in order."""

    def __init__(self) -> None:
        self.down = True
        self.requests: list[tuple[str, int]] = []  # (event id, status), in arrival order

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        assert verify(body, SECRET, request.headers.get("X-Gpufleet-Signature", ""))
        status = 503 if self.down else 200
        self.requests.append((json.loads(body).get("id") or json.loads(body)["plan_id"], status))
        return web.Response(status=status)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        return app


async def run_until(deliverer: Deliverer, done, timeout: float = 30.0) -> None:
    task = asyncio.create_task(deliverer.run())
    try:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_drain_retried_through_an_outage_is_not_overtaken_by_its_resume(aiohttp_server, tmp_path):
    receiver = Receiver503()
    server = await aiohttp_server(receiver.app())
    store = Store(tmp_path / "outbox.sqlite")
    # the first retry comes 1 to 2 s after the first attempt: long after the resume is queued
    deliverer = Deliverer(store, (Receiver("r", str(server.make_url("/hook")), SECRET),),
                          base_delay=2.0, max_delay=2.0)
    other = Drain("gpu-node-2", "a", "XID 79 on GPU 0", T0 + 3600)
    assert deliverer.enqueue_event(event_id(DRAIN), event_body(DRAIN)) == 1
    task = asyncio.create_task(run_until(deliverer, lambda: deliverer.results[("r", "retry")] == 1))
    await task
    receiver.down = False  # the receiver is back, the drain waits out its backoff
    for event in (RESUME, other):
        assert deliverer.enqueue_event(event_id(event), event_body(event)) == 1
    deliverer.enqueue("plan-abc", b'{"plan_id": "plan-abc"}', time.time() + 600)
    await run_until(deliverer, lambda: store.pending_count() == 0)
    drain, resume = event_id(DRAIN), event_id(RESUME)
    # the other node's drain and the plan are not held up; the resume never goes before the drain
    assert receiver.requests[0] == (drain, 503)
    assert sorted(receiver.requests[1:3]) == [(event_id(other), 200), ("plan-abc", 200)]
    assert receiver.requests[3:] == [(drain, 200), (resume, 200)]
    assert store.status_of("r", resume) == ("delivered", 1, "")
    assert store.status_of("r", drain) == ("delivered", 2, "HTTP 503")


# -- act: the order, by itself ---------------------------------------------------------------


def scontrol(tmp_path: Path, show: str) -> tuple[Path, Path]:
    """An scontrol that logs its arguments and answers ``show`` (``$4``: the node) to show."""
    calls, script = tmp_path / "calls", tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nif [ "$1" = show ]; then {show}; fi\n')
    script.chmod(0o755)
    return script, calls


OURS = 'echo "NodeName=$4 State=IDLE+DRAIN Reason=gpufleet: XID 79 on GPU 3 [root@now]"'


def act(tmp_path: Path, script: Path, *events: Event, mode: str = "act") -> int:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    return main(["act", "--slurm", "--mode", mode, "--events", str(path), "--scontrol", str(script),
                 "--audit-log", str(tmp_path / "audit.jsonl")])


def audit(tmp_path: Path) -> list[tuple[str, str, str]]:
    return [(r["mode"], r["id"], r["outcome"])
            for r in map(json.loads, (tmp_path / "audit.jsonl").read_text().splitlines())]


def test_act_refuses_a_drain_that_arrives_after_the_resume_that_undid_it(tmp_path, capsys):
    script, calls = scontrol(tmp_path, OURS)
    stale = (f"gpufleet act: {event_id(DRAIN)}: refused, stale: decided before "
             f"{event_id(RESUME)}, already taken for this node\n")
    assert act(tmp_path, script, RESUME, DRAIN, RESET) == 0
    assert calls.read_text().splitlines() == [f"show node -o {NODE}",
                                              f"update NodeName={NODE} State=RESUME"]
    assert capsys.readouterr().err == stale + stale.replace(event_id(DRAIN), event_id(RESET))
    assert audit(tmp_path) == [("act", event_id(RESUME), "done"), ("act", event_id(DRAIN), "refused"),
                               ("act", event_id(RESET), "refused")]
    # another run: the audit log is the record
    assert act(tmp_path, script, DRAIN) == 0
    assert capsys.readouterr().err == stale
    assert len(calls.read_text().splitlines()) == 2
    # dry-run says the same, and prints no command for it
    assert act(tmp_path, script, DRAIN, mode="dry-run") == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("", stale)
    # a drain decided later is acted on; another node is not held by this one's order
    later = Drain(NODE, "a", "XID 79 on GPU 3", T0 + 7200)
    elsewhere = Drain("gpu-node-2", "a", "XID 79 on GPU 0", T0)
    assert act(tmp_path, script, later, elsewhere) == 0
    assert calls.read_text().splitlines()[2:] == [
        f"show node -o {NODE}", f'update NodeName={NODE} State=DRAIN Reason=gpufleet: XID 79 on GPU 3',
        "show node -o gpu-node-2", "update NodeName=gpu-node-2 State=DRAIN Reason=gpufleet: XID 79 on GPU 0"]


def test_a_resume_skipped_on_an_undrained_node_still_outdates_the_older_drain(tmp_path, capsys):
    """The issue's case: the resume comes first, finds the node not drained and is skipped;
    the drain retried through the outage comes next and must not take the node out."""
    script, calls = scontrol(tmp_path, 'echo "NodeName=$4 State=IDLE"')
    assert act(tmp_path, script, RESUME, DRAIN) == 0
    assert calls.read_text().splitlines() == [f"show node -o {NODE}"]  # no update at all
    assert [outcome for _, _, outcome in audit(tmp_path)] == ["skipped", "refused"]
    assert capsys.readouterr().err.count("\n") == 1


def test_in_order_drain_reset_resume_are_all_taken_and_a_replay_is_skipped(tmp_path, capsys):
    script, calls = scontrol(tmp_path, OURS)
    assert act(tmp_path, script, DRAIN, RESET, RESUME) == 0
    # replayed: what was done is skipped, not refused; the reset is advice from before the
    # resume taken since, stale now, so it is not advised again
    assert act(tmp_path, script, DRAIN, RESET, RESUME) == 0
    assert [outcome for _, _, outcome in audit(tmp_path)] == [
        "done", "advice", "done", "skipped", "refused", "skipped"]
    assert len(calls.read_text().splitlines()) == 4


# -- act: Slurm must name exactly the node ---------------------------------------------------


@pytest.mark.parametrize("show", [
    'echo "NodeName=$4 State=IDLE"; echo "NodeName=$4-b State=IDLE"',  # a NodeSet: several
    'echo "NodeName=gpu-node-9 State=IDLE"',  # another node answers for the name
    "true",  # nothing
])
def test_act_refuses_a_name_slurm_does_not_answer_as_exactly_one_node(tmp_path, capsys, show):
    script, calls = scontrol(tmp_path, show)
    assert act(tmp_path, script, DRAIN) == 1
    assert calls.read_text().splitlines() == [f"show node -o {NODE}"]  # no update
    err = capsys.readouterr().err
    assert err.startswith(f"gpufleet act: {event_id(DRAIN)}: scontrol show node {NODE}: answers ")
    assert err.endswith("not exactly the node of that name (a NodeSet?); not acting\n")
    assert err.count("\n") == 1


# -- act: bounded input ----------------------------------------------------------------------


def act_process(*args: str, stdin=None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``gpufleet act`` in its own process under a 1 GiB address-space limit, so reading an
    endless line whole fails (MemoryError) instead of taking the machine."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([sys.executable, "-m", "exporter", "act", *args], stdin=stdin,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          timeout=timeout, check=False, preexec_fn=limit)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield path


def feed(path: Path, data: bytes, times: int) -> threading.Thread:
    """Write ``data`` ``times`` times into the FIFO, until its reader goes."""
    def write() -> None:
        try:
            with open(path, "wb") as pipe:
                for _ in range(times):
                    pipe.write(data)
        except (BrokenPipeError, OSError):
            pass

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_events_from_dev_zero_a_fifo_or_a_huge_line_are_one_line_exit_2(tmp_path, fifo):
    long = f"line 1: longer than {MAX_EVENT_BYTES} bytes"
    done = act_process("--slurm", "--events", "/dev/zero", "--audit-log", str(tmp_path / "a"))
    assert (done.returncode, done.stderr.decode()) == (2, f"gpufleet: --events /dev/zero: {long}\n")
    # 4 GB down a FIFO, without a newline
    writer = feed(fifo, b"x" * (1 << 20), 4096)
    done = act_process("--slurm", "--events", str(fifo), "--audit-log", str(tmp_path / "a"))
    assert (done.returncode, done.stderr.decode()) == (2, f"gpufleet: --events {fifo}: {long}\n")
    writer.join(10)
    # one good event, then a line one byte too long: the first is handled, the second refused
    huge = tmp_path / "huge.jsonl"
    huge.write_bytes(encode_event(RESET) + b"\n" + b" " * (MAX_EVENT_BYTES + 1) + b"\n")
    done = act_process("--slurm", "--events", str(huge), "--audit-log", str(tmp_path / "a"))
    assert done.returncode == 2
    assert done.stderr.decode().endswith(f"gpufleet: --events {huge}: line 2: longer than "
                                         f"{MAX_EVENT_BYTES} bytes\n")
    # stdin is read the same way
    with open("/dev/zero", "rb") as zero:
        done = act_process("--slurm", "--audit-log", str(tmp_path / "a"), stdin=zero)
    assert (done.returncode, done.stderr.decode()) == (2, f"gpufleet: --events -: {long}\n")
    # a line of exactly the limit is an event's line (here: not JSON, said as such)
    exact = tmp_path / "exact.jsonl"
    exact.write_bytes(b"x" * MAX_EVENT_BYTES + b"\n")
    done = act_process("--slurm", "--events", str(exact), "--audit-log", str(tmp_path / "a"))
    assert done.returncode == 2 and "line 1: remediation event: not JSON" in done.stderr.decode()


def test_a_token_file_that_is_a_fifo_or_a_device_is_one_line_exit_2(tmp_path, fifo):
    events = tmp_path / "none.jsonl"
    events.write_text("")
    for path, why in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"),
                      (tmp_path / "missing", "cannot read: No such file or directory")):
        done = act_process("--kubernetes", "--mode", "dry-run", "--api-server", "http://127.0.0.1:9",
                           "--token-file", str(path), "--events", str(events), timeout=30)
        assert (done.returncode, done.stderr.decode()) == (2, f"gpufleet: --token-file {path}: {why}\n")
    big = tmp_path / "big"
    big.write_bytes(b"t" * (64 * 1024 + 1))
    done = act_process("--kubernetes", "--mode", "dry-run", "--api-server", "http://127.0.0.1:9",
                       "--token-file", str(big), "--events", str(events), timeout=30)
    assert (done.returncode, done.stderr.decode()) == (
        2, f"gpufleet: --token-file {big}: 65537 bytes, over the 65536-byte limit\n")


def test_an_audit_log_that_is_a_fifo_is_one_line_exit_2(tmp_path, fifo):
    events = tmp_path / "events.jsonl"
    events.write_bytes(encode_event(RESET) + b"\n")
    done = act_process("--slurm", "--events", str(events), "--audit-log", str(fifo), timeout=30)
    assert (done.returncode, done.stderr.decode()) == (
        2, f"gpufleet: --audit-log {fifo}: not a regular file\n")
    # an audit log line past any record's size is skipped, not read whole
    log = tmp_path / "audit.jsonl"
    log.write_bytes(b"x" * (1 << 20) + b"\n" + json.dumps({
        "mode": "act", "id": event_id(RESUME), "type": "resume", "outcome": "done",
        "event": json.loads(encode_event(RESUME))}).encode() + b"\n")
    actor = Actor("slurm", "act", log, sys.stdout)
    assert actor.done == {event_id(RESUME)}
    assert actor.newest == {NODE: (round(RESUME.at * 1000), event_id(RESUME))}


# -- on a real Slurm -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with running_cluster(Path(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


def state_of(slurm: SlurmCluster, node: str) -> tuple[str, bool]:
    """(State=, whether Slurm keeps a Reason) of ``node``."""
    shown = slurm.run("scontrol", "show", "node", "-o", node)
    return shown.split(" State=", 1)[1].split(" ", 1)[0], " Reason=" in shown


class ActingReceiver:
    """A scheduler's receiver: answers 503 while ``down``; else runs ``gpufleet act --slurm
    --mode act`` on each body as it arrives, then answers 200."""

    def __init__(self, slurm: SlurmCluster, audit_log: Path) -> None:
        self.slurm, self.audit_log = slurm, audit_log
        self.down = True
        self.received: list[tuple[str, int]] = []  # (event type, status)
        self.acted: list[tuple[int, bytes]] = []  # act's exit status and stderr, per body

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not verify(body, SECRET, request.headers.get("X-Gpufleet-Signature", "")):
            return web.Response(status=401)
        if self.down:
            self.received.append((json.loads(body)["type"], 503))
            return web.Response(status=503)
        self.received.append((json.loads(body)["type"], 200))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "exporter", "act", "--slurm", "--mode", "act",
            "--audit-log", str(self.audit_log), stdin=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            env={**self.slurm.env, "PYTHONPATH": str(REPO)})
        _, err = await proc.communicate(body + b"\n")
        self.acted.append((proc.returncode or 0, err))
        return web.Response(status=200)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        return app


@pytest.mark.slow
async def test_on_slurm_a_drain_retried_through_an_outage_and_overtaken_leaves_the_node_resumed(
        slurm, aiohttp_server, tmp_path):
    node, now = "gpu-006", time.time()
    drain = Drain(node, "gpu-h100", "XID 79 on GPU 3", now)
    resume = Resume(node, "gpu-h100", now, now + 60)
    receiver = ActingReceiver(slurm, tmp_path / "audit.jsonl")
    server = await aiohttp_server(receiver.app())
    store = Store(tmp_path / "outbox.sqlite")
    deliverer = Deliverer(store, (Receiver("slurm", str(server.make_url("/hook")), SECRET,
                                            timeout=60),), base_delay=2.0, max_delay=2.0)
    try:
        deliverer.enqueue_event(event_id(drain), event_body(drain))
        await run_until(deliverer, lambda: deliverer.results[("slurm", "retry")] == 1)
        receiver.down = False  # the receiver is back; the resume is decided meanwhile
        deliverer.enqueue_event(event_id(resume), event_body(resume))
        await run_until(deliverer, lambda: store.pending_count() == 0, timeout=120)
        assert receiver.received == [("drain", 503), ("drain", 200), ("resume", 200)]
        assert receiver.acted == [(0, b""), (0, b"")]
        state, reason = state_of(slurm, node)
        assert "DRAIN" not in state and not reason, state
        records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [(r["type"], r["outcome"]) for r in records] == [("drain", "done"), ("resume", "done")]
    finally:
        store.close()
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


@pytest.mark.slow
def test_on_slurm_act_alone_refuses_the_stale_drain(slurm, tmp_path):
    """Fed out of order by hand (the deliverer's order aside): the resume finds the node in
    service and is skipped, the older drain is refused; the node stays in service."""
    node, now = "gpu-007", time.time()
    drain = Drain(node, "gpu-h100", "XID 79 on GPU 3", now)
    resume = Resume(node, "gpu-h100", now, now + 60)
    events = tmp_path / "events.jsonl"
    events.write_bytes(encode_event(resume) + b"\n" + encode_event(drain) + b"\n")
    done = subprocess.run([sys.executable, "-m", "exporter", "act", "--slurm", "--mode", "act",
                           "--events", str(events), "--audit-log", str(tmp_path / "audit.jsonl")],
                          env={**slurm.env, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0
    assert done.stderr == (f"gpufleet act: {event_id(drain)}: refused, stale: decided before "
                           f"{event_id(resume)}, already taken for this node\n")
    assert "DRAIN" not in state_of(slurm, node)[0]
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["type"], r["outcome"]) for r in records] == [("resume", "skipped"), ("drain", "refused")]


@pytest.mark.slow
def test_on_slurm_a_name_that_answers_several_nodes_is_refused(slurm, tmp_path):
    """Slurm answers a hostlist with each node it names: act's pre-check takes only one."""
    actor = Actor("slurm", "act", None, sys.stdout, env=slurm.env)
    assert actor._one_node("gpu-005").startswith("NodeName=gpu-005 ")
    with pytest.raises(ActError, match=r"gpu-00\[5-6\]: answers 2 node\(s\), not exactly"):
        actor._one_node("gpu-00[5-6]")
    with pytest.raises(ActError, match="Node ALL not found"):
        actor._one_node("ALL")
