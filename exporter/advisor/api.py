"""The advisor's HTTP API on the exporter's aiohttp server.

- ``GET /v1/advice``: the current decision and plan.
- ``POST /v1/plan``: what-if for the snapshot in the body; no side effects.
- ``POST /v1/alerts``: Alertmanager's webhook (payload version 4). Deduplicated
  on (groupKey, status); ``firing`` triggers an evaluation, ``resolved`` is a no-op.

Every POST needs ``Authorization: Bearer <token>``, stripped and compared in
constant time; a blank one never matches.
Errors are JSON ``{"error": reason}``: 400 for malformed JSON or schema, 401
for a missing or wrong token, 413 for a body over the limit. A handler never
lets an exception reach aiohttp's 500 page: the server keeps serving.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from exporter.snapshot import FleetSnapshot, from_json

log = logging.getLogger(__name__)

Advice = dict[str, Any]
# the bearer token: bytes, or a callable that reads it again (advisor.token_file, rotated)
Token = bytes | Callable[[], bytes | None] | None


@dataclass
class AdvisorApi:
    """State the handlers share. ``evaluate`` and ``what_if`` come from the advisor engine."""

    evaluate: Callable[[str], Coroutine[Any, Any, Advice | None]]  # reason -> new advice
    what_if: Callable[[FleetSnapshot], Advice]
    current: Callable[[], Advice | None]
    token: Token
    max_body_bytes: int
    seen_groups: OrderedDict[str, str] = field(default_factory=OrderedDict)
    # Alertmanager notifications by outcome: accepted, duplicate, invalid, unauthorized
    notifications: Counter = field(default_factory=Counter)
    _tasks: set[asyncio.Task[Advice | None]] = field(default_factory=set)

    MAX_GROUPS = 10_000  # dedupe memory is bounded; the oldest groups are forgotten first

    async def finish_evaluations(self) -> None:
        """Wait for the evaluations /v1/alerts scheduled; at shutdown, before the outbox closes."""
        await asyncio.gather(*self._tasks, return_exceptions=True)


ADVISOR_API = web.AppKey("advisor_api", AdvisorApi)


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def _authorized(api: AdvisorApi, request: web.Request) -> str | None:
    """None when authorized, else the reason for a 401."""
    token = api.token() if callable(api.token) else api.token
    if not token:  # an empty token would match a blank bearer
        return ("the advisor has no usable token (set GPUFLEET_ADVISOR_TOKEN or "
                "advisor.token_file, non-blank)")
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    presented = presented.strip()  # str.strip: Unicode whitespace too, U+00A0 included
    if scheme.lower() != "bearer" or not presented:
        return "missing bearer token"
    if not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), token):
        return "wrong bearer token"
    return None


async def _read_json(api: AdvisorApi, request: web.Request) -> tuple[Any, web.Response | None]:
    if request.content_length is not None and request.content_length > api.max_body_bytes:
        return None, _error(413, f"body of {request.content_length} bytes exceeds the "
                                 f"{api.max_body_bytes}-byte limit")
    body = bytearray()
    async for chunk in request.content.iter_chunked(65536):
        body += chunk
        if len(body) > api.max_body_bytes:  # chunked bodies carry no Content-Length
            return None, _error(413, f"body exceeds the {api.max_body_bytes}-byte limit")
    try:
        return json.loads(body), None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, _error(400, f"body is not valid JSON: {exc}")


def _guarded(handler: Callable[[web.Request], Awaitable[web.Response]]):
    """POST handlers: token first, and no exception ever escapes as a 500 page."""

    async def wrapped(request: web.Request) -> web.Response:
        api = request.app[ADVISOR_API]
        reason = _authorized(api, request)
        if reason is not None:
            if request.path == "/v1/alerts":
                api.notifications["unauthorized"] += 1
            return web.json_response({"error": reason}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="gpufleet"'})
        try:
            return await handler(request)
        except Exception as exc:  # the server never crashes on a request
            log.exception("advisor request failed")
            return _error(500, f"internal error: {type(exc).__name__}")

    return wrapped


async def get_advice(request: web.Request) -> web.Response:
    advice = request.app[ADVISOR_API].current()
    if advice is None:
        return web.json_response({"decision": "none", "reasons": ["no snapshot evaluated yet"]})
    return web.json_response(advice)


@_guarded
async def post_plan(request: web.Request) -> web.Response:
    api = request.app[ADVISOR_API]
    payload, error = await _read_json(api, request)
    if error is not None:
        return error
    if not isinstance(payload, dict):
        return _error(400, "body must be a JSON object: a snapshot as served by GET /v1/snapshot")
    try:
        snapshot = from_json(payload)
    except (TypeError, ValueError, KeyError) as exc:
        return _error(400, f"body is not a snapshot: {exc}")
    advice = await asyncio.to_thread(api.what_if, snapshot)
    return web.json_response(advice)


def validate_alertmanager(payload: Any) -> str | None:
    """None if ``payload`` is an Alertmanager webhook body (version 4), else what is wrong."""
    if not isinstance(payload, dict):
        return "body must be a JSON object"
    if payload.get("version") != "4":
        return f"unsupported payload version {payload.get('version')!r} (expected \"4\")"
    if not isinstance(payload.get("groupKey"), str) or not payload["groupKey"]:
        return "groupKey must be a non-empty string"
    if payload.get("status") not in ("firing", "resolved"):
        return "status must be \"firing\" or \"resolved\""
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        return "alerts must be a list"
    for i, alert in enumerate(alerts):
        if not isinstance(alert, dict) or not isinstance(alert.get("labels"), dict):
            return f"alerts[{i}] must be an object with a labels object"
        if alert.get("status") not in ("firing", "resolved"):
            return f"alerts[{i}].status must be \"firing\" or \"resolved\""
    return None


@_guarded
async def post_alerts(request: web.Request) -> web.Response:
    api = request.app[ADVISOR_API]
    payload, error = await _read_json(api, request)
    if error is None:
        problem = validate_alertmanager(payload)
        error = None if problem is None else _error(400, problem)
    if error is not None:
        api.notifications["invalid"] += 1
        return error
    group, status = payload["groupKey"], payload["status"]
    if api.seen_groups.get(group) == status:
        api.notifications["duplicate"] += 1  # Alertmanager repeats a group every group_interval
        return web.json_response({"accepted": True, "duplicate": True, "evaluation": "none"})
    api.notifications["accepted"] += 1
    api.seen_groups[group] = status
    api.seen_groups.move_to_end(group)
    while len(api.seen_groups) > api.MAX_GROUPS:
        api.seen_groups.popitem(last=False)
    if status == "resolved":
        return web.json_response({"accepted": True, "duplicate": False, "evaluation": "none"})
    names = sorted({a["labels"].get("alertname", "?") for a in payload["alerts"]})
    task = asyncio.create_task(api.evaluate(f"alertmanager: {', '.join(names)} firing"))
    api._tasks.add(task)
    task.add_done_callback(api._tasks.discard)
    return web.json_response({"accepted": True, "duplicate": False, "evaluation": "scheduled"},
                             status=202)


def add_routes(app: web.Application, api: AdvisorApi) -> None:
    app[ADVISOR_API] = api
    app.router.add_get("/v1/advice", get_advice)
    app.router.add_post("/v1/plan", post_plan)
    app.router.add_post("/v1/alerts", post_alerts)
