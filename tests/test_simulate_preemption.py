"""High-priority jobs preempting spot jobs in ``gpufleet simulate`` (issue 43, Build 2): the
exemption, the work lost since the last checkpoint, the resume from it, each rule's victims, and
``--preemption none`` placing exactly as before."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from exporter.analysis.workload import Shape
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.outcomes import COLUMNS
from exporter.outcome_sim.preemption import Preempter
from exporter.outcome_sim.run import RunSettings, resumed, simulate, target_workload
from exporter.outcome_sim.scheduler import Scheduler, order_key
from exporter.outcome_sim.timeline import HourlyArrivals, Job, TimelineSettings
from exporter.snapshot import Gpu, Node

SERIES = HourlyArrivals(np.array([3600.0 * 20, 3600.0 * 60, 3600.0 * 10, 3600.0 * 40] * 30),
                        np.array([20.0, 30.0, 10.0, 20.0] * 30))
MINUTE = 60.0
LONG = 1e7


def fleet_of(nodes: list[tuple[str, int]]) -> SimFleet:
    listed = tuple(Node(f"n{i}", model, 64.0, f"pool-{model}", "hopper", gpus)
                   for i, (model, gpus) in enumerate(nodes))
    shapes = (Shape(4, 1.0, 1), Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(16, 1.0, 4), Shape(32, 1.0, 8),
              Shape(1, 0.0, 0))
    return SimFleet("tiny", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                          for n in listed for i in range(n.gpu_count)), shapes)


TINY = [("H100", 8), ("H200", 8), ("H100", 8), ("H200", 8), ("H100", 8), ("H100", 4)] * 2


def cluster_of(nodes: list[tuple[str, int]]) -> tuple[Cluster, Scheduler]:
    fleet = fleet_of(nodes)
    state = fleet.empty_state()
    # checkpoints every 15 minutes (the reference cluster), a 2-minute restore
    cluster = Cluster(state, "bestfit", target_workload(fleet, state.model_names), MoveCost(900.0, 120.0))
    return cluster, Scheduler(cluster)


def job(id_: int, gpus: int, high: bool = False, work: float = LONG, submit: float = 0.0,
        parts: int = 1) -> Job:
    return Job(id_, submit, work, 1.0, gpus, 1.0, parts, ("H100",), high)


def run_on(cluster: Cluster, scheduler: Scheduler, j: Job, node: int, at: float) -> None:
    placement = cluster.placer.place_on(cluster.task(j), node, "bestfit")
    assert placement is not None
    cluster.start(j, [placement], at)


def test_a_job_preempted_after_40_minutes_loses_the_10_since_its_checkpoint_at_30_and_resumes_from_it():
    cluster, scheduler = cluster_of([("H100", 8)])
    spot = job(1, 8, work=4 * 3600.0)
    run_on(cluster, scheduler, spot, 0, 0.0)
    high = job(2, 8, high=True, work=3600.0, submit=40 * MINUTE)
    scheduler.submit(high)
    assert scheduler.run_pass(40 * MINUTE) == []  # it does not fit
    preempter = Preempter("kube")
    started, victims = preempter.run(cluster, scheduler, 40 * MINUTE)
    assert started == [high] and victims == [spot]
    assert spot.done == pytest.approx(30 * MINUTE)  # its checkpoint at 30 minutes is kept
    [(when, lost, _)] = preempter.events
    assert when == 40 * MINUTE
    assert lost == pytest.approx((10 * MINUTE + 120.0) * 8)  # 10 minutes on 8 GPUs, and the restore
    assert spot.lost_gpu_seconds == pytest.approx(10 * MINUTE * 8)
    assert spot.preemptions == 1 and spot.paused and spot.id not in cluster.running
    assert scheduler.queue.jobs() == [spot]
    # the high-priority job ends at 1 h 40; the spot job resumes from its checkpoint then
    for done in cluster.due(100 * MINUTE):
        cluster.stop(done)
    assert resumed(scheduler.run_pass(100 * MINUTE)) == [spot]
    assert not spot.paused
    assert spot.resumed == 100 * MINUTE + 120.0  # after its restore
    assert spot.end() == pytest.approx(100 * MINUTE + 120.0 + 4 * 3600.0 - 30 * MINUTE)
    assert spot.waited(100 * MINUTE) == pytest.approx(60 * MINUTE)  # queued again for an hour


def test_a_job_at_20_minutes_is_never_preempted():
    cluster, scheduler = cluster_of([("H100", 8)])
    spot = job(1, 8)
    run_on(cluster, scheduler, spot, 0, 0.0)
    high = job(2, 8, high=True, submit=20 * MINUTE)
    scheduler.submit(high)
    scheduler.run_pass(20 * MINUTE)
    preempter = Preempter("advisor")
    for rule in ("slurm", "kube", "advisor"):
        preempter = Preempter(rule)
        assert preempter.run(cluster, scheduler, 20 * MINUTE) == ([], [])
        assert preempter.run(cluster, scheduler, 29 * MINUTE) == ([], [])
    assert spot.id in cluster.running and scheduler.queue.jobs() == [high]
    assert preempter.events == []
    # past the exemption (30 minutes since its start) it is
    assert Preempter("kube").run(cluster, scheduler, 31 * MINUTE) == ([high], [spot])


def test_the_exemption_counts_from_the_last_restart():
    cluster, scheduler = cluster_of([("H100", 8)])
    spot = job(1, 8)
    run_on(cluster, scheduler, spot, 0, 0.0)
    cluster.stop(spot)
    run_on(cluster, scheduler, spot, 0, 50 * MINUTE)  # restarted at 50 minutes
    scheduler.submit(job(2, 8, high=True, submit=60 * MINUTE))
    assert Preempter("kube").run(cluster, scheduler, 60 * MINUTE) == ([], [])
    assert Preempter("kube").run(cluster, scheduler, 80 * MINUTE)[1] == [spot]


def test_no_preemption_when_the_head_is_spot_or_nothing_old_enough_would_make_room():
    cluster, scheduler = cluster_of([("H100", 8)])
    old, young = job(1, 4), job(2, 4)
    run_on(cluster, scheduler, old, 0, 0.0)
    run_on(cluster, scheduler, young, 0, 50 * MINUTE)
    scheduler.submit(job(3, 8, submit=60 * MINUTE))  # spot: preempts nothing
    assert Preempter("kube").run(cluster, scheduler, 60 * MINUTE) == ([], [])
    scheduler.submit(job(4, 8, high=True, submit=60 * MINUTE))
    # the old one alone would leave 4 GPUs: not enough, so neither goes
    for rule in ("slurm", "kube", "advisor"):
        assert Preempter(rule).run(cluster, scheduler, 60 * MINUTE) == ([], [])
    assert set(cluster.running) == {1, 2}


def test_a_gang_is_preempted_whole_and_loses_the_work_of_all_its_gpus():
    now = 3 * 3600.0 + 5 * MINUTE
    for rule in ("slurm", "kube", "advisor"):
        cluster, scheduler = cluster_of([("H100", 8), ("H100", 8)])
        gang = job(1, 8, parts=2)
        parts = cluster.find(gang)
        assert parts is not None
        cluster.start(gang, parts, 0.0)
        high = job(2, 8, high=True, submit=now)
        scheduler.submit(high)
        preempter = Preempter(rule)
        assert preempter.run(cluster, scheduler, now) == ([high], [gang])
        assert preempter.events[0][1] == pytest.approx((5 * MINUTE + 120.0) * 16)
        assert gang.id not in cluster.running and len(cluster.running) == 1
        assert cluster.busy == 8  # the gang's other node is free too


def test_a_high_priority_gang_preempts_nothing():
    cluster, scheduler = cluster_of([("H100", 8), ("H100", 8)])
    run_on(cluster, scheduler, job(1, 8), 0, 0.0)
    run_on(cluster, scheduler, job(2, 8), 1, 0.0)
    scheduler.submit(job(3, 8, high=True, parts=2, submit=3600.0))
    for rule in ("slurm", "kube", "advisor"):
        assert Preempter(rule).run(cluster, scheduler, 3600.0) == ([], [])


def three_nodes() -> tuple[Cluster, Scheduler, dict[str, Job]]:
    """Node 0: two 4-GPU spot jobs submitted first, one started at 0 (its checkpoint just taken at
    2 h), one at 10 min; node 1: one 8-GPU spot job submitted later, started at 5 min (14 min since
    its last checkpoint at 1 h 50)."""
    cluster, scheduler = cluster_of([("H100", 8), ("H100", 8)])
    jobs = {"a": job(1, 4, submit=0.0), "b": job(2, 4, submit=1.0), "c": job(3, 8, submit=2.0)}
    run_on(cluster, scheduler, jobs["a"], 0, 0.0)
    run_on(cluster, scheduler, jobs["b"], 0, 10 * MINUTE)
    run_on(cluster, scheduler, jobs["c"], 1, 5 * MINUTE)
    scheduler.submit(job(4, 8, high=True, submit=2 * 3600.0))
    return cluster, scheduler, jobs


def test_each_rule_picks_its_own_victims():
    now = 2 * 3600.0 + 9 * MINUTE
    # a: 9 min since its checkpoint (x4 GPUs = 36), b: 14 min since 1 h 55 (x4 = 56),
    # c: 4 min since 2 h 05 (x8 = 32)
    cluster, scheduler, jobs = three_nodes()
    # Kubernetes: the node with the fewest victims, node 1's one job
    assert Preempter("kube").run(cluster, scheduler, now)[1] == [jobs["c"]]
    cluster, scheduler, jobs = three_nodes()
    # Slurm: candidates by priority, equal, so in job order: a, then b; node 0 fits then
    assert Preempter("slurm").run(cluster, scheduler, now)[1] == [jobs["a"], jobs["b"]]
    cluster, scheduler, jobs = three_nodes()
    # the advisor: the fewest GPU-seconds lost, c's 32 x 60 against a's and b's 92 x 60
    assert Preempter("advisor").run(cluster, scheduler, now)[1] == [jobs["c"]]
    cluster, scheduler, jobs = three_nodes()
    later = 2 * 3600.0 + 16 * MINUTE  # a: 1, b: 6 (x4 = 28), c: 11 (x8 = 88)
    assert Preempter("advisor").run(cluster, scheduler, later)[1] == [jobs["a"], jobs["b"]]
    cluster, scheduler, jobs = three_nodes()
    assert Preempter("kube").run(cluster, scheduler, later)[1] == [jobs["c"]]


def test_kube_reprieves_the_earliest_started_and_preempts_the_youngest():
    cluster, scheduler = cluster_of([("H100", 8)])
    old, mid, young = job(1, 4), job(2, 2), job(3, 2)
    run_on(cluster, scheduler, old, 0, 0.0)
    run_on(cluster, scheduler, mid, 0, 5 * MINUTE)
    run_on(cluster, scheduler, young, 0, 10 * MINUTE)
    scheduler.submit(job(4, 4, high=True, submit=3600.0))
    assert Preempter("kube").run(cluster, scheduler, 3600.0)[1] == [mid, young]
    assert old.id in cluster.running


def test_a_paused_job_resumes_ahead_of_new_spot_jobs_and_behind_high_ones():
    paused, new, high = job(1, 8, submit=500.0), job(2, 8, submit=100.0), job(3, 8, True, submit=900.0)
    paused.paused = True
    assert sorted([new, paused, high], key=order_key) == [high, paused, new]


def rows(preemption: str) -> list[dict[str, object]]:
    out = []
    for strategy in ("none", "consolidate"):
        settings = RunSettings(TimelineSettings(days=1.0, warmup_days=0.25, load=1.2), demand="openb",
                               preemption=preemption)
        row = simulate(fleet_of(TINY), SERIES, strategy, 1, settings).row()
        row.pop("wall_seconds")
        out.append(row)
    return out


def test_preemption_none_gives_the_rows_of_before():
    none, consolidate = rows("none")
    # the rows of this seed before preemption existed (the commit before it), exactly; recomputed
    # for the scheduler's heads per partition and its backfill run times at the model's speed
    assert (none["jobs_started"], none["migrations"]) == (544, 0)
    assert none["gpu_hours_waited"] == 5197.816290210684
    assert none["wait_p95_s"] == 21756.30915778659
    assert none["wait_p95_s_high"] == 3077.442898851249
    assert none["gpu_hours_delivered"] == 1897.703990643374
    assert none["mean_fragmentation_index"] == 21.433570178706454
    assert (consolidate["jobs_started"], consolidate["migrations"]) == (552, 21)
    assert consolidate["gpu_hours_waited"] == 4487.538666705889
    assert consolidate["wait_p95_s"] == 24821.52101498817
    assert consolidate["gpu_hours_delivered"] == 1983.359808956543
    assert none["preemption"] == "none" and none["preemptions"] == 0 and none["lost_gpu_hours"] == 0.0


@pytest.mark.parametrize("rule", ["slurm", "kube", "advisor"])
def test_a_run_with_preemption_preempts_and_counts_it(rule):
    none, _ = rows("none")
    row, _ = rows(rule)
    assert row["preemption"] == rule
    assert row["preemptions"] > 0
    assert row["lost_gpu_hours"] > 0
    assert 0 < row["lost_pct"] < 100
    assert row["lost_pct"] == pytest.approx(100 * row["lost_gpu_hours"] / row["gpu_hours_delivered"])
    spot_jobs = row["preemptions"] * 1000 / row["spot_evictions_per_1000"]
    assert 0 < spot_jobs < row["jobs"]
    # high-priority jobs wait less when they may preempt, spot jobs more
    assert row["wait_p95_s_high"] < none["wait_p95_s_high"]
    assert row["wait_p95_s_spot"] > 0 and row["wait_p95_s_spot"] >= row["wait_p50_s_spot"] >= 0
    assert row["wait_p50_s_high"] <= row["wait_p95_s_high"]


def test_the_cli_writes_the_preemption_columns_and_refuses_a_bad_exemption(tmp_path, capsys):
    from exporter.cli import main

    assert main(["simulate", "--out", str(tmp_path / "bad"), "--preempt-exempt", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--preempt-exempt" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as refused:  # argparse's choices
        main(["simulate", "--out", str(tmp_path / "x"), "--preemption", "sometimes"])
    assert refused.value.code == 2
    code = main(["simulate", "--out", str(tmp_path / "o"), "--days", "0.5", "--warmup-days", "0.1",
                 "--strategies", "none", "--preemption", "kube", "--preempt-exempt", "600"])
    assert code == 0
    with open(tmp_path / "o" / "outcomes.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == COLUMNS
        [row] = list(reader)
    assert row["preemption"] == "kube"
    assert int(row["preemptions"]) >= 0
