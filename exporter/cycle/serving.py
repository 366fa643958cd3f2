"""The cycle as ``gpufleet serve`` runs it on each collection, and the frame's side effects.

:meth:`ServingCycle.run` takes a collected snapshot through the stages (one worker thread),
then carries out what the frame asks of the world: the remediation events and the advisor's
plan into the durable store, whence the webhook delivers them, and the states that must
outlive a restart. :meth:`ServingCycle.exposition` takes every stage's families for the
frame; rendering them is then a pure function of the frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.aio import complete
from exporter.cycle.frame import Frame, Stage, exposition, run_cycle, runs, with_exposition
from exporter.cycle.stages import AdvisorStage

if TYPE_CHECKING:
    from aiohttp import web

    from exporter.advisor.service import AdvisorService
    from exporter.advisor.webhook import Deliverer
    from exporter.health.monitor import HealthMonitor
    from exporter.metrics import Family
    from exporter.pool_load.tracker import LoadTracker
    from exporter.snapshot import FleetSnapshot

log = logging.getLogger(__name__)


@dataclass
class HealthEffects:
    """A frame's remediation events, queued in the durable store for every receiver, and the
    remediator's state written beside them (what gpufleet drained outlives a restart).
    Without a store (no receivers, no advisor) the events are only logged."""

    monitor: HealthMonitor
    deliverer: Deliverer | None = None
    _saved: str | None = None  # the remediator's state as last written

    def apply(self, frame: Frame) -> None:
        """Blocking (the store is SQLite): the caller runs it in a worker thread."""
        from exporter.health.remediation import event_id

        if frame.health is None:
            return
        if self.deliverer is None:  # only logged: no wire (the advisor's modules load numpy)
            for event in frame.health.events:
                log.warning("remediation advised", extra={"event": event_id(event)})
            return
        from exporter.advisor.wire import event_body, remediation_state_text

        for event in frame.health.events:
            self.deliverer.enqueue_event(event_id(event), event_body(event))
            log.warning("remediation advised", extra={"event": event_id(event)})
        state = remediation_state_text(self.monitor.remediator.state)
        if state == self._saved:
            return
        try:
            self.deliverer.store.save_state(state, "remediation")
        except sqlite3.Error as exc:
            log.warning("cannot write the remediation state to the outbox; a restart now would "
                        "forget what gpufleet drained", extra={"err": str(exc)})
            return
        self._saved = state

    def restore(self) -> None:
        """Take back what an earlier process drained; a state that cannot be read is logged,
        and the remediator starts afresh."""
        if self.deliverer is None:
            return
        from exporter.advisor.wire import remediation_state_from_text

        try:
            text = self.deliverer.store.load_state("remediation")
            remediation = remediation_state_from_text(text)
        except (sqlite3.Error, ValueError) as exc:
            log.warning("cannot read the remediation state from the outbox; starting afresh "
                        "(nodes gpufleet drained before are not resumed by it)",
                        extra={"err": f"{type(exc).__name__}: {exc}"})
            return
        if remediation is not None:
            self.monitor.remediator.state = remediation
            self._saved = text


@dataclass
class ServingCycle:
    """The stages serve runs, in order, and the side effects of each frame."""

    stages: Sequence[Stage]
    health: HealthEffects | None = None
    advisor: AdvisorService | None = None  # the advisor's API, plan delivery and families
    # families that belong to the process, not to a stage (the log lines not written)
    extra: Sequence[tuple[str, Callable[[], Iterable[Family]]]] = ()
    # the store's deliverer when no advisor runs it (remediation events only)
    deliverer: Deliverer | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _closed: bool = False

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    async def run(self, snapshot: FleetSnapshot, blind: tuple[str, ...] = ()) -> Frame:
        """``snapshot`` through the cycle, then its side effects, then its families taken:
        the frame, from which rendering is a pure function (:func:`families`). ``blind``:
        why the snapshot does not show the whole fleet (the collector's verdict)."""
        service = self.advisor
        lock = service.lock if service is not None else self._lock
        async with lock:
            if service is not None:
                await service.before_cycle()
            # complete(): a cancelled collection (shutdown) waits for its cycle's thread
            frame = await complete(asyncio.to_thread(run_cycle, self.stages, snapshot, blind))
            if service is not None:  # what steering answers from: never a blind frame's
                service.last_report = None if frame.blind else frame.report
            closed = service.closed if service is not None else self._closed
            if self.health is not None and not closed:
                await complete(asyncio.to_thread(self.health.apply, frame))
            if service is not None:
                await service.after_cycle(frame.advice)
            # under the lock: what an Alertmanager evaluation changes after it belongs to
            # the next frame, not to this one's exposition
            return await complete(asyncio.to_thread(self.exposition, frame))

    def exposition(self, frame: Frame) -> Frame:
        """``frame`` with every stage's families taken (blocking: a worker thread). One
        part that fails is logged and left out: it must not stop the exposition."""
        parts: list[tuple[str, Iterable[Family]]] = []
        producers: list[tuple[str, Callable[[], Iterable[Family]]]] = [
            (s.name, lambda s=s: s.families(frame))  # type: ignore[misc]
            for s in self.stages if runs(s, frame)]
        if self.advisor is not None:
            producers.append(("advisor", lambda: self.advisor.families(  # type: ignore[union-attr]
                frame.snapshot, decided=not frame.blind)))
        producers.extend(self.extra)
        for name, produce in producers:
            try:
                parts.append((name, list(produce())))
            except Exception:
                log.exception("families failed", extra={"part": name})
        return with_exposition(frame, parts)

    def families(self, frame: Frame) -> list[Family]:
        """The families /metrics renders beside the snapshot's: the frame's own, as
        :meth:`run` took them (a frame made outside :meth:`run` has them taken now)."""
        return exposition(frame if frame.families else self.exposition(frame))

    async def background(self, app: web.Application) -> AsyncIterator[None]:
        """Without an advisor, the store's deliverer runs here (remediation events); at
        shutdown it stops, and the store closes once no cycle can write to it."""
        deliverer = self.deliverer
        if deliverer is None:
            yield
            return
        task = asyncio.create_task(deliverer.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        async with self._lock:
            self._closed = True
            deliverer.store.close()


def advisor_stage(service: AdvisorService, load: LoadTracker | None = None) -> AdvisorStage:
    """The cycle's advisor stage for ``service``: the same engine and planner, and the
    service's Alertmanager evaluations run on the stage's last frame."""
    from exporter.advisor.advise import Steerer
    from exporter.preemption.advice import Adviser

    stage = AdvisorStage(service.advisor, service.planner, load, steerer=Steerer(), preemption=Adviser())
    service.evaluator = stage.evaluate_last
    return stage


__all__ = ["HealthEffects", "ServingCycle", "advisor_stage"]
