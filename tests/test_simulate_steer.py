"""The simulated scheduler honours steering's node weights (issue 42, Build 2): among the nodes
where a job fits, the lowest weight, then its own policy; and every other strategy places as before."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exporter.advisor import steer
from exporter.analysis.workload import Shape
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.run import RunSettings, Sim, make_strategy, simulate, target_workload
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.steering import Steer
from exporter.outcome_sim.timeline import HourlyArrivals, Job, TimelineSettings
from exporter.placement.engine import Placer, preferred
from exporter.placement.task import Task
from exporter.snapshot import Gpu, Node

SERIES = HourlyArrivals(np.array([3600.0 * 20, 3600.0 * 60, 3600.0 * 10, 3600.0 * 40] * 30),
                        np.array([20.0, 30.0, 10.0, 20.0] * 30))
LONG = 1e7


def fleet_of(nodes: list[tuple[str, int]]) -> SimFleet:
    listed = tuple(Node(f"n{i}", model, 64.0, f"pool-{model}", "hopper", gpus)
                   for i, (model, gpus) in enumerate(nodes))
    shapes = (Shape(4, 1.0, 1), Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(16, 1.0, 4), Shape(32, 1.0, 8),
              Shape(1, 0.0, 0))
    return SimFleet("tiny", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                          for n in listed for i in range(n.gpu_count)), shapes)


MIXED = [("H100", 8), ("H200", 8), ("H100", 8), ("H200", 8), ("H100", 8), ("H100", 4)] * 2


def sim_of(fleet: SimFleet) -> Sim:
    state = fleet.empty_state()
    workload = target_workload(fleet, state.model_names)
    cluster = Cluster(state, "bestfit", workload, MoveCost(900.0, 120.0))
    return Sim(fleet, cluster, Scheduler(cluster), RunSettings(), workload)


def job(id_: int, gpus: int, work: float = LONG) -> Job:
    return Job(id_, 0.0, work, 1.0, gpus, 1.0, 1, (), False)


def test_a_rank_filters_to_the_lowest_rank_where_the_task_fits():
    key = np.array([3.0, np.inf, 1.0, 2.0])
    rank = np.array([2, 1, 5, 2])
    # node 1 has the lowest rank but the task does not fit there: it stays inf, and does not
    # keep the task from the nodes of rank 2
    assert preferred(key, rank).tolist() == [3.0, np.inf, np.inf, 2.0]
    nowhere = np.full(3, np.inf)
    assert np.isinf(preferred(nowhere, np.array([1, 2, 3]))).all()


def test_the_placer_goes_to_the_lowest_weight_then_by_its_policy_and_a_new_weight_takes_effect_at_once():
    placer = Placer.for_nodes(["a", "b", "c"], ["H100"] * 3, ["p"] * 3, [64.0] * 3, [8, 8, 8])
    placer.apply(placer.place_on(Task(8.0, 6, 1.0), 0, "bestfit"))  # a: 2 free, the fullest
    task = Task(4.0, 1, 1.0)
    assert placer.place(task, "bestfit").node == 0  # bestfit alone: the fullest node
    placer.preference = np.array([5, 1, 1])
    assert placer.place(task, "bestfit").node == 1  # weight first; b and c tie, b first by name
    placer.preference = np.array([5, 9, 1])  # no node changed: the cached scores serve again
    assert placer.place(task, "bestfit").node == 2
    # whether a task fits at all is the policy's: a weight never keeps a task from a node it fits
    assert placer.place(Task(8.0, 8, 1.0), "bestfit").node == 2
    assert placer.place(Task(8.0, 8, 1.0), "bestfit", exclude=[2]).node == 1
    placer.preference = None
    assert placer.place(task, "bestfit").node == 0


def test_steer_sets_the_weights_of_the_live_fleet_every_interval_and_moves_nothing():
    sim = sim_of(fleet_of(MIXED))
    cluster = sim.cluster
    for i, gpus in enumerate((3, 5, 8, 1)):
        j = job(i, gpus)
        cluster.start(j, cluster.find(j), 0.0)
    strategy = make_strategy("steer", RunSettings())
    assert isinstance(strategy, Steer) and strategy.interval == strategy.every == 300.0
    strategy.tick(sim, 300.0)
    want = steer.weights(steer.expected_growth(cluster.placer.state, sim.workload))
    assert cluster.placer.preference is not None
    assert cluster.placer.preference.tolist() == want.tolist()
    assert len(set(want.tolist())) > 1  # the weights tell the nodes apart
    assert cluster.migrations == 0
    # the job on the best node ends before the next computation: the weights stand until it
    best = next(j for j in cluster.running.values() if want[j.placements[0].node] == steer.WEIGHT_BEST)
    cluster.stop(best)
    strategy.tick(sim, 500.0)
    assert cluster.placer.preference.tolist() == want.tolist() and strategy.computations == 1
    strategy.tick(sim, 600.0)
    assert strategy.computations == 2
    assert cluster.placer.preference.tolist() == steer.weights(
        steer.expected_growth(cluster.placer.state, sim.workload)).tolist() != want.tolist()


def test_steer_puts_a_small_job_on_a_node_already_broken_where_bestfit_breaks_an_empty_one():
    sim = sim_of(fleet_of(MIXED))
    cluster = sim.cluster
    first = job(0, 1)
    cluster.start(first, [cluster.placer.place_on(cluster.task(first), 3, "bestfit")], 0.0)  # n3: 7 free
    one = job(1, 1)
    assert cluster.find(one)[0].node_name == "n5"  # bestfit alone: the empty 4-GPU node, the fuller
    make_strategy("steer", RunSettings()).tick(sim, 300.0)
    weights = cluster.placer.preference
    assert weights is not None and weights[3] == steer.WEIGHT_BEST < weights[5]
    # a whole 4-GPU node broken costs the 4-GPU jobs it; a gap on a broken node costs less
    assert cluster.find(one)[0].node_name == "n3"


def test_steer_and_steer_with_the_advisor_run_and_their_rows_add_up():
    fleet = fleet_of(MIXED)
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1, load=1.2, gang_share=0.3))
    none = simulate(fleet, SERIES, "none", 7, settings)
    steered = simulate(fleet, SERIES, "steer", 7, settings)
    both = simulate(fleet, SERIES, "steer+advisor", 7, settings)
    assert steered.strategy == "steer" and both.strategy == "steer+advisor"
    assert steered.migrations == 0 and steered.plans == 0
    assert steered.jobs == none.jobs == both.jobs
    # the weights changed where jobs went: the run is not none's
    assert (steered.gpu_hours_waited, steered.mean_fragmentation_index) != (
        none.gpu_hours_waited, none.mean_fragmentation_index)
    for out in (steered, both):
        assert out.gpu_hours_waited_whole_node == pytest.approx(
            out.gpu_hours_waited_whole_node_fragmentation + out.gpu_hours_waited_whole_node_capacity)


# none and consolidate on this fleet and seed, recorded before steering was added to the placer:
# they set no weight, so they must place exactly as before (recompute these only for a change
# that means to move them, and say so). Recomputed for the scheduler's heads per partition and
# its backfill run times at the model's speed (tests/test_sim_queue_heads.py).
BEFORE = {
    "none": dict(jobs=323, jobs_started=306, gpu_hours_delivered=907.1124629036813,
                 gpu_hours_waited=2087.298450688555, gpu_hours_waited_whole_node=2044.609850162248,
                 wait_p95_s_small=259.87071051101003, wait_p95_s_mid=2707.5133921503484, migrations=0),
    "consolidate": dict(jobs=323, jobs_started=310, gpu_hours_delivered=955.9048419504193,
                        gpu_hours_waited=2059.2024006605884, gpu_hours_waited_whole_node=1965.5980967156079,
                        wait_p95_s_small=462.5460454379179, wait_p95_s_mid=6153.446330511059,
                        migrations=15),
}


@pytest.mark.parametrize("strategy", sorted(BEFORE))
def test_the_strategies_that_do_not_steer_place_as_before(strategy):
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1, load=1.2, gang_share=0.3))
    out = dataclasses.asdict(simulate(fleet_of(MIXED), SERIES, strategy, 7, settings))
    assert {k: out[k] for k in BEFORE[strategy]} == pytest.approx(BEFORE[strategy], rel=1e-12)


def test_nodes_without_gpus_keep_the_default_weight_as_serve_leaves_them():
    sim = sim_of(fleet_of([("H100", 8), ("H100", 8), ("H100", 0)]))
    cluster = sim.cluster
    first = job(0, 1)
    cluster.start(first, cluster.find(first), 0.0)
    make_strategy("steer", RunSettings()).tick(sim, 300.0)
    weights = cluster.placer.preference
    assert weights is not None
    assert weights[2] == steer.WEIGHT_BEST  # no GPU job fits it: weights() alone gives it the worst
    assert steer.weights(steer.expected_growth(cluster.placer.state, sim.workload))[2] == steer.WEIGHT_WORST
