"""A job's work runs at its GPU model's speed: the catalogue's throughput, the H100 1.0; a move
to a slower model costs time."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.workload import Shape
from exporter.gpu_catalogue import default_catalogue, speed
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet, default_fleet
from exporter.outcome_sim.run import RunSettings, reference_capacity, simulate, target_workload
from exporter.outcome_sim.timeline import HourlyArrivals, Job, TimelineSettings
from exporter.snapshot import Gpu, Node

SERIES = HourlyArrivals(np.array([3600.0 * 20] * 200), np.array([20.0] * 200))


def fleet_of(*models: str) -> SimFleet:
    listed = tuple(Node(f"n{i}", model, 64.0, "one", "any", 8) for i, model in enumerate(models))
    return SimFleet("speeds", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                            for n in listed for i in range(8)), (Shape(4, 1.0, 1),))


def cluster_of(fleet: SimFleet) -> Cluster:
    state = fleet.empty_state()
    return Cluster(state, "bestfit", target_workload(fleet, state.model_names), MoveCost(900.0, 120.0))


def job(id_: int, gpus: int, work: float, models: tuple[str, ...] = ()) -> Job:
    return Job(id_, 0.0, work, 1.0, gpus, 1.0, 1, models, False)


def test_the_catalogue_orders_the_models_by_throughput_the_h100_the_reference():
    catalogue = default_catalogue()
    b200, h200, h100, a100 = (speed(catalogue.get(m)) for m in ("B200", "H200", "H100", "A100-80GB"))
    assert h100 == 1.0
    assert b200 > h200 > h100 > a100
    assert h200 == pytest.approx(1.47)  # MLPerf Training v4.0's "up to 47%" (gpu_catalogue.yaml)
    # a model the catalogue cites no figure for runs at the reference speed, not a guess
    assert catalogue.get("V100").throughput is None and speed(catalogue.get("V100")) == 1.0
    assert speed(catalogue.get("G2")) == 1.0


def test_a_job_moved_from_an_h100_to_an_a100_finishes_later_than_one_left_in_place():
    cluster = cluster_of(fleet_of("H100", "H100", "A100-80GB"))
    stays, moves = job(1, 2, 36_000.0, ("H100",)), job(2, 2, 36_000.0)
    for j in (stays, moves):
        cluster.start(j, cluster.find(j), 0.0)
    assert stays.end() == moves.end() == 36_000.0  # H100: a second of work a second
    a100 = cluster.find(moves, models=("A100-80GB",))
    assert a100 is not None and cluster.placer.model_names[cluster.placer.model[a100[0].node]] == "A100-80GB"
    cluster.move(moves, a100, 1000.0)
    # 900 s saved by its checkpoint; the other 35,100 s of work at half speed, after the restore
    assert moves.done == 900.0 and moves.speed == 0.5
    assert moves.end() == pytest.approx(1000 + 120 + 35_100 / 0.5)
    assert moves.end() > stays.end()
    # a free move (the oracle's) loses nothing, and still finishes later on the slower model
    free = job(3, 2, 36_000.0)
    cluster.start(free, cluster.find(free, models=("H100",)), 0.0)
    cluster.relocate(free, cluster.find(free, models=("A100-80GB",)), 1000.0)
    assert free.done == 1000.0 and free.end() == pytest.approx(1000 + 35_000 / 0.5)
    assert free.end() > stays.end()


def test_work_saved_by_a_checkpoint_is_run_time_times_the_models_speed():
    cluster = cluster_of(fleet_of("H200", "H100"))
    fast = job(1, 8, 10_000.0, ("H200",))
    cluster.start(fast, cluster.find(fast), 0.0)
    assert fast.speed == pytest.approx(1.47)
    assert fast.end() == pytest.approx(10_000 / 1.47)
    cluster.interrupt(fast, 1000.0)  # one checkpoint in, at 900 s of run
    assert fast.done == pytest.approx(900 * 1.47)
    assert cluster.lost_gpu_seconds == pytest.approx(100 * 8)  # run time lost, not work


@pytest.mark.parametrize(("model", "hours"), [("H100", 1.0), ("A100-80GB", 2.0), ("B200", 0.5)])
def test_in_the_loop_a_job_holds_its_gpus_for_its_work_over_its_models_speed(model: str, hours: float):
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.0))
    out = simulate(fleet_of(model), SERIES, "none", 1, settings, jobs=[job(0, 8, 3600.0)])
    assert out.gpu_hours_delivered == pytest.approx(8 * hours)


def test_the_load_counts_each_gpu_at_its_speed():
    fleet = default_fleet()
    catalogue = default_catalogue()
    by_model: dict[str, int] = {}
    for n in fleet.nodes:
        by_model[n.model] = by_model.get(n.model, 0) + n.gpu_count
    expected = sum(gpus * speed(catalogue.get(m)) for m, gpus in by_model.items())
    assert reference_capacity(fleet) == pytest.approx(expected)
    # 256 H200 x 1.47 + 512 H100 + 256 A100 x 0.5 + 64 B200 x 2.0
    assert reference_capacity(fleet) == pytest.approx(256 * 1.47 + 512 + 256 * 0.5 + 64 * 2.0)
