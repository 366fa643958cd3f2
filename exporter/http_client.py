"""The one outgoing HTTP client: no redirect is followed, no answer is read past a cap.

Every request gpufleet makes (webhook receivers, dcgm-exporter targets, the Prometheus
API, the Kubernetes apiserver, ``gpufleet plan``'s fetch, ``gpufleet act``'s node calls)
goes through here, because each of them carries something that must reach only the host
it was meant for: a signed plan, a bearer token, basic auth. Following a redirect sends
it to whichever host the answer names (a 307 re-sends the body, and urllib keeps
``Authorization`` across hosts), and a 302 turns a POST into a body-less GET whose 200
would read as a success. So a 3xx is handed to the caller as what it is: an answer that
is not the one asked for. And an answer is read up to the caller's cap, never whole
first: ``ClientResponse.read()`` would hold a 1.5 GB answer in memory before anyone
looked at its size.

- :func:`client_session`: the aiohttp session every asynchronous caller opens. Its
  requests still need ``allow_redirects=False`` (aiohttp has no session-wide switch);
  should one forget it, the session refuses the redirect rather than follow it.
- :func:`request`: a request on any aiohttp session, redirects never followed.
- :func:`read_capped`: a body up to a cap, or :class:`AnswerTooLarge`.
- :func:`fetch`: the same for a synchronous caller (urllib), whole answer and status.

aiohttp is imported only where a function needs it: ``gpufleet act`` stays free of it.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl
    from collections.abc import Mapping
    from contextlib import AbstractAsyncContextManager

    import aiohttp

REDIRECTS = range(300, 400)
CHUNK_BYTES = 1 << 20  # the most one read takes: what a cap can be overshot by, at most


class AnswerTooLarge(Exception):
    """An answer over the caller's cap: ``declared`` is its Content-Length when that
    alone said so (nothing was read), else None (the read stopped at the cap)."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        self.limit = limit
        self.declared = declared
        if declared is not None:
            super().__init__(f"answer of {declared:,} bytes, over the {limit:,}-byte limit")
        else:
            super().__init__(f"answer over the {limit:,}-byte limit (read stopped there)")


def redirect_refused(status: int) -> str:
    """The one line every caller gives a 3xx answer."""
    return f"HTTP {status}: redirects are not followed"


def client_session(*, timeout: aiohttp.ClientTimeout | None = None,
                   headers: Mapping[str, str] | None = None,
                   limit: int | None = None) -> aiohttp.ClientSession:
    """An aiohttp session that will not follow a redirect even when asked to: a request
    sent without ``allow_redirects=False`` fails with the 3xx (a ClientResponseError)
    before the next hop is sent. ``limit`` caps its open connections."""
    import aiohttp

    guard = aiohttp.TraceConfig()
    guard.on_request_redirect.append(_refuse_redirect)
    options: dict[str, Any] = {"trace_configs": [guard]}
    if timeout is not None:
        options["timeout"] = timeout
    if headers is not None:
        options["headers"] = dict(headers)
    if limit is not None:
        options["connector"] = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(**options)


async def _refuse_redirect(session: aiohttp.ClientSession, context: Any,
                           params: aiohttp.TraceRequestRedirectParams) -> None:
    import aiohttp

    answer = params.response
    answer.close()  # its connection is not reused for a hop that is not taken
    raise aiohttp.ClientResponseError(answer.request_info, (answer,), status=answer.status,
                                      message=redirect_refused(answer.status))


def request(session: aiohttp.ClientSession, method: str, url: str,
            **options: Any) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """``session.request`` with redirects never followed: a 3xx is the answer (see
    :func:`redirect_refused`). ``allow_redirects`` cannot be passed."""
    if "allow_redirects" in options:
        raise TypeError("request(): redirects are never followed")
    return session.request(method, url, allow_redirects=False, **options)


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of ``response``, or AnswerTooLarge as soon as it passes ``limit`` bytes
    (decompressed, so a gzip bomb is cut too). A Content-Length over the cap refuses the
    answer unread, unless the body is encoded (its decoded size is what counts)."""
    declared = response.content_length
    if declared is not None and declared > limit and not response.headers.get("Content-Encoding"):
        raise AnswerTooLarge(limit, declared)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.content.iter_chunked(min(CHUNK_BYTES, limit + 1)):
            size += len(chunk)
            if size > limit:
                raise AnswerTooLarge(limit)
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        # an exception's traceback (a cut answer, a read cancelled with the others) keeps this
        # frame, and with it what was read, for as long as someone holds the exception
        chunks.clear()


@dataclass(frozen=True, slots=True)
class Answer:
    """A synchronous answer: its status (a 3xx included: never followed), reason and body."""

    status: int
    reason: str
    body: bytes


def fetch(method: str, url: str, *, body: bytes | None = None,
          headers: Mapping[str, str] | None = None, timeout: float = 10.0,
          context: ssl.SSLContext | None = None, max_bytes: int) -> Answer:
    """One synchronous request: any status is an :class:`Answer` (a redirect is not
    followed); its body read up to ``max_bytes`` (AnswerTooLarge past it) within
    ``timeout`` seconds in all (TimeoutError). Connection errors are OSError (urllib's
    URLError is one); a URL urllib cannot take is ValueError."""
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    sent = urllib.request.Request(url, body, dict(headers or {}), method=method)
    deadline = time.monotonic() + timeout
    try:
        answer = opener.open(sent, timeout=timeout)
    except urllib.error.HTTPError as exc:  # 3xx (not followed), 4xx, 5xx: an answer all the same
        answer = exc
    with answer:
        status = answer.status if answer.status is not None else answer.getcode()
        reason = str(getattr(answer, "reason", "") or "")
        declared = answer.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise AnswerTooLarge(max_bytes, int(declared))
        return Answer(int(status or 0), reason, _read_sync(answer, max_bytes, deadline, timeout))


def _read_sync(answer: Any, limit: int, deadline: float, timeout: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:  # a trickle stays under the socket timeout each read
            raise TimeoutError(f"no complete answer within {timeout:g} s")
        chunk = answer.read1(min(CHUNK_BYTES, limit + 1))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(limit)
        chunks.append(chunk)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Hands a 3xx back as an HTTPError (an answer) instead of opening its Location."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


__all__ = ["REDIRECTS", "Answer", "AnswerTooLarge", "client_session", "fetch", "read_capped",
           "redirect_refused", "request"]
