"""The baselines follow the advisor's memory and model rules by default (their unrestricted
variants stay selectable), and the descheduler's requeued job is charged its second wait and
only the restore it performs."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.workload import Shape
from exporter.gpu_catalogue import default_catalogue
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.run import RunSettings, Sim, simulate, target_workload
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.strategies import STRATEGIES, Descheduler, destinations
from exporter.outcome_sim.timeline import HourlyArrivals, Job, TimelineSettings
from exporter.placement.engine import Placement
from exporter.snapshot import Gpu, Node

SERIES = HourlyArrivals(np.array([3600.0 * 20, 3600.0 * 60, 3600.0 * 10, 3600.0 * 40] * 30),
                        np.array([20.0, 30.0, 10.0, 20.0] * 30))
LONG = 1e7
HORIZON = 2300.0


def fleet_of(*models: str) -> SimFleet:
    listed = tuple(Node(f"n{i}", model, 64.0, "one", "any", 8) for i, model in enumerate(models))
    shapes = (Shape(4, 1.0, 1), Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(16, 1.0, 4), Shape(32, 1.0, 8),
              Shape(8, 1.0, 2))
    return SimFleet("mixed", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                           for n in listed for i in range(8)), shapes)


def sim_of(fleet: SimFleet) -> Sim:
    state = fleet.empty_state()
    workload = target_workload(fleet, state.model_names)
    cluster = Cluster(state, "bestfit", workload, MoveCost(900.0, 120.0))
    return Sim(fleet, cluster, Scheduler(cluster), RunSettings(), workload)


def job(id_: int, gpus: int, work: float, submit: float = 0.0, high: bool = False,
        models: tuple[str, ...] = ()) -> Job:
    return Job(id_, submit, work, 1.0, gpus, 1.0, 1, models, high)


def memory(model: str) -> int:
    spec = default_catalogue().get(model)
    assert spec.memory_bytes is not None
    return spec.memory_bytes


def test_the_destinations_are_the_advisors_models_of_as_much_memory_within_the_allowed_ones():
    sim = sim_of(fleet_of("H200", "H100", "A100-80GB", "B200"))
    cluster = sim.cluster
    on = {}
    for model in ("H200", "H100"):
        j = job(len(on), 1, LONG, models=(model,))
        cluster.start(j, cluster.find(j), 0.0)
        on[model] = j
    free = job(9, 1, LONG)
    cluster.start(free, cluster.find(free, models=("H200",)), 0.0)
    assert set(destinations(cluster, free)) == {"H200", "B200"}  # never an 80 GB GPU
    assert destinations(cluster, on["H100"]) == ("H100",)  # pinned: its own list wins
    a100 = job(10, 1, LONG)
    cluster.start(a100, cluster.find(a100, models=("A100-80GB",)), 0.0)
    assert set(destinations(cluster, a100)) == {"A100-80GB", "H100", "H200", "B200"}


def moves_of(monkeypatch: pytest.MonkeyPatch, strategy: str, seed: int) -> list[tuple[str, str, tuple]]:
    """(from model, to model, the job's allowed models) of every move the strategy made in a run."""
    moved: list[tuple[str, str, tuple]] = []
    move = Cluster.move

    def recorded(self: Cluster, j: Job, destination: list[Placement], now: float) -> None:
        names, model = self.placer.model_names, self.placer.model
        moved.append((names[model[j.placements[0].node]], names[model[destination[0].node]], j.models))
        move(self, j, destination, now)

    monkeypatch.setattr(Cluster, "move", recorded)
    fleet = fleet_of("H200", "H100", "H200", "H100", "A100-80GB", "H100", "B200", "A100-80GB")
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1, load=1.1, gang_share=0.0))
    simulate(fleet, SERIES, strategy, seed, settings)
    return moved


def test_fair_consolidate_never_moves_a_job_to_less_memory_nor_off_its_models(monkeypatch):
    fair = [m for seed in (1, 2, 3) for m in moves_of(monkeypatch, "consolidate", seed)]
    unrestricted = [m for seed in (1, 2, 3) for m in moves_of(monkeypatch, "consolidate-unrestricted", seed)]
    assert fair, "consolidate moved nothing: the test would prove nothing"
    for source, destination, models in fair:
        assert memory(destination) >= memory(source), (source, destination)
        assert not models or destination in models
    # the unrestricted variant is today's: it does send jobs to GPUs of less memory
    assert any(memory(d) < memory(s) for s, d, _ in unrestricted)


@pytest.mark.parametrize(("fair", "requeued"), [(True, True), (False, False)])
def test_the_fair_descheduler_requeues_a_job_it_may_not_re_place_on_less_memory(fair, requeued):
    sim = sim_of(fleet_of("H200", "H100"))
    cluster = sim.cluster
    evicted = job(1, 1, LONG)
    cluster.start(evicted, cluster.find(evicted, models=("H200",)), 0.0)  # 1/8 used: under 20%
    Descheduler(fair=fair).tick(sim, 600.0)
    assert cluster.migrations == 1
    assert (evicted.requeued is not None) == requeued
    assert sim.requeued == ([evicted] if requeued else [])
    if not requeued:  # today's: off to the H100, half the memory
        assert cluster.placer.model_names[cluster.placer.model[evicted.placements[0].node]] == "H100"


def requeue_run(first_blocker_work: float):
    """Three H100 nodes: two high-priority 8-GPU jobs and a 1-GPU spot job start at 0, each on a
    node; an 8-GPU high-priority job arrives at 1 and waits. At 600 the descheduler evicts the
    spot job (1 of its node's 8 GPUs used); the waiting job takes its node, and it waits again,
    until the first blocker ends. The run ends at 2,300 s, before the next tick would evict it again."""
    fleet = fleet_of("H100", "H100", "H100")
    jobs = [job(0, 8, first_blocker_work, high=True), job(1, 8, LONG, high=True), job(2, 1, LONG),
            job(3, 8, LONG, submit=1.0, high=True)]
    settings = RunSettings(timeline=TimelineSettings(days=HORIZON / 86400, warmup_days=0.0),
                           descheduler_interval=600.0, cost=MoveCost(900.0, 120.0))
    return simulate(fleet, SERIES, "descheduler", 1, settings, jobs=jobs), jobs


def test_the_requeued_job_is_charged_its_second_wait_and_the_restore_it_performs():
    out, jobs = requeue_run(2000.0)
    spot = jobs[2]
    assert spot.start == 0.0 and spot.migrations == 1
    assert spot.rewaited == pytest.approx(2000.0 - 600.0)  # requeued at 600, restarted at 2,000
    assert spot.waited(HORIZON) == pytest.approx(1400.0)
    # the late job's 599 s on 8 GPUs, the spot job's second wait on 1
    assert out.gpu_hours_waited == pytest.approx((599 * 8 + 1400 * 1) / 3600)
    assert out.gpu_hours_waited_fragmentation + out.gpu_hours_waited_capacity == pytest.approx(
        out.gpu_hours_waited)
    # lost: 600 s of run since no checkpoint, and the 120 s restore at its restart, on 1 GPU
    assert spot.lost_gpu_seconds == pytest.approx(600 + 120)


def test_a_requeued_job_that_never_restarts_is_charged_no_restore():
    out, jobs = requeue_run(LONG)
    spot = jobs[2]
    assert spot.requeued == 600.0 and not spot.placements
    assert spot.lost_gpu_seconds == pytest.approx(600)  # its run since the start; no restore
    assert spot.waited(HORIZON) == pytest.approx(HORIZON - 600)  # waits again until the horizon
    assert out.gpu_hours_waited == pytest.approx((599 * 8 + (HORIZON - 600)) / 3600)


def test_the_unrestricted_baselines_stay_selectable():
    assert {"consolidate", "descheduler", "consolidate-unrestricted", "descheduler-unrestricted"} <= set(
        STRATEGIES)
