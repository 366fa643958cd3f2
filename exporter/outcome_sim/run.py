"""One run: a fleet, a seed's jobs, one strategy, from the first arrival to the horizon.

The loop jumps from event to event: an arrival, a job's end, a strategy's tick,
a sample for the figure. After the events of an instant the scheduler runs a
pass; a strategy that moved jobs gets another pass at once. GPU-hours delivered
are the integral of the GPUs held, so the allocation is exact, not sampled; the
fragmentation index is sampled every ``sample_interval``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

from exporter.analysis.fgd import CompiledWorkload, compile_workload
from exporter.analysis.index import IndexSettings, KeptScorer, evaluate
from exporter.analysis.workload import from_tasks
from exporter.gpu_catalogue import default_catalogue, speed
from exporter.outcome_sim.advisor_loop import AdvisorStrategy
from exporter.outcome_sim.blocked import WaitSplit
from exporter.outcome_sim.cluster import Cluster
from exporter.outcome_sim.demand import build_jobs
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.lookahead import LOOKAHEAD_STRATEGIES, lookahead_strategy
from exporter.outcome_sim.lookahead import fill as fill_lookahead
from exporter.outcome_sim.oracle import Oracle
from exporter.outcome_sim.outcomes import Outcome, Sample, job_outcomes
from exporter.outcome_sim.preemption import SPOT_QUOTAS, Preempter, SpotGate, fill, fill_quota
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.sim import RunSettings, Sim
from exporter.outcome_sim.steering import POD_STRATEGIES, STEER_STRATEGIES, Steer, pod_strategy
from exporter.outcome_sim.strategies import (
    STRATEGIES,
    Consolidate,
    Descheduler,
    HeadUnblocker,
    Nothing,
    Strategy,
)
from exporter.outcome_sim.timeline import HourlyArrivals, Job

# see _fewer_collections
YOUNG_COLLECTION = 10_000


def make_strategy(name: str, settings: RunSettings) -> Strategy:
    """The strategy called ``name``, at the intervals of ``settings``."""
    if name == "none":
        return Nothing()
    if name in ("descheduler", "descheduler-unrestricted"):
        return Descheduler(name=name, interval=settings.descheduler_interval, fair=name == "descheduler")
    if name in ("consolidate", "consolidate-unrestricted", "consolidate-heads"):
        return Consolidate(name=name, interval=settings.consolidate_interval,
                           unblocker=HeadUnblocker(fair=name != "consolidate-unrestricted",
                                                   every_head=name == "consolidate-heads"))
    if name in ("oracle", "oracle-heads"):
        return Oracle(name=name, interval=settings.consolidate_interval, every_head=name == "oracle-heads")
    if name in ("advisor", "advisor-current"):
        strategy = AdvisorStrategy(name=name, evaluate_every=settings.advisor_interval,
                                   revised=name == "advisor", rule=settings.advisor_rule)
        strategy.pools(settings.advisor_one_partition)
        return strategy
    if name in STEER_STRATEGIES:
        advisor = None
        if name == "steer+advisor":
            advisor = AdvisorStrategy(name="advisor", evaluate_every=settings.advisor_interval)
            advisor.pools(settings.advisor_one_partition)
        return Steer(name=name, advisor=advisor)
    if name in POD_STRATEGIES:
        advisor = None
        if name.startswith("steer-pod+advisor"):
            advisor = AdvisorStrategy(name="advisor", evaluate_every=settings.advisor_interval,
                                      rule=settings.advisor_rule, freedoms=name.endswith("-freedoms"))
            advisor.pools(settings.advisor_one_partition)
        return pod_strategy(name, advisor)
    if name in LOOKAHEAD_STRATEGIES:
        advisor = None
        if name.endswith("+advisor"):
            advisor = AdvisorStrategy(name="advisor", evaluate_every=settings.advisor_interval)
            advisor.pools(settings.advisor_one_partition)
        return lookahead_strategy(name, advisor)
    raise ValueError(f"unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")


def resumed(started: list[Job]) -> list[Job]:
    """Jobs a pass started: a paused one resumed (no longer ahead of other spot jobs once queued again)."""
    for job in started:
        job.paused = False
    return started


def reference_capacity(fleet: SimFleet) -> float:
    """The fleet's GPUs weighted by their model's throughput: GPUs of the reference model (the
    H100) that compute as much, what a load of 1.0 offers per hour."""
    catalogue = default_catalogue()
    return sum(n.gpu_count * speed(catalogue.get(n.model)) for n in fleet.nodes)


def target_workload(fleet: SimFleet, model_names: tuple[str, ...]) -> CompiledWorkload:
    """The trace's typical workload (the shapes covering 95% of its pods), as ``replay`` uses."""
    return compile_workload(from_tasks(fleet.shapes), model_names)


def seed_jobs(fleet: SimFleet, series: HourlyArrivals, settings: RunSettings, seed: int) -> list[Job]:
    """The jobs of ``seed``'s run, fresh, the same for every strategy (the matrix perturbs a copy).
    The load is offered work over what the fleet can compute: its GPUs, each at its speed."""
    return build_jobs(settings.demand, fleet, series, reference_capacity(fleet), settings.timeline, seed)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """The garbage collector's youngest generation collected every YOUNG_COLLECTION new
    objects, not Python's 700, while a run lasts.

    A run keeps thousands of jobs, allocations and plans alive for simulated hours and builds
    new ones at every evaluation; at 700 each young collection promoted the still-live ones,
    and the full collections they brought about rescanned every kept object: a tenth of openb's
    CPU with the advisor (2 + 1 days, gc.callbacks). Its objects form no cycles to speak of
    (the same run with the collector off peaked at the same memory), so collecting less often
    frees nothing later that matters."""
    was = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION, *was[1:])
    try:
        yield
    finally:
        gc.set_threshold(*was)


def simulate(fleet: SimFleet, series: HourlyArrivals, strategy_name: str, seed: int,
             settings: RunSettings | None = None, jobs: list[Job] | None = None) -> Outcome:
    """One run of ``strategy_name`` over ``seed``'s jobs (or ``jobs``, sorted by submission)."""
    with _fewer_collections():
        return _simulate(fleet, series, strategy_name, seed, settings, jobs)


def _simulate(fleet: SimFleet, series: HourlyArrivals, strategy_name: str, seed: int,
              settings: RunSettings | None, jobs: list[Job] | None) -> Outcome:
    started = time.perf_counter()
    settings = settings or RunSettings()
    tl = settings.timeline
    if jobs is None:
        jobs = seed_jobs(fleet, series, settings, seed)
    state = fleet.empty_state()
    workload = target_workload(fleet, state.model_names)
    cluster = Cluster(state, settings.policy, workload, settings.cost)
    scheduler = Scheduler(cluster, settings.mode, settings.backfill_depth)
    sim = Sim(fleet, cluster, scheduler, settings, workload)
    strategy = make_strategy(strategy_name, settings)
    preempter = Preempter(settings.preemption, settings.preempt_exempt)
    if settings.spot_quota not in SPOT_QUOTAS:
        raise ValueError(f"unknown spot quota {settings.spot_quota!r}; one of {', '.join(SPOT_QUOTAS)}")
    # spot jobs beyond the quota wait (borrow: unless no high-priority job waits for their pool)
    gate = None
    if settings.spot_quota != "none":
        gate = SpotGate(borrow=settings.spot_quota.startswith("borrow"),
                        short=settings.preempt_exempt if settings.spot_quota in ("borrow-short", "borrow-fit")
                        else None, fit=settings.spot_quota == "borrow-fit")
    if gate is not None:
        preempter.borrowed = gate.lent  # the jobs lent GPUs beyond the quota go first
    since, horizon = tl.measured_from, tl.horizon
    out = Outcome(strategy_name, seed, tl.load)
    index_settings = IndexSettings()
    kept_scorer = KeptScorer()  # the fleet's layout does not change in a run
    delivered = 0.0
    queued_gpu_seconds = 0.0
    split = WaitSplit(cluster.placer, since, scheduler, free=cluster.free)
    lost_before = 0.0
    migrations_before = plans_before = dropped_before = 0
    indices: list[float] = []
    now = 0.0
    next_job = 0
    next_tick = strategy.interval if math.isfinite(strategy.interval) else math.inf
    next_sample = since
    marked = False
    while True:
        upcoming = min(jobs[next_job].submit if next_job < len(jobs) else math.inf,
                       cluster.finishes[0][0] if cluster.finishes else math.inf,
                       next_tick, next_sample, horizon)
        if upcoming > now:
            span = max(0.0, min(upcoming, horizon) - max(now, since))
            delivered += cluster.busy * span
            queued_gpu_seconds += scheduler.queue.demand * span
            split.accrue(span)
            now = upcoming
        if not marked and now >= since:  # the warm-up ends: what strategies did so far is not counted
            lost_before, migrations_before = cluster.lost_gpu_seconds, cluster.migrations
            plans_before, dropped_before = sim.plans, sim.moves_dropped
            marked = True
        if now >= horizon:
            break
        for job in cluster.due(now):
            cluster.stop(job)
        while next_job < len(jobs) and jobs[next_job].submit <= now:
            added = scheduler.queue.added
            if gate is None or not gate.hold(jobs[next_job]):
                scheduler.submit(jobs[next_job])
            if scheduler.queue.added > added:
                split.joined(jobs[next_job])
            next_job += 1
        if gate is not None:
            for job in gate.release(cluster, scheduler, now):
                split.joined(job)
        split.left(resumed(scheduler.run_pass(now)))
        if preempter.rule != "none":
            heads, victims = preempter.run(cluster, scheduler, now)
            for job in victims:
                split.joined(job)
            split.left(heads)
            split.left(resumed(scheduler.run_pass(now)))
        if now >= next_tick:
            # the oracle unblocks head after head: a pass starts each before it looks at the next
            for _ in range(getattr(strategy, "heads_per_tick", 1)):
                before = (cluster.migrations, cluster.releases)
                strategy.tick(sim, now)
                for job in sim.requeued:  # evicted back into the queue: they wait again
                    split.joined(job)
                sim.requeued.clear()
                if (cluster.migrations, cluster.releases) == before:
                    break
                split.left(resumed(scheduler.run_pass(now)))
            next_tick = now + strategy.interval
        if now >= next_sample:
            report = evaluate(cluster.placer.state, workload, index_settings, kept=kept_scorer)
            indices.append(report.cluster.index)
            out.samples.append(Sample(now - since, scheduler.queue.size, scheduler.queue.demand,
                                      100.0 * cluster.busy / cluster.capacity, report.cluster.index,
                                      split.hours(True, False), split.hours(True, True)))
            next_sample = now + settings.sample_interval
    window = horizon - since
    job_outcomes(out, jobs, scheduler.rejected, since, horizon)
    fill(out, preempter, jobs, cluster.running, since, horizon, delivered)
    fill_quota(out, gate, since)
    fill_lookahead(out, strategy, since, horizon)
    out.gpu_hours_delivered = delivered / 3600
    out.gpu_hours_waited_fragmentation = split.hours(False, False) + split.hours(True, False)
    out.gpu_hours_waited_capacity = split.hours(False, True) + split.hours(True, True)
    out.gpu_hours_waited_whole_node_fragmentation = split.hours(True, False)
    out.gpu_hours_waited_whole_node_capacity = split.hours(True, True)
    lost = cluster.lost_gpu_seconds - lost_before
    out.migrations = int(cluster.migrations - migrations_before)
    out.migration_overhead_pct = 100.0 * lost / delivered if delivered > 0 else 0.0
    out.mean_allocation_pct = 100.0 * delivered / (cluster.capacity * window)
    out.mean_fragmentation_index = sum(indices) / len(indices) if indices else 0.0
    out.mean_queued_gpus = queued_gpu_seconds / window
    out.plans = sim.plans - plans_before
    out.moves_dropped = sim.moves_dropped - dropped_before
    out.wall_seconds = time.perf_counter() - started
    return out


# -- several runs ---------------------------------------------------------------

_SHARED: tuple[SimFleet, HourlyArrivals, RunSettings] | None = None


def _init(fleet: SimFleet, series: HourlyArrivals, settings: RunSettings) -> None:
    global _SHARED
    _SHARED = (fleet, series, settings)


def _one(strategy: str, seed: int, load: float) -> Outcome:
    assert _SHARED is not None
    fleet, series, settings = _SHARED
    return simulate(fleet, series, strategy, seed, with_load(settings, load))


def with_load(settings: RunSettings, load: float) -> RunSettings:
    import dataclasses

    return dataclasses.replace(settings, timeline=dataclasses.replace(settings.timeline, load=load))


def simulate_many(fleet: SimFleet, series: HourlyArrivals, strategy_names: Sequence[str],
                  seeds: Sequence[int], loads: Sequence[float], settings: RunSettings,
                  jobs: int = 1, progress=None) -> list[Outcome]:  # type: ignore[no-untyped-def]
    """Every (load, seed, strategy), ``jobs`` runs at a time; outcomes in that order."""
    runs = [(s, seed, load) for load in loads for seed in seeds for s in strategy_names]
    if jobs <= 1:
        outcomes = []
        for s, seed, load in runs:
            outcomes.append(simulate(fleet, series, s, seed, with_load(settings, load)))
            if progress is not None:
                progress(outcomes[-1])
        return outcomes
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(jobs, len(runs), os.cpu_count() or 1), mp_context=context,
                             initializer=_init, initargs=(fleet, series, settings)) as pool:
        futures = [pool.submit(_one, s, seed, load) for s, seed, load in runs]
        outcomes = []
        for future in futures:
            outcomes.append(future.result())
            if progress is not None:
                progress(outcomes[-1])
        return outcomes


__all__ = ["RunSettings", "Sim", "make_strategy", "reference_capacity", "seed_jobs", "simulate",
           "simulate_many", "target_workload", "with_load"]
