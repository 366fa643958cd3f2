"""Run every enabled source, isolate failures, and merge the readings into one snapshot.

This is node_exporter's ``execute()`` for gpufleet: each source read is timed
and bounded by a timeout, one failing source never removes the others, and a
source that fails keeps serving its last good reading with every GPU marked
stale, so a flapping upstream doesn't make series vanish and reappear. It is
the only place a :class:`~exporter.snapshot.SourceStatus` is built: sources
return a :class:`~exporter.sources.SourceReading` (the contract is in
:mod:`exporter.sources`), and the duration is this module's own measurement.

A source whose ``role`` is ``"allocation"`` (Slurm) is the scheduler's view; when one
is enabled together with others, the others are telemetry and the two views are
joined by :func:`exporter.compose.compose` rather than concatenated. Sources without
a ``role`` see the whole fleet and are merged as they are.

Never green while blind. A source that reads no GPU, or under :data:`PARTIAL_BELOW` of the
most GPUs one of its readings listed before, makes the collection *blind*: the collector
says why in :attr:`Collector.blind`, the cycle then leaves out everything it would derive
from the whole fleet (the fragmentation index, the pools' load and hints, the advisor's
decision), and ``/-/ready`` answers 503 with the reason, rather than a fleet of 0 or a
fraction of one read as healthy. A partial reading is served as it is (those GPUs were
read) but counts as down, and is not kept as the source's last good reading. A fleet that
really shrank to under half in one collection stays partial until SIGHUP
(:meth:`Collector.forget_sizes`) or a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence

from exporter.compose import ALLOCATION, compose
from exporter.snapshot import FleetSnapshot, SourceStatus, TargetCount, merge
from exporter.sources import Clock, NoData, Source, SourceReading
from exporter.sources.lastgood import LastGood

log = logging.getLogger(__name__)

# A reading with fewer GPUs than this fraction of the most its source listed before is partial
PARTIAL_BELOW = 0.5


@dataclasses.dataclass
class Collector:
    sources: Sequence[Source]
    timeout_seconds: float
    clock: Clock = time.time
    timer: Clock = time.perf_counter  # measures read durations; fixed in the golden exposition
    # per source: its last good reading, served with every GPU stale while reads fail
    _last_good: LastGood[str, SourceReading] = dataclasses.field(
        default_factory=lambda: LastGood(SourceReading.marked_stale))
    _last_success: dict[str, float] = dataclasses.field(default_factory=dict)
    # last parse-error count per source, so the counter does not drop to 0 while a read fails
    _parse_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    _series_refused: dict[str, tuple[TargetCount, ...]] = dataclasses.field(default_factory=dict)
    _last_unmatched: tuple[tuple[str, int], ...] = ()
    # per source: a read cancelled at its deadline that has not ended yet. The next round
    # does not start a second read beside it, and does not wait for it either
    _abandoned: dict[str, tuple[asyncio.Task[SourceReading], float]] = dataclasses.field(
        default_factory=dict)
    # per source: the most GPUs one of its readings listed (a partial one excluded)
    _most_gpus: dict[str, int] = dataclasses.field(default_factory=dict)
    # why the last collection is blind, one line per source; () when every source saw its fleet
    blind: tuple[str, ...] = ()

    async def collect(self) -> FleetSnapshot:
        judged = await asyncio.gather(*(self._read_one(s) for s in self.sources))
        parts = [part for part, _ in judged]
        self.blind = tuple(reason for _, reason in judged if reason)
        now = self.clock()
        roles = [getattr(s, "role", "full") for s in self.sources]
        scheduled = [p for p, role in zip(parts, roles, strict=True) if role == ALLOCATION]
        measured = [p for p, role in zip(parts, roles, strict=True) if role != ALLOCATION]
        if scheduled and measured:
            snapshot = compose(now, merge(now, scheduled), merge(now, measured))
            self._log_unmatched(snapshot)
            return snapshot
        return merge(now, parts)

    def _log_unmatched(self, snapshot: FleetSnapshot) -> None:
        counts = tuple((u.side, u.count) for u in snapshot.unmatched)
        if counts != self._last_unmatched and any(c for _, c in counts):
            log.warning("GPUs seen by one side only", extra=dict(counts))
        self._last_unmatched = counts

    def forget_sizes(self) -> str:
        """Forget the fleet sizes partial readings are judged by (SIGHUP: a fleet that
        really shrank by half is accepted); the outcome for the reload's log line."""
        sizes = ", ".join(f"{name} {n}" for name, n in sorted(self._most_gpus.items()))
        self._most_gpus.clear()
        return f"forgot {sizes or 'nothing'}"

    def _judge(self, name: str, reading: SourceReading) -> tuple[SourceReading, bool]:
        """``reading``, with ``error`` set when it is partial, and whether it is."""
        count, most = len(reading.gpus), self._most_gpus.get(name, 0)
        if reading.error:
            return reading, False
        if most and count < PARTIAL_BELOW * most:
            what = "no GPU" if not count else f"{count} GPUs"
            error = (f"partial: read {what}, under {PARTIAL_BELOW:.0%} of the {most} it listed "
                     f"before (SIGHUP accepts a fleet that really shrank)")
            return dataclasses.replace(reading, error=error), True
        self._most_gpus[name] = max(most, count)
        return reading, False

    async def _read_one(self, source: Source) -> tuple[FleetSnapshot, str]:
        """One source's part of the snapshot, with the SourceStatus only this module builds,
        and why it makes the collection blind ("" when it does not)."""
        part, partial = await self._part_of(source)
        status = part.sources[0]
        if partial:
            return part, f"source {source.name} is {status.error}"
        if not part.gpus:
            why = f": {status.error}" if status.error else ""
            return part, f"source {source.name} reads no GPU{why}"
        return part, ""

    async def _part_of(self, source: Source) -> tuple[FleetSnapshot, bool]:
        started = self.timer()
        error = ""
        reading: SourceReading | None = None
        try:
            reading = await self._bounded_read(source)
        except _StillRunning as exc:
            error = str(exc)
            log.warning("source read still running", extra={"source": source.name, "err": error})
        except NoData as exc:
            error = f"no data: {exc}"
            log.debug("source returned no data", extra={"source": source.name, "err": str(exc)})
            self._last_good.forget(source.name)  # nothing is there: nothing to serve stale
        except TimeoutError:
            error = f"timed out after {self.timeout_seconds:g}s"
            log.warning("source read timed out", extra={"source": source.name})
        except Exception as exc:  # a bad upstream must never stop the collection loop
            error = f"{type(exc).__name__}: {exc}"
            log.warning("source read failed", extra={"source": source.name, "err": error})
        duration = self.timer() - started
        now = self.clock()
        if reading is not None:
            reading, partial = self._judge(source.name, reading)
            if not partial:  # a stale full fleet serves better than a fresh fraction
                self._last_good.remember(source.name, reading, now)
            if not reading.error:
                # an answer with ``error`` set (every target down) counts as down: the
                # last-success time stays where the last good read left it
                self._last_success[source.name] = now
            self._parse_errors[source.name] = reading.parse_errors
            self._series_refused[source.name] = reading.series_refused
            status = SourceStatus(
                source.name,
                up=not reading.error,
                duration_seconds=duration,
                last_success_time=self._last_success.get(source.name),
                error=reading.error,
                parse_errors=reading.parse_errors,
                series_refused=reading.series_refused,
            )
            return _part(now, reading, status), partial
        status = SourceStatus(
            source.name,
            up=False,
            duration_seconds=duration,
            last_success_time=self._last_success.get(source.name),
            error=error,
            parse_errors=self._parse_errors.get(source.name, 0),
            series_refused=self._series_refused.get(source.name, ()),
        )
        last = self._last_good.recall(source.name, now)
        if last is None:
            return FleetSnapshot(now, sources=(status,)), False
        return _part(now, last, status), False

    async def _bounded_read(self, source: Source) -> SourceReading:
        """``source.read()``, or TimeoutError at ``timeout_seconds``, whatever the read does.

        ``asyncio.wait_for`` waits, after its deadline, for the cancelled read to end: a
        read that swallows the cancellation, or takes its time to clean up (a child that
        will not die), would hold the whole collection with it, and the snapshot would
        silently age. So the read runs as a task of its own: at the deadline it is
        cancelled and left to end on its own, and the source is down until it has.
        """
        previous = self._abandoned.pop(source.name, None)
        if previous is not None and not previous[0].done():
            self._abandoned[source.name] = previous
            raise _StillRunning(
                f"the read cancelled at its {self.timeout_seconds:g}s deadline "
                f"{self.clock() - previous[1]:.0f}s ago has not ended")
        task = asyncio.ensure_future(source.read())
        try:
            await asyncio.wait((task,), timeout=self.timeout_seconds)
        except asyncio.CancelledError:  # the collection itself stops: so does the read
            task.cancel()
            raise
        if task.done():
            return task.result()
        task.cancel()
        task.add_done_callback(_retrieve)
        self._abandoned[source.name] = (task, self.clock())
        raise TimeoutError

    async def close(self) -> None:
        for task, _ in self._abandoned.values():
            task.cancel()
        for source in self.sources:
            try:
                await source.close()
            except Exception as exc:
                log.warning("source close failed", extra={"source": source.name, "err": str(exc)})


class _StillRunning(Exception):
    """A source's earlier read, cancelled at its deadline, has not ended yet."""


def _retrieve(task: asyncio.Task[SourceReading]) -> None:
    """An abandoned read's outcome, taken so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _part(now: float, reading: SourceReading, status: SourceStatus) -> FleetSnapshot:
    """A reading as a partial snapshot: the source's status first, then one per target."""
    targets = tuple(
        SourceStatus(status.source, up=t.up, duration_seconds=t.duration_seconds,
                     last_success_time=t.last_success_time, target=t.target, error=t.error)
        for t in reading.targets
    )
    return FleetSnapshot(now, reading.nodes, reading.gpus, reading.allocations, reading.pending,
                         sources=(status, *targets))
