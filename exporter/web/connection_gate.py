"""Connection limits in front of aiohttp's server: what an unauthenticated client may hold.

Without them, 20,000 idle TCP connections from one client used up the process's file
descriptors, three scrapes in a row failed, and asyncio logged 102,666 ``accept()`` lines
(24.7 MB): aiohttp keeps a silent connection until its keep-alive timeout and limits
neither connections nor requests. Four limits, each cheap:

- :class:`ConnectionGate`, the listening socket's protocol factory, keeps at most
  ``web.max_connections`` open. A new connection beyond it closes the connection that
  has waited longest without a request in progress, one that never finished a request
  (silent, half-sent headers) before one kept alive after a request, so a flood of silent
  sockets can neither lock a scraper out nor close the connection it reuses (a flood that
  finishes one request per socket ranks with the scraper: docs/reliability.md); if every
  connection is serving a request, the new one is closed at once. No 503 is written:
  that would cost a write per refused connection to a client that sends nothing.
- A header timer per connection (:class:`_Guard`): complete request headers must arrive
  within ``web.header_timeout`` of the opening, or of a later request's first byte,
  like Go's ``http.Server.ReadHeaderTimeout``. aiohttp has no such timer (its
  ``keepalive_timeout`` is the only one, and data does not reset it), and a middleware
  never sees a request whose headers do not end, hence a protocol wrapper.
- ``keepalive_timeout``, aiohttp's own, for a connection idle between requests: 75 s by
  default, over Prometheus' default 1m scrape interval, so a scraper reuses its
  connection (no TCP or TLS handshake per scrape). A shorter one buys no safety: the gate
  closes idle kept-alive connections for a new one once no silent one is left.
- A body deadline (``web.body_timeout``, in :func:`request_limits`): a request body must have
  arrived whole within it of the headers, else 408 and the connection closed. The header
  timer ends when the headers do, so a body sent a byte a second held a connection, an
  endpoint slot and a handler for as long as the client liked.
- :func:`request_limits`, a middleware: at most ``web.max_requests`` requests in flight
  per endpoint, more answered 503 at once; node_exporter's ``--web.max-requests``
  (promhttp's ``MaxRequestsInFlight``). The response is written inside the middleware,
  so a slow reader of a large /metrics (2.5 MB at 1,088 GPUs) holds its slot as it
  does in Go.

Over TLS (a web config file, exporter/web/webconfig.py), :class:`_TLSStart` sits between
the socket and the guard, made per connection with the context current at that moment:
a handshake counts against the same limits (evictable, bounded by the header timeout,
its slot freed when it fails), and a reloaded certificate reaches new connections only.

Shed connections are logged by :class:`IntervalLog` as one ``connections shed`` line per
10 s at most, with the counts, never one per connection. :func:`accept_error_handler`
adds asyncio's ``accept()`` errors (``EMFILE``) to the same line: asyncio reports one per
accept() attempt, up to 128 in a tick (``BaseSelectorEventLoop._accept_connection``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

log = logging.getLogger(__name__)

INTERVAL = 10.0  # seconds between two summary lines
BACKLOG = 128  # the most sockets asyncio accepts in one tick (create_server's backlog)
SOMAXCONN = "/proc/sys/net/core/somaxconn"
# asyncio's accept() errors for a full process or system (selector_events.py)
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


class IntervalLog:
    """Counts events and logs them at most once per ``interval``, as one line with the counts.

    The first event after a quiet interval is logged on the next loop iteration (so a burst
    in one tick is one line); later ones wait for the interval to end, and no count is lost.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, message: str,
                 interval: float = INTERVAL, **fields: object) -> None:
        self._loop = loop
        self._message = message
        self._interval = interval
        self._fields = fields
        self._counts: Counter[str] = Counter()
        self._last = -interval
        self._handle: asyncio.TimerHandle | None = None

    def note(self, kind: str, **fields: object) -> None:
        self._counts[kind] += 1
        self._fields.update(fields)
        if self._handle is None:
            delay = max(0.0, self._last + self._interval - self._loop.time())
            self._handle = self._loop.call_later(delay, self._emit)

    def _emit(self) -> None:
        self._handle = None
        self._last = self._loop.time()
        counts, self._counts = self._counts, Counter()
        log.warning(self._message, extra={**dict(counts), **self._fields,
                                          "interval_seconds": self._interval})

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._emit()


def shed_log(loop: asyncio.AbstractEventLoop) -> IntervalLog:
    """The one ``connections shed`` line (per 10 s) of a server and its accept() errors."""
    return IntervalLog(loop, "connections shed")


def accept_error_handler(lines: IntervalLog,
                         fallback: ExceptionHandler | None = None) -> ExceptionHandler:
    """A loop exception handler that counts ``accept()`` resource errors as
    ``accept_errors`` in ``lines``; every other context goes to ``fallback`` (the
    loop's default handler)."""

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> object:
        exc = context.get("exception")
        if (isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS
                and "accept" in str(context.get("message", ""))):
            lines.note("accept_errors", error=exc.strerror or str(exc))
            return None
        if fallback is None:
            return loop.default_exception_handler(context)
        return fallback(loop, context)

    return handler


def effective_max_connections(configured: int, soft: int | None = None) -> int:
    """``web.max_connections``, lowered to fit the soft open-file limit (``soft``, by
    default this process's): half of what is left after two accept batches.

    The limit exists so that accept() never meets ``EMFILE``. asyncio accepts up to
    ``BACKLOG`` sockets in a tick before the gate sees any, and the sockets the gate
    closed close in the next tick: 2 x 128 beyond the limit at worst. The other half is
    for the listening socket, threads, source connections, the store and logs. At
    ulimit -n 1024 this is 384; at 512, 128, where half the limit (256) still met EMFILE
    under a 19,000-connection flood.
    """
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, (soft - 2 * BACKLOG) // 2))


def listen_backlog(path: str = SOMAXCONN) -> int:
    """The listen() backlog: two of asyncio's accept batches (256), within the kernel's
    ``somaxconn`` (where it can be read).

    asyncio listens with its batch, 128. ``wrk -c1000`` overflowed that queue (1,592
    ``ListenOverflows`` in 15 s, 946 TCP retransmission timeouts): Linux drops a handshake's
    last ACK, the client believes it is connected and its request waits for a retransmission,
    1 s or more. A deep queue is worse under a flood: with 1,000 or 4,096 (Go's somaxconn),
    20,000 idle connections kept it full and a scraper's connection waited behind the queued
    ones, each accepted and evicted in turn: scrapes of 1.35-1.46 s, against 70 ms at 256.
    Measured on 2 shared cores; docs/reliability.md, row 9.
    """
    try:
        with open(path) as file:
            somaxconn = int(file.read().strip())
    except (OSError, ValueError):
        return 2 * BACKLOG
    return max(1, min(2 * BACKLOG, somaxconn))


class _Refused(asyncio.Protocol):
    """A connection over the limit: closed as soon as it is made, before any read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.abort()


class _Guard(asyncio.Protocol):
    """One connection: aiohttp's ``RequestHandler`` behind a header timer.

    Forwards every protocol call; tracks whether a request is in progress (set by
    :func:`request_limits`, which aiohttp reaches only once the headers are complete).
    """

    __slots__ = ("_gate", "_inner", "_timer", "in_request", "transport")

    def __init__(self, gate: ConnectionGate, inner: asyncio.Protocol) -> None:
        self._gate = gate
        self._inner = inner
        self._timer: asyncio.TimerHandle | None = None
        self.in_request = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._gate.waiting[self] = None
        self._arm()  # the first request's headers are due from the opening on
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.in_request and self._timer is None:
            self._arm()  # the first byte of a later request on a kept-alive connection
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._gate.release(self)
        self._inner.connection_lost(exc)

    def request_started(self) -> None:
        self._disarm()
        self.in_request = True
        self._gate.waiting.pop(self, None)
        self._gate.kept.pop(self, None)

    def request_done(self) -> None:
        self.in_request = False
        if self in self._gate.guards:
            self._gate.kept[self] = None  # longest-waiting last: evicted last

    def _arm(self) -> None:
        self._timer = self._gate.loop.call_later(self._gate.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self.in_request and self.transport is not None:
            self._gate.shed.note("header_timeouts", limit=self._gate.max_connections)
            self.transport.abort()


class _TLSStart(asyncio.Protocol):
    """TLS between the socket and a :class:`_Guard`, made per connection with the context
    of that moment, so that a reloaded web config (exporter/web/webconfig.py) reaches new
    connections whole (certificate, versions, ciphers, client auth) and open ones keep
    theirs; asyncio's ``create_server(ssl=...)`` fixes one context for the server's life.

    The TCP connection is handed to ``loop.start_tls``, the public way to wrap one (this
    class once subclassed ``SSLProtocol``, private to asyncio). The guard counts
    from the TCP opening: a connection in its handshake can be evicted like an idle one,
    the handshake must end within the header timeout, and a failed handshake, which never
    reaches the guard, still frees its slot.

    Until the guard takes over, this object is the TLS transport's protocol and keeps what
    arrives: the handshake's last read can carry the first request (a TLS 1.3 client sends
    it with its Finished), and asyncio delivers it before ``start_tls`` returns.
    """

    __slots__ = ("_context", "_eof", "_gate", "_guard", "_kept", "_lost", "_wrapping")

    def __init__(self, gate: ConnectionGate, guard: _Guard, context: ssl.SSLContext) -> None:
        self._gate = gate
        self._guard = guard
        self._context = context
        self._wrapping = False  # set once start_tls owns the socket's events
        self._kept: list[bytes] = []
        self._eof = False
        self._lost: tuple[Exception | None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._guard.transport = transport  # replaced by the TLS transport after the handshake
        self._gate.waiting[self._guard] = None
        transport.pause_reading()  # no byte may reach this object before start_tls has the socket
        task = self._gate.loop.create_task(self._handshake(transport))
        self._gate.handshakes.add(task)  # held, or the loop may drop it mid-handshake
        task.add_done_callback(self._gate.handshakes.discard)

    async def _handshake(self, transport: asyncio.Transport) -> None:
        if transport.is_closing():  # evicted before the task ran
            self._gate.release(self._guard)
            return
        self._wrapping = True
        try:
            tls = await self._gate.loop.start_tls(
                transport, self, self._context, server_side=True,
                ssl_handshake_timeout=self._gate.header_timeout)
        except asyncio.CancelledError:  # the server stops
            self._gate.release(self._guard)
            raise
        except Exception:  # refused, timed out, reset: start_tls closed the socket; not ours to log
            tls = None
        if tls is None:  # also when the socket was aborted mid-handshake (an eviction)
            self._gate.release(self._guard)
            return
        tls.set_protocol(self._guard)
        self._guard.connection_made(tls)
        for data in self._kept:
            self._guard.data_received(data)
        if self._eof and not self._guard.eof_received():
            tls.close()
        if self._lost is not None:
            self._guard.connection_lost(self._lost[0])

    def data_received(self, data: bytes) -> None:
        self._kept.append(data)

    def eof_received(self) -> bool:
        self._eof = True
        return True  # the guard decides, once it has the connection

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._wrapping:  # the TCP connection, lost before the handshake began
            self._gate.release(self._guard)
        else:
            self._lost = (exc,)


class ConnectionGate:
    """The listening socket's protocol factory: aiohttp's, behind a connection limit, and
    behind TLS when ``tls`` gives a context (called once per connection)."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], loop: asyncio.AbstractEventLoop,
                 max_connections: int, header_timeout: float, shed: IntervalLog,
                 tls: Callable[[], ssl.SSLContext | None] | None = None) -> None:
        self._factory = factory
        self._tls = tls
        self.loop = loop
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.guards: set[_Guard] = set()
        # connections with no request in progress, longest-waiting first (dicts keep order):
        # those that never finished a request (silent, half-sent headers, a TLS handshake),
        # and those kept alive after one (a scraper's: Prometheus reuses its connection)
        self.waiting: dict[_Guard, None] = {}
        self.kept: dict[_Guard, None] = {}
        self.handshakes: set[asyncio.Task[None]] = set()  # TLS handshakes under way
        self.shed = shed

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self.guards) >= self.max_connections and not self._evict():
            self.shed.note("refused", open=len(self.guards), limit=self.max_connections)
            return _Refused()
        guard = _Guard(self, self._factory())
        self.guards.add(guard)
        context = self._tls() if self._tls is not None else None
        return guard if context is None else _TLSStart(self, guard, context)

    def _evict(self) -> bool:
        """Close the longest-waiting connection with no request in progress and nothing left
        to write (a response still draining is not cut off); False when there is none.

        One that never finished a request goes before one kept alive after a request: a
        flood of silent sockets, which the attacker reopens as fast as they are closed, then
        never closes a scraper's kept-alive connection, and the scraper never has to queue
        for a new one behind the flood's handshakes (docs/reliability.md, row 2)."""
        for waiting in (self.waiting, self.kept):
            for guard in waiting:
                transport = guard.transport
                if transport is not None and not transport.get_write_buffer_size():
                    del waiting[guard]
                    self.guards.discard(guard)  # its slot is free now; connection_lost follows
                    transport.abort()
                    self.shed.note("evicted", open=len(self.guards), limit=self.max_connections)
                    return True
        return False

    def release(self, guard: _Guard) -> None:
        self.guards.discard(guard)
        self.waiting.pop(guard, None)
        self.kept.pop(guard, None)


class GuardedSite(web.BaseSite):
    """``web.SockSite`` with a :class:`ConnectionGate` as the protocol factory."""

    __slots__ = ("_header_timeout", "_max_connections", "_shed", "_sock", "_tls", "gate")

    def __init__(self, runner: web.BaseRunner, sock: Any, max_connections: int,
                 header_timeout: float, shed: IntervalLog | None = None,
                 tls: Callable[[], ssl.SSLContext | None] | None = None) -> None:
        super().__init__(runner, backlog=BACKLOG)
        self._sock = sock
        self._tls = tls  # the TLS context for each new connection; None: plain HTTP
        self._max_connections = max_connections
        self._header_timeout = header_timeout
        self._shed = shed  # default: a line of its own (shed_log)
        self.gate: ConnectionGate | None = None

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{'https' if self._tls is not None else 'http'}://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        shed = self._shed if self._shed is not None else shed_log(loop)
        self.gate = ConnectionGate(server, loop, self._max_connections, self._header_timeout, shed,
                                   self._tls)
        self._server = await loop.create_server(self.gate, sock=self._sock,
                                                backlog=self._backlog)
        # listen() again (Linux takes a new backlog on a listening socket): a deeper kernel
        # queue while asyncio still accepts 128 per tick, which effective_max_connections
        # counts on
        self._sock.listen(listen_backlog())

    async def stop(self) -> None:
        if self.gate is not None:
            self.gate.shed.close()
            for task in self.gate.handshakes:
                task.cancel()
        await super().stop()


def request_limits(max_requests: int, body_timeout: float | None = None) -> Middleware:
    """The middleware: marks the connection busy, caps requests in flight per endpoint
    (0: no cap), holds a request body to ``body_timeout`` (None: no deadline), and writes
    the response before it lets go of either."""
    in_flight: Counter[str] = Counter()

    async def respond(request: web.Request, handler: Handler) -> web.StreamResponse:
        if body_timeout is None or not request.body_exists or request.content.is_eof():
            return await _respond(request, handler)
        return await _body_deadline(request, handler, body_timeout)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        guard = transport.get_protocol() if transport is not None else None
        if not isinstance(guard, _Guard):  # e.g. aiohttp's test server, without the gate
            guard = None
        if guard is not None:
            guard.request_started()
        try:
            resource_ = request.match_info.route.resource
            endpoint = resource_.canonical if resource_ is not None else ""
            if max_requests and endpoint:
                if in_flight[endpoint] >= max_requests:
                    return web.Response(status=503, text="limit of concurrent requests reached "
                                        f"({max_requests}), try again later\n")
                in_flight[endpoint] += 1
                try:
                    return await respond(request, handler)
                finally:
                    in_flight[endpoint] -= 1
            return await respond(request, handler)
        finally:
            if guard is not None:
                guard.request_done()

    return middleware


WRITE_CHUNK = 256 * 1024  # bytes handed to the transport at a time by write_large


async def write_large(request: web.Request, body: bytes, headers: dict[str, str]
                      ) -> web.StreamResponse:
    """A 200 with ``body`` written in ``WRITE_CHUNK`` slices, each once the socket has taken
    the previous ones; bodies up to one slice, and HEAD, go out as a plain Response.

    asyncio's transport copies what a send() does not take: an 8.9 MB /metrics (1,088 GPUs
    with issue 16's values) was copied twice per request (``data[n:]``, then into the
    transport's buffer), and 40 slow readers held 40 copies (356 MB). Slices of memoryview
    are not copied, and at most one slice per connection waits in userspace.
    """
    if request.method == "HEAD" or len(body) <= WRITE_CHUNK:
        return web.Response(body=body, headers=headers)
    response = web.StreamResponse(headers=headers)
    response.content_length = len(body)
    try:
        await response.prepare(request)
        view = memoryview(body)
        for start in range(0, len(body), WRITE_CHUNK):
            await response.write(view[start:start + WRITE_CHUNK])  # waits for the drain
        await response.write_eof()
    except ConnectionError:
        pass  # the client left; nothing more to write
    return response


async def _body_deadline(request: web.Request, handler: Handler, seconds: float
                         ) -> web.StreamResponse:
    """The handler's response, or 408 (connection closed) when the body has not arrived
    whole ``seconds`` after the headers. Only an unfinished body ends the handler: once it
    is in, the handler runs as long as it needs (a what-if has its own limit)."""
    loop = asyncio.get_running_loop()
    late = False
    timer: asyncio.TimerHandle | None = None
    try:
        async with asyncio.timeout(None) as deadline:
            def check() -> None:
                nonlocal late
                if not request.content.is_eof():
                    late = True
                    deadline.reschedule(loop.time())  # cancels the handler's wait for the body

            timer = loop.call_later(seconds, check)
            return await _respond(request, handler)
    except TimeoutError:
        if not late:
            raise  # the handler's own timeout, not ours
    finally:
        if timer is not None:
            timer.cancel()
    response = web.Response(status=408, text=f"request body not received within {seconds:g} s\n")
    response.force_close()
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        return response
    # closed once the 408 is out, without reading the rest: aiohttp would otherwise read and
    # discard the body for up to 10 s more (its lingering close)
    request.protocol.force_close()
    return response


async def _respond(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The handler's response, written out here (aiohttp's own write then finds it done)."""
    response = await handler(request)
    if not response.prepared:
        try:
            await response.prepare(request)
            await response.write_eof()
        except ConnectionError:
            pass  # the client left; aiohttp's write of the response sees the same, quietly
    return response
