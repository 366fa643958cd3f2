"""The advisor's HTTP API on the exporter's aiohttp server.

- ``GET /v1/advice``: the current decision and plan, and the fleet's health (verdicts,
  remediation, stragglers: issue 31).
- ``POST /v1/plan``: what-if for the snapshot in the body; no side effects.
- ``POST /v1/alerts``: Alertmanager's webhook (payload version 4). Deduplicated
  on (groupKey, status); ``firing`` triggers an evaluation, ``resolved`` is a no-op.

Every POST needs ``Authorization: Bearer <token>``, stripped and compared in
constant time; a blank one never matches. Errors are JSON ``{"error": reason}``:
400 for malformed JSON or a body outside :mod:`bounds`' schemas (checked before
any work), 401 for a missing or wrong token, 413 for a body over the limit, 503
with ``Retry-After`` while a what-if runs or when one passed its time limit.
Replies are strict JSON: NaN and infinities are refused on input and never
written. The handlers get typed advice and write it with :mod:`wire`, here and nowhere
before. A handler never lets an exception reach aiohttp's 500 page: the server
keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from exporter.advisor import bounds, openapi
from exporter.advisor.advice import Advice, WhatIf
from exporter.advisor.wire import advice_json, health_json, what_if_json
from exporter.bearer import Token, current_token, token_problem
from exporter.health.monitor import HealthAdvice
from exporter.snapshot import FleetSnapshot

log = logging.getLogger(__name__)

# the bearer token: bytes, or a callable that reads it again (advisor.token_file, rotated)


def _dumps(value: Any) -> str:
    # RFC 8259 has no NaN or Infinity: json.dumps' default wrote them, and clients choked
    return json.dumps(value, allow_nan=False)


@dataclass
class QueuedEvaluation:
    """An evaluation that Alertmanager notifications wait on, not started yet."""

    names: set[str]
    groups: list[tuple[str, str]]


@dataclass
class AdvisorApi:
    """State the handlers share. ``evaluate`` and ``what_if`` come from the advisor engine."""

    evaluate: Callable[[str], Coroutine[Any, Any, Advice | None]]  # reason -> new advice
    what_if: Callable[[FleetSnapshot], WhatIf]
    current: Callable[[], Advice | None]
    token: Token
    max_body_bytes: int
    # A what-if runs in a thread, one at a time: a big snapshot is seconds of CPU and a
    # parsed copy in memory. A thread cannot be stopped, so past the limit the request
    # gets 503 and the slot stays taken until the thread ends.
    what_if_timeout: float = 10.0  # api.what_if_timeout, at most 300 s
    what_if_busy: bool = False
    seen_groups: OrderedDict[str, str] = field(default_factory=OrderedDict)
    # Alertmanager notifications by outcome: accepted, duplicate, invalid, unauthorized
    notifications: Counter = field(default_factory=Counter)
    _tasks: set[asyncio.Task[Advice | None]] = field(default_factory=set)
    # told the firing alerts before their evaluation: a fragmentation alert has served dwell
    on_alerts: Callable[[list[dict[str, Any]]], Any] | None = None
    # GET /v1/advice's "health" (HealthMonitor.advice); None: not served
    health: Callable[[], HealthAdvice | None] | None = None

    # Issue 32, finding 11: one evaluation covers every scope, so at most one waits; the
    # notifications that arrive meanwhile merge into it (their alert names, their groups).
    # 500 notifications a second are then two evaluations at a time, not 500 on the lock.
    _queued: QueuedEvaluation | None = None
    _alert_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    merged: int = 0  # notifications merged into an evaluation already queued
    # the info line per notification, at most one per LOG_EVERY; the ones between are counted
    _logged_at: float = float("-inf")
    _unlogged: int = 0

    MAX_GROUPS = 10_000  # dedupe memory is bounded; the oldest groups are forgotten first
    LOG_EVERY = 10.0  # seconds between two "notification accepted" lines

    def schedule(self, names: set[str], group: str, status: str) -> None:
        """Queue an evaluation for these alerts, or merge them into the one already waiting."""
        queued = self._queued
        if queued is not None:
            queued.names |= names
            queued.groups.append((group, status))
            self.merged += 1
            return
        queued = self._queued = QueuedEvaluation(set(names), [(group, status)])
        task = asyncio.create_task(self._run_queued(queued))
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self.evaluated_all, queued))

    async def _run_queued(self, queued: QueuedEvaluation) -> Advice | None:
        async with self._alert_lock:  # one alert evaluation at a time; the next one waits, merging
            if self._queued is queued:
                self._queued = None  # started: a notification from now on queues the next one
            return await self.evaluate(f"alertmanager: {', '.join(sorted(queued.names))} firing")

    def evaluated_all(self, queued: QueuedEvaluation, task: asyncio.Task[Advice | None]) -> None:
        if self._queued is queued:  # cancelled before it started
            self._queued = None
        for group, status in queued.groups:
            self.evaluated(group, status, task)

    def log_accepted(self, **fields: object) -> None:
        """The info line for an accepted notification, at most one per ``LOG_EVERY`` seconds."""
        now = time.monotonic()
        if now - self._logged_at < self.LOG_EVERY:
            self._unlogged += 1
            return
        log.info("alertmanager notification accepted",
                 extra={**fields, "not_logged_since_last_line": self._unlogged})
        self._logged_at, self._unlogged = now, 0

    async def finish_evaluations(self) -> None:
        """Wait for the evaluations /v1/alerts scheduled; at shutdown, before the store closes."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def remember(self, group: str, status: str) -> None:
        self.seen_groups[group] = status
        self.seen_groups.move_to_end(group)
        while len(self.seen_groups) > self.MAX_GROUPS:
            self.seen_groups.popitem(last=False)

    def evaluated(self, group: str, status: str, task: asyncio.Task[Advice | None]) -> None:
        """An evaluation that raised did not process its group: the next notification evaluates."""
        exc = None if task.cancelled() else task.exception()
        if exc is not None and task in self._tasks:  # once per evaluation, not per merged group
            log.error("evaluation for an Alertmanager notification failed", exc_info=exc)
        self._tasks.discard(task)
        if (task.cancelled() or exc is not None) and self.seen_groups.get(group) == status:
            del self.seen_groups[group]

    def what_if_done(self, job: asyncio.Future[tuple[int, bytes]]) -> None:
        self.what_if_busy = False
        if not job.cancelled():
            job.exception()  # retrieved: the handler, if still waiting, reports it as a 500


def _late_failure(job: asyncio.Future[tuple[int, bytes]]) -> None:
    """A what-if that passed its time limit has no handler left to report its failure."""
    if not job.cancelled() and (exc := job.exception()) is not None:
        log.error("what-if failed after its time limit", exc_info=exc)


ADVISOR_API = web.AppKey("advisor_api", AdvisorApi)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(data, status=status, headers=headers, dumps=_dumps)


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json({"error": reason}, status, headers)


async def _authorized(api: AdvisorApi, request: web.Request) -> str | None:
    """None when authorized, else the reason for a 401."""
    return bearer_problem(await current_token(api.token), request)



def bearer_problem(token_source: Token, request: web.Request) -> str | None:
    """The bearer check of every POST, and of GET /v1/* under ``api.require_token_for_reads``
    (exporter/web/server.py): None when authorized, else the reason for a 401."""
    return token_problem(token_source() if callable(token_source) else token_source, request)


async def _read_body(api: AdvisorApi, request: web.Request) -> tuple[bytes, web.Response | None]:
    if request.content_length is not None and request.content_length > api.max_body_bytes:
        return b"", _error(413, f"body of {request.content_length} bytes exceeds the "
                                f"{api.max_body_bytes}-byte limit")
    body = bytearray()
    async for chunk in request.content.iter_chunked(65536):
        body += chunk
        if len(body) > api.max_body_bytes:  # chunked bodies carry no Content-Length
            return b"", _error(413, f"body exceeds the {api.max_body_bytes}-byte limit")
    return bytes(body), None


def _guarded(handler: Callable[[web.Request], Awaitable[web.Response]]):
    """POST handlers: token first, and no exception ever escapes as a 500 page."""

    async def wrapped(request: web.Request) -> web.Response:
        api = request.app[ADVISOR_API]
        reason = await _authorized(api, request)
        if reason is not None:
            if request.path == "/v1/alerts":
                api.notifications["unauthorized"] += 1
            return _error(401, reason, {"WWW-Authenticate": 'Bearer realm="gpufleet"'})
        try:
            return await handler(request)
        except Exception as exc:  # the server never crashes on a request
            log.exception("advisor request failed")
            return _error(500, f"internal error: {type(exc).__name__}")

    return wrapped


async def get_advice(request: web.Request) -> web.Response:
    api = request.app[ADVISOR_API]
    advice = api.current()
    if advice is None:
        return _json({"decision": "none", "reasons": ["no snapshot evaluated yet"]})
    data = advice_json(advice)
    health = api.health() if api.health is not None else None
    if health is not None:
        data["health"] = health_json(health)
    return _json(data)


def _plan(what_if: Callable[[FleetSnapshot], WhatIf], body: bytes) -> tuple[int, bytes]:
    """In the worker thread: the body checked against the schema first, then the what-if."""
    try:
        snapshot = bounds.snapshot_from_body(body)
    except bounds.Invalid as exc:
        return 400, _dumps({"error": str(exc)}).encode()
    return 200, _dumps(what_if_json(what_if(snapshot))).encode()


@_guarded
async def post_plan(request: web.Request) -> web.Response:
    api = request.app[ADVISOR_API]
    body, error = await _read_body(api, request)
    if error is not None:
        return error
    retry = {"Retry-After": str(max(1, math.ceil(api.what_if_timeout)))}
    if api.what_if_busy:
        return _error(503, "busy: another what-if is running; retry later", retry)
    api.what_if_busy = True
    job = asyncio.get_running_loop().run_in_executor(None, _plan, api.what_if, body)
    job.add_done_callback(api.what_if_done)  # frees the slot when the thread ends, not before
    try:
        # shield: a timeout or a client gone cancels the wait, never the job's bookkeeping
        status, reply = await asyncio.wait_for(asyncio.shield(job), api.what_if_timeout)
    except TimeoutError:
        log.warning("what-if passed its time limit; its thread runs on, holding the slot",
                    extra={"limit_seconds": api.what_if_timeout})
        job.add_done_callback(_late_failure)
        return _error(503, f"the what-if passed its {api.what_if_timeout:g} s time limit; "
                           "retry later", retry)
    return web.Response(body=reply, status=status, content_type="application/json")


def validate_alertmanager(payload: Any) -> str | None:
    """None if ``payload`` is an Alertmanager webhook body (version 4), else what is wrong."""
    try:
        bounds.check_alertmanager(payload)
    except bounds.Invalid as exc:
        return str(exc)
    return None


@_guarded
async def post_alerts(request: web.Request) -> web.Response:
    api = request.app[ADVISOR_API]
    body, error = await _read_body(api, request)
    if error is None:
        try:
            payload = await asyncio.to_thread(bounds.alertmanager_from_body, body)
        except bounds.Invalid as exc:
            error = _error(400, str(exc))
    if error is not None:
        api.notifications["invalid"] += 1
        return error
    group, status = payload["groupKey"], payload["status"]
    if api.seen_groups.get(group) == status:
        api.notifications["duplicate"] += 1  # Alertmanager repeats a group every group_interval
        return _json({"accepted": True, "duplicate": True, "evaluation": "none"})
    if status == "resolved":
        reply = _json({"accepted": True, "duplicate": False, "evaluation": "none"})
    else:
        names = {a["labels"].get("alertname", "?") for a in payload["alerts"]}
        if api.on_alerts is not None:
            api.on_alerts(payload["alerts"])
        api.schedule(names, group, status)
        reply = _json({"accepted": True, "duplicate": False, "evaluation": "scheduled"}, 202)
    # remembered only now, once processed: a notification that failed before this line
    # (a 400, a 500) is not a duplicate when Alertmanager retries it
    api.notifications["accepted"] += 1
    api.remember(group, status)
    api.log_accepted(group=group, status=status, alerts=len(payload["alerts"]),
                     receiver=payload.get("receiver", ""))
    return reply


def openapi_handler(advisor: bool = True) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``GET /v1/openapi.json``: public (it says what the API takes, nothing about the fleet),
    rendered once, served as bytes; ``advisor`` False documents only what is then served."""
    body = _dumps(openapi.document(advisor)).encode()

    async def get_openapi(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return get_openapi


def add_routes(app: web.Application, api: AdvisorApi) -> None:
    app[ADVISOR_API] = api
    app.router.add_get("/v1/advice", get_advice)
    app.router.add_post("/v1/plan", post_plan)
    app.router.add_post("/v1/alerts", post_alerts)
    app.router.add_get("/v1/openapi.json", openapi_handler())
