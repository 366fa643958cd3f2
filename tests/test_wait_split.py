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
    assert not capacity_blocked(tight, 4, 1.0, 1, ("H100",))
    # a gang's parts run on distinct nodes: 4 parts of 1 GPU need 4 nodes, and there are two H100s
    # (and two H200s, with 4 GPUs between them)
    assert capacity_blocked(tight, 1, 1.0, 4, ("H100",))
    assert not capacity_blocked(tight, 1, 1.0, 2, ("H100",))
    assert capacity_blocked(tight, 1, 1.0, 5, ())
    assert not capacity_blocked(tight, 4, 1.0, 1, ())
    # shares: half a GPU needs half a GPU's room anywhere, here the two halves on H200s
    full = room_of(fleet, [[0] * 8, [0] * 8, [0.25, 0, 0, 0], [0.25, 0, 0, 0]])
    assert not capacity_blocked(full, 1, 0.5, 1, ())
    assert capacity_blocked(full, 1, 0.5, 1, ("H100",))
    assert capacity_blocked(full, 1, 1.0, 1, ())
    assert not capacity_blocked(full, 0, 1.0, 1, ())  # asks no GPU: never blocked by GPUs


def test_a_gang_needs_as_many_nodes_as_parts_on_one_model():
    """Three parts of 1 GPU beside 3 free GPUs on the two H100s, the A100s full: a repack could
    gather the 3 GPUs, not spread them over a third H100 (there is none); capacity-blocked.
    Judged by its total, it was fragmentation-blocked."""
    fleet = fleet_of([("H100", 8), ("H100", 8), ("A100-80GB", 8), ("A100-80GB", 8), ("A100-80GB", 8)])
    room = room_of(fleet, [[1, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0], [0] * 8, [0] * 8, [0] * 8])
    assert capacity_blocked(room, 1, 1.0, 3, ())
    assert not capacity_blocked(room, 1, 1.0, 2, ())
    assert not capacity_blocked(room, 3, 1.0, 1, ())


def test_a_4_worker_gang_of_8_gpu_parts_beside_4_free_gpus_on_each_of_8_nodes_is_fragmentation_blocked():
    """32 free GPUs, 4 on each of eight 8-GPU nodes: moving the jobs of four nodes onto the other
    four's free GPUs would empty four nodes (nodes of one size: a move between them always fits
    by size); 5 workers would need 40."""
    fleet = fleet_of([("H100", 8)] * 8)
    room = room_of(fleet, [[1, 1, 1, 1, 0, 0, 0, 0]] * 8)
    assert not capacity_blocked(room, 8, 1.0, 4, ())
    assert capacity_blocked(room, 8, 1.0, 5, ())


def test_free_gpus_on_nodes_of_another_size_do_not_join():
    """A 4-GPU job beside 2 free GPUs on an 8-GPU node and 2 on a 4-GPU node: the rule pools
    free GPUs only between nodes of one model and size, so it is capacity-blocked (a move
    between sizes is not counted: the rule's conservative side)."""
    fleet = fleet_of([("H100", 8), ("H100", 4)])
    room = room_of(fleet, [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 0, 0]])
    assert capacity_blocked(room, 4, 1.0, 1, ())
    assert not capacity_blocked(room, 2, 1.0, 2, ())


def beside_four_half_nodes(gang: bool) -> Outcome:
    """Four 8-GPU nodes, each half held by a long 4-GPU part: of one gang of four parts, or of
    four single-node jobs. An 8-GPU job comes at t=100 and waits to the end."""
    fleet = fleet_of([("H100", 8)] * 4)
    # each single-node job takes 40 of a node's 64 cores: best-fit cannot pair them
    held = [job(0, 4, LONG, parts=4)] if gang else [Job(i, 0.0, LONG, 40.0, 4, 1.0, 1, (), False)
                                                    for i in range(4)]
    jobs = [*held, job(len(held), 8, LONG, submit=100.0)]
    settings = RunSettings(timeline=TimelineSettings(days=0.1, warmup_days=0.0))
    out = simulate(fleet, SERIES, "none", 1, settings, jobs=jobs)
    assert len({p.node for j in held for p in j.placements}) == 4 and jobs[-1].start is None
    return out


def test_gang_parts_do_not_move_so_the_gpus_beside_them_are_capacity():
    """No repack moves a gang's part (the oracle's and the baselines' rule): beside four parts of
    one gang, the 16 free GPUs give the 8-GPU job no node; beside four single-node jobs, moving two
    of them would."""
    waited = 8 * (0.1 * 86400 - 100.0) / 3600
    gang = beside_four_half_nodes(gang=True)
    assert gang.gpu_hours_waited_whole_node_capacity == pytest.approx(waited)
    assert gang.gpu_hours_waited_whole_node_fragmentation == 0.0
    single = beside_four_half_nodes(gang=False)
    assert single.gpu_hours_waited_whole_node_fragmentation == pytest.approx(waited)
    assert single.gpu_hours_waited_whole_node_capacity == 0.0


def behind_the_head(head_capacity: bool) -> tuple[Outcome, list[Job]]:
    """Node n0 full for the whole run, n1 half busy until t=1000; or n0 with 4 free GPUs and n1
    with 5 (a 3-GPU job; each of the two busy jobs takes 40 of a node's 64 cores, so they cannot
    share one). An 8-GPU head arrives at 100 and reserves n1; a long job arrives at 200 that fits
    n1 now but would end after the head's shadow time: it waits behind the head."""
    fleet = fleet_of([("H100", 8), ("H100", 8)])
    if head_capacity:
        jobs = [job(0, 8, LONG), job(1, 4, 1000.0), job(2, 8, LONG, submit=100.0),
                job(3, 4, LONG, submit=200.0)]
    else:  # the head's 8 GPUs are there after a repack: 4 + 5 free
        jobs = [Job(0, 0.0, LONG, 40.0, 4, 1.0, 1, (), False),
                Job(1, 0.0, 1000.0, 40.0, 3, 1.0, 1, (), False),
                job(2, 8, LONG, submit=100.0), job(3, 5, LONG, submit=200.0)]
    settings = RunSettings(timeline=TimelineSettings(days=0.1, warmup_days=0.0))
    return simulate(fleet, SERIES, "none", 1, settings, jobs=jobs), jobs


def test_a_job_that_fits_now_behind_a_capacity_blocked_head_waits_for_capacity():
    out, jobs = behind_the_head(head_capacity=True)
    assert jobs[2].start == 1000.0 and jobs[3].start is None
    # the 4-GPU job fitted n1's 4 free GPUs from 200 to 1000, held back by the head's reservation:
    # it waited for what the head waited for, capacity; then for capacity itself
    assert out.gpu_hours_waited_fragmentation == 0.0
    assert out.gpu_hours_waited_capacity == pytest.approx(
        (8 * 900.0 + 4 * (0.1 * 86400 - 200.0)) / 3600)


def test_a_job_that_fits_now_behind_a_fragmentation_blocked_head_waits_for_fragmentation():
    out, jobs = behind_the_head(head_capacity=False)
    assert jobs[2].start == 1000.0 and jobs[3].start is None
    # 200 to 1000: the 5-GPU job fits n1 now, behind a head a repack could start (4 + 5 free)
    assert out.gpu_hours_waited_fragmentation == pytest.approx((8 * 900.0 + 5 * 800.0) / 3600)


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
