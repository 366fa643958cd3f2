"""The work-conserving spot quota (``--spot-quota borrow``): a spot job beyond its pool's quota
is admitted while no single-node high-priority job is queued for the pool, and such a job is
the preempter's first victim."""

from __future__ import annotations

import pytest

from exporter.outcome_sim.preemption import Preempter, SpotGate
from exporter.outcome_sim.run import RunSettings, simulate
from exporter.outcome_sim.timeline import TimelineSettings
from tests.test_simulate_preemption import MINUTE, SERIES, TINY, cluster_of, fleet_of, job, run_on

HOUR = 3600.0


def quota_of_8(gate: SpotGate):  # type: ignore[no-untyped-def]
    """Two 8-GPU H100 nodes, one held by a high-priority job for the first hour: quota 16 - 8."""
    cluster, scheduler = cluster_of([("H100", 8), ("H100", 8)])
    scheduler.submit(job(1, 8, True, submit=0.0))
    scheduler.run_pass(0.0)
    for t in range(0, 3600, 300):
        gate.release(cluster, scheduler, float(t))
    gate.release(cluster, scheduler, HOUR)
    assert gate.quota_of(0) == pytest.approx(8.0)
    return cluster, scheduler


def test_beyond_the_quota_a_spot_job_is_lent_gpus_while_no_high_priority_job_waits():
    for borrow in (False, True):
        gate = SpotGate(borrow=borrow)
        cluster, scheduler = quota_of_8(gate)
        spot = [job(10 + i, 4, submit=HOUR) for i in range(3)]
        assert all(gate.hold(j) for j in spot)
        admitted = gate.release(cluster, scheduler, HOUR + 1)
        if borrow:  # 4 + 4 under the quota, the third lent: no high-priority job is queued
            assert admitted == spot and gate.held == [] and gate.lent == {12}
        else:
            assert admitted == spot[:2] and gate.held == [spot[2]] and gate.lent == set()


def test_a_queued_high_priority_job_stops_the_lending():
    gate = SpotGate(borrow=True)
    cluster, scheduler = quota_of_8(gate)
    spot = [job(10 + i, 4, submit=HOUR) for i in range(2)]
    assert all(gate.hold(j) for j in spot)
    assert gate.release(cluster, scheduler, HOUR + 1) == spot  # 8 GPUs: the quota's
    scheduler.run_pass(HOUR + 1)  # the fleet is full now
    scheduler.submit(job(20, 4, True, submit=HOUR + 2))  # a single-node high-priority job waits
    third = job(12, 4, submit=HOUR + 2)
    assert gate.hold(third)
    assert gate.release(cluster, scheduler, HOUR + 100) == [] and gate.held == [third]
    # a queued high-priority gang does not stop it: it preempts nothing
    gate = SpotGate(borrow=True)
    cluster, scheduler = quota_of_8(gate)
    scheduler.submit(job(21, 8, True, submit=HOUR, parts=2))
    scheduler.run_pass(HOUR)
    spot = [job(30 + i, 4, submit=HOUR) for i in range(3)]
    assert all(gate.hold(j) for j in spot)
    assert gate.release(cluster, scheduler, HOUR + 1) == spot and gate.lent == {32}


@pytest.mark.parametrize("rule", ["kube", "advisor"])
def test_a_lent_job_is_preempted_before_one_the_quota_admitted(rule):
    def fleet():  # type: ignore[no-untyped-def]
        # node 0: job 1 (8 GPUs, started at 0, checkpointed at 2 h: it would lose nothing);
        # node 1: job 2 (8 GPUs, started at 5 min, 14 min since its checkpoint)
        cluster, scheduler = cluster_of([("H100", 8), ("H100", 8)])
        a, b = job(1, 8, submit=0.0), job(2, 8, submit=1.0)
        run_on(cluster, scheduler, a, 0, 0.0)
        run_on(cluster, scheduler, b, 1, 5 * MINUTE)
        scheduler.submit(job(4, 8, high=True, submit=2 * HOUR))
        return cluster, scheduler, a, b

    now = 2 * HOUR + 9 * MINUTE
    cluster, scheduler, a, b = fleet()
    # nothing lent: both take b (kube: the latest start; the advisor: 4 min x 8 lost against 9 x 8);
    # with a lent, a goes first under either rule
    assert [j.id for j in Preempter(rule).run(cluster, scheduler, now)[1]] == [b.id]
    cluster, scheduler, a, b = fleet()
    assert [j.id for j in Preempter(rule, borrowed={a.id}).run(cluster, scheduler, now)[1]] == [a.id]
    assert b.id in cluster.running


def test_a_run_with_the_borrowing_quota_admits_more_than_the_plain_quota():
    def row(quota: str) -> dict[str, object]:
        settings = RunSettings(TimelineSettings(days=1.0, warmup_days=0.25, load=1.2), demand="openb",
                               preemption="advisor", spot_quota=quota)
        return simulate(fleet_of(TINY), SERIES, "none", 1, settings).row()

    quota, borrow, fit = row("advisor"), row("borrow"), row("borrow-fit")
    assert borrow["spot_quota"] == "borrow" and quota["spot_quota"] == "advisor"
    assert fit["spot_quota"] == "borrow-fit" and fit["jobs_started"] > quota["jobs_started"]
    # the same quotas (the same forecast), but spot jobs wait less at the gate
    assert borrow["wait_p50_s_spot"] < quota["wait_p50_s_spot"]
    assert borrow["jobs_started"] > quota["jobs_started"]
    with pytest.raises(ValueError, match="unknown spot quota"):
        simulate(fleet_of(TINY), SERIES, "none", 1, RunSettings(spot_quota="sometimes"))


def test_a_job_that_ends_within_the_exemption_is_lent_gpus_even_while_high_priority_jobs_wait():
    gate = SpotGate(borrow=True, short=1800.0)
    cluster, scheduler = quota_of_8(gate)
    spot = [job(10 + i, 4, submit=HOUR) for i in range(2)]
    assert all(gate.hold(j) for j in spot)
    assert gate.release(cluster, scheduler, HOUR + 1) == spot  # the quota's 8 GPUs
    scheduler.run_pass(HOUR + 1)
    scheduler.submit(job(20, 4, True, submit=HOUR + 2))  # a single-node high-priority job waits
    # on the H100 (speed 1.0): 1,800 s of work runs 1,800 s, within the exemption; 1,801 does not
    short, long_ = job(12, 4, submit=HOUR + 2, work=1800.0), job(13, 4, submit=HOUR + 2, work=1801.0)
    assert gate.hold(short) and gate.hold(long_)
    assert gate.release(cluster, scheduler, HOUR + 100) == [short] and gate.held == [long_]
    assert gate.lent == {12} and gate.name == "borrow-short"
    assert SpotGate(borrow=True).name == "borrow" and SpotGate().name == "advisor"


def test_the_command_line_offers_every_spot_quota_the_simulator_has():
    import argparse

    from exporter.cli.simulate import add_arguments
    from exporter.outcome_sim.preemption import SPOT_QUOTAS

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    action = next(a for a in parser._actions if a.dest == "spot_quota")
    assert tuple(action.choices or ()) == SPOT_QUOTAS
    assert parser.parse_args(["--out", "o", "--spot-quota", "borrow-short"]).spot_quota == "borrow-short"


def pool_with_a_queued_high_priority_job(gpus: int, gate: SpotGate):  # type: ignore[no-untyped-def]
    """Node 0 held by a high-priority job (quota 16 - 8 = 8); node 1 runs a 4-GPU high-priority
    job and a 4-GPU spot job; a high-priority job of ``gpus`` GPUs is queued, and an 8-GPU spot
    job beyond the quota (room 8 - 4 = 4) waits at the gate."""
    cluster, scheduler = quota_of_8(gate)
    run_on(cluster, scheduler, job(2, 4, True, submit=HOUR), 1, HOUR)
    run_on(cluster, scheduler, job(3, 4, submit=HOUR), 1, HOUR)
    scheduler.submit(job(20, gpus, True, submit=HOUR + 2))
    big = job(30, 8, submit=HOUR + 2)
    assert gate.hold(big)
    return cluster, scheduler, big


def test_a_pool_lends_when_its_queued_high_priority_job_could_not_start_even_by_preempting():
    # 8 GPUs fit no node even with the spot job gone (node 0: 8 high-priority GPUs; node 1: 4)
    gate = SpotGate(borrow=True, short=1800.0, fit=True)
    cluster, scheduler, big = pool_with_a_queued_high_priority_job(8, gate)
    assert gate.release(cluster, scheduler, HOUR + 100) == [big]
    assert gate.held == [] and gate.lent == {30} and gate.name == "borrow-fit"
    # the queue-only test refuses the same loan: a single-node high-priority job is queued
    gate = SpotGate(borrow=True, short=1800.0)
    cluster, scheduler, big = pool_with_a_queued_high_priority_job(8, gate)
    assert gate.release(cluster, scheduler, HOUR + 100) == [] and gate.held == [big]


def test_a_pool_does_not_lend_when_its_queued_high_priority_job_could_start_by_preempting():
    # 4 GPUs fit node 1 once its 4-GPU spot job is preempted (it has none free)
    gate = SpotGate(borrow=True, short=1800.0, fit=True)
    cluster, scheduler, big = pool_with_a_queued_high_priority_job(4, gate)
    assert gate.release(cluster, scheduler, HOUR + 100) == []
    assert gate.held == [big] and gate.lent == set()
    # and the preempter does start it so, taking the spot job (job 3, past its exemption)
    started, victims = Preempter("kube").run(cluster, scheduler, HOUR + 31 * MINUTE)
    assert [j.id for j in started] == [20] and [j.id for j in victims] == [3]
