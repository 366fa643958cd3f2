"""The FIFO scheduler's reservation for the blocked head, made in one sweep over the job ends, is
the one its per-node definition gives, on fleets caught mid-run: mixed models, shares, gangs,
model constraints and ties in end times."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from exporter.analysis.workload import Shape
from exporter.outcome_sim.cluster import Cluster
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.scheduler import reserve, reserve_per_node
from exporter.outcome_sim.timeline import Job
from exporter.snapshot import Gpu, Node

MODELS = ("H100", "A100-SXM4-80GB", "H200")


def fleet(rng: np.random.Generator) -> SimFleet:
    nodes = tuple(Node(f"n{i}", MODELS[int(rng.integers(3))], float(rng.choice([16, 32, 64])), "p", "x",
                       int(rng.choice([2, 4, 8]))) for i in range(int(rng.integers(3, 14))))
    return SimFleet("random", nodes, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                           for n in nodes for i in range(n.gpu_count)),
                    (Shape(1, 1.0, 1),))


def random_job(rng: np.random.Generator, id_: int, gang: bool) -> Job:
    gpus = int(rng.choice([0, 1, 1, 2, 4, 8]))
    share = 1.0 if gpus != 1 or rng.random() < 0.6 else float(rng.choice([0.25, 0.5]))
    parts = int(rng.choice([1, 2, 3])) if gang and gpus >= 2 else 1
    models = () if rng.random() < 0.6 else tuple(rng.choice(MODELS, size=int(rng.integers(1, 3)),
                                                            replace=False).tolist())
    # ends on a coarse grid: many running jobs end at the same instant, so ties are common
    work = float(rng.integers(1, 6)) * 100.0
    return Job(id_, 0.0, work, float(rng.choice([1, 4, 8])), gpus, share, parts, models, False)


@pytest.mark.parametrize("case", range(300))
def test_the_sweep_reserves_what_the_per_node_definition_does(case):
    rng = np.random.default_rng([case, 41])
    cluster = Cluster(fleet(rng).empty_state(), "bestfit")
    for i in range(int(rng.integers(0, 40))):
        j = random_job(rng, i, gang=True)
        found = cluster.find(j)
        if found is not None:
            cluster.start(j, found, float(rng.integers(0, 3)) * 50.0)
    now = 150.0
    for k in range(5):
        head = random_job(rng, 1000 + k, gang=True)
        assert reserve(cluster, head, now) == reserve_per_node(cluster, head, now)
        # the partitions it heads: some of its models only
        some = tuple(rng.choice(MODELS, size=int(rng.integers(1, 3)), replace=False).tolist())
        assert reserve(cluster, head, now, some) == reserve_per_node(cluster, head, now, some)


def three_nodes_two_heads(mode: str):  # type: ignore[no-untyped-def]
    """Two H100 nodes and an A100, all busy: an 8-GPU head of any model reserves the H100 n1
    (free at 100); a long 4-GPU job waits behind it; then a high-priority A100 job comes."""
    from exporter.outcome_sim.scheduler import Scheduler

    models = ("H100", "H100", "A100-SXM4-80GB")
    nodes = tuple(Node(f"n{i}", m, 64.0, "p", "x", 8) for i, m in enumerate(models))
    cluster = Cluster(SimFleet("three", nodes, (), (Shape(1, 1.0, 1),)).empty_state(), "bestfit")
    scheduler = Scheduler(cluster, mode)
    busy = [Job(90 + i, 0.0, work, 1.0, gpus, 1.0, 1, (), False)
            for i, (gpus, work) in enumerate(((8, 1000.0), (4, 100.0), (8, 500.0)))]
    for node, j in enumerate(busy):
        cluster.start(j, cluster.find(j, exclude=[n for n in range(3) if n != node]), 0.0)
    first_head = Job(1, 1.0, 50.0, 1.0, 8, 1.0, 1, (), False)
    waiting = Job(2, 2.0, 10_000.0, 1.0, 4, 1.0, 1, (), False)  # ends long after any shadow
    for j in (first_head, waiting):
        scheduler.submit(j)
    assert scheduler.run_pass(10.0) == []
    assert scheduler.reservation is not None and scheduler.reservation.nodes == (1,)
    new_head = Job(3, 11.0, 50.0, 1.0, 8, 1.0, 1, ("A100-SXM4-80GB",), True)  # high: goes first
    scheduler.submit(new_head)
    return scheduler, first_head, waiting, new_head


def test_per_partition_the_first_head_keeps_its_h100_reservation_when_an_a100_head_comes():
    """The A100 head blocks the A100 partition only: the first head still heads the H100 one and
    keeps n1 reserved, so the long job stays off it; each head has its own reservation."""
    scheduler, first_head, waiting, new_head = three_nodes_two_heads("fifo")
    assert scheduler.run_pass(11.0) == []
    assert scheduler.heads == (new_head, first_head) and scheduler.blocked is new_head
    assert scheduler.reservations[first_head.id].nodes == (1,)
    assert scheduler.reservations[new_head.id].nodes == (2,)
    assert waiting.start is None


def test_a_new_heads_reservation_lets_a_job_kept_off_the_old_one_backfill_at_once():
    """One head for the fleet (``fifo-one-head``). No capacity comes back between the two
    passes, but the head changes: the job that failed off the old head's reserved node is
    tried again off the new head's, and starts there."""
    scheduler, _, waiting, _ = three_nodes_two_heads("fifo-one-head")
    assert scheduler.run_pass(11.0) == [waiting]
    assert scheduler.reservation.nodes == (2,) and waiting.placements[0].node == 1


def test_a_gang_that_no_model_can_hold_is_not_tried_part_by_part():
    """Four free nodes, two H100s and two A100s: a gang of three H100 parts cannot start, and the
    pass says so from the fleet's arrays, without placing (and taking back) a part."""
    from exporter.outcome_sim.scheduler import Scheduler

    models = ("H100", "H100", "A100-SXM4-80GB", "A100-SXM4-80GB", "H100")
    nodes = tuple(Node(f"n{i}", m, 64.0, "p", "x", 8) for i, m in enumerate(models))
    cluster = Cluster(SimFleet("five", nodes, (), (Shape(1, 1.0, 1),)).empty_state(), "bestfit")
    scheduler = Scheduler(cluster, "fifo")
    busy = Job(90, 0.0, 1000.0, 1.0, 8, 1.0, 1, (), False)
    cluster.start(busy, cluster.find(busy, exclude=[1, 2, 3, 4]), 0.0)  # n0 is full
    gang = Job(1, 1.0, 50.0, 1.0, 8, 1.0, 3, ("H100",), False)
    assert cluster.could_fit(gang)  # enough free nodes, counted over every model
    scheduler.submit(gang)
    placed_before = cluster.placer._clock
    assert scheduler.run_pass(2.0) == []
    assert cluster.placer._clock == placed_before  # no part was placed and taken back
    assert scheduler.blocked is gang


def busy_jobs(rng: np.random.Generator, count: int = 120, slots: int = 40, minutes: tuple[int, int] = (1, 30),
              high: float = 0.3) -> list[Job]:
    """``count`` random jobs, gangs among them, submitted over ``slots`` half minutes (by default
    120 over 20 minutes: more than a small fleet serves), each running ``minutes`` (from, to),
    ``high`` of them high-priority."""
    jobs = []
    for i in range(count):
        j = random_job(rng, i, gang=True)
        j.submit = float(rng.integers(0, slots)) * 30.0
        j.work = float(rng.integers(*minutes)) * 60.0
        j.high = bool(rng.random() < high)
        jobs.append(j)
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


def run_row(case: int, salt: int, strategy: str, days: float = 0.5, advisor_interval: float | None = None,
            jobs_of: Callable[[np.random.Generator], list[Job]] = busy_jobs
            ) -> tuple[dict, list[tuple[int, float | None]]]:
    """A random fleet (seeded by ``case`` and ``salt``) under ``jobs_of``'s stream of jobs, for
    ``days``: the outcome's columns (but the wall time) and each job's first start."""
    from exporter.outcome_sim.run import RunSettings, simulate
    from exporter.outcome_sim.timeline import HourlyArrivals, TimelineSettings

    rng = np.random.default_rng([case, salt])
    sim_fleet = fleet(rng)
    jobs = jobs_of(rng)
    series = HourlyArrivals(np.array([3600.0] * 48), np.array([1.0] * 48))
    extra = {} if advisor_interval is None else {"advisor_interval": advisor_interval}
    settings = RunSettings(timeline=TimelineSettings(days=days, warmup_days=0.0), **extra)
    out = simulate(sim_fleet, series, strategy, 1, settings, jobs=jobs)
    row = out.row()
    row.pop("wall_seconds")
    return row, [(j.id, j.start) for j in jobs]


def busy_run(case: int, strategy: str, remember: bool) -> tuple[dict, list[tuple[int, float | None]]]:
    """A random fleet under a random stream of jobs, longer than it can serve: the outcome's
    columns and each job's first start. ``remember`` False: the scheduler forgets every failed
    backfill and the wait split every job's reason before each use, as they did before they
    kept them."""
    from exporter.outcome_sim.blocked import WaitSplit
    from exporter.outcome_sim.run import RunSettings, simulate
    from exporter.outcome_sim.scheduler import Scheduler
    from exporter.outcome_sim.timeline import HourlyArrivals, TimelineSettings

    rng = np.random.default_rng([case, 4141])
    sim_fleet = fleet(rng)
    jobs = busy_jobs(rng)
    series = HourlyArrivals(np.array([3600.0] * 48), np.array([1.0] * 48))
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.0))
    backfill, accrue = Scheduler._backfill, WaitSplit.accrue

    def forgetful_backfill(self, job, ahead, now):  # type: ignore[no-untyped-def]
        self._no_backfill.clear()
        return backfill(self, job, ahead, now)

    def forgetful_accrue(self, span):  # type: ignore[no-untyped-def]
        self._why_state = ()
        return accrue(self, span)

    if not remember:
        Scheduler._backfill, WaitSplit.accrue = forgetful_backfill, forgetful_accrue  # type: ignore[method-assign]
    try:
        out = simulate(sim_fleet, series, strategy, 1, settings, jobs=jobs)
    finally:
        Scheduler._backfill, WaitSplit.accrue = backfill, accrue  # type: ignore[method-assign]
    row = out.row()
    row.pop("wall_seconds")
    return row, [(j.id, j.start) for j in jobs]


@pytest.mark.parametrize("strategy", ["none", "oracle", "consolidate"])
@pytest.mark.parametrize("case", range(8))
def test_what_the_pass_and_the_split_remember_changes_no_outcome(case, strategy):
    """The failed backfills the scheduler remembers (while the reservations and the released
    capacity are the same) and the reasons the wait split keeps (while the fleet and the heads
    are): every column and every job's start are as when both are told afresh each time."""
    kept, kept_starts = busy_run(case, strategy, remember=True)
    fresh, fresh_starts = busy_run(case, strategy, remember=False)
    assert kept_starts == fresh_starts
    assert kept == fresh
    assert sum(1 for _, start in kept_starts if start is not None) > 0
