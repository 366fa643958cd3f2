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
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence

from exporter.compose import ALLOCATION, compose
from exporter.snapshot import FleetSnapshot, SourceStatus, merge
from exporter.sources import Clock, NoData, Source, SourceReading
from exporter.sources.lastgood import LastGood

log = logging.getLogger(__name__)


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
    _last_unmatched: tuple[tuple[str, int], ...] = ()

    async def collect(self) -> FleetSnapshot:
        parts = await asyncio.gather(*(self._read_one(s) for s in self.sources))
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

    async def _read_one(self, source: Source) -> FleetSnapshot:
        """One source's part of the snapshot, with the SourceStatus only this module builds."""
        started = self.timer()
        error = ""
        reading: SourceReading | None = None
        try:
            reading = await asyncio.wait_for(source.read(), self.timeout_seconds)
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
            self._last_good.remember(source.name, reading, now)
            if not reading.error:
                # an answer with ``error`` set (every target down) counts as down: the
                # last-success time stays where the last good read left it
                self._last_success[source.name] = now
            self._parse_errors[source.name] = reading.parse_errors
            status = SourceStatus(
                source.name,
                up=not reading.error,
                duration_seconds=duration,
                last_success_time=self._last_success.get(source.name),
                error=reading.error,
                parse_errors=reading.parse_errors,
            )
            return _part(now, reading, status)
        status = SourceStatus(
            source.name,
            up=False,
            duration_seconds=duration,
            last_success_time=self._last_success.get(source.name),
            error=error,
            parse_errors=self._parse_errors.get(source.name, 0),
        )
        last = self._last_good.recall(source.name, now)
        if last is None:
            return FleetSnapshot(now, sources=(status,))
        return _part(now, last, status)

    async def close(self) -> None:
        for source in self.sources:
            try:
                await source.close()
            except Exception as exc:
                log.warning("source close failed", extra={"source": source.name, "err": str(exc)})


def _part(now: float, reading: SourceReading, status: SourceStatus) -> FleetSnapshot:
    """A reading as a partial snapshot: the source's status first, then one per target."""
    targets = tuple(
        SourceStatus(status.source, up=t.up, duration_seconds=t.duration_seconds,
                     last_success_time=t.last_success_time, target=t.target, error=t.error)
        for t in reading.targets
    )
    return FleetSnapshot(now, reading.nodes, reading.gpus, reading.allocations, reading.pending,
                         sources=(status, *targets))
