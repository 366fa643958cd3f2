"""dcgm-exporter source: scrape every node's dcgm-exporter and build a cluster-wide view.

The NVIDIA GPU Operator runs dcgm-exporter on every GPU node; with
``--kubernetes`` it labels each GPU with the pod holding it, which the
fragmentation analyzer needs. This source scrapes one or many ``/metrics``
endpoints concurrently (aiohttp, at most ``max_concurrency`` at once), parses
the text with the fast line parser (:mod:`exporter.sources.dcgm.exposition_parser`)
and maps it with :mod:`exporter.sources.dcgm.fields`.

Targets come from ``sources.dcgm.targets`` and from ``targets_file``, a
Prometheus ``file_sd``-style JSON or YAML list of ``{targets: [...], labels:
{pool: ...}}`` that is re-read whenever its modification time or size
changes. A file that fails to load keeps the previous list (and is logged).

Each target is isolated: one that is down, answers HTTP 500, sends a truncated
body or garbage gets ``gpufleet_source_up{source="dcgm",target=URL} 0`` while
the others are exported as usual. Its last good reading is served, marked
stale, for ``stale_for``, then dropped. Skipped lines and unattributable
samples add to the source's cumulative ``gpufleet_source_parse_errors_total``.
A targets file that lists no target (yet) raises :class:`~exporter.sources.NoData`:
the source is down with ``no data`` and serves nothing, stale or not.

Hostile targets (issue 14) are bounded, because a worker thread cannot be killed:
  - The body is parsed as it arrives, in chunks of whole lines (256 KiB), each in
    this source's own two worker threads. ``timeout`` is one deadline for every
    target's slot wait, fetch and parse, counted from the start of the read, so a
    read ends within ``timeout`` plus one chunk's parse (tens of milliseconds),
    whatever the number of targets or their behaviour; keep it below
    ``source_timeout``. A target still waiting for a slot at the deadline is down.
  - Caps per target: ``max_body_bytes``, ``max_lines``, ``max_gpus`` (with at most
    7 MIG instances and 128 pods per GPU), and 64 KiB per line. The first chunk
    beyond one stops the read: the target is down with the reason and nothing of
    its body is used. Memory per target in flight is one chunk and the capped GPUs.
  - Targets are deduplicated by address: each host name is resolved (the loop's
    ``getaddrinfo``) when the target list is loaded, and a target whose
    (address, port, path) an earlier one has is merged into it, logged once.
  - GPUs are deduplicated by UUID across targets too: an address the resolver does
    not tie to another (a host name and the IP of a second interface, a proxy) can
    still reach the same node. The first target listed keeps a GPU; later copies,
    their placements and their node are dropped, logged once.
  - ``http://user:password@host`` authenticates with basic auth; the target is
    named without its userinfo everywhere (labels, logs, the snapshot, errors).

A target speaks for its own node only (issue 39, :mod:`exporter.sources.dcgm.identity`): a
body naming another node than the target's (its configured ``node``, else its URL's host
name), ``ALL``, a hostlist or several nodes, or a node another target names with other
GPUs, is refused whole: the target is down with the reason, logged once, and its last good
reading is forgotten.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp

from exporter import http_client
from exporter.node_names import node_name_problem
from exporter.node_names import shown as shown_name
from exporter.snapshot import Allocation, Gpu, Node
from exporter.sources import Clock, NoData, SourceReading, SourceStartupError, TargetStatus
from exporter.sources.dcgm.exposition_parser import parse_text
from exporter.sources.dcgm.fields import DcgmFleet, DcgmFleetBuilder, OverCap, RateIntegrator
from exporter.sources.dcgm.identity import Identity, Part, claim, conflicts, identity, renamed
from exporter.sources.dcgm.options import DcgmSource as DcgmConfig
from exporter.sources.gpu_models import ModelResolver, catalogue_resolver
from exporter.sources.lastgood import LastGood

log = logging.getLogger(__name__)

# Parsed per worker-thread call: a real 8-GPU body (50-200 KB) is one or two calls, and one
# call takes some 20 ms, which is all a deadline can overrun by (a thread cannot be stopped).
CHUNK_BYTES = 256 * 1024
# Real lines are 100-500 bytes; a longer one is hostile (and would make one call unbounded).
MAX_LINE_BYTES = 64 * 1024
# Parsing holds the GIL: more threads add no throughput, and two keep this source's work
# off the loop's default executor (getaddrinfo, other sources) and take chunks in turn.
PARSE_THREADS = 2
# A host name that did not resolve is tried again this long after, not on every read.
RESOLVE_RETRY_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Target:
    url: str  # without userinfo: the target's name in labels, logs, errors and the snapshot
    pool: str
    host: str  # names the node when the samples carry no Hostname label
    # "Basic ..." from the URL's userinfo, sent as the Authorization header; never shown
    authorization: str = field(default="", repr=False)
    node: str = ""  # the node it serves, as configured (labels.node); "" none configured

    def known(self) -> Identity:
        """The node this target may speak for (:mod:`exporter.sources.dcgm.identity`)."""
        return identity(self.host, self.node)


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^/?#]*@")


def without_userinfo(text: str) -> str:
    """``text`` with any ``user:password@`` removed, for messages about a target as written."""
    return _USERINFO.sub(r"\1", text)


def target_from(text: str, pool: str, node: str = "") -> Target:
    """``host:port`` or a URL → a Target; ``/metrics`` is the default path. ``node``: the node
    it serves, as configured ("" none).

    Userinfo becomes the request's basic auth and is dropped from the URL, the target's name.
    """
    raw = text.strip()
    if not raw:
        raise ValueError("empty target")
    if node and node_name_problem(node):
        raise ValueError(f"node {shown_name(node)} {node_name_problem(node)}")
    shown = without_userinfo(raw)
    if "://" not in raw:
        raw = f"http://{raw}"
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"target {shown!r} is not host:port or an http(s) URL")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"target {shown!r} has a bad port") from None
    authorization = ""
    if parts.username is not None or parts.password is not None:
        # RFC 7617 basic auth, UTF-8 (aiohttp.BasicAuth is deprecated in aiohttp 3.14)
        userinfo = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(userinfo.encode()).decode()
    netloc = parts.netloc.rpartition("@")[2]
    path = parts.path or "/metrics"
    query = f"?{parts.query}" if parts.query else ""
    return Target(f"{parts.scheme}://{netloc}{path}{query}", pool, parts.hostname,
                  authorization, node)


def parse_targets_file(data: Any, default_pool: str, where: str) -> list[Target]:
    """Targets from a loaded file_sd document: a list of {targets: [...], labels: {...}}."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise ValueError(f"{where}: must be a list of {{targets: [...], labels: {{...}}}}")
    targets = []
    for i, group in enumerate(data):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ValueError(f"{where}[{i}]: must be a mapping with a 'targets' list")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict):
            raise ValueError(f"{where}[{i}].labels: must be a mapping")
        pool = str(labels.get("pool", default_pool))
        node = labels.get("node", "")
        if not isinstance(node, str) or (node and node_name_problem(node)):
            raise ValueError(f"{where}[{i}].labels.node: {shown_name(node)} "
                             f"{node_name_problem(node)}")
        for j, text in enumerate(group["targets"]):
            if not isinstance(text, str):
                raise ValueError(f"{where}[{i}].targets[{j}]: must be a string")
            try:
                targets.append(target_from(text, pool, node))
            except ValueError as exc:
                raise ValueError(f"{where}[{i}].targets[{j}]: {exc}") from None
    return targets


def load_targets_file(path: str, default_pool: str) -> list[Target]:
    # JSON is YAML too, so the one YAML reader reads both file_sd formats
    from exporter.yamlfile import parse, read_text

    data = parse(read_text(path, "the targets file", ValueError), path, ValueError)
    return parse_targets_file(data, default_pool, path)


@dataclass(frozen=True, slots=True)
class ScrapeOutcome:
    fleet: DcgmFleet | None  # None: the target is down
    parse_errors: int
    error: str
    duration_seconds: float
    refused: bool = False  # it answered for a node not its own: nothing of it is used


@dataclass
class _TargetState:
    last_success: float | None = None
    down: bool = False  # logged as down: log again only when it comes back
    refused: str = ""  # why it is refused, as last logged: log again only when that changes
    duplicates: bool = False  # logged as serving another target's GPUs: log once while so


class UnmappableBody(Exception):
    """Mapping a body raised something we did not foresee: only its target is spoiled."""


class BodyParser:
    """One target's body, fed in pieces of whole lines; stops at the first cap it passes.

    Not thread-safe: one piece at a time (each in a worker thread), then :meth:`finish`.
    """

    def __init__(self, target: Target, resolve_model: ModelResolver, *,
                 max_lines: int | None = None, max_gpus: int | None = None) -> None:
        self.target = target
        self.max_lines = max_lines
        self.lines = 0
        self.errors = 0
        self.first_error = ""
        self._builder = DcgmFleetBuilder(default_node=target.node or target.host, pool=target.pool,
                                         resolve_model=resolve_model, max_gpus=max_gpus)

    def feed(self, data: bytes) -> None:
        """Parse and map ``data``, whole lines (the last may lack its newline). Raises OverCap."""
        lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
        if self.max_lines is not None and self.lines + lines > self.max_lines:
            raise OverCap(f"more than {self.max_lines} lines")
        self.lines += lines
        # A cut at a newline never splits a UTF-8 sequence (0x0A is no continuation byte).
        parsed = parse_text(data.decode("utf-8", errors="replace"))
        self.errors += parsed.errors
        self.first_error = self.first_error or parsed.first_error
        add = self._builder.add
        try:
            for name, labels, value in parsed.samples:
                add(name, labels, value)
        except OverCap:
            raise
        except Exception as exc:
            raise UnmappableBody(_one_line(exc)) from exc

    def finish(self) -> tuple[DcgmFleet, int]:
        """The fleet and the number of lines and samples skipped."""
        try:
            fleet = self._builder.build()
        except Exception as exc:
            raise UnmappableBody(_one_line(exc)) from exc
        if self.errors:
            log.debug("skipped unparsable lines", extra={
                "target": self.target.url, "lines": self.errors, "first": self.first_error})
        return fleet, self.errors + fleet.skipped


def parse_body(body: bytes, target: Target, resolve_model: ModelResolver) -> tuple[DcgmFleet, int]:
    """Text → fleet and the number of lines/samples skipped, without caps. Pure."""
    parser = BodyParser(target, resolve_model)
    parser.feed(body)
    return parser.finish()


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


class DcgmExporterSource:
    name = "dcgm"
    # dcgm-exporter run with --kubernetes labels each GPU with the pod holding it, so this
    # relay knows the jobs and serves their joins (NVML alone knows none)
    schedules = True

    def __init__(self, config: DcgmConfig, clock: Clock, *,
                 session: aiohttp.ClientSession | None = None,
                 resolve_model: ModelResolver | None = None) -> None:
        self.config = config
        self.clock = clock
        self._session = session
        self._own_session = session is None
        self._resolve_model = resolve_model or catalogue_resolver()
        self._static = [target_from(t, config.pool) for t in config.targets] + [
            target_from(t, group.pool or config.pool, group.node)
            for group in config.target_groups for t in group.targets]
        self._file_targets: list[Target] = []
        self._file_key: tuple[int, int] | None = None
        self._states: dict[str, _TargetState] = {}
        # per target URL: its last good reading, served stale for stale_for while it is down
        self._last_good: LastGood[str, SourceReading] = LastGood(
            SourceReading.marked_stale, max_age=config.stale_for)
        self._integrator = RateIntegrator()
        self._parse_errors = 0  # cumulative: feeds a counter
        self._parse_pool: ThreadPoolExecutor | None = None
        # (host, port) -> its addresses, or () and when to retry; emptied when the list changes
        self._addresses: dict[tuple[str, int], tuple[tuple[str, ...], float]] = {}
        self._merged: dict[str, str] = {}  # duplicate URL -> the URL kept, as last logged

    async def _targets(self) -> list[Target]:
        path = self.config.targets_file
        if path:
            try:
                stat = os.stat(path)
                key: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
            except OSError as exc:
                key = None
                if self._file_key is not None or not self._file_targets:
                    log.warning("targets file unreadable; keeping the last targets",
                                extra={"path": path, "err": exc.strerror})
            if key is not None and key != self._file_key:
                try:
                    self._file_targets = await asyncio.to_thread(
                        load_targets_file, path, self.config.pool)
                    self._addresses.clear()  # names are resolved again at each load
                    log.info("targets file loaded",
                             extra={"path": path, "targets": len(self._file_targets)})
                except ValueError as exc:
                    log.warning("targets file rejected; keeping the last targets",
                                extra={"err": str(exc)})
            self._file_key = key
        seen: dict[str, Target] = {}
        for target in [*self._static, *self._file_targets]:
            seen.setdefault(target.url, target)
        return list(seen.values())

    async def _unique(self, targets: list[Target]) -> list[Target]:
        """``targets`` less those whose (address, port, path) an earlier one has."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        wanted = set()
        for target in targets:
            key = _host_port(target)[:2]
            known = self._addresses.get(key)
            if known is None or (not known[0] and now >= known[1]):
                wanted.add(key)

        async def resolve(host: str, port: int) -> None:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                addresses = tuple(sorted({str(info[4][0]) for info in infos}))
            except (OSError, UnicodeError):
                addresses = ()  # the scrape reports why; try again later
            self._addresses[(host, port)] = (addresses, now + RESOLVE_RETRY_SECONDS)

        if wanted:
            # Bounded, so a hung resolver cannot take the read past its deadline: half the
            # deadline for names, the rest for scrapes. Unresolved names are merged by name.
            try:
                async with asyncio.timeout(self.config.timeout / 2):
                    await asyncio.gather(*(resolve(host, port) for host, port in wanted))
            except TimeoutError:
                for key in wanted:
                    self._addresses.setdefault(key, ((), now + RESOLVE_RETRY_SECONDS))
        kept: list[Target] = []
        owners: dict[tuple[str, int, str], Target] = {}
        merged: dict[str, str] = {}
        for target in targets:
            host, port, path = _host_port(target)
            addresses = self._addresses.get((host, port), ((), 0.0))[0] or (host.lower(),)
            keys = [(address, port, path) for address in addresses]
            owner = next((owners[k] for k in keys if k in owners), None)
            if owner is not None:
                merged[target.url] = owner.url
                continue
            owners.update((k, target) for k in keys)
            kept.append(target)
        if merged and merged != self._merged:
            log.info("dcgm targets merged: same address, port and path as an earlier target",
                     extra={"merged": merged})
        self._merged = merged
        return kept

    def _session_for_read(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = http_client.client_session(limit=self.config.max_concurrency)
            self._own_session = True
        return self._session

    async def scrape(self, target: Target, session: aiohttp.ClientSession,
                     limit: asyncio.Semaphore, deadline: float) -> ScrapeOutcome:
        """One target, from its slot wait to its fleet, ended at ``deadline`` (loop time)."""
        started: float | None = None

        def took() -> float:
            return 0.0 if started is None else time.perf_counter() - started

        try:
            async with asyncio.timeout_at(deadline):
                async with limit:
                    started = time.perf_counter()
                    fleet, errors = await self._fetch_and_parse(target, session)
        except TimeoutError:
            if started is None:
                return ScrapeOutcome(None, 0, f"no free slot within {self.config.timeout:g}s "
                                     f"(max_concurrency {self.config.max_concurrency})", 0.0)
            return ScrapeOutcome(None, 0, f"timed out after {self.config.timeout:g}s", took())
        except OverCap as exc:
            return ScrapeOutcome(None, 0, f"over a cap: {exc}", took())
        except UnmappableBody as exc:  # a payload we did not foresee spoils only its target
            log.warning("dcgm body could not be mapped", exc_info=exc.__cause__,
                        extra={"target": target.url})
            return ScrapeOutcome(None, 1, f"unmappable body: {exc}", took())
        except aiohttp.ClientPayloadError as exc:
            return ScrapeOutcome(None, 0, f"truncated body: {exc}", took())
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return ScrapeOutcome(None, 0, _one_line(exc), took())
        if not fleet.gpus:
            return ScrapeOutcome(None, errors, f"no DCGM GPU samples in the body "
                                 f"({errors} lines skipped)", took())
        node, refused = claim(target.known(), {g.node for g in fleet.gpus})
        if refused:
            return ScrapeOutcome(None, errors, refused, took(), refused=True)
        if node != fleet.gpus[0].node:  # the configured name, spelled as configured
            nodes, gpus, allocations = renamed(node, fleet.nodes, fleet.gpus, fleet.allocations)
            fleet = dataclasses.replace(fleet, nodes=nodes, gpus=gpus, allocations=allocations)
        return ScrapeOutcome(fleet, errors, "", took())

    async def _fetch_and_parse(self, target: Target,
                               session: aiohttp.ClientSession) -> tuple[DcgmFleet, int]:
        """Read the body in chunks and parse each in a worker as it comes; OverCap at a cap."""
        config = self.config
        loop = asyncio.get_running_loop()
        parser = BodyParser(target, self._resolve_model, max_lines=config.max_lines,
                            max_gpus=config.max_gpus)
        too_big = f"body over {_size(config.max_body_bytes)}"
        headers = {"Accept": "text/plain"}
        if target.authorization:
            headers["Authorization"] = target.authorization
        # a target speaks for its own address only: its redirect is not followed
        async with http_client.request(session, "GET", target.url, headers=headers) as response:
            if response.status in http_client.REDIRECTS:
                raise ValueError(http_client.redirect_refused(response.status))
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            if (response.content_length or 0) > config.max_body_bytes:
                raise OverCap(too_big)
            size = 0
            pending = bytearray()
            # A body cut short (Content-Length not reached, chunked stream closed
            # early) raises ClientPayloadError here: the target counts as down.
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                size += len(chunk)
                if size > config.max_body_bytes:
                    raise OverCap(too_big)
                pending += chunk
                if len(pending) < CHUNK_BYTES:
                    continue
                cut = pending.rfind(b"\n") + 1
                if len(pending) - cut > MAX_LINE_BYTES:
                    raise OverCap(f"a line over {_size(MAX_LINE_BYTES)}")
                if cut:
                    piece = bytes(pending[:cut])
                    del pending[:cut]
                    await loop.run_in_executor(self._executor(), parser.feed, piece)
            if pending:
                if len(pending) - (pending.rfind(b"\n") + 1) > MAX_LINE_BYTES:
                    raise OverCap(f"a line over {_size(MAX_LINE_BYTES)}")
                await loop.run_in_executor(self._executor(), parser.feed, bytes(pending))
        return await loop.run_in_executor(self._executor(), parser.finish)

    def _executor(self) -> ThreadPoolExecutor:
        if self._parse_pool is None:
            self._parse_pool = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="dcgm-parse")
        return self._parse_pool

    async def read(self) -> SourceReading:
        # One deadline for the whole read: every target's slot wait, fetch and parse end by it.
        deadline = asyncio.get_running_loop().time() + self.config.timeout
        targets = await self._unique(await self._targets())
        for url in [u for u in self._states if u not in {t.url for t in targets}]:
            del self._states[url]  # the target left the file: forget it at once
            self._last_good.forget(url)
        if not targets:
            # Only a targets file can list none (build() wants targets or a file). An empty
            # file_sd is nothing to scrape, not a failure, as in Prometheus.
            self._integrator.forget_except(())
            raise NoData(f"the targets file {self.config.targets_file} lists no target")
        session = self._session_for_read()
        limit = asyncio.Semaphore(self.config.max_concurrency)
        outcomes = await asyncio.gather(*(self.scrape(t, session, limit, deadline)
                                          for t in targets))
        now = self.clock()

        # each target's part: its fresh reading, or its last good one served stale
        readings: list[SourceReading | None] = []
        for target, outcome in zip(targets, outcomes, strict=True):
            if outcome.fleet is not None:
                readings.append(SourceReading(outcome.fleet.nodes,
                                              self._integrator.apply(outcome.fleet, now),
                                              outcome.fleet.allocations))
            else:
                readings.append(None if outcome.refused else self._last_good.recall(target.url, now))
        refused = conflicts([Part(t.url, t.known(), r.gpus[0].node, frozenset(g.uuid for g in r.gpus))
                             for t, r in zip(targets, readings, strict=True) if r is not None and r.gpus])

        nodes: list[Node] = []
        gpus: list[Gpu] = []
        allocations: list[Allocation] = []
        statuses: list[TargetStatus | None] = [None] * len(targets)
        any_up = False
        seen = _SeenGpus()
        # a target whose node is known keeps a GPU another target also shows (see _SeenGpus)
        order = sorted(range(len(targets)), key=lambda i: not targets[i].known().node)
        for i in order:
            target, outcome, reading = targets[i], outcomes[i], readings[i]
            self._parse_errors += outcome.parse_errors
            state = self._states.setdefault(target.url, _TargetState())
            why = outcome.error if outcome.refused else refused.get(target.url, "")
            if why:
                # nothing of it is used, nor its past readings: they made the same claim
                self._last_good.forget(target.url)
                if why != state.refused:  # once per change, not every collection
                    log.warning("dcgm target refused: it names a node not its own",
                                extra={"target": target.url, "err": why})
                state.refused = why
                statuses[i] = TargetStatus(target.url, up=False, error=why,
                                           last_success_time=state.last_success,
                                           duration_seconds=outcome.duration_seconds)
                continue
            if state.refused:
                log.info("dcgm target no longer refused", extra={"target": target.url})
                state.refused = ""
            if outcome.fleet is not None and reading is not None:
                any_up = True
                self._last_good.remember(target.url, reading, now)
                state.last_success = now
                if state.down:
                    log.info("dcgm target back", extra={"target": target.url})
                    state.down = False
                part = seen.unseen(reading)
                self._log_duplicates(target, state, len(reading.gpus) - len(part.gpus))
                gpus += part.gpus
                nodes += part.nodes
                allocations += part.allocations
            else:
                if not state.down:  # once per outage, not every collection
                    log.warning("dcgm target down",
                                extra={"target": target.url, "err": outcome.error})
                    state.down = True
                if reading is not None:
                    part = seen.unseen(reading)
                    gpus += part.gpus
                    nodes += part.nodes
                    allocations += part.allocations
            statuses[i] = TargetStatus(target.url, up=outcome.fleet is not None,
                                       error=outcome.error,
                                       last_success_time=state.last_success,
                                       duration_seconds=outcome.duration_seconds)
        shown = [s for s in statuses if s is not None]
        # A GPU served stale restarts its NVLink counters from 0 when it is back (a counter
        # reset to Prometheus) rather than crediting the outage with its latest rate.
        self._integrator.forget_except(g.uuid for g in gpus if not g.stale)
        return SourceReading(tuple(nodes), tuple(gpus), tuple(allocations),
                             parse_errors=self._parse_errors, targets=tuple(shown),
                             error="" if any_up else _none_up(shown))

    @staticmethod
    def _log_duplicates(target: Target, state: _TargetState, dropped: int) -> None:
        if dropped and not state.duplicates:  # once, while it lasts
            log.info("dcgm target serves GPUs an earlier target has (same UUID); its copies "
                     "are dropped", extra={"target": target.url, "gpus": dropped})
        state.duplicates = bool(dropped)

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        if self._parse_pool is not None:
            # a chunk being parsed finishes in its thread (bounded); queued ones are dropped
            self._parse_pool.shutdown(wait=False, cancel_futures=True)
            self._parse_pool = None


class _SeenGpus:
    """GPUs by UUID across the targets of one read: the first target to show a GPU keeps it.

    Targets are merged by address when their names resolve to one (``_unique``), but one
    GPU node can be reached by two addresses the resolver does not tie together (a host
    name and an IP of another interface, a proxy): an 8-GPU node counted as 16. A GPU is
    one UUID whatever the address it was read from.
    """

    def __init__(self) -> None:
        self._uuids: set[str] = set()
        self._nodes: set[str] = set()

    def unseen(self, part: SourceReading) -> SourceReading:
        """``part`` less the GPUs seen before, their placements, and nodes already listed."""
        copies = {(g.node, g.index) for g in part.gpus if g.uuid and g.uuid in self._uuids}
        gpus = tuple(g for g in part.gpus if (g.node, g.index) not in copies)
        self._uuids.update(g.uuid for g in gpus if g.uuid)
        allocations = part.allocations
        if copies:
            allocations = tuple(a for a in (_without(a, copies) for a in part.allocations)
                                if a.placements)
        kept_nodes = {g.node for g in gpus}
        nodes = tuple(n for n in part.nodes if n.name not in self._nodes and (
            n.name in kept_nodes or not copies))
        self._nodes.update(n.name for n in nodes)
        return SourceReading(nodes, gpus, allocations)


def _without(allocation: Allocation, copies: set[tuple[str, int]]) -> Allocation:
    """``allocation`` less its placements on GPUs another target already serves."""
    placements = []
    for placement in allocation.placements:
        gpus = tuple(i for i in placement.gpus if (placement.node, i) not in copies)
        if gpus == placement.gpus:
            placements.append(placement)
        elif gpus:
            placements.append(dataclasses.replace(placement, gpus=gpus))
    if len(placements) == len(allocation.placements) and all(
            p is q for p, q in zip(placements, allocation.placements, strict=True)):
        return allocation
    return dataclasses.replace(allocation, placements=tuple(placements))


def _host_port(target: Target) -> tuple[str, int, str]:
    """Host, port and path (with its query) of a target: what names its endpoint."""
    parts = urlsplit(target.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port, f"{parts.path}?{parts.query}"


def _none_up(statuses: list[TargetStatus]) -> str:
    """The source's reason when no target served a GPU: the first target's own (issue 30).

    "no target answered" hid a target that answered 200 with no GPU in its body (a
    dcgm-exporter whose DCGM lost the GPUs, a port that serves some other exporter).
    """
    first = statuses[0]
    more = f" (and {len(statuses) - 1} more targets down)" if len(statuses) > 1 else ""
    return f"no target served a GPU: {first.target}: {first.error}{more}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def build(config: DcgmConfig, clock: Clock) -> DcgmExporterSource:
    try:
        source = DcgmExporterSource(config, clock)
    except ValueError as exc:
        raise SourceStartupError(f"sources.dcgm.targets: {exc}") from None
    if not source._static and not config.targets_file:
        raise SourceStartupError(
            "sources.dcgm: no targets; set sources.dcgm.targets (host:port of each "
            "dcgm-exporter), sources.dcgm.target_groups or sources.dcgm.targets_file in the config")
    if config.targets_file and not os.path.exists(config.targets_file):
        log.warning("targets file does not exist yet; it is read once it appears",
                    extra={"path": config.targets_file})
    return source
