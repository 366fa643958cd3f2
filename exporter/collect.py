"""Run every enabled source, isolate failures, and merge the readings into one snapshot.

This is node_exporter's ``execute()`` for gpufleet: each source read is timed
and bounded by a timeout, one failing source never removes the others, and a
source that fails keeps serving its last good reading with every GPU marked
stale, so a flapping upstream doesn't make series vanish and reappear.

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
from exporter.sources import Clock, NoData, Source

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Collector:
    sources: Sequence[Source]
    timeout_seconds: float
    clock: Clock = time.time
    timer: Clock = time.perf_counter  # measures read durations; fixed in the golden exposition
    _last_good: dict[str, FleetSnapshot] = dataclasses.field(default_factory=dict)
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
        started = self.timer()
        error = ""
        reading: FleetSnapshot | None = None
        try:
            reading = await asyncio.wait_for(source.read(), self.timeout_seconds)
        except NoData as exc:
            error = f"no data: {exc}"
            log.debug("source returned no data", extra={"source": source.name, "err": str(exc)})
        except TimeoutError:
            error = f"timed out after {self.timeout_seconds:g}s"
            log.warning("source read timed out", extra={"source": source.name})
        except Exception as exc:  # a bad upstream must never stop the collection loop
            error = f"{type(exc).__name__}: {exc}"
            log.warning("source read failed", extra={"source": source.name, "err": error})
        duration = self.timer() - started
        now = self.clock()
        if reading is not None:
            self._last_good[source.name] = reading
            self._last_success[source.name] = now
            own = [s for s in reading.sources if s.source == source.name and not s.target]
            self._parse_errors[source.name] = own[0].parse_errors if own else 0
            status = SourceStatus(
                source.name,
                up=own[0].up if own else True,
                duration_seconds=duration,
                last_success_time=now,
                parse_errors=own[0].parse_errors if own else 0,
            )
            others = tuple(s for s in reading.sources if not (s.source == source.name and not s.target))
            return dataclasses.replace(reading, sources=(status, *others))
        status = SourceStatus(
            source.name,
            up=False,
            duration_seconds=duration,
            last_success_time=self._last_success.get(source.name),
            error=error,
            parse_errors=self._parse_errors.get(source.name, 0),
        )
        last = self._last_good.get(source.name)
        if last is None:
            return FleetSnapshot(now, sources=(status,))
        stale_gpus = tuple(dataclasses.replace(g, stale=True) for g in last.gpus)
        return dataclasses.replace(last, gpus=stale_gpus, sources=(status,))

    async def close(self) -> None:
        for source in self.sources:
            try:
                await source.close()
            except Exception as exc:
                log.warning("source close failed", extra={"source": source.name, "err": str(exc)})
