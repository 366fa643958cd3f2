"""The durable store, in SQLite (stdlib ``sqlite3``, WAL): the webhook's deliveries (plans,
remediation events), the advisor's state and the remediation state, in one file:
``advisor.outbox`` in the config (the key and the ``gpufleet_advisor_outbox_*`` families
keep their names: users read them).

Advice that cannot be delivered yet is kept, not dropped: every delivery is a
row written before the first attempt, so a crash or restart loses nothing and
a new process on the same file carries on. A row leaves ``pending`` only when
a receiver answered 2xx (``delivered``), gave a final 4xx (``rejected``) or the
plan expired (``expired``).

A delivery is one *proposal* of a plan to a receiver: (receiver, plan id,
proposal) is unique. Enqueuing a plan again is a no-op while its latest
proposal is pending, or delivered and not yet expired (the receiver has it and
it still holds); once that proposal expired, was rejected or was delivered and
then expired, the same plan (the plan id is a content hash, so the same moves
give the same id) is a new proposal with the next number. Finished rows are
deleted by :meth:`Store.prune` after a retention period.

Every failed operation is counted in :attr:`Store.errors` by kind (insert,
update, select, prune) before the error propagates: a full disk shows on
``/metrics``, not only in one log line.

The advisor's own state (its cooldown, its last plan, its dwell clocks: issue 32,
finding 6) is kept in the same file, table ``advisor_state``, so a restart inside the
cooldown proposes no new plan; the remediator's (issue 31: what gpufleet drained, each node's
faults) under the key ``remediation``, so a restart neither drains twice nor forgets a resume.
A file that fails ``PRAGMA integrity_check`` is refused when opened (``gpufleet serve``
exits 2 with one line), not served with holes.

Order: a row may carry an ``order_key`` (a remediation event's node). Of the pending rows
for one receiver with the same key, only the oldest (by creation: SQLite's rowid, which a
new row always takes above every row still there) is handed out by :meth:`Store.pending`
and :meth:`Store.due`; the others wait behind it, so a drain retried through an outage
reaches the receiver before the resume decided after it. Rows without a key (plans, pages)
are not ordered.

The methods are synchronous and quick (one small transaction each); the async
delivery loop calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

OPERATIONS = ("insert", "update", "select", "prune")  # the kinds :attr:`Store.errors` counts
STATE_KEYS = ("advisor", "remediation")  # the rows of advisor_state

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id     TEXT PRIMARY KEY,
    receiver        TEXT NOT NULL,
    plan_id         TEXT NOT NULL,
    proposal        INTEGER NOT NULL DEFAULT 1,
    body            BLOB NOT NULL,
    created_at      REAL NOT NULL,
    expires_at      REAL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending',
    last_error      TEXT NOT NULL DEFAULT '',
    finished_at     REAL,
    order_key       TEXT,
    UNIQUE (receiver, plan_id, proposal)
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (status, next_attempt_at);
CREATE INDEX IF NOT EXISTS deliveries_finished ON deliveries (status, finished_at);
CREATE TABLE IF NOT EXISTS advisor_state (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO advisor_state (key, value) VALUES ('advisor', 'null');
INSERT OR IGNORE INTO advisor_state (key, value) VALUES ('remediation', 'null');
"""
# the row is there from the start: a state write is one UPDATE of a row of the same size,
# never an INSERT that grows the file

# The first schema had UNIQUE (receiver, plan_id) and no proposal: a plan that expired
# could never be sent again. SQLite cannot drop a table constraint, so the table is
# rebuilt once, in one transaction, keeping every row as proposal 1.
_V1_COLUMNS = ("delivery_id, receiver, plan_id, body, created_at, expires_at, attempts, "
               "next_attempt_at, status, last_error, finished_at")
MIGRATE_V1 = f"""
BEGIN IMMEDIATE;
ALTER TABLE deliveries RENAME TO deliveries_v1;
DROP INDEX IF EXISTS deliveries_due;
{SCHEMA}
INSERT INTO deliveries ({_V1_COLUMNS}) SELECT {_V1_COLUMNS} FROM deliveries_v1 ORDER BY rowid;
DROP TABLE deliveries_v1;
COMMIT;
"""
# The second schema had no order_key: the column is added, and the pending remediation
# events it holds get their node as key (:func:`_backfill_order_keys`).
MIGRATE_V2 = """
BEGIN IMMEDIATE;
ALTER TABLE deliveries ADD COLUMN order_key TEXT;
COMMIT;
"""
# a pending row that heads its (receiver, order_key) line, or has no key: the subquery is
# run once per statement (not per row), over the pending rows only
_HEAD = (" AND (order_key IS NULL OR rowid IN (SELECT MIN(rowid) FROM deliveries"
         " WHERE status = 'pending' AND order_key IS NOT NULL GROUP BY receiver, order_key))")


def _backfill_order_keys(db: sqlite3.Connection) -> None:
    """Key the pending remediation events written before rows had keys by their node, as
    :class:`~exporter.advisor.webhook.Deliverer` keys new ones; a plan (``plan-...``) has none."""
    rows = db.execute("SELECT rowid, body FROM deliveries WHERE status = 'pending'"
                      " AND order_key IS NULL AND plan_id NOT LIKE 'plan-%'").fetchall()
    keyed = [(key, rowid) for rowid, body in rows if (key := event_order_key(bytes(body)))]
    if keyed:
        db.execute("BEGIN IMMEDIATE")
        db.executemany("UPDATE deliveries SET order_key = ? WHERE rowid = ? AND order_key IS NULL",
                       keyed)
        db.execute("COMMIT")


def event_order_key(body: bytes) -> str | None:
    """A remediation event's order key: its node (a page, for a pool, has none)."""
    try:
        node = json.loads(body).get("node")
    except (ValueError, AttributeError):
        return None
    return node if isinstance(node, str) and node else None


def connect(path: str) -> sqlite3.Connection:
    """The store's connection: autocommit (transactions are explicit), shared across threads."""
    return sqlite3.connect(path, check_same_thread=False, isolation_level=None)


@dataclass(frozen=True, slots=True)
class Delivery:
    delivery_id: str
    receiver: str
    plan_id: str
    body: bytes
    attempts: int
    expires_at: float | None
    proposal: int = 1
    next_attempt_at: float = 0.0  # wall time, as written: for display, and once after a restart
    order_key: str | None = None  # deliveries with the same key go one at a time, oldest first

    @property
    def idempotency_key(self) -> str:
        """The same for every retry of this delivery, different for another proposal of the plan.

        The first proposal's key is the plan id, as before proposals existed. A receiver
        need remember keys only for a plan's lifetime (``advisor.plan_ttl``): a plan past
        its expiry must not be acted on, and the same plan comes back only as a new proposal.
        """
        return self.plan_id if self.proposal == 1 else f"{self.plan_id}.{self.proposal}"


class Store:
    def __init__(self, path: str | Path,
                 connect: Callable[[str], sqlite3.Connection] = connect) -> None:
        """``connect`` opens the SQLite connection: the seam tests use to fill the disk."""
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.errors: Counter[str] = Counter({operation: 0 for operation in OPERATIONS})
        # one connection guarded by a lock: calls come from worker threads one at a time
        self._db = connect(self.path)
        self._lock = threading.Lock()
        with self._lock:
            try:
                problems = [r[0] for r in self._db.execute("PRAGMA integrity_check").fetchall()]
            except sqlite3.Error:
                self._db.close()
                raise
            if problems != ["ok"]:
                self._db.close()
                first = " ".join(str(problems[0] if problems else "?").split())  # one line
                raise sqlite3.DatabaseError(f"integrity check failed ({len(problems)} problems, "
                                            f"the first: {first})")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a delivery row must survive power loss
            columns = [r[1] for r in self._db.execute("PRAGMA table_info(deliveries)").fetchall()]
            if columns and "proposal" not in columns:
                self._db.executescript(MIGRATE_V1)
            elif columns and "order_key" not in columns:
                self._db.executescript(MIGRATE_V2)
            self._db.executescript(SCHEMA)
            _backfill_order_keys(self._db)

    def _run(self, operation: str, call: Callable[[sqlite3.Connection], T]) -> T:
        """One operation under the lock; a failure is counted, its transaction rolled back."""
        with self._lock:
            try:
                return call(self._db)
            except sqlite3.Error:
                self.errors[operation] += 1
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):  # the first error is the one to report
                        self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def enqueue(self, receiver: str, plan_id: str, body: bytes, now: float,
                expires_at: float | None = None, order_key: str | None = None) -> str | None:
        """Queue ``body`` for ``receiver``; the delivery id, or None while the plan is open there.

        Open: its latest proposal is pending, or delivered and not expired at ``now``.
        ``order_key``: the row waits behind every older pending row with the same key there.
        """
        delivery_id = str(uuid.uuid4())

        def insert(db: sqlite3.Connection) -> str | None:
            db.execute("BEGIN IMMEDIATE")  # another process on the file must not slip in between
            latest = db.execute(
                "SELECT proposal, status, expires_at FROM deliveries WHERE receiver = ?"
                " AND plan_id = ? ORDER BY proposal DESC LIMIT 1", (receiver, plan_id),
            ).fetchone()
            proposal = 1
            if latest is not None:
                last, status, expires = latest
                if status == "pending" or (status == "delivered" and (expires is None or expires > now)):
                    db.execute("COMMIT")
                    return None
                proposal = last + 1
            db.execute(
                "INSERT INTO deliveries (delivery_id, receiver, plan_id, proposal, body, created_at,"
                " expires_at, next_attempt_at, order_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (delivery_id, receiver, plan_id, proposal, body, now, expires_at, now, order_key),
            )
            db.execute("COMMIT")
            return delivery_id

        return self._run("insert", insert)

    def due(self, now: float, limit: int = 100) -> list[Delivery]:
        """The pending deliveries due by ``now`` that wait behind no older one (see the module)."""
        rows = self._run("select", lambda db: db.execute(
            "SELECT delivery_id, receiver, plan_id, body, attempts, expires_at, proposal,"
            " next_attempt_at, order_key FROM deliveries WHERE status = 'pending'"
            f" AND next_attempt_at <= ?{_HEAD} ORDER BY next_attempt_at LIMIT ?",
            (now, limit)).fetchall())
        return [Delivery(r[0], r[1], r[2], bytes(r[3]), r[4], r[5], r[6], r[7], r[8]) for r in rows]

    def pending(self, limit: int = 1000) -> list[Delivery]:
        """Every pending delivery, due or not, that waits behind no older one with its order
        key: the deliverer keeps the schedule, on its monotonic clock."""
        rows = self._run("select", lambda db: db.execute(
            "SELECT delivery_id, receiver, plan_id, body, attempts, expires_at, proposal,"
            f" next_attempt_at, order_key FROM deliveries WHERE status = 'pending'{_HEAD}"
            " ORDER BY next_attempt_at LIMIT ?", (limit,)).fetchall())
        return [Delivery(r[0], r[1], r[2], bytes(r[3]), r[4], r[5], r[6], r[7], r[8]) for r in rows]

    def finish(self, delivery_id: str, status: str, now: float, error: str | None = None) -> None:
        """Record an outcome (delivered, rejected, expired): the one UPDATE that leaves ``pending``."""
        self._finish(delivery_id, status, now, error)

    def next_due_at(self) -> float | None:
        row = self._run("select", lambda db: db.execute(
            "SELECT MIN(next_attempt_at) FROM deliveries WHERE status = 'pending'").fetchone())
        return row[0]

    def _finish(self, delivery_id: str, status: str, now: float, error: str | None = None) -> None:
        # a delivered row keeps the error of its last failed attempt, for the record
        self._run("update", lambda db: db.execute(
            "UPDATE deliveries SET status = ?, attempts = attempts + ?, finished_at = ?,"
            " last_error = COALESCE(?, last_error) WHERE delivery_id = ? AND status = 'pending'",
            (status, 0 if status == "expired" else 1, now, error, delivery_id)))

    def delivered(self, delivery_id: str, now: float) -> None:
        self._finish(delivery_id, "delivered", now)

    def rejected(self, delivery_id: str, now: float, error: str) -> None:
        self._finish(delivery_id, "rejected", now, error)

    def expired(self, delivery_id: str, now: float) -> None:
        self._finish(delivery_id, "expired", now, "plan expired before delivery")

    def retry_at(self, delivery_id: str, when: float, error: str) -> None:
        self._run("update", lambda db: db.execute(
            "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?"
            " WHERE delivery_id = ? AND status = 'pending'", (when, error, delivery_id)))

    def prune(self, before: float) -> int:
        """Delete the rows finished (delivered, rejected, expired) before ``before``; how many."""
        cursor = self._run("prune", lambda db: db.execute(
            "DELETE FROM deliveries WHERE status != 'pending' AND finished_at < ?", (before,)))
        return cursor.rowcount

    def save_state(self, value: str, key: str = "advisor") -> None:
        """Keep a state (JSON text): ``advisor`` (``wire.advisor_state_text``) or ``remediation``
        (what gpufleet drained, its fault history: ``wire.remediation_state_text``)."""
        if key not in STATE_KEYS:
            raise ValueError(f"outbox state: unknown key {key!r}")
        self._run("update", lambda db: db.execute(
            "UPDATE advisor_state SET value = ? WHERE key = ?", (value, key)))

    def load_state(self, key: str = "advisor") -> str:
        """The state under ``key`` as last saved; ``null`` (JSON) when none was."""
        row = self._run("select", lambda db: db.execute(
            "SELECT value FROM advisor_state WHERE key = ?", (key,)).fetchone())
        return "null" if row is None else str(row[0])

    def pending_count(self) -> int:
        row = self._run("select", lambda db: db.execute(
            "SELECT COUNT(*) FROM deliveries WHERE status = 'pending'").fetchone())
        return int(row[0])

    def status_of(self, receiver: str, plan_id: str) -> tuple[str, int, str] | None:
        """(status, attempts, last error) of the plan's latest proposal, for tests and the API."""
        row = self._run("select", lambda db: db.execute(
            "SELECT status, attempts, last_error FROM deliveries WHERE receiver = ? AND plan_id = ?"
            " ORDER BY proposal DESC LIMIT 1", (receiver, plan_id)).fetchone())
        return (row[0], row[1], row[2]) if row else None
