"""dcgm-exporter source: scrape every node's dcgm-exporter and build a cluster-wide view.

The NVIDIA GPU Operator runs dcgm-exporter on every GPU node; with
``--kubernetes`` it labels each GPU with the pod holding it, which the
fragmentation analyzer needs. This source scrapes one or many ``/metrics``
endpoints concurrently (aiohttp, a per-target timeout, at most
``max_concurrency`` at once), parses the text with the fast line parser
(:mod:`exporter.sources.exposition_parser`, in a worker thread so the event
loop keeps serving) and maps it with :mod:`exporter.sources.dcgm_mapping`.

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
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from exporter.snapshot import Allocation, Gpu, Node
from exporter.sources import Clock, NoData, SourceReading, SourceStartupError, TargetStatus
from exporter.sources.dcgm_mapping import DcgmFleet, RateIntegrator, build_fleet
from exporter.sources.dcgm_options import DcgmSource as DcgmConfig
from exporter.sources.exposition_parser import parse_text
from exporter.sources.gpu_models import ModelResolver, catalogue_resolver
from exporter.sources.lastgood import LastGood

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # a 8-GPU node's full dcgm-exporter body is ~60 KiB


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    pool: str
    host: str  # names the node when the samples carry no Hostname label


def target_from(text: str, pool: str) -> Target:
    """``host:port`` or a URL → a Target; ``/metrics`` is the default path."""
    raw = text.strip()
    if not raw:
        raise ValueError("empty target")
    if "://" not in raw:
        raw = f"http://{raw}"
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"target {text!r} is not host:port or an http(s) URL")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"target {text!r} has a bad port") from None
    path = parts.path or "/metrics"
    query = f"?{parts.query}" if parts.query else ""
    return Target(f"{parts.scheme}://{parts.netloc}{path}{query}", pool, parts.hostname)


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
        for j, text in enumerate(group["targets"]):
            if not isinstance(text, str):
                raise ValueError(f"{where}[{i}].targets[{j}]: must be a string")
            try:
                targets.append(target_from(text, pool))
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


@dataclass
class _TargetState:
    last_success: float | None = None
    down: bool = False  # logged as down: log again only when it comes back


def parse_body(body: bytes, target: Target, resolve_model: ModelResolver) -> tuple[DcgmFleet, int]:
    """Text → fleet and the number of lines/samples skipped. Pure; runs in a worker thread."""
    parsed = parse_text(body.decode("utf-8", errors="replace"))
    fleet = build_fleet(parsed.samples, default_node=target.host, pool=target.pool,
                        resolve_model=resolve_model)
    if parsed.errors:
        log.debug("skipped unparsable lines", extra={"target": target.url, "lines": parsed.errors,
                                                     "first": parsed.first_error})
    return fleet, parsed.errors + fleet.skipped


class DcgmExporterSource:
    name = "dcgm"

    def __init__(self, config: DcgmConfig, clock: Clock, *,
                 session: aiohttp.ClientSession | None = None,
                 resolve_model: ModelResolver | None = None) -> None:
        self.config = config
        self.clock = clock
        self._session = session
        self._own_session = session is None
        self._resolve_model = resolve_model or catalogue_resolver()
        self._static = [target_from(t, config.pool) for t in config.targets]
        self._file_targets: list[Target] = []
        self._file_key: tuple[int, int] | None = None
        self._states: dict[str, _TargetState] = {}
        # per target URL: its last good reading, served stale for stale_for while it is down
        self._last_good: LastGood[str, SourceReading] = LastGood(
            SourceReading.marked_stale, max_age=config.stale_for)
        self._integrator = RateIntegrator()
        self._parse_errors = 0  # cumulative: feeds a counter

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

    def _session_for_read(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.config.max_concurrency)
            self._session = aiohttp.ClientSession(connector=connector)
            self._own_session = True
        return self._session

    async def scrape(self, target: Target, session: aiohttp.ClientSession,
                     limit: asyncio.Semaphore) -> ScrapeOutcome:
        async with limit:
            started = time.perf_counter()
            try:
                body = await asyncio.wait_for(self._fetch(target, session), self.config.timeout)
            except TimeoutError:
                return ScrapeOutcome(None, 0, f"timed out after {self.config.timeout:g}s",
                                     time.perf_counter() - started)
            except aiohttp.ClientPayloadError as exc:
                return ScrapeOutcome(None, 0, f"truncated body: {exc}",
                                     time.perf_counter() - started)
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                return ScrapeOutcome(None, 0, _one_line(exc), time.perf_counter() - started)
            try:
                fleet, errors = await asyncio.to_thread(
                    parse_body, body, target, self._resolve_model)
            except Exception as exc:  # a payload we did not foresee spoils only its target
                log.exception("dcgm body could not be mapped", extra={"target": target.url})
                return ScrapeOutcome(None, 1, f"unmappable body: {_one_line(exc)}",
                                     time.perf_counter() - started)
            duration = time.perf_counter() - started
            if not fleet.gpus:
                return ScrapeOutcome(None, errors, f"no DCGM GPU samples in the body "
                                     f"({errors} lines skipped)", duration)
            return ScrapeOutcome(fleet, errors, "", duration)

    @staticmethod
    async def _fetch(target: Target, session: aiohttp.ClientSession) -> bytes:
        async with session.get(target.url, headers={"Accept": "text/plain"}) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            chunks, size = [], 0
            # A body cut short (Content-Length not reached, chunked stream closed
            # early) raises ClientPayloadError here: the target counts as down.
            async for chunk in response.content.iter_chunked(256 * 1024):
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise ValueError(f"body over {MAX_BODY_BYTES // (1024 * 1024)} MiB")
                chunks.append(chunk)
            return b"".join(chunks)

    async def read(self) -> SourceReading:
        targets = await self._targets()
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
        outcomes = await asyncio.gather(*(self.scrape(t, session, limit) for t in targets))
        now = self.clock()

        nodes: list[Node] = []
        gpus: list[Gpu] = []
        allocations: list[Allocation] = []
        statuses: list[TargetStatus] = []
        any_up = False
        for target, outcome in zip(targets, outcomes, strict=True):
            self._parse_errors += outcome.parse_errors
            state = self._states.setdefault(target.url, _TargetState())
            if outcome.fleet is not None:
                any_up = True
                fresh = self._integrator.apply(outcome.fleet, now)
                self._last_good.remember(target.url, SourceReading(
                    outcome.fleet.nodes, fresh, outcome.fleet.allocations), now)
                state.last_success = now
                if state.down:
                    log.info("dcgm target back", extra={"target": target.url})
                    state.down = False
                gpus += fresh
                nodes += outcome.fleet.nodes
                allocations += outcome.fleet.allocations
            else:
                if not state.down:  # once per outage, not every collection
                    log.warning("dcgm target down",
                                extra={"target": target.url, "err": outcome.error})
                    state.down = True
                last = self._last_good.recall(target.url, now)
                if last is not None:
                    gpus += last.gpus
                    nodes += last.nodes
                    allocations += last.allocations
            statuses.append(TargetStatus(target.url, up=outcome.fleet is not None,
                                         error=outcome.error,
                                         last_success_time=state.last_success,
                                         duration_seconds=outcome.duration_seconds))
        # A GPU served stale restarts its NVLink counters from 0 when it is back (a counter
        # reset to Prometheus) rather than crediting the outage with its latest rate.
        self._integrator.forget_except(g.uuid for g in gpus if not g.stale)
        return SourceReading(tuple(nodes), tuple(gpus), tuple(allocations),
                             parse_errors=self._parse_errors, targets=tuple(statuses),
                             error="" if any_up else "no target answered")

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def build(config: DcgmConfig, clock: Clock) -> DcgmExporterSource:
    try:
        source = DcgmExporterSource(config, clock)
    except ValueError as exc:
        raise SourceStartupError(f"sources.dcgm.targets: {exc}") from None
    if not config.targets and not config.targets_file:
        raise SourceStartupError(
            "sources.dcgm: no targets; set sources.dcgm.targets (host:port of each "
            "dcgm-exporter) or sources.dcgm.targets_file in the config")
    if config.targets_file and not os.path.exists(config.targets_file):
        log.warning("targets file does not exist yet; it is read once it appears",
                    extra={"path": config.targets_file})
    return source
