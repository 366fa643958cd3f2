"""The simulated scheduler honours each job's preferred nodes, the admission webhook's (issue 42,
Build 2, the per-pod form): named at submission from the fleet as serve's last cycle saw it;
among the nodes where the job fits, the named ones first, then the scheduler's own policy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exporter.advisor import steer
from exporter.outcome_sim.run import RunSettings, make_strategy, simulate
from exporter.outcome_sim.steering import SteerPod
from exporter.outcome_sim.timeline import Job, TimelineSettings
from tests.test_simulate_steer import MIXED, SERIES, fleet_of, job, sim_of


def on(sim, j, node: int, now: float = 0.0):
    cluster = sim.cluster
    cluster.start(j, [cluster.placer.place_on(cluster.task(j), node, "bestfit")], now)
    return j


def submitted(j, at: float):
    j.submit = at
    return j


def test_a_job_goes_to_its_preferred_node_where_it_fits_and_passes_over_one_where_it_does_not():
    sim = sim_of(fleet_of(MIXED))
    cluster, scheduler = sim.cluster, sim.scheduler
    on(sim, job(0, 1), 3)  # n3: 7 of 8 free
    one = job(1, 1)
    assert cluster.find(one)[0].node_name == "n5"  # bestfit: the empty 4-GPU node, the fuller
    prefer = np.ones(len(cluster.placer.names), dtype=np.int8)
    scheduler.steer = lambda j: prefer
    prefer[[9]] = 0  # n9: an empty 8-GPU H200 node, which bestfit would not take
    scheduler.submit(one)
    assert [j.placements[0].node_name for j in scheduler.run_pass(0.0)] == ["n9"]
    # a preferred node where the job does not fit is passed over: the other preferred one
    on(sim, job(2, 8), 1)  # n1 full
    prefer[:] = 1
    prefer[[1, 10]] = 0
    two = job(3, 1)
    scheduler.submit(two)
    assert [j.placements[0].node_name for j in scheduler.run_pass(1.0)] == ["n10"]
    # it fits none of them: the scheduler's own policy over every node
    prefer[:] = 1
    prefer[[1]] = 0
    three = job(4, 1)
    scheduler.submit(three)
    assert [j.placements[0].node_name for j in scheduler.run_pass(2.0)] == ["n5"]
    # the rank held for that job's placement only
    assert cluster.placer.preference is None


def test_steer_pod_names_the_webhooks_nodes_from_the_last_cycle_and_a_stale_full_one_is_passed_over():
    sim = sim_of(fleet_of(MIXED))
    cluster, scheduler = sim.cluster, sim.scheduler
    strategy = make_strategy("steer-pod", RunSettings())
    # serve's cycle: collect_interval's default
    assert isinstance(strategy, SteerPod) and strategy.interval == strategy.cycle == 5.0
    strategy.limit = 1
    on(sim, job(0, 1), 3)  # n3: 7 of 8 free
    early = submitted(job(1, 1), 10.0)
    assert strategy.rank(early) is None  # no cycle yet: the webhook admits a pod unchanged
    strategy.tick(sim, 60.0)
    at_cycle = cluster.placer.state
    # FGD's choice for a 1-GPU ask is the node already broken; bestfit's the empty 4-GPU one
    assert steer.preferred_nodes(at_cycle, sim.workload, 1.0, 1, 1.0, (), 1) == ["n3"]
    assert cluster.find(job(9, 1))[0].node_name == "n5"
    a = submitted(job(2, 1), 70.0)
    scheduler.submit(a)
    assert [j.placements[0].node_name for j in scheduler.run_pass(70.0)] == ["n3"]
    # n3 fills after the cycle: a job submitted now is still named n3, from the cycle's state,
    # finds it full, and goes where bestfit puts it
    on(sim, job(3, 6), 3, 75.0)
    b = submitted(job(4, 1), 80.0)
    rank = strategy.rank(b)
    assert rank is not None and np.flatnonzero(rank == 0).tolist() == [3]
    scheduler.submit(b)
    assert [j.placements[0].node_name for j in scheduler.run_pass(80.0)] == ["n5"]
    assert strategy.named == 2 and cluster.migrations == 0


def test_a_waiting_job_keeps_the_nodes_named_at_its_submission_and_the_fresh_form_names_them_again():
    for fresh in (False, True):
        sim = sim_of(fleet_of(MIXED))
        cluster, scheduler = sim.cluster, sim.scheduler
        strategy = SteerPod(limit=2, fresh=fresh)
        strategy.tick(sim, 60.0)  # the empty fleet
        eights = [i for i, g in enumerate(cluster.placer.gpu_count) if g == 8]
        small = [on(sim, job(100 + i, 1), i, 61.0) for i in eights]  # every 8-GPU node broken
        big = submitted(job(1, 8), 70.0)
        scheduler.submit(big)
        assert scheduler.run_pass(70.0) == []  # it waits
        strategy.tick(sim, 120.0)
        rank = strategy.rank(big)
        if not fresh:
            # named from the state it was submitted under (the empty fleet): n0 and n1, though
            # both are broken now
            assert rank is not None and np.flatnonzero(rank < 2).tolist() == [0, 1] and rank[0] == 0
        else:
            assert rank is None  # as the fleet is now, an 8-GPU ask fits nowhere: no preference
        cluster.stop(small[eights.index(4)])  # n4 empties
        assert [j.placements[0].node_name for j in scheduler.run_pass(130.0)] == ["n4"]
        strategy.tick(sim, 180.0)
        if not fresh:  # started: forgotten (put back in the queue, it would be a new pod)
            assert big.id not in strategy._named


def test_steer_pod_runs_and_its_rows_add_up():
    fleet = fleet_of(MIXED)
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.1, load=1.2, gang_share=0.3))
    none = simulate(fleet, SERIES, "none", 7, settings)
    outs = [simulate(fleet, SERIES, s, 7, settings) for s in ("steer-pod", "steer-pod-flat",
                                                                "steer-pod-fresh", "steer-pod+advisor")]
    for out in outs:
        assert out.jobs == none.jobs
        assert out.gpu_hours_waited_whole_node == pytest.approx(
            out.gpu_hours_waited_whole_node_fragmentation + out.gpu_hours_waited_whole_node_capacity)
    assert outs[0].migrations == 0 and outs[0].plans == 0
    # the preferences changed where jobs went: the run is not none's
    assert (outs[0].gpu_hours_waited, outs[0].mean_fragmentation_index) != (
        none.gpu_hours_waited, none.mean_fragmentation_index)


def test_the_first_node_named_is_where_the_fgd_policy_places_the_same_ask():
    """fgd_order's first is fgd's own pick (near-ties, the fuller first), on fleets filled at
    random, for asks of several sizes and cores."""
    from exporter.placement.engine import Placer
    from exporter.placement.task import Task

    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(30):
        sim = sim_of(fleet_of(MIXED))
        placer = sim.cluster.placer
        for i in range(int(rng.integers(3, 30))):
            gpus = int(rng.choice([1, 1, 2, 3, 4, 6]))
            j = Job(i, 0.0, 1e7, float(rng.choice([1, 8, 32, 48])), gpus,
                    float(rng.choice([0.5, 1.0])) if gpus == 1 else 1.0, 1, (), False)
            found = sim.cluster.find(j, policy="random")
            if found is not None:
                sim.cluster.start(j, found, 0.0)
        state = placer.state
        for gpus, cpus in ((1, 1.0), (2, 1.0), (4, 1.0), (8, 1.0), (1, 16.0), (2, 32.0)):
            fgd = Placer(state, sim.workload).place(Task(cpus, gpus, 1.0), "fgd")
            order = steer.fgd_order(state, sim.workload, cpus, gpus)
            if fgd is None:
                assert len(order) == 0
                continue
            assert int(order[0]) == fgd.node
            checked += 1
    assert checked > 100


def test_with_the_advisor_the_advisor_is_looked_at_on_its_own_cadence_not_each_cycle():
    sim = sim_of(fleet_of(MIXED))
    strategy = make_strategy("steer-pod+advisor", RunSettings())
    assert isinstance(strategy, SteerPod) and strategy.advisor is not None
    looked: list[float] = []
    strategy.advisor.tick = lambda sim_, now: looked.append(now)  # type: ignore[method-assign]
    for now in np.arange(5.0, 181.0, strategy.interval):
        strategy.tick(sim, float(now))
    assert strategy.interval == 5.0 and strategy.cycles == 36
    assert looked == [5.0, 65.0, 125.0]


def test_the_freedoms_form_grants_the_planner_what_the_defaults_withhold_and_nothing_else():
    from exporter.outcome_sim.advisor_loop import FREEDOMS

    plain = make_strategy("steer-pod+advisor", RunSettings(advisor_rule="head"))
    freed = make_strategy("steer-pod+advisor-freedoms", RunSettings(advisor_rule="head"))
    assert isinstance(plain, SteerPod) and isinstance(freed, SteerPod)
    assert plain.advisor is not None and freed.advisor is not None
    plain.advisor._setup()
    freed.advisor._setup()
    before = plain.advisor._stages[1].planner.settings
    after = freed.advisor._stages[1].planner.settings
    granted = ("move_high_priority", "max_migrations", "min_runtime_seconds")
    assert [getattr(before, k) for k in granted] == [False, 10, 1800.0]
    assert [getattr(after, k) for k in granted] == [True, 64, 0.0]
    assert dict(FREEDOMS) == {"move_high_priority": True, "max_migrations": 64, "min_runtime_seconds": 0.0}
    # the rule asked for is the one both plan by; every other setting is the default's
    assert before.rule == after.rule == "head"
    assert dataclasses.replace(after, **{k: getattr(before, k) for k, _ in FREEDOMS}) == before
