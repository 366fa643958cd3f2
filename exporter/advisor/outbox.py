"""A durable outbox for webhook deliveries, in SQLite (stdlib ``sqlite3``, WAL).

Advice that cannot be delivered yet is kept, not dropped: every delivery is a
row written before the first attempt, so a crash or restart loses nothing and
a new process on the same file carries on. A plan goes to each receiver at
most once: (receiver, plan id) is unique, enqueuing it again is a no-op, and a
row leaves ``pending`` only when a receiver answered 2xx (``delivered``), gave
a final 4xx (``rejected``) or the plan expired (``expired``).

The methods are synchronous and quick (one small transaction each); the async
delivery loop calls them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id     TEXT PRIMARY KEY,
    receiver        TEXT NOT NULL,
    plan_id         TEXT NOT NULL,
    body            BLOB NOT NULL,
    created_at      REAL NOT NULL,
    expires_at      REAL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending',
    last_error      TEXT NOT NULL DEFAULT '',
    finished_at     REAL,
    UNIQUE (receiver, plan_id)
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (status, next_attempt_at);
"""


@dataclass(frozen=True, slots=True)
class Delivery:
    delivery_id: str
    receiver: str
    plan_id: str
    body: bytes
    attempts: int
    expires_at: float | None


class Outbox:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # one connection guarded by a lock: calls come from worker threads one at a time
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a delivery row must survive power loss
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def enqueue(self, receiver: str, plan_id: str, body: bytes, now: float,
                expires_at: float | None = None) -> str | None:
        """Queue ``body`` for ``receiver``; returns the delivery id, or None if already queued."""
        delivery_id = str(uuid.uuid4())
        with self._lock:
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO deliveries (delivery_id, receiver, plan_id, body, created_at,"
                " expires_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (delivery_id, receiver, plan_id, body, now, expires_at, now),
            )
        return delivery_id if cursor.rowcount == 1 else None

    def due(self, now: float, limit: int = 100) -> list[Delivery]:
        with self._lock:
            rows = self._db.execute(
                "SELECT delivery_id, receiver, plan_id, body, attempts, expires_at FROM deliveries"
                " WHERE status = 'pending' AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?",
                (now, limit),
            ).fetchall()
        return [Delivery(r[0], r[1], r[2], bytes(r[3]), r[4], r[5]) for r in rows]

    def next_due_at(self) -> float | None:
        with self._lock:
            row = self._db.execute(
                "SELECT MIN(next_attempt_at) FROM deliveries WHERE status = 'pending'"
            ).fetchone()
        return row[0]

    def _finish(self, delivery_id: str, status: str, now: float, error: str | None = None) -> None:
        # a delivered row keeps the error of its last failed attempt, for the record
        with self._lock:
            self._db.execute(
                "UPDATE deliveries SET status = ?, attempts = attempts + ?, finished_at = ?,"
                " last_error = COALESCE(?, last_error) WHERE delivery_id = ? AND status = 'pending'",
                (status, 0 if status == "expired" else 1, now, error, delivery_id),
            )

    def delivered(self, delivery_id: str, now: float) -> None:
        self._finish(delivery_id, "delivered", now)

    def rejected(self, delivery_id: str, now: float, error: str) -> None:
        self._finish(delivery_id, "rejected", now, error)

    def expired(self, delivery_id: str, now: float) -> None:
        self._finish(delivery_id, "expired", now, "plan expired before delivery")

    def retry_at(self, delivery_id: str, when: float, error: str) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = ?, last_error = ?"
                " WHERE delivery_id = ? AND status = 'pending'",
                (when, error, delivery_id),
            )

    def pending_count(self) -> int:
        with self._lock:
            return self._db.execute(
                "SELECT COUNT(*) FROM deliveries WHERE status = 'pending'"
            ).fetchone()[0]

    def status_of(self, receiver: str, plan_id: str) -> tuple[str, int, str] | None:
        """(status, attempts, last error) of one delivery, for tests and the API."""
        with self._lock:
            row = self._db.execute(
                "SELECT status, attempts, last_error FROM deliveries WHERE receiver = ? AND plan_id = ?",
                (receiver, plan_id),
            ).fetchone()
        return (row[0], row[1], row[2]) if row else None
