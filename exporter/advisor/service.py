"""The advisor inside ``gpufleet serve``: its API, the delivery of its plans, its state.

Wiring only: the cycle's advisor stage (exporter/cycle/stages.py) evaluates each snapshot
with :func:`advise.advise` (the decision lives in :mod:`engine`, plans in :mod:`planner`);
delivery is :mod:`webhook` and :mod:`store`, the HTTP handlers :mod:`api`. Advice stays
typed here; :mod:`wire` writes it where it leaves (api, webhook)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiohttp import web

from exporter import metrics
from exporter.advisor.advice import Advice, WhatIf
from exporter.advisor.advise import (
    PlanFunction,
    decision_settings,
    planner_for,
    what_if,
)
from exporter.advisor.api import AdvisorApi, add_routes
from exporter.advisor.engine import Advisor, nvlink_generations
from exporter.advisor.planner import last_checkpoint, plan_compaction
from exporter.advisor.store import Store
from exporter.advisor.token_file import SECRET_MAX_BYTES as SECRET_MAX_BYTES  # moved there
from exporter.advisor.token_file import TOKEN_ENV, TokenFile, _read_secret, load_token
from exporter.advisor.webhook import Deliverer, Receiver
from exporter.advisor.wire import advisor_state_from_text, advisor_state_text
from exporter.aio import complete
from exporter.analysis.analyzer import LiveAnalyzer
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import Report, evaluate
from exporter.analysis.state import from_snapshot
from exporter.config import AdvisorConfig, ConfigError
from exporter.health.monitor import HealthMonitor
from exporter.health.settings import build_health as build_health  # moved there
from exporter.metrics import Family
from exporter.snapshot import FleetSnapshot
from exporter.thresholds import Thresholds

log = logging.getLogger(__name__)

def load_receivers(config: AdvisorConfig, environ=os.environ) -> tuple[Receiver, ...]:
    receivers = []
    for i, r in enumerate(config.receivers):
        key = f"advisor.receivers[{i}]"
        if r.secret_file:
            secret = _read_secret(r.secret_file, f"{key}.secret_file")
        elif environ.get(r.secret_env):
            secret = environ[r.secret_env].encode()
        else:
            raise ConfigError(f"{key}: no HMAC secret: set {r.secret_env} or {key}.secret_file")
        receivers.append(Receiver(r.name, r.url, secret, r.timeout))
    return tuple(receivers)


def reload_secret_files(config: AdvisorConfig, deliverer: Deliverer) -> str:
    """SIGHUP (issue 32, Build 4): each receiver's ``secret_file`` read again, so a rotated
    HMAC secret needs no restart. A file that cannot be read, or is blank, keeps that
    receiver's last secret and says why (a delivery signed with no secret is worse than one
    signed with the old). The new tuple replaces the deliverer's in one assignment, between
    two of its rounds; a delivery in flight is signed with the secret it started with."""
    if not any(r.secret_file for r in config.receivers):
        return "none"
    current = {r.name: r for r in deliverer.receivers}
    fresh, kept = [], 0
    for i, r in enumerate(config.receivers):
        old = current.get(r.name)
        if old is None:
            continue
        if not r.secret_file:
            fresh.append(old)
            continue
        try:
            secret = _read_secret(r.secret_file, f"advisor.receivers[{i}].secret_file")
        except ConfigError as exc:
            log.warning(f"receiver secret kept: {exc}", extra={"receiver": r.name})
            fresh.append(old)
            kept += 1
            continue
        fresh.append(dataclasses.replace(old, secret=secret))
    deliverer.receivers = tuple(fresh)
    return "read" if not kept else f"{kept} kept"


@dataclass
class AdvisorService:
    """The advisor's side of ``gpufleet serve``: its API, the delivery of its plans, its
    durable state and its families. The cycle's advisor stage (exporter/cycle/stages.py)
    evaluates each snapshot; serve hands this service the stage's evaluation of the last
    frame as ``evaluator``, for Alertmanager's notifications."""

    advisor: Advisor
    analyzer: LiveAnalyzer  # the live workload and settings a what-if is measured with
    deliverer: Deliverer
    token: bytes | TokenFile | None
    max_body_bytes: int
    what_if_timeout: float = 10.0  # api.what_if_timeout
    clock: Callable[[], float] = time.time
    # the planner with its settings (advise.planner_for(config)); the engine never calls it
    planner: PlanFunction = plan_compaction
    # the last frame evaluated again for a trigger (blocking); None: nothing to evaluate yet
    evaluator: Callable[[str], Advice | None] | None = None
    evaluations_by_trigger: Counter = field(default_factory=Counter)  # snapshot | alertmanager
    # one cycle or one Alertmanager evaluation at a time, and none after the store closed
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    health: HealthMonitor | None = None  # the ``health`` part of /v1/advice
    # the last frame's fragmentation report, what steering answers from (POST /v1/admission);
    # None before the first frame and while the fleet is read blind
    last_report: Report | None = None
    _api: AdvisorApi | None = None
    _closed: bool = False  # the store is closed: no more evaluations
    _unwritten: bool = False  # a proposed plan waits in memory for the store: no cooldown yet
    _saved_state: str | None = None  # the advisor's state as last written to the store
    _pending_seen: float = 0.0  # the store's pending count as last read, served if a read fails

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def evaluations(self) -> int:
        return sum(self.evaluations_by_trigger.values())

    async def evaluate(self, reason: str) -> Advice | None:
        """An evaluation of the last frame outside the cycle (Alertmanager's notification)."""
        if self.evaluator is None:
            return None
        async with self.lock:
            if self._closed:
                return None
            await self.before_cycle()
            advice = await complete(asyncio.to_thread(self.evaluator, reason))
            if advice is None:
                return None
            await self.after_cycle(advice, reason)
            return advice

    async def before_cycle(self) -> None:
        """A plan the store could not take is written first (the deliverer may have written
        it already): once it is in the store its cooldown starts, one evaluation late at most.
        The caller holds :attr:`lock`."""
        if self._unwritten and not self._closed:
            await complete(asyncio.to_thread(self.deliverer.flush))
            if not self.deliverer.unwritten_plans():
                self._unwritten = False
                self.advisor.durable(self.clock())

    async def after_cycle(self, advice: Advice | None, reason: str = "snapshot") -> None:
        """The advice's side effects: a new plan into the store, then the advisor's state.
        The caller holds :attr:`lock`."""
        if advice is None or self._closed:
            return
        self.evaluations_by_trigger[reason.split(":")[0]] += 1
        plan = advice.plan
        if advice.decision == "compact" and plan is not None:
            queued = await complete(asyncio.to_thread(self.deliverer.enqueue_plan, plan))
            if self.deliverer.unwritten_plans():
                # no cooldown for a plan nobody can receive: the next evaluations propose
                # again (the newest plan replaces the kept one) until one is written
                self._unwritten = True
                self.advisor.not_durable()
                log.warning("compaction plan proposed but the outbox cannot take it; kept in "
                            "memory and retried, no cooldown until it is written",
                            extra={"plan": plan.plan_id})
            else:
                log.info("compaction plan proposed", extra={
                    "plan": plan.plan_id, "migrations": len(plan.migrations),
                    "queued": queued, "reasons": "; ".join(advice.reasons)})
        await complete(asyncio.to_thread(self.save_state))

    def save_state(self) -> None:
        """Write the advisor's durable state to the store when it changed (issue 32, finding 6).

        A failed write is counted by the store and logged; the state in memory goes on, and
        the next evaluation writes it again."""
        state = advisor_state_text(self.advisor.durable_state())
        if state == self._saved_state:
            return
        try:
            self.deliverer.store.save_state(state)
        except sqlite3.Error as exc:
            log.warning("cannot write the advisor's state to the outbox; a restart now would "
                        "lose its cooldown", extra={"err": str(exc)})
            return
        self._saved_state = state

    def restore_state(self) -> None:
        """Take back the state an earlier process wrote; one that cannot be read is logged, and
        the advisor starts afresh (it then waits its dwell again: no plan comes sooner)."""
        try:
            text = self.deliverer.store.load_state()
            state = advisor_state_from_text(text)
            if state is not None:
                self.advisor.restore(state)
        except (sqlite3.Error, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("cannot read the advisor's state from the outbox; starting afresh",
                        extra={"err": f"{type(exc).__name__}: {exc}"})
        else:
            self._saved_state = text

    def what_if(self, snapshot: FleetSnapshot) -> WhatIf:
        """Analyse the posted snapshot against the live workload, without touching live state."""
        workload = self.analyzer.current_workload()
        state = from_snapshot(snapshot)
        report = evaluate(state, compile_workload(workload, state.model_names), self.analyzer.settings)
        return what_if(self.advisor, snapshot, report, self.planner)

    def api(self) -> AdvisorApi:
        if self._api is None:
            self._api = AdvisorApi(evaluate=self.evaluate, what_if=self.what_if,
                                   current=self.advisor.current, token=self.token,
                                   max_body_bytes=self.max_body_bytes,
                                   what_if_timeout=self.what_if_timeout,
                                   on_alerts=self.advisor.alert_firing,
                                   health=self.health.advice if self.health else None)
        return self._api

    def families(self, snapshot: FleetSnapshot, decided: bool = True) -> list[Family]:
        """The advisor's families; without ``decided`` (a blind snapshot, which the advisor
        did not evaluate) only its counters and deliveries, not a decision it did not make."""
        advice = self.advisor.advice
        plan = self.advisor.plan
        scopes = sorted(self.advisor.scopes.items())
        results = sorted(self.deliverer.results.items())
        decision = [
            metrics.ADVISOR_COMPACTION_RECOMMENDED.family(
                [((("scope", k),), float(st.recommended)) for k, st in scopes]),
            metrics.ADVISOR_PLAN_MIGRATIONS.family(
                [((), float(len(plan.migrations) if plan else 0))]),
            metrics.ADVISOR_PLAN_FRAGMENTED_GPUS_RECOVERED.family(
                [((), plan.fragmented_gpus_recovered if plan else 0.0)]),
            metrics.ADVISOR_PLAN_NODES_FREED.family(
                [((("pool", p),), float(n))
                 for p, n in sorted((plan.nodes_freed if plan else {}).items())]),
            metrics.ADVISOR_DECISION_INFO.family(
                [((("decision", advice.decision if advice else "none"),), 1.0)]),
        ]
        return [
            *(decision if decided else ()),
            metrics.ADVISOR_WEBHOOK_DELIVERIES_TOTAL.family(
                [((("receiver", r), ("result", res)), float(n)) for (r, res), n in results]),
            metrics.ADVISOR_EVALUATIONS_TOTAL.family(
                [((("trigger", t),), float(n)) for t, n in sorted(self.evaluations_by_trigger.items())]),
            metrics.ADVISOR_ALERTMANAGER_NOTIFICATIONS_TOTAL.family(
                [((("result", r),), float(n)) for r, n in sorted(self.api().notifications.items())]),
            metrics.ADVISOR_OUTBOX_PENDING.family([((), self._pending())]),
            metrics.ADVISOR_OUTBOX_ERRORS_TOTAL.family(
                [((("operation", op),), float(n)) for op, n in sorted(self.deliverer.store.errors.items())]),
            *self.job_families(snapshot, decided),
        ]

    def _pending(self) -> float:
        """The pending count; a failed read (counted in outbox_errors_total) serves the last one,
        so a database that breaks while serving keeps every advisor family on /metrics."""
        try:
            self._pending_seen = float(self.deliverer.store.pending_count())
        except sqlite3.Error as exc:
            log.warning("cannot count the outbox's pending deliveries", extra={"err": str(exc)})
        return self._pending_seen

    def job_families(self, snapshot: FleetSnapshot, decided: bool = True) -> list[Family]:
        """Checkpoint ages, memory peaks, NVLink generations, idle held GPUs and right-sizing
        (issue 17); without ``decided`` (a blind snapshot) not the pools' sums of the last
        evaluation's lists, which the advisor did not make of this snapshot."""
        interval = self.advisor.settings.checkpoint_interval_seconds
        ages = []
        for alloc in sorted(snapshot.allocations, key=lambda a: a.job):
            last = last_checkpoint(alloc, snapshot.taken_at, interval)
            if last is not None:
                source = "stated" if alloc.last_checkpoint_time is not None else "assumed"
                ages.append(((("job", alloc.job), ("namespace", alloc.namespace),
                              ("account", alloc.account), ("source", source)),
                             max(0.0, snapshot.taken_at - last)))
        generations = [((("job", a.job), ("namespace", a.namespace)), float(len(g)))
                       for a, g in sorted(nvlink_generations(snapshot), key=lambda x: x[0].job)]
        gpus: defaultdict[str, float] = defaultdict(float)
        seconds: defaultdict[str, float] = defaultdict(float)
        advice = self.advisor.advice
        for idle in advice.reclaim if advice else ():
            gpus[idle.pool] += idle.gpus
            seconds[idle.pool] += idle.gpu_hours_wasted * 3600
        sized: defaultdict[str, float] = defaultdict(float)
        held: defaultdict[str, float] = defaultdict(float)
        for entry in advice.right_sizing if advice else ():
            sized[entry.pool] += entry.gpus
            held[entry.pool] += entry.gpu_hours_held * 3600
        owners = {a.job: a for a in snapshot.allocations}
        peaks = [((("job", job), ("namespace", owners[job].namespace),
                   ("account", owners[job].account)), peak)
                 for job, peak in sorted(self.advisor.memory_peak.items()) if job in owners]
        pools = [
            metrics.POOL_IDLE_ALLOCATED_GPUS.family(
                [((("pool", p),), float(n)) for p, n in sorted(gpus.items())]),
            metrics.POOL_IDLE_ALLOCATED_GPU_SECONDS.family(
                [((("pool", p),), float(n)) for p, n in sorted(seconds.items())]),
        ] if decided else []
        sizing = [
            metrics.POOL_RIGHT_SIZING_GPUS.family(
                [((("pool", p),), float(n)) for p, n in sorted(sized.items())]),
            metrics.POOL_RIGHT_SIZING_GPU_SECONDS.family(
                [((("pool", p),), float(n)) for p, n in sorted(held.items())]),
        ] if decided else []
        return [
            metrics.JOB_CHECKPOINT_AGE_SECONDS.family(ages),
            metrics.JOB_NVLINK_GENERATIONS.family(generations),
            *pools,
            metrics.JOB_GPU_MEMORY_PEAK_BYTES.family(peaks),
            *sizing,
        ]

    async def background(self, app: web.Application) -> AsyncIterator[None]:
        """Deliver while the app runs; at shutdown, close the store once nothing can use it.

        Evaluations that Alertmanager started may still queue a plan, so they finish
        first; then the deliverer stops (its store calls finish with it); the close
        happens under the evaluation lock, and later evaluations return None.
        """
        task = asyncio.create_task(self.deliverer.run())
        yield
        await self.api().finish_evaluations()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        async with self.lock:
            self._closed = True
            # a plan kept from a failed write gets a last try; one still unwritten dies with
            # the process (after a restart, the advisor proposes it again if it is still due)
            if self.deliverer.unwritten_plans():
                await complete(asyncio.to_thread(self.deliverer.flush))
                if lost := self.deliverer.unwritten_plans():
                    log.error("plans the outbox could not take are lost at shutdown",
                              extra={"plans": lost})
            self.deliverer.store.close()


def build_deliverer(config: AdvisorConfig, environ=os.environ) -> Deliverer:
    """The durable store (``advisor.outbox``) and the webhook that delivers from it to
    ``advisor.receivers``: plans and remediation events alike."""
    receivers = load_receivers(config, environ)
    try:
        store = Store(config.outbox)
    except Exception as exc:  # sqlite3.Error or OSError: the path is the user's to fix
        raise ConfigError(f"advisor.outbox: cannot open {config.outbox}: {exc}") from None
    return Deliverer(store, receivers, base_delay=config.retry_initial,
                     max_delay=config.retry_max, retention=config.outbox_retention)


NO_RECEIVER = ("advisor.receivers is empty: plans and remediation events are only advised "
               "(/v1/advice, /metrics) and sent to no one, so nothing carries out a move or a "
               "drain: add a receiver (docs/advisor.md); `gpufleet act --from URL` carries out "
               "the drains of /v1/advice")


def build_service(config: AdvisorConfig, analyzer: LiveAnalyzer, planner: PlanFunction | None = None,
                  environ=os.environ, what_if_timeout: float = 10.0,
                  table: Thresholds | None = None, deliverer: Deliverer | None = None,
                  health: HealthMonitor | None = None) -> AdvisorService:
    """The advisor of ``gpufleet serve``; ``what_if_timeout`` is ``api.what_if_timeout``;
    ``table`` the threshold table in force (advise.decision_settings); ``deliverer`` the
    store serve built (else one from ``config``); ``health`` the monitor whose verdicts
    /v1/advice shows (else one from ``config`` and ``table``)."""
    settings = decision_settings(config, table)  # a clear bound at the table's trigger: first
    token = load_token(config, environ)
    if token is None:
        log.warning("advisor POST endpoints refuse every request: no token configured "
                    f"(set {TOKEN_ENV} or advisor.token_file)")
    if not config.receivers:
        # the runbooks say who acts: with no receiver, no one does unless told
        log.warning(NO_RECEIVER)
    if deliverer is None:
        deliverer = build_deliverer(config, environ)
    if planner is None:
        planner = planner_for(config, table)
    service = AdvisorService(Advisor(settings), analyzer, deliverer, token,
                             config.max_body_bytes, what_if_timeout, planner=planner,
                             health=health if health is not None else build_health(config, table))
    service.restore_state()
    return service


def install(app: web.Application, service: AdvisorService) -> None:
    add_routes(app, service.api())
    # placement steering for the Kubernetes scheduler, from the last frame the cycle analysed
    from exporter.advisor import admission

    admission.add_route(app, lambda: service.last_report)
    # first in, so last out: aiohttp cleans up in reverse order, and the collection loop
    # (make_app's) evaluates and renders the advisor's families, which read the store;
    # it must have stopped before the store closes
    app.cleanup_ctx.insert(0, service.background)
