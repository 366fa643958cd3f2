"""Deliver plans to schedulers: signed, idempotent, retried, from the durable store.

Each POST carries ``X-Gpufleet-Signature: sha256=<HMAC-SHA256 of the body>``,
``X-Gpufleet-Delivery: <delivery id>`` and ``Idempotency-Key: <plan id>`` (``<plan id>.<n>``
for the n-th proposal of the same plan, n >= 2: see :class:`~exporter.advisor.store.Delivery`)
and ``X-Gpufleet-Event: plan``, or ``remediation`` for a remediation event (issue 31: drain,
reset_gpu, resume, replace, page; its id, e.g. ``drain:gpu-003:1764547230000``, is the
Idempotency-Key and the store's key, so an event is delivered once).
Timeouts, connection errors, 5xx and 429 are retried with exponential backoff
and jitter (``Retry-After`` is honoured); any other 4xx is final, because the
receiver told us the request itself is wrong and repeating it will not help.
A 3xx is retried too, never followed (:mod:`exporter.http_client`): the signed body
goes to the configured URL only. So is an answer over ``MAX_ANSWER_BYTES``, read no
further: its status line alone is not taken as a delivery.
Deliveries run one at a time, so a plan never reaches a receiver twice
concurrently; the store row is marked delivered before the next is tried.

Order: a remediation event is queued with its node as its store order key, so per
receiver and node the events go in the order they were decided: a later one is not tried
while an earlier one is pending (it waits behind it, whatever the earlier one's backoff).
A drain retried through a receiver's outage is not overtaken by the resume decided after
it. Plans are not ordered: each has its own expiry, and a newer one does not depend on an
older one's delivery.

Each result is counted (:attr:`Deliverer.results`) before its store row
changes, and a store call once begun is finished even if the deliverer is
cancelled meanwhile: whoever sees a row ``delivered`` sees it counted, and
when :meth:`Deliverer.run` has ended no write is still landing behind it.

A plan the store cannot take (a full disk, a read-only file) is kept in memory,
the latest one per receiver, and written again on every delivery round (with
backoff) and on every :meth:`Deliverer.enqueue`; :meth:`Deliverer.unwritten_plans`
tells the advisor whether its plan is durable yet. One per receiver because the
advisor has one current plan: a newer one comes from a newer snapshot and
supersedes the unwritten older one, which would move jobs by a stale picture.

Time (issue 32, finding 5): the schedule runs on the monotonic clock. The store's
``next_attempt_at`` is wall time, written for the record and read once, when a row is
first seen (a new one is due at once; one left by an earlier process is due within
``max_delay`` at most); from then on the deliverer's own monotonic due times decide. A
wall clock stepped back an hour neither stalls deliveries for that hour nor, stepped
forward, sends the retries early. Plan expiry stays wall time: it is the plan's own
``expires_at``, on the wire.

Outcomes (finding 7): a receiver's answer whose record the store cannot take (a full
disk fails the ``delivered`` UPDATE) is held in memory with its outcome, and only the
write is retried, with exponential backoff: the delivery is never POSTed again by this
process (after a restart the row is pending and goes once more, with the same
``Idempotency-Key``). A retry whose ``retry_at`` UPDATE fails keeps its backoff in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import hashlib
import hmac
import logging
import random
import sqlite3
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import aiohttp

from exporter import __version__, http_client
from exporter.advisor.plan import CompactionPlan
from exporter.advisor.store import Delivery, Store, event_order_key
from exporter.advisor.wire import plan_body
from exporter.aio import complete

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Gpufleet-Signature"
DELIVERY_HEADER = "X-Gpufleet-Delivery"
IDEMPOTENCY_HEADER = "Idempotency-Key"
EVENT_HEADER = "X-Gpufleet-Event"  # plan, or remediation (issue 31): what the body is
PLAN, EVENT = "plan", "remediation"
MAX_RETRY_AFTER = 3600.0  # a receiver asking for more than an hour is treated as asking for an hour
DEFAULT_RETENTION = 7 * 86400.0  # finished store rows kept a week: long after any plan's expiry
PRUNE_EVERY = 3600.0  # one DELETE an hour keeps the file small; retention is days
MAX_ANSWER_BYTES = 64 * 1024  # a receiver's answer: its status decides, the body is not used

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Receiver:
    name: str
    url: str
    secret: bytes
    timeout: float = 10.0


def sign(body: bytes, secret: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(body: bytes, secret: bytes, header: str) -> bool:
    """What a receiver does: recompute the signature and compare in constant time."""
    return hmac.compare_digest(sign(body, secret), header or "")


def backoff(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with equal jitter: half fixed, half random, so retries spread out."""
    delay = min(cap, base * 2 ** max(0, attempt))
    return delay / 2 + rng.uniform(0, delay / 2)


def retry_after_seconds(value: str | None, now: float) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when - now), MAX_RETRY_AFTER)


@dataclass
class Deliverer:
    store: Store
    receivers: tuple[Receiver, ...]
    base_delay: float = 1.0
    max_delay: float = 300.0
    clock: Callable[[], float] = time.time  # wall: the store's stamps and plan expiry
    monotonic: Callable[[], float] = time.monotonic  # the schedule: retries, rewrites, prunes
    rng: random.Random = field(default_factory=random.Random)
    results: Counter = field(default_factory=Counter)  # (receiver, result) -> count
    retention: float = DEFAULT_RETENTION  # finished rows are pruned this long after they finished
    unwritten_per_receiver: int = 1
    unwritten_events_per_receiver: int = 1000  # remediation events: each is owed, none supersedes
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _loop: asyncio.AbstractEventLoop | None = None  # run()'s, for wake() from worker threads
    # what the store could not take yet: (receiver, plan | event) -> (id, body, expires at),
    # oldest first
    _unwritten: dict[tuple[str, str], deque[tuple[str, bytes, float | None]]] = \
        field(default_factory=dict)
    _unwritten_lock: threading.Lock = field(default_factory=threading.Lock)
    _write_failures: int = 0
    _next_write_at: float = 0.0  # monotonic, as every _next_* and _due
    _next_prune_at: float = float("-inf")
    _due: dict[str, float] = field(default_factory=dict)  # delivery id -> when it is next tried
    _attempts: dict[str, int] = field(default_factory=dict)  # attempts the store failed to record
    # answers the store could not record: delivery id -> (status, wall time, error)
    _outcomes: dict[str, tuple[str, float, str | None]] = field(default_factory=dict)
    _outcome_failures: int = 0
    _next_outcome_at: float = 0.0
    pending_limit: int = 1000  # pending rows read per round: receivers x open plans, a handful

    def enqueue_plan(self, plan: CompactionPlan) -> int:
        """Queue ``plan`` for every receiver as its JSON body (:func:`wire.plan_body`, the one
        place a plan becomes the bytes the store keeps and the signature covers)."""
        return self.enqueue(plan.plan_id, plan_body(plan), plan.expires_at)

    def enqueue_event(self, event_id: str, body: bytes) -> int:
        """Queue a remediation event (issue 31) for every receiver. Its id is its store key:
        the same event is queued once, and never expires (a drain is owed until delivered).
        One the store cannot take is kept in memory beside the plan, up to
        ``unwritten_events_per_receiver``, oldest dropped first (each dropped one logged)."""
        return self.enqueue(event_id, body, None, kind=EVENT)

    def enqueue(self, plan_id: str, body: bytes, expires_at: float | None, kind: str = PLAN) -> int:
        """Queue the plan (or event) for every receiver; returns how many new deliveries were queued.

        Plans kept from a failed write go first. What the store cannot take now is
        kept (see the module's docstring); :meth:`unwritten_plans` says whether it was.
        """
        limit = self.unwritten_per_receiver if kind == PLAN else self.unwritten_events_per_receiver
        with self._unwritten_lock:
            for r in self.receivers:
                kept = self._unwritten.setdefault((r.name, kind), deque(maxlen=limit))
                for older in [k for k in kept if k[0] == plan_id]:  # the same plan: the newest copy
                    kept.remove(older)
                if kind == EVENT and len(kept) == limit:
                    log.error("remediation event dropped: the outbox cannot take events and "
                              "the memory queue is full", extra={"receiver": r.name, "event": kept[0][0]})
                kept.append((plan_id, body, expires_at))
            return self._write_unwritten()

    def flush(self) -> int:
        """Write the kept plans to the store, if any; returns how many deliveries were queued."""
        with self._unwritten_lock:
            return self._write_unwritten()

    def unwritten_plans(self) -> int:
        """How many plans (over all receivers) wait in memory for the store to take them."""
        with self._unwritten_lock:
            return sum(len(kept) for (_, kind), kept in self._unwritten.items() if kind == PLAN)

    def unwritten(self) -> int:
        """Plans and remediation events waiting in memory for the store."""
        with self._unwritten_lock:
            return sum(len(kept) for kept in self._unwritten.values())

    def _write_unwritten(self) -> int:
        queued = 0
        now = self.clock()
        for (receiver, kind), kept in self._unwritten.items():
            while kept:  # oldest first: an event's place in its node's line is when it was decided
                plan_id, body, expires_at = kept[0]
                order_key = event_order_key(body) if kind == EVENT else None
                try:
                    if self.store.enqueue(receiver, plan_id, body, now, expires_at,
                                           order_key) is not None:
                        queued += 1
                except sqlite3.Error as exc:  # counted by the store; the plan stays in memory
                    delay = backoff(self._write_failures, self.base_delay, self.max_delay, self.rng)
                    self._write_failures += 1
                    self._next_write_at = self.monotonic() + delay
                    log.warning("cannot write the plan to the outbox; kept in memory, will retry",
                                extra={"receiver": receiver, "plan": plan_id, "err": str(exc),
                                       "retry_in_s": round(delay, 2)})
                    if queued:
                        self.wake()
                    return queued
                kept.popleft()
        self._write_failures = 0
        if queued:
            self.wake()
        return queued

    def wake(self) -> None:
        """Start a delivery round now. Safe from any thread: enqueue runs in worker threads,
        and an asyncio.Event may be set only from its loop's thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._wake.set()
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # a worker thread: no running loop
            on_loop = False
        if on_loop:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        """Deliver until cancelled; sleeps until the next due delivery or a new enqueue."""
        self._loop = asyncio.get_running_loop()
        async with http_client.client_session(headers={"User-Agent": f"gpufleet/{__version__}"}) \
                as session:
            while True:
                self._wake.clear()
                try:
                    if self.unwritten() and self.monotonic() >= self._next_write_at:
                        await self._in_store(self.flush)
                    await self.write_outcomes()
                    await self._prune()
                    await self.deliver_due(session)
                    next_at = self.next_due()
                except Exception:  # a broken store row must not end deliveries for good
                    log.exception("delivery round failed")
                    next_at = self.monotonic() + self.base_delay
                if self.unwritten():
                    next_at = min(self._next_write_at, next_at or self._next_write_at)
                if self._outcomes:
                    next_at = min(self._next_outcome_at, next_at or self._next_outcome_at)
                timeout = None if next_at is None else max(0.0, next_at - self.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)

    def next_due(self) -> float | None:
        """The monotonic time of the next attempt, of the deliveries seen; None when none waits."""
        return min((at for d, at in self._due.items() if d not in self._outcomes), default=None)

    async def _prune(self) -> None:
        if self.monotonic() < self._next_prune_at:
            return
        self._next_prune_at = self.monotonic() + PRUNE_EVERY  # a failed prune is retried in an hour too
        try:
            pruned = await self._in_store(self.store.prune, self.clock() - self.retention)
        except sqlite3.Error as exc:  # counted by the store; deliveries go on regardless
            log.warning("cannot prune the outbox; will retry", extra={"err": str(exc)})
            return
        if pruned:
            log.info("pruned finished deliveries", extra={"rows": pruned})

    async def deliver_due(self, session: aiohttp.ClientSession) -> None:
        """Try every pending delivery that is due by the monotonic schedule, or has expired."""
        pending = await self._in_store(self.store.pending, self.pending_limit)
        by_name = {r.name: r for r in self.receivers}
        mono, wall = self.monotonic(), self.clock()
        for delivery in pending:
            key = delivery.delivery_id
            if key in self._outcomes:  # answered already: only its record waits, never a POST
                continue
            if key not in self._due:
                # first seen: due as written, but no later than max_delay from now, so a wall
                # clock stepped since (or another process's) cannot hold it back for longer
                self._due[key] = mono + min(max(0.0, delivery.next_attempt_at - wall), self.max_delay)
            expired = delivery.expires_at is not None and wall >= delivery.expires_at
            if self._due[key] > mono and not expired:
                continue
            attempts = max(delivery.attempts, self._attempts.get(key, 0))
            delivery = dataclasses.replace(delivery, attempts=attempts)
            receiver = by_name.get(delivery.receiver)
            if receiver is None:  # receiver removed from the config: keep the row, say why
                self._due[key] = mono + self.max_delay
                await self._record_retry(delivery, self.max_delay, "receiver not configured")
                continue
            await self._attempt(session, receiver, delivery)
        if len(pending) < self.pending_limit:  # the schedule of rows finished elsewhere goes
            seen = {d.delivery_id for d in pending}
            for gone in [k for k in self._due if k not in seen]:
                self._due.pop(gone, None)
                self._attempts.pop(gone, None)

    async def _finish(self, delivery: Delivery, status: str, error: str | None = None) -> None:
        """Record the outcome; one the store cannot take is held, and only its write retried."""
        key, now = delivery.delivery_id, self.clock()
        self._due.pop(key, None)
        self._attempts.pop(key, None)
        try:
            await self._in_store(self.store.finish, key, status, now, error)
        except sqlite3.Error as exc:  # counted by the store
            self._outcomes[key] = (status, now, error)
            self._outcome_failed(exc)
            return
        if delivery.order_key is not None:  # the next in its line is due now: another round
            self.wake()

    def _outcome_failed(self, exc: sqlite3.Error) -> None:
        delay = backoff(self._outcome_failures, self.base_delay, self.max_delay, self.rng)
        self._outcome_failures += 1
        self._next_outcome_at = self.monotonic() + delay
        log.warning("cannot record a delivery's outcome; held in memory, not sent again",
                    extra={"outcomes": len(self._outcomes), "err": str(exc),
                           "retry_in_s": round(delay, 2)})

    async def write_outcomes(self) -> None:
        """Write the outcomes held in memory, when their backoff allows."""
        if not self._outcomes or self.monotonic() < self._next_outcome_at:
            return
        for key, (status, at, error) in list(self._outcomes.items()):
            try:
                await self._in_store(self.store.finish, key, status, at, error)
            except sqlite3.Error as exc:
                self._outcome_failed(exc)
                return
            del self._outcomes[key]
        self._outcome_failures = 0

    def held_outcomes(self) -> int:
        """How many answered deliveries wait in memory for their outcome to be written."""
        return len(self._outcomes)

    async def _record_retry(self, delivery: Delivery, delay: float, error: str) -> None:
        self._attempts[delivery.delivery_id] = delivery.attempts + 1
        try:
            await self._in_store(self.store.retry_at, delivery.delivery_id, self.clock() + delay, error)
        except sqlite3.Error as exc:  # counted by the store; the schedule in memory holds
            log.warning("cannot record a delivery's retry; its backoff is kept in memory",
                        extra={"plan": delivery.plan_id, "err": str(exc)})

    async def _attempt(self, session: aiohttp.ClientSession, receiver: Receiver,
                       delivery: Delivery) -> None:
        if delivery.expires_at is not None and self.clock() >= delivery.expires_at:
            self._count(receiver, "expired")
            await self._finish(delivery, "expired", "plan expired before delivery")
            return
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(delivery.body, receiver.secret),
            DELIVERY_HEADER: delivery.delivery_id,
            IDEMPOTENCY_HEADER: delivery.idempotency_key,
            EVENT_HEADER: PLAN if delivery.plan_id.startswith("plan-") else EVENT,
        }
        retry_after: float | None = None
        status = 0
        try:
            # never redirected: a 302 would turn the POST into a body-less GET whose 200 reads
            # as delivered, and a 307 re-sends the signed body to whichever host it names
            async with http_client.request(session, "POST", receiver.url, data=delivery.body,
                                           headers=headers, timeout=aiohttp.ClientTimeout(
                                               total=receiver.timeout)) as resp:
                status = resp.status
                retry_after = retry_after_seconds(resp.headers.get("Retry-After"), self.clock())
                if status not in http_client.REDIRECTS:
                    await http_client.read_capped(resp, MAX_ANSWER_BYTES)
        except http_client.AnswerTooLarge as exc:
            # the body is not used, but a receiver's answer is all of it: one past the cap
            # is no answer (the status line of a 1.5 GB body is not trusted), so kept, retried
            await self._retry(receiver, delivery, f"HTTP {status}: {exc}", retry_after)
            return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await self._retry(receiver, delivery, error, None)
            return
        if status in http_client.REDIRECTS:  # not delivered where it was sent: kept, retried
            await self._retry(receiver, delivery, http_client.redirect_refused(status), retry_after)
        elif 200 <= status < 300:
            self._count(receiver, "delivered")
            await self._finish(delivery, "delivered")
            log.info("plan delivered", extra={"receiver": receiver.name, "plan": delivery.plan_id,
                                              "attempts": delivery.attempts + 1})
        elif status == 429 or status >= 500:
            await self._retry(receiver, delivery, f"HTTP {status}", retry_after)
        else:
            self._count(receiver, "rejected")
            await self._finish(delivery, "rejected", f"HTTP {status}")
            log.warning("plan rejected by receiver", extra={"receiver": receiver.name,
                                                            "plan": delivery.plan_id, "status": status})

    async def _retry(self, receiver: Receiver, delivery: Delivery, error: str,
                     retry_after: float | None) -> None:
        delay = backoff(delivery.attempts, self.base_delay, self.max_delay, self.rng)
        if retry_after is not None:
            delay = max(delay, retry_after)
        self._count(receiver, "retry")
        self._due[delivery.delivery_id] = self.monotonic() + delay
        await self._record_retry(delivery, delay, error)
        log.warning("plan delivery failed; will retry", extra={
            "receiver": receiver.name, "plan": delivery.plan_id, "err": error,
            "attempt": delivery.attempts + 1, "retry_in_s": round(delay, 2)})

    def _count(self, receiver: Receiver, result: str) -> None:
        # called before the store row changes: the receiver's answer is in, and a count
        # taken after the write could be lost to a cancellation that the write outlives
        self.results[(receiver.name, result)] += 1

    async def _in_store(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """One store call in a worker thread, finished even if this task is cancelled meanwhile."""
        return await complete(asyncio.to_thread(call, *args, **kwargs))
