"""A Kubernetes informer: list once, then watch, keeping a local copy of one kind of object.

The apiserver's own contract (``api-concepts``, "Efficient detection of changes"),
as client-go's reflector follows it:

1. **List** with ``limit``/``continue`` pages. All pages of one list are one
   consistent view, at the ``resourceVersion`` of the list; a ``continue`` token
   that expired meanwhile answers ``410 Gone`` and the list starts again.
2. **Watch** from that ``resourceVersion`` with ``allowWatchBookmarks=true`` and
   ``timeoutSeconds``: one JSON object per line, ``ADDED``/``MODIFIED``/``DELETED``
   applied in the order they come, each moving the ``resourceVersion`` on;
   ``BOOKMARK`` moves it on without a change, so a reopened watch never starts
   from a version the apiserver has compacted away.
3. A watch the apiserver ends (``timeoutSeconds``) is reopened from the last
   ``resourceVersion``: no re-list, no event lost or repeated.
4. ``410 Gone`` (the HTTP status, or an ``ERROR`` event whose Status has code 410):
   the version is too old. The informer lists again and swaps the new copy in
   whole, so readers see the old copy until the new one is complete (no gap) and
   never a mix of both (no duplicate, nothing deleted meanwhile left behind).
5. Anything else that breaks the watch (connection refused or reset, 5xx, a
   timeout) is retried after a backoff from the last ``resourceVersion``. There is
   exactly one task per informer, and :meth:`Informer.stop` cancels and awaits it:
   nothing is leaked.
6. The backoff is client-go's reflector's (:class:`Backoff`): every list after the
   first and every retry after a failure waits a step, from ``backoff_initial``
   (0.8 s) doubling to ``backoff_max`` (30 s), each wait 1 to 2 times its step; the
   step starts again once a list and watch have lived ``backoff_reset`` (2 min). An
   apiserver answering 410 to every watch sees about 5 lists per resource in 20 s.

It never polls: after the first list, the apiserver pushes every change.

Every input is bounded before it is parsed: a list page by ``max_page_bytes``, a
watch event (one line) by ``max_event_bytes``, the copy by ``max_objects``.

Objects are not kept as the apiserver's JSON: ``transform`` turns each into the
small record the source needs (or None: not kept), which is what lets 50,000 pods
fit in tens of MB rather than the ~1 GB their JSON would take as Python dicts.

JSON is decoded with msgspec against the shape the source reads (``shape``, a
TypedDict of the fields it needs): fields outside it (managedFields, volumes, env,
most of status: two thirds of a real pod) are skipped without being built, which
decodes a page of 500 pods 3.3 times faster than ``json.loads`` (14 vs 47 ms
measured here). An object that does not fit the shape (a field of the wrong type,
an ``ERROR`` event's Status) is decoded again in full with ``json``, so a strange
object is judged by the source's own defensive reading, never dropped by the decoder.

The HTTP client is aiohttp. ``kubernetes_asyncio`` would decode each object into
its generated model classes, 0.17 ms for a minimal pod measured here (several
times that for a real one), which alone would spend the 5 s budget for 50,000
pods; it is used only to load credentials (:mod:`exporter.sources.kubernetes.source`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypedDict, TypeVar
from urllib.parse import urlencode

import aiohttp
import msgspec

from exporter import http_client

log = logging.getLogger(__name__)

T = TypeVar("T")
Transform = Callable[[Mapping[str, Any]], "T | None"]
Authorization = Callable[[], Awaitable[str | None]]

SHORT_WATCH = 1.0  # seconds: a watch that ends sooner with nothing in it counts as a failure


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection during one synchronous burst of allocation.

    Decoding a page and making its records allocates thousands of objects, none in a
    cycle; each batch of them made CPython walk every live object again (a full
    collection whenever the survivors grow by a quarter). Measured on 50,000 pods:
    decoding took 1.53 s of CPU with collections and 0.38 s without, building the
    snapshot 0.82 s and 0.45 s. Only around code with no ``await`` inside, so other
    tasks never run with collection off; the previous state is restored.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class ApiError(Exception):
    """The apiserver refused or failed a call; one line, with the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Gone(ApiError):
    """410: the resourceVersion (or continue token) is older than the apiserver keeps."""


class NotServed(ApiError):
    """404 on a list: this apiserver does not serve the API (no DRA on a 1.31 cluster)."""


@dataclass(frozen=True)
class Endpoint:
    """Where the apiserver is and how to authenticate to it."""

    base_url: str  # https://host:port, no trailing slash
    ssl: Any = None  # an ssl.SSLContext, False (no verification) or None (aiohttp's default)
    authorization: Authorization | None = None  # the Authorization header's value, refreshed


@dataclass(frozen=True)
class Limits:
    page_size: int = 500
    request_timeout: float = 10.0
    watch_timeout: float = 300.0
    # client-go's reflector: wait.NewExponentialBackoffManager(800ms, 30s, 2min, 2.0, 1.0)
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    backoff_reset: float = 120.0
    max_objects: int = 500_000
    max_event_bytes: int = 4 * 1024 * 1024
    max_page_bytes: int = 256 * 1024 * 1024


@dataclass
class InformerStats:
    """What happened so far; tests and the bench read it, nothing else depends on it."""

    lists: int = 0  # complete lists (the first one, and each after a 410)
    pages: int = 0
    watches: int = 0  # watch requests the apiserver accepted
    events: int = 0  # ADDED/MODIFIED/DELETED applied
    bookmarks: int = 0
    gone: int = 0  # 410s seen (each followed by a backoff, then a re-list)
    failures: int = 0  # broken lists and watches (each followed by a backoff)
    waits: int = 0  # backoffs begun (after a 410, a failure, or a watch ended at once)
    backoff: float = 0.0  # seconds of the last backoff begun, jittered
    skipped: int = 0  # objects, or watch events, nested too deep to decode: dropped alone
    apply_seconds: float = 0.0  # time spent applying watch events (parse, transform, store)
    last_watch_at: float | None = None  # monotonic time the last watch was accepted


@dataclass
class Backoff:
    """How long an informer waits before it lists again or retries, as client-go's
    reflector does (``wait.NewExponentialBackoffManager(initial, cap, reset, 2.0, 1.0)``).

    Each wait is its step times 1 to 2 (``draw``: a random number in [0, 1)); the step
    doubles up to ``cap``, and starts again from ``initial`` once the informer ran
    ``reset`` seconds without waiting: a list and watch that lived. client-go counts those
    seconds from the start of its last wait; here they count from its end, so a wait is
    never taken for time lived. A ``cap`` below ``initial`` caps the first step too.
    """

    initial: float
    cap: float
    reset: float
    step: float = 0.0  # of the next wait, unless reset first
    resumes_at: float | None = None  # monotonic time the last wait ends

    def next(self, now: float, draw: float) -> float:
        """The seconds to wait from ``now``."""
        if self.resumes_at is None or now - self.resumes_at > self.reset:
            self.step = min(self.initial, self.cap)
        wait = self.step * (1.0 + draw)
        self.step = min(self.step * 2.0, self.cap)
        self.resumes_at = now + wait
        return wait


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, dict | Mapping):
        return ""
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return ""
    namespace = meta.get("namespace")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def _resource_version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    value = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def _status_message(body: bytes, status: int, reason: str) -> str:
    """The apiserver's ``Status.message`` ('pods is forbidden: User ... cannot list ...')."""
    message = ""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        data = json.loads(body[:65536])
        if isinstance(data, Mapping) and isinstance(data.get("message"), str):
            message = data["message"][:300]
    return f"HTTP {status} {reason}" + (f": {message}" if message else "")


class Decoder:
    """JSON to dicts, pruned to ``shape`` (a TypedDict) when the object fits it."""

    def __init__(self, shape: Any = None) -> None:
        self._list: msgspec.json.Decoder[Any] | None = None
        self._event: msgspec.json.Decoder[Any] | None = None
        self._item: msgspec.json.Decoder[Any] | None = None
        if shape is not None:
            self._item = msgspec.json.Decoder(shape)
            self._list = msgspec.json.Decoder(
                TypedDict("ObjectList", {"metadata": Any, "items": list[shape]},  # type: ignore[misc,operator]
                          total=False))
            self._event = msgspec.json.Decoder(
                TypedDict("WatchEvent", {"type": Any, "object": shape},  # type: ignore[misc,operator]
                          total=False))

    @staticmethod
    def _decode(decoder: msgspec.json.Decoder[Any] | None, data: bytes | bytearray) -> Any:
        if decoder is not None:
            try:
                return decoder.decode(data)
            except msgspec.ValidationError:
                pass  # valid JSON of another shape: read it whole
            except msgspec.DecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        return json.loads(data)

    def page(self, data: bytes | bytearray) -> tuple[Any, int]:
        """A list page, and how many of its objects were skipped as too deep to decode.

        Both decoders recurse, and refuse JSON nested deeper than Python's recursion limit
        (1,000): one such object (3,000 deep) made the whole list fail, every time. Then
        the page is split into its objects without recursion, and each is decoded alone.
        """
        try:
            return self._decode(self._list, data), 0
        except RecursionError:
            pass
        metadata, raws = split_list(bytes(data))
        items: list[Any] = []
        skipped = 0
        for raw in raws:
            try:
                items.append(self._decode(self._item, raw))
            except RecursionError:
                skipped += 1
        try:
            meta = json.loads(metadata)
        except RecursionError:
            raise ValueError("a list answer whose metadata is nested too deep") from None
        return {"metadata": meta, "items": items}, skipped

    def event(self, data: bytes | bytearray) -> Any:
        return self._decode(self._event, data)


# a JSON string (escapes and all), or one structural character: what split_list walks
_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]')


def split_list(data: bytes) -> tuple[bytes, list[bytes]]:
    """A list answer's ``metadata`` and each of its ``items``, as raw JSON, without recursion.

    Only for a page the decoders refused as too deep: it walks every structural token
    in Python, so it is slower than they are, but its depth is a counter. Not a
    validator: what it hands back is decoded afterwards, and fails there if bad.
    """
    depth = 0
    key = b""
    last_string = b""
    value_start = 0
    metadata = b"{}"
    items: list[bytes] = []
    item_start = -1  # inside the items array: where the current item began
    for match in _JSON_TOKEN.finditer(data):
        token = match.group()
        first = token[:1]
        if first == b'"':
            last_string = token
        elif first == b":":
            if depth == 1:
                key, value_start = last_string, match.end()
        elif first in (b"[", b"{"):
            depth += 1
            if depth == 2 and first == b"[" and key == b'"items"':
                item_start = match.end()
        elif first in (b"]", b"}"):
            if depth == 2 and item_start >= 0 and first == b"]":
                item = data[item_start:match.start()].strip()
                if item:
                    items.append(item)
                item_start = -1
            depth -= 1
            if depth == 0 and key == b'"metadata"':
                metadata = data[value_start:match.start()]
        elif first == b",":
            if depth == 2 and item_start >= 0:
                items.append(data[item_start:match.start()].strip())
                item_start = match.end()
            elif depth == 1:
                if key == b'"metadata"':
                    metadata = data[value_start:match.start()]
                key = b""
    return metadata, items


def _is_gone(status: Mapping[str, Any]) -> bool:
    """A watch ERROR's Status says 410 Gone: by its code (a number, or a number as text),
    or by its reason where the code is missing. Whatever else the Status holds or lacks
    (``"status": "Failure"``, ``kind``) does not matter."""
    code = status.get("code")
    if isinstance(code, str) and code.strip().isdigit():
        code = int(code)
    if isinstance(code, int) and not isinstance(code, bool):
        return code == 410
    return status.get("reason") in ("Expired", "Gone")


class Informer(Generic[T]):
    """A local copy of one kind of object (``path``, e.g. ``/api/v1/pods``), kept by watching.

    ``store`` maps ``namespace/name`` to ``transform(object)``; it is replaced whole by a
    re-list and changed in place by events, always between two awaits, so a reader on
    the same event loop never sees half a change. ``revision`` grows with every change,
    so a reader can tell that nothing changed since it last looked.
    """

    def __init__(self, session: aiohttp.ClientSession, endpoint: Endpoint, path: str,
                 transform: Transform[T], limits: Limits = Limits(), name: str = "",
                 shape: Any = None) -> None:
        self.decoder = Decoder(shape)
        self.session = session
        self.endpoint = endpoint
        self.path = path
        self.transform = transform
        self.limits = limits
        self.name = name or path.rsplit("/", 1)[-1]
        self.store: dict[str, T] = {}
        self.resource_version = ""
        self.revision = 0
        self.synced = asyncio.Event()  # set once the first list is in the store
        self.healthy = False  # False from a failed call until the next call that works
        self.error = "not listed yet"
        self.not_served = False  # the apiserver answered 404 to the list: no such API
        self.stats = InformerStats()
        self._task: asyncio.Task[None] | None = None
        self._random = random.Random()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"informer {self.path}")

    async def stop(self) -> None:
        """Cancel the informer's one task and wait for it: its connection is closed on return."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """List, then watch, for ever (until cancelled)."""
        limits = self.limits
        backoff = Backoff(limits.backoff_initial, limits.backoff_max, limits.backoff_reset)
        need_list = True
        while True:
            pause = False
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                started, events = time.monotonic(), self.stats.events + self.stats.bookmarks
                await self.watch()
                # A watch that ran and ended (timeoutSeconds) is reopened at once. One that
                # ended within a second with nothing in it (a proxy closing every stream)
                # would make this loop a busy one: it waits as after a failure.
                pause = time.monotonic() - started < SHORT_WATCH and \
                    self.stats.events + self.stats.bookmarks == events
            except Gone as exc:
                self.stats.gone += 1
                log.info("kubernetes watch expired; listing again",
                         extra={"source": "kubernetes", "err": f"{self.path}: {exc}"})
                need_list = True
                # as client-go, the list a 410 calls for waits a backoff step first: an
                # apiserver answering 410 to every watch (or a list whose pages keep
                # expiring) is listed from less and less often, not once a round trip
                pause = True
            except NotServed as exc:
                self._fail(exc)
                self.not_served = True
                self.synced.set()  # nothing to wait for: the source reads without this kind
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # anything uncaught would end the task for good
                # an ApiError, a connection error, a timeout, JSON that does not parse, or a
                # bug a strange object found in the transform: the informer must keep going
                if not isinstance(exc, ApiError | aiohttp.ClientError | TimeoutError | OSError
                                  | ValueError):
                    log.error("kubernetes informer error", extra={
                        "source": "kubernetes", "err": f"{self.path}: {exc!r}"[:400]})
                self._fail(exc)
                pause = True
            if pause:
                # jitter: many exporters restarted with one apiserver should not retry in step
                wait = backoff.next(time.monotonic(), self._random.random())
                self.stats.waits += 1
                self.stats.backoff = wait
                await asyncio.sleep(wait)

    def _fail(self, exc: BaseException) -> None:
        self.stats.failures += 1
        message = str(exc) or type(exc).__name__
        if isinstance(exc, aiohttp.ClientConnectionError | OSError | TimeoutError):
            message = f"apiserver unreachable: {message}"
        self.error = f"{self.path}: {message}"[:400]
        if self.healthy:
            log.warning("kubernetes watch broken; retrying",
                        extra={"source": "kubernetes", "err": self.error})
        self.healthy = False

    def _url(self, params: Mapping[str, str]) -> str:
        return f"{self.endpoint.base_url}{self.path}?{urlencode(params)}"

    async def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.endpoint.authorization is not None:
            value = await self.endpoint.authorization()
            if value:
                headers["Authorization"] = value
        return headers

    @staticmethod
    async def _raise_for(response: aiohttp.ClientResponse) -> None:
        if response.status == 200:
            return
        if response.status in http_client.REDIRECTS:
            raise ApiError(response.status, http_client.redirect_refused(response.status))
        body = await response.content.read(65536)
        message = _status_message(body, response.status, response.reason or "")
        if response.status == 410:
            raise Gone(410, message)
        if response.status == 404:
            raise NotServed(404, message)
        raise ApiError(response.status, message)

    # -- list --------------------------------------------------------------------------

    async def _read_capped(self, response: aiohttp.ClientResponse) -> bytearray:
        """The whole body, refused once it passes ``max_page_bytes`` (before it is parsed)."""
        body = bytearray()
        limit = self.limits.max_page_bytes
        while True:
            chunk = await response.content.readany()
            if not chunk:
                return body
            body += chunk
            if len(body) > limit:
                raise ApiError(0, f"a list page is over max_page_bytes ({limit} bytes)")

    def _take_page(self, body: bytearray, items: dict[str, T],
                   room: int) -> tuple[int, Mapping[str, Any], int]:
        """Decode one list page and put its records into ``items`` (in a worker thread):
        how many objects it held, its metadata, and how many were skipped as too deep.

        A page of more than ``room`` objects (what ``max_objects`` leaves) keeps none of
        its records: the caller refuses the list, as when this ran on the loop. With
        collection paused here the loop runs for these milliseconds without cyclic
        collection too: harmless, it only defers it."""
        with paused_gc():
            page, skipped = self.decoder.page(body)
            if not isinstance(page, Mapping) or not isinstance(page.get("items"), list):
                raise ValueError("a list answer without items")
            objects = page["items"]
            if len(objects) > room:
                return len(objects), {}, skipped
            for obj in objects:
                if not isinstance(obj, dict | Mapping):
                    continue
                key = object_key(obj)
                record = self.transform(obj) if key else None
                if record is not None:
                    items[key] = record
            meta = page.get("metadata")
            return len(objects), meta if isinstance(meta, Mapping) else {}, skipped

    async def relist(self) -> None:
        """A full, paged list, swapped in whole once complete."""
        items: dict[str, T] = {}
        count = 0
        token = ""
        version = ""
        timeout = aiohttp.ClientTimeout(total=self.limits.request_timeout)
        while True:
            params = {"limit": str(self.limits.page_size)}
            if token:
                params["continue"] = token
            # never redirected: the bearer token goes to the apiserver and nowhere else
            async with http_client.request(self.session, "GET", self._url(params),
                                           headers=await self._headers(), ssl=self.endpoint.ssl,
                                           timeout=timeout) as response:
                await self._raise_for(response)
                body = await self._read_capped(response)
            # decoded and made into records in a worker thread: 300,000 pods are 600 pages
            # of about 14 ms each, and on the loop every one of them stood between a
            # scrape and its answer (issue 32, finding 10). The records go into ``items``
            # there too, a dict no other code sees until the swap below.
            page_count, meta, skipped = await asyncio.to_thread(
                self._take_page, body, items, self.limits.max_objects - count)
            del body
            if skipped:
                self.stats.skipped += skipped
                log.warning("kubernetes objects skipped: nested too deep to decode",
                            extra={"source": "kubernetes",
                                   "err": f"{self.path}: {skipped} in one list page"})
            self.stats.pages += 1
            count += page_count
            if count > self.limits.max_objects:
                raise ApiError(0, f"more than max_objects ({self.limits.max_objects}) "
                                  "objects")
            version = meta.get("resourceVersion") or version
            token = meta.get("continue") or ""
            if not isinstance(token, str) or not token:
                break
        if not isinstance(version, str) or not version:
            raise ValueError("a list answer without metadata.resourceVersion")
        # the swap: one assignment, between two awaits
        self.store = items
        self.resource_version = version
        self.revision += 1
        self.stats.lists += 1
        self.healthy = True
        self.error = ""
        self.synced.set()

    # -- watch -------------------------------------------------------------------------

    async def watch(self) -> None:
        """One watch request, from ``resource_version`` until the apiserver ends it."""
        params = {"watch": "1", "resourceVersion": self.resource_version,
                  "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(int(self.limits.watch_timeout))}
        # the apiserver sends a bookmark about every minute and ends the watch at
        # timeoutSeconds: a connection silent for longer than that plus a grace is dead
        timeout = aiohttp.ClientTimeout(total=None, connect=self.limits.request_timeout,
                                        sock_connect=self.limits.request_timeout,
                                        sock_read=self.limits.watch_timeout + 30)
        async with http_client.request(self.session, "GET", self._url(params),
                                       headers=await self._headers(), ssl=self.endpoint.ssl,
                                       timeout=timeout) as response:
            await self._raise_for(response)
            self.stats.watches += 1
            self.stats.last_watch_at = time.monotonic()
            self.healthy = True
            self.error = ""
            # one bytearray, searched only where new bytes arrived: a 4 MiB event in 64 KiB
            # chunks is not copied 64 times over
            buffer = bytearray()
            limit = self.limits.max_event_bytes
            while True:
                chunk = await response.content.readany()
                if not chunk:
                    break  # the apiserver ended the watch
                searched = len(buffer)
                buffer += chunk
                start = 0
                end = buffer.find(b"\n", searched)
                while end >= 0:
                    line = bytes(buffer[start:end])
                    if line.strip():
                        self.apply_line(line)
                    start = end + 1
                    end = buffer.find(b"\n", start)
                del buffer[:start]
                if len(buffer) > limit:
                    raise ApiError(0, f"a watch event is over max_event_bytes ({limit} bytes)")
            if bytes(buffer).strip():
                self.apply_line(bytes(buffer))

    def apply_line(self, line: bytes) -> None:
        """Apply one watch event (one JSON line)."""
        started = time.perf_counter()
        if len(line) > self.limits.max_event_bytes:
            raise ApiError(0, f"a watch event is over max_event_bytes "
                              f"({self.limits.max_event_bytes} bytes)")
        try:
            event = self.decoder.event(line)
        except RecursionError:
            # one event nested too deep: dropped alone. Raising would reopen the watch from
            # the same version and meet the same event again, about once a second
            self.stats.skipped += 1
            log.warning("kubernetes watch event skipped: nested too deep to decode",
                        extra={"source": "kubernetes", "err": self.path})
            return
        if not isinstance(event, Mapping):
            raise ValueError("a watch event that is not an object")
        kind = event.get("type")
        if kind == "ERROR":
            # a Status, read whole: the shape's decoder keeps only the fields of the kind
            # watched, and a Status that happens to fit it (no "status": "Failure", which
            # is not an object) would lose its code and message
            with contextlib.suppress(ValueError, RecursionError):
                event = json.loads(line)
        obj = event.get("object") if isinstance(event, Mapping) else None
        if not isinstance(obj, Mapping):
            raise ValueError(f"a {kind} watch event without an object")
        if kind == "ERROR":
            code = obj.get("code")
            text = obj.get("message")
            message = text if isinstance(text, str) else ""
            if _is_gone(obj):
                raise Gone(410, f"watch: {message[:300]}")
            raise ApiError(code if isinstance(code, int) else 0, f"watch error: {message[:300]}")
        version = _resource_version(obj)
        if kind == "BOOKMARK":
            if version:
                self.resource_version = version
            self.stats.bookmarks += 1
            return
        key = object_key(obj)
        # most events change nothing kept: node heartbeats, pods without GPUs, a pod's
        # status churn. Only a changed record moves the revision, so a read rebuilds the
        # snapshot only when what it is made of changed (records compare by value).
        changed = False
        if kind in ("ADDED", "MODIFIED"):
            record = self.transform(obj) if key else None
            if record is not None:
                if key not in self.store and len(self.store) >= self.limits.max_objects:
                    raise ApiError(0, f"more than max_objects ({self.limits.max_objects}) "
                                      "objects")
                changed = self.store.get(key) != record
                self.store[key] = record
            else:  # no longer of interest (a pod that finished)
                changed = self.store.pop(key, None) is not None
        elif kind == "DELETED":
            changed = self.store.pop(key, None) is not None
        else:
            raise ValueError(f"unknown watch event type {str(kind)[:40]!r}")
        if version:
            self.resource_version = version
        if changed:
            self.revision += 1
        self.stats.events += 1
        self.stats.apply_seconds += time.perf_counter() - started


@dataclass
class InformerSet:
    """The informers of one source, started and stopped together."""

    informers: list[Informer[Any]] = field(default_factory=list)

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    async def stop(self) -> None:
        for informer in self.informers:
            await informer.stop()

    async def synced(self, timeout: float) -> bool:
        """True when every informer has listed once, within ``timeout`` seconds."""
        waits = [asyncio.ensure_future(i.synced.wait()) for i in self.informers]
        try:
            _, pending = await asyncio.wait(waits, timeout=timeout)
        finally:
            for wait in waits:
                wait.cancel()
        return not pending
