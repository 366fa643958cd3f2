"""The aiohttp server: collection on its own interval, scrapes served from cached bytes.

Collection never runs inside a scrape. A background task reads the sources
every ``collect_interval``, renders the new snapshot to text and gzip once in a
worker thread, and swaps one reference. ``/metrics`` only writes out the bytes
of the current rendering, so a scrape costs the same for 100 GPUs or 100k.
``/v1/snapshot`` is the same for its JSON: encoded (and gzipped) once per snapshot,
by the first request that asks, in a worker thread that the others wait on.

With a web config file (exporter/web/webconfig.py), :func:`protect` is the middleware
in front of every handler: basic auth, and the advisor's bearer token for GET
``/v1/*`` under ``api.require_token_for_reads``. A route that takes the bearer
token (the advisor's POSTs, and GET ``/v1/*`` when reads need it) is not also
asked for basic auth: a request has one ``Authorization`` header, and
Alertmanager's ``http_config`` sends one credential. The file's headers are added
to every response by an ``on_response_prepare`` hook, 401s and 503s included.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import math
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from exporter.aio import complete
from exporter.bearer import current_token, token_problem
from exporter.collect import Collector
from exporter.config import Config, WebConfig
from exporter.exposition import CONTENT_TYPE, ExpositionOptions, Family, LabelCache, Rendered, render
from exporter.snapshot import FleetSnapshot, to_json
from exporter.web import landing
from exporter.web.connection_gate import (
    GuardedSite,
    IntervalLog,
    accept_error_handler,
    effective_max_connections,
    request_limits,
    shed_log,
    write_large,
)
from exporter.web.webconfig import Busy, LiveWebConfig, san_allowed

if TYPE_CHECKING:
    from exporter.bearer import Token

log = logging.getLogger(__name__)

class Cycle(Protocol):
    """What serve runs on each collected snapshot (exporter/cycle/serving.py's
    ``ServingCycle``): the stages and their side effects, then the families of the frame."""

    async def run(self, snapshot: FleetSnapshot, blind: tuple[str, ...] = ()) -> Any: ...  # the frame

    def families(self, frame: Any) -> list[Family]: ...  # blocking: the render thread


@dataclass
class ServingState:
    """What the handlers read. ``current`` is replaced whole, never mutated."""

    current: Rendered | None = None
    # /v1/snapshot's (json, gzipped json) for the rendering it was made from
    snapshot_body: tuple[Rendered, asyncio.Future[tuple[bytes, bytes]]] | None = None
    collections: int = 0
    # the cycle each snapshot goes through before it is rendered; None: the snapshot alone
    cycle: Cycle | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # time.monotonic() when the last collection finished (None: none yet); /-/ready compares
    # it with the stall limit, so a collection that hangs is seen even while stale bytes serve.
    # Monotonic: a wall clock stepped back must not read as a stall, nor forward hide one
    collected_at: float | None = None
    # what SIGHUP reads again: (name in the log line, a blocking call run in a thread that
    # returns a short outcome for that line); serve and other parts append their own
    reloaders: list[tuple[str, Callable[[], object]]] = field(default_factory=list)
    # which families are served and the cluster label (serve_cmd.exposition_options)
    exposition: ExpositionOptions = field(default_factory=ExpositionOptions)
    # why the current snapshot is blind (exporter/collect.py): /-/ready answers 503 with it
    blind: tuple[str, ...] = ()


@dataclass
class Protection:
    """Who may read what: the web config file's users and headers (``web``), and the bearer
    token GET ``/v1/*`` needs when ``reads_need_token`` (``api.require_token_for_reads``)."""

    web: LiveWebConfig | None = None
    read_token: Token = None
    reads_need_token: bool = False


STATE = web.AppKey("state", ServingState)
COLLECTOR = web.AppKey("collector", Collector)
CONFIG = web.AppKey("config", Config)
PROTECTION = web.AppKey("protection", Protection)
OPENAPI_PATH = "/v1/openapi.json"  # public: it says what the API takes, nothing of the fleet


def _render_all(snapshot: FleetSnapshot, frame: Any, state: ServingState, labels: LabelCache,
                level: int) -> Rendered:
    extra = state.cycle.families(frame) if state.cycle is not None and frame is not None else []
    return render(snapshot, labels, extra, gzip_level=level, options=state.exposition)


async def collect_once(app: web.Application, labels: LabelCache) -> None:
    """Collect, run the cycle on the snapshot, then render the frame.

    The cycle runs before rendering so that what it concludes about this snapshot is
    exported with it, not one collection late.
    """
    state, collector, config = app[STATE], app[COLLECTOR], app[CONFIG]
    rendered = await collect_and_render(collector, state, labels, config.gzip_level)
    state.current = rendered
    state.blind = collector.blind
    state.collections += 1
    state.collected_at = time.monotonic()
    state.ready.set()
    log.debug("collected", extra={"gpus": len(rendered.snapshot.gpus), "series": rendered.series,
                                  "render_seconds": round(rendered.render_seconds, 4)})


async def collect_and_render(collector: Collector, state: ServingState, labels: LabelCache,
                             gzip_level: int) -> Rendered:
    """One collection: the snapshot, its cycle, then the bytes /metrics serves."""
    snapshot = await collector.collect()
    frame = None
    if state.cycle is not None:
        try:
            frame = await state.cycle.run(snapshot, collector.blind)
        except Exception:  # a broken stage must not stop the exposition of the snapshot
            log.exception("cycle failed; the snapshot is served without its analysis")
    loop = asyncio.get_running_loop()
    # complete(): a cancelled collection (shutdown) waits for the render thread, which takes
    # the frame's families; left running, it could read the advisor's store after it closed
    return await complete(loop.run_in_executor(None, _render_all, snapshot, frame, state, labels,
                                               gzip_level))


async def _collect_loop(app: web.Application) -> None:
    labels = LabelCache()
    interval = app[CONFIG].collect_interval
    while True:
        started = time.monotonic()
        try:
            await collect_once(app, labels)
        except Exception:  # the serving loop outlives any bad collection
            log.exception("collection failed; serving the previous snapshot")
        elapsed = time.monotonic() - started
        await asyncio.sleep(max(0.0, interval - elapsed))


async def _background(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(_collect_loop(app))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await app[COLLECTOR].close()


async def metrics(request: web.Request) -> web.StreamResponse:
    rendered = request.app[STATE].current
    if rendered is None:
        return web.Response(status=503, text="no snapshot collected yet\n")
    headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return web.Response(body=rendered.gzipped, headers=headers)
    # the plain body is decompressed on first use (exposition.Rendered.text): 900 MB at
    # 108,800 GPUs, so off the loop; later requests for this snapshot find it made
    text = await asyncio.get_running_loop().run_in_executor(None, lambda: rendered.text)
    return await write_large(request, text, headers)  # 8.9 MB at 1,088 GPUs: in slices


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="gpufleet is healthy.\n")


def stall_limit(config: Config) -> float:
    """Seconds after the last finished collection at which collection counts as stalled:
    ``web.stall_intervals`` collect intervals, but never less than ``source_timeout`` plus one
    interval, since a collection whose source times out takes that long by design."""
    interval = config.collect_interval
    return max(config.web.stall_intervals * interval, config.source_timeout + interval)


def stalled(state: ServingState, config: Config, now: float | None = None) -> str | None:
    """Why collection counts as stalled, or None while it keeps up."""
    if state.collected_at is None:
        return None
    age = (time.monotonic() if now is None else now) - state.collected_at
    limit = stall_limit(config)
    if age <= limit:
        return None
    return (f"collection stalled: the last one finished {age:.1f}s ago, more than {limit:g}s "
            f"(web.stall_intervals={config.web.stall_intervals} x collect_interval="
            f"{config.collect_interval:g}s); /metrics serves that snapshot")


async def ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.current is None:
        return web.Response(status=503, text="gpufleet is not ready: no snapshot yet.\n")
    reason = stalled(state, request.app[CONFIG])
    if reason is not None:
        return web.Response(status=503, text=f"gpufleet is not ready: {reason}.\n")
    if state.blind:  # never green while blind: a fleet of 0, or a fraction, is no fleet
        reasons = "; ".join(state.blind)
        return web.Response(status=503, text=f"gpufleet is not ready: {reasons}.\n")
    return web.Response(text="gpufleet is ready.\n")


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None (JSON null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def snapshot_bodies(snapshot: FleetSnapshot, gzip_level: int) -> tuple[bytes, bytes]:
    """``/v1/snapshot``'s body and its gzip, as strict JSON (RFC 8259 has no NaN: json.dumps'
    default wrote ``NaN``, e.g. for a GPU whose power limit a source could not read).
    In a worker thread: 1,088 GPUs are ~1 MB of JSON."""
    data = to_json(snapshot)
    try:
        text = json.dumps(data, allow_nan=False)
    except ValueError:  # a rare non-finite number: walk the tree only then
        text = json.dumps(_finite(data), allow_nan=False)
    body = text.encode()
    return body, gzip.compress(body, gzip_level, mtime=0)


async def snapshot(request: web.Request) -> web.Response:
    state = request.app[STATE]
    rendered = state.current
    if rendered is None:
        return web.json_response({"error": "no snapshot collected yet"}, status=503)
    cached = state.snapshot_body
    if cached is None or cached[0] is not rendered:
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(None, snapshot_bodies, rendered.snapshot,
                                   request.app[CONFIG].gzip_level)
        state.snapshot_body = cached = (rendered, job)
    try:
        # shield: a client that leaves must not cancel the encoding the others wait on
        body, gzipped = await asyncio.shield(cached[1])
    except Exception as exc:
        if state.snapshot_body is cached:
            state.snapshot_body = None  # the next request tries again
        log.error("encoding /v1/snapshot failed", exc_info=exc)
        return web.json_response({"error": f"internal error: {type(exc).__name__}"}, status=500)
    headers = {"Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        headers["Content-Encoding"] = "gzip"
        body = gzipped
    return web.Response(body=body, content_type="application/json", headers=headers)


def _reads_bearer(request: web.Request, protection: Protection) -> bool:
    """True for a request the advisor's bearer token guards: a POST under /v1/ (the advisor's
    own check answers it), or a GET/HEAD there when reads need the token."""
    path = request.path
    if not path.startswith("/v1/") or path == OPENAPI_PATH:
        return False
    return request.method not in ("GET", "HEAD") or protection.reads_need_token


def protect(protection: Protection) -> Middleware:
    """The middleware of the web config file (rate limit, client SANs, basic auth) and of the
    bearer token for reads. It runs inside :func:`request_limits`, so a request waiting for
    a password check holds its endpoint's slot: the 16 checks that may wait
    (webconfig.MAX_PENDING_CHECKS) stay under the default 40 per endpoint."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        bearer = _reads_bearer(request, protection)
        live = protection.web
        if live is not None:
            if not live.allow():  # rate_limit: first, as exporter-toolkit's handler does
                return web.Response(status=429, text="Too Many Requests\n")
            loaded = live.current
            sans = loaded.web.tls.client_allowed_sans
            if sans is not None and not san_allowed(
                    request.transport.get_extra_info("peercert") if request.transport else None,
                    sans):
                # Go refuses in the handshake; Python's ssl has no hook there, so the first
                # request is refused and the connection closed
                return web.Response(status=403, text="client certificate not allowed\n",
                                    headers={"Connection": "close"})
            if loaded.users and not bearer:
                try:
                    ok = await live.authenticator.check(
                        loaded.users, request.headers.get("Authorization", ""))
                except Busy:
                    return web.Response(status=503, headers={"Retry-After": "1"},
                                        text="too many password checks in progress, "
                                        "try again later\n")
                if not ok:
                    return web.Response(status=401, text="Unauthorized\n",
                                        headers={"WWW-Authenticate": "Basic"})
        if bearer and request.method in ("GET", "HEAD"):
            reason = token_problem(await current_token(protection.read_token), request)
            if reason is not None:
                return web.json_response(
                    {"error": reason}, status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="gpufleet"'})
        return await handler(request)

    return middleware


async def _web_headers(request: web.Request, response: web.StreamResponse) -> None:
    """The web config file's ``http_server_config.headers``, on every response."""
    live = request.app[PROTECTION].web
    if live is not None:
        for name, value in live.current.web.headers:
            response.headers[name] = value


async def _watch_web_config(app: web.Application) -> AsyncIterator[None]:
    live = app[PROTECTION].web
    if live is None:
        yield
        return
    task = asyncio.create_task(live.watch())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    live.authenticator.close()


async def index(request: web.Request) -> web.Response:
    """The landing page (exporter/web/landing.py): endpoints, version, sources, advice, runbooks."""
    rendered = request.app[STATE].current
    sources = rendered.snapshot.sources if rendered is not None else None
    show_errors = not request.app[PROTECTION].reads_need_token
    body = landing.render(request.app, sources, show_errors, landing.packaged_runbook_page())
    return web.Response(text=body, content_type="text/html")


def make_app(config: Config, collector: Collector, state: ServingState | None = None,
             protection: Protection | None = None) -> web.Application:
    protection = protection or Protection()
    # the limits' middleware first: it marks the connection busy around all the others,
    # a wait for a password check included
    app = web.Application(client_max_size=1024 * 1024,
                          middlewares=[request_limits(config.web.max_requests,
                                                      config.web.body_timeout),
                                       protect(protection)])
    app[CONFIG] = config
    app[COLLECTOR] = collector
    app[STATE] = state or ServingState()
    # SIGHUP accepts a fleet that really shrank: partial readings are judged afresh
    app[STATE].reloaders.append(("fleet sizes", collector.forget_sizes))
    app[PROTECTION] = protection
    app.on_response_prepare.append(_web_headers)
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/healthy", healthy)
    app.router.add_get("/-/ready", ready)
    app.router.add_get("/v1/snapshot", snapshot)
    app.cleanup_ctx.append(_background)
    app.cleanup_ctx.append(_watch_web_config)
    return app


async def start(app: web.Application, sock: socket.socket, limits: WebConfig,
                handle_signals: bool = False, shed: IntervalLog | None = None) -> web.AppRunner:
    """Serve ``app`` on the listening ``sock`` behind the connection limits
    (exporter/web/connection_gate.py), over TLS when its web config file says so;
    ``runner.cleanup()`` stops it."""
    max_connections = effective_max_connections(limits.max_connections)
    if max_connections < limits.max_connections:
        # info, not warning: with the default 1000 this is the expected case under ulimit -n 1024
        log.info("web.max_connections lowered to fit the open-file limit",
                    extra={"configured": limits.max_connections, "effective": max_connections})
    runner = web.AppRunner(app, handle_signals=handle_signals, access_log=None,
                           keepalive_timeout=limits.keepalive_timeout,
                           shutdown_timeout=limits.shutdown_grace)
    await runner.setup()
    live = app[PROTECTION].web
    tls = live.ssl_context if live is not None and live.tls else None
    await GuardedSite(runner, sock, max_connections, limits.header_timeout, shed, tls).start()
    return runner


class Reload:
    """SIGHUP, as Prometheus and Alertmanager take it: read the files again now (the
    ``reloaders`` of :class:`ServingState`), in a thread, with one log line of outcomes.
    A SIGHUP during a reload runs one more after it, not one per signal."""

    def __init__(self, state: ServingState) -> None:
        self.state = state
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def requested(self) -> None:
        """The signal handler: on the loop, so it only schedules."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            outcomes = await asyncio.to_thread(self.run_once)
            log.info("reloaded on SIGHUP", extra=outcomes)
            if not self._again:
                return

    def run_once(self) -> dict[str, object]:
        outcomes: dict[str, object] = {}
        for name, reload in self.state.reloaders:
            try:
                outcomes[name] = reload()
            except Exception as exc:  # one broken reloader must not stop the others
                log.exception("reload failed", extra={"what": name})
                outcomes[name] = f"failed: {type(exc).__name__}"
        return outcomes


async def serve(app: web.Application, sock: socket.socket, limits: WebConfig) -> None:
    """``web.run_app`` with the connection limits (it takes no protocol factory of ours),
    and the signals as operators expect them.

    SIGTERM or SIGINT: the listening socket closes, idle keep-alive connections close, and
    responses in flight get ``web.shutdown_grace`` to finish (a slow scraper still gets the
    whole body) before the collection stops; a second signal ends at once. SIGHUP: the
    files are read again (:class:`Reload`), and the process lives.
    """
    loop = asyncio.get_running_loop()
    shed = shed_log(loop)  # one line per 10 s for shed connections and accept() errors
    loop.set_exception_handler(accept_error_handler(shed))
    runner = await start(app, sock, limits, shed=shed)
    stopping = asyncio.Event()
    reload = Reload(app[STATE])

    def stop(signum: int) -> None:
        if stopping.is_set():  # the operator insists: no more grace
            log.warning("second stop signal: exiting now", extra={"signal": signal.Signals(signum).name})
            raise web.GracefulExit()
        stopping.set()
        log.info("stopping: no new connections, responses in flight may finish",
                 extra={"signal": signal.Signals(signum).name,
                        "grace_seconds": limits.shutdown_grace})

    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    loop.add_signal_handler(signal.SIGHUP, reload.requested)
    try:
        await stopping.wait()
    finally:
        try:
            await runner.cleanup()
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)

