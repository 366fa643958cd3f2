"""The preemption's queue depth counts what the queued high-priority jobs ask for, not the jobs:
jobs of one shape that no preemption helps do not hide the jobs behind them (on the GFS demand
the oldest blocked shape filled the depth and nothing was ever preempted)."""

from __future__ import annotations

from exporter.outcome_sim.preemption import HEADS_PER_PASS, Preempter
from exporter.outcome_sim.timeline import Job
from tests.test_simulate_preemption import LONG, cluster_of, run_on


def test_many_blocked_jobs_of_one_shape_do_not_hide_a_job_that_a_preemption_helps():
    cluster, scheduler = cluster_of([("H100", 8), ("H200", 8)])
    high_h200 = Job(0, 0.0, LONG, 1.0, 8, 1.0, 1, ("H200",), True)
    spot_h100 = Job(1, 0.0, LONG, 1.0, 8, 1.0, 1, ("H100",), False)
    run_on(cluster, scheduler, high_h200, 1, 0.0)
    run_on(cluster, scheduler, spot_h100, 0, 0.0)
    # more blocked H200 jobs than the depth, all older than the H100 one: only a high-priority
    # job holds the H200 node, so nothing can be preempted for them
    for i in range(HEADS_PER_PASS + 20):
        scheduler.submit(Job(10 + i, 100.0 + i, LONG, 1.0, 8, 1.0, 1, ("H200",), True))
    wanted = Job(999, 5000.0, LONG, 1.0, 8, 1.0, 1, ("H100",), True)
    scheduler.submit(wanted)
    preempter = Preempter("kube")
    started, victims = preempter.run(cluster, scheduler, 7200.0)
    assert started == [wanted] and victims == [spot_h100]
    assert spot_h100.paused and wanted.id in cluster.running
