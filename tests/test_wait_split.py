"""Why each job waited: capacity-blocked (no room even after a perfect repack) or
fragmentation-blocked (room in total, no placement), and that the two add up to the waiting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporter.analysis.workload import Shape
from exporter.outcome_sim.blocked import RepackRoom, WaitSplit, capacity_blocked
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.outcomes import Outcome
from exporter.outcome_sim.run import RunSettings, simulate
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.strategies import STRATEGIES
from exporter.outcome_sim.timeline import HourlyArrivals, Job, TimelineSettings
from exporter.placement.engine import Placer
from exporter.snapshot import Gpu, Node

SERIES = HourlyArrivals(np.array([3600.0 * 20, 3600.0 * 60, 3600.0 * 10, 3600.0 * 40] * 30),
                        np.array([20.0, 30.0, 10.0, 20.0] * 30))
LONG = 1e7  # seconds of work: runs past any horizon here


def fleet_of(nodes: list[tuple[str, int]]) -> SimFleet:
    """Nodes as (model, GPUs); the shapes only matter to runs that draw jobs."""
    listed = tuple(Node(f"n{i}", model, 64.0, f"pool-{model}", "hopper", gpus)
                   for i, (model, gpus) in enumerate(nodes))
    shapes = (Shape(4, 1.0, 1), Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(16, 1.0, 4), Shape(32, 1.0, 8),
              Shape(1, 0.0, 0))
    return SimFleet("tiny", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                          for n in listed for i in range(n.gpu_count)), shapes)


def job(id_: int, gpus: int, work: float, submit: float = 0.0, parts: int = 1, share: float = 1.0,
        models: tuple[str, ...] = ()) -> Job:
    return Job(id_, submit, work, 1.0, gpus, share, parts, models, False)


def room_of(fleet: SimFleet, free: list[list[float]]) -> RepackRoom:
    """The repack room of ``fleet`` with ``free`` shares per node's GPU."""
    placer = Placer(fleet.empty_state())
    for node, row in enumerate(free):
        placer.set_node(node, float(placer.cpu_free[node]), row)
    return WaitSplit(placer, 0.0).room()


# -- the must-show: 8 GPUs beside 8 free on two nodes, and beside 4 --------------------------


def whole_node_wait(second_ends: bool) -> tuple[Outcome, list[Job]]:
    """Two 8-GPU nodes. Three 4-GPU jobs: best-fit packs the first two on one node, the third on
    the other; if ``second_ends``, the second ends at t=100 and 8 GPUs are free, 4 per node,
    else 4 are free. An 8-GPU job arrives at t=200 and waits to the end."""
    fleet = fleet_of([("H100", 8), ("H100", 8)])
    jobs = [job(0, 4, LONG), job(1, 4, 100.0 if second_ends else LONG), job(2, 4, LONG),
            job(3, 8, LONG, submit=200.0)]
    settings = RunSettings(timeline=TimelineSettings(days=0.1, warmup_days=0.0))
    return simulate(fleet, SERIES, "none", 1, settings, jobs=jobs), jobs


def test_an_8_gpu_job_beside_8_free_gpus_split_over_two_nodes_is_fragmentation_blocked():
    out, jobs = whole_node_wait(second_ends=True)
    assert jobs[0].placements[0].node != jobs[2].placements[0].node  # 4 free on each node
    assert jobs[3].start is None
    waited = 8 * (0.1 * 86400 - 200.0) / 3600
    assert out.gpu_hours_waited_whole_node == pytest.approx(waited)
    assert out.gpu_hours_waited_whole_node_fragmentation == pytest.approx(waited)
    assert out.gpu_hours_waited_whole_node_capacity == 0.0
    assert out.gpu_hours_waited_fragmentation == pytest.approx(waited)
    assert out.gpu_hours_waited_capacity == 0.0


def test_an_8_gpu_job_beside_4_free_gpus_is_capacity_blocked():
    out, jobs = whole_node_wait(second_ends=False)
    assert jobs[3].start is None
    waited = 8 * (0.1 * 86400 - 200.0) / 3600
    assert out.gpu_hours_waited_whole_node_capacity == pytest.approx(waited)
    assert out.gpu_hours_waited_whole_node_fragmentation == 0.0
    assert out.gpu_hours_waited_capacity == pytest.approx(waited)
    assert out.gpu_hours_waited_fragmentation == 0.0


def test_a_job_is_fragmentation_blocked_for_the_first_part_of_its_wait_and_capacity_after():
    """The same 8-GPU job: 8 free GPUs (4 + 4) until a 4-GPU job takes half of them at t=1000."""
    fleet = fleet_of([("H100", 8), ("H100", 8)])
    jobs = [job(0, 4, LONG), job(1, 4, 100.0), job(2, 4, LONG), job(3, 8, LONG, submit=200.0),
            job(4, 4, LONG, submit=1000.0)]
    settings = RunSettings(timeline=TimelineSettings(days=0.1, warmup_days=0.0))
    out = simulate(fleet, SERIES, "none", 1, settings, jobs=jobs)
    assert jobs[4].start == 1000.0  # backfilled: the head could never start anyway (its shadow is infinite)
    assert out.gpu_hours_waited_whole_node_fragmentation == pytest.approx(8 * 800.0 / 3600)
    assert out.gpu_hours_waited_whole_node_capacity == pytest.approx(8 * (0.1 * 86400 - 1000.0) / 3600)


# -- the rule ---------------------------------------------------------------------------------


def test_the_rule_counts_whole_gpus_a_repack_could_free_per_model_on_nodes_big_enough():
    fleet = fleet_of([("H100", 8), ("H100", 8), ("H200", 4), ("H200", 4)])
    # 4 + 3.5 + 0.5 free on the H100s: 8 shares, whole GPUs after a repack: 8
    room = room_of(fleet, [[1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0.5, 0.5, 0, 0, 0],
                           [0.5, 0, 0, 0], [1, 1, 1, 1]])
    assert not capacity_blocked(room, 8, 1.0, 1, ())
    assert not capacity_blocked(room, 8, 1.0, 1, ("H100",))
    assert capacity_blocked(room, 8, 1.0, 1, ("H200",))  # 4.5 free there, and no node holds 8
    assert capacity_blocked(room, 4, 1.0, 3, ("H100",))  # a gang of 3 x 4 asks 12
    assert not capacity_blocked(room, 4, 1.0, 2, ())  # 2 x 4
    assert capacity_blocked(room, 9, 1.0, 1, ())  # no node has 9 GPUs
    # 3.5 + 0.5 + 0.5 = 4.5 shares on the H100s: 4 whole GPUs after a repack, not 5; the
    # H200s' 4 do not join them (a gang runs on one model)
    tight = room_of(fleet, [[1, 1, 1, 0.5, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0, 0, 0],
                            [1, 0, 0, 0], [1, 1, 1, 0]])
    assert not capacity_blocked(tight, 1, 1.0, 4, ("H100",))
    assert capacity_blocked(tight, 1, 1.0, 5, ())
    assert not capacity_blocked(tight, 4, 1.0, 1, ())
    # shares: half a GPU needs half a GPU's room anywhere, here the two halves on H200s
    full = room_of(fleet, [[0] * 8, [0] * 8, [0.25, 0, 0, 0], [0.25, 0, 0, 0]])
    assert not capacity_blocked(full, 1, 0.5, 1, ())
    assert capacity_blocked(full, 1, 0.5, 1, ("H100",))
    assert capacity_blocked(full, 1, 1.0, 1, ())
    assert not capacity_blocked(full, 0, 1.0, 1, ())  # asks no GPU: never blocked by GPUs


# -- the must-show: the parts add up to the totals on every row of every run ------------------


def parts_add_up(out: Outcome) -> None:
    for total, fragmentation, capacity in (
            (out.gpu_hours_waited, out.gpu_hours_waited_fragmentation, out.gpu_hours_waited_capacity),
            (out.gpu_hours_waited_whole_node, out.gpu_hours_waited_whole_node_fragmentation,
             out.gpu_hours_waited_whole_node_capacity)):
        assert fragmentation >= 0 and capacity >= 0
        assert math.isclose(fragmentation + capacity, total, rel_tol=1e-6, abs_tol=1e-9), (
            out.strategy, out.seed, out.load, total, fragmentation, capacity)
    assert out.gpu_hours_waited_whole_node_capacity <= out.gpu_hours_waited_capacity + 1e-9
    assert out.gpu_hours_waited_whole_node_fragmentation <= out.gpu_hours_waited_fragmentation + 1e-9


def test_fragmentation_and_capacity_add_up_to_the_waiting_on_every_row_of_every_run():
    runs = [  # (fleet, settings, seed): moves for blocked heads; gangs on two models; per-pod retry
        (fleet_of([("H100", 8)] * 4),
         RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1, load=0.9, gang_share=0.0),
                     advisor_interval=600.0), 1),
        (fleet_of([("H100", 8), ("H200", 8), ("H100", 8), ("H200", 8), ("H100", 8), ("H100", 4)]),
         RunSettings(timeline=TimelineSettings(days=0.25, warmup_days=0.1, load=1.2, gang_share=0.5)), 2),
        (fleet_of([("H100", 8), ("H200", 8), ("H100", 8), ("H200", 8), ("H100", 8), ("H100", 4)]),
         RunSettings(timeline=TimelineSettings(days=0.25, warmup_days=0.1, load=1.6, gang_share=0.5),
                     mode="kube"), 3),
    ]
    rows = [simulate(fleet, SERIES, strategy, seed, settings)
            for fleet, settings, seed in runs for strategy in STRATEGIES]
    for out in rows:
        parts_add_up(out)
    # the rows say something: both kinds of waiting, jobs started after moves, requeues
    assert any(o.gpu_hours_waited_whole_node_capacity > 0 for o in rows)
    assert any(o.gpu_hours_waited_whole_node_fragmentation > 0 for o in rows)
    assert any(o.gpu_hours_waited_capacity > o.gpu_hours_waited_whole_node_capacity for o in rows)
    assert any(o.strategy == "consolidate" and o.plans > 0 for o in rows)
    assert any(o.strategy == "advisor" and o.plans > 0 for o in rows)
    assert any(o.strategy == "descheduler" and o.migrations > 0 for o in rows)


def test_a_requeued_jobs_second_wait_is_not_counted_as_the_outcomes_do_not_count_it(monkeypatch):
    requeued: list[int] = []
    requeue = Scheduler.requeue

    def counted(self: Scheduler, job: Job) -> None:
        requeued.append(job.id)
        requeue(self, job)

    monkeypatch.setattr(Scheduler, "requeue", counted)
    fleet = fleet_of([("H100", 8), ("H100", 8), ("H100", 8)])
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.0, load=1.5),
                           descheduler_interval=300.0)
    out = simulate(fleet, SERIES, "descheduler", 7, settings)
    assert requeued
    parts_add_up(out)


def test_a_job_submitted_in_the_warm_up_is_not_counted():
    fleet = fleet_of([("H100", 8)])
    jobs = [job(0, 8, LONG), job(1, 8, LONG, submit=100.0), job(2, 8, LONG, submit=0.1 * 86400 + 50)]
    settings = RunSettings(timeline=TimelineSettings(days=0.1, warmup_days=0.1))
    out = simulate(fleet, SERIES, "none", 1, settings, jobs=jobs)
    waited = 8 * (0.1 * 86400 - 50) / 3600  # the third job's alone
    assert out.gpu_hours_waited_whole_node == pytest.approx(waited)
    assert out.gpu_hours_waited_whole_node_capacity == pytest.approx(waited)
    assert out.gpu_hours_waited_capacity == pytest.approx(waited)
