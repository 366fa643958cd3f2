"""The horizon-surge rule: horizon-room, and no whole-node job started into room the small
jobs' forecast daily rise needs.

The small jobs' demand (GPUs held plus GPUs queued) is kept hourly
(:class:`~exporter.advisor.surge.SmallDemand`); a plan that starts a whole-node job gets the
forecast rise over its head's horizon that the free GPUs it leaves cannot hold
(``QueuePlan.surge_gpus``), and :func:`~exporter.advisor.engine.surge_gate` refuses it when
that is above 0.
"""

from __future__ import annotations

import pytest

from exporter.advisor.advise import Planner, advise
from exporter.advisor.engine import Advisor, DecisionSettings, horizon_gate, queue_gate, surge_gate
from exporter.advisor.planner import PlanSettings, QueuePlan, plan_for_pending
from exporter.advisor.surge import SmallDemand, free_gpus, shortfall, small_demand
from exporter.snapshot import JobRequest
from tests.helpers.advisor_rules import simulated_planner
from tests.test_planner_horizon import BIG, blocked_whole_node
from tests.test_planner_queue import BLOCKED_TWICE, FIRST, HOUR, NOW, SECOND, fleet, report_of
from tests.test_planner_starts import SMALL

SURGE = PlanSettings(rule="horizon-surge")


def history(values: list[float]) -> SmallDemand:
    """A demand history whose complete hours are ``values``, oldest first, up to the hour
    before NOW's (one sample an hour; the last, at NOW, opens NOW's hour)."""
    demand = SmallDemand()
    start = NOW - len(values) * HOUR
    for i, value in enumerate([*values, values[-1]]):
        demand.history.add(start + i * HOUR, value)
    return demand


def surging() -> SmallDemand:
    """25 complete hours; a day ago the demand rose from 12 to 40 two hours after this hour
    of the day, and it is 12 again now: the forecast peak over the next 6 h is 12 + 28."""
    return history([12.0, 12.0, 40.0, 40.0, *[12.0] * 21])


def flat() -> SmallDemand:
    return history([12.0] * 25)


def test_the_small_jobs_demand_is_what_they_hold_and_what_their_queued_jobs_ask():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    # held: stray-a 1, small-run-1 4, small-run-2 3 (the 8-GPU jobs are not small); queued:
    # the four 1-GPU jobs (BIG is not small)
    assert small_demand(snapshot) == 8.0 + 4.0
    assert small_demand(fleet((), ())) == 0.0


def test_the_rise_is_read_from_the_daily_profile_once_a_day_and_an_hour_are_known():
    assert surging().rise(6 * HOUR) == pytest.approx(28.0)
    # one hour ahead: a day ago the next hour stayed at 12
    assert surging().rise(HOUR) == pytest.approx(0.0)
    # two hours ahead: the rise to 40 comes in the second
    assert surging().rise(2 * HOUR) == pytest.approx(28.0)
    assert flat().rise(6 * HOUR) == pytest.approx(0.0)
    # 24 complete hours: no day before the last hour to read a profile from
    assert history([12.0] * 24).rise(6 * HOUR) is None
    assert SmallDemand().rise(6 * HOUR) is None


def test_the_shortfall_is_the_rise_the_free_gpus_left_cannot_hold():
    assert shortfall(28.0, 8.0, 8.0) == 28.0
    assert shortfall(28.0, 40.0, 8.0) == 0.0
    assert shortfall(28.0, 30.0, 8.0) == 6.0
    assert shortfall(0.0, 0.0, 8.0) == 0.0
    assert shortfall(None, 8.0, 8.0) is None
    import numpy as np
    # a half-free GPU counts a half; padding (0) nothing
    assert free_gpus(np.array([[1.0, 0.5, 0.0], [0.0, 0.0, 0.0]])) == 1.5


def test_a_whole_node_job_started_into_the_last_free_gpus_before_a_surge_is_refused():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    report = report_of(snapshot)
    room = plan_for_pending(snapshot, report, BIG, NOW, PlanSettings(rule="horizon-room"))
    plan = plan_for_pending(snapshot, report, BIG, NOW, SURGE, demand=surging())
    assert isinstance(room, QueuePlan) and isinstance(plan, QueuePlan)
    # the same plan and account as horizon-room: 1 GPU of room off the reservation, 6 GPU-hours
    assert plan.lets_start == room.lets_start == ("big",)
    assert [m.job for m in plan.migrations] == [m.job for m in room.migrations] == ["stray-a"]
    assert plan.small_wait_gpu_hours == room.small_wait_gpu_hours == 6.0
    assert horizon_gate(plan) is None and room.surge_gpus is None and surge_gate(room) is None
    # 8 GPUs free (h1's 7, h3's 1), all 8 taken: none left for the forecast rise of 28
    assert plan.surge_rise_gpus == pytest.approx(28.0) and plan.surge_gpus == pytest.approx(28.0)
    why = queue_gate(plan, DecisionSettings())
    assert why is not None and why == surge_gate(plan)
    assert "rise by 28 GPUs" in why and "28 fewer" in why
    # no rise forecast: proposed
    level = plan_for_pending(snapshot, report, BIG, NOW, SURGE, demand=flat())
    assert isinstance(level, QueuePlan) and level.surge_gpus == 0.0 and surge_gate(level) is None
    assert queue_gate(level, DecisionSettings()) is None
    # no history given, or not a day of it yet: nothing counted, horizon-room's decision
    bare = plan_for_pending(snapshot, report, BIG, NOW, SURGE)
    assert isinstance(bare, QueuePlan) and bare.surge_gpus is None and surge_gate(bare) is None
    young = plan_for_pending(snapshot, report, BIG, NOW, SURGE, demand=history([12.0] * 24))
    assert isinstance(young, QueuePlan) and young.surge_gpus is None


def test_a_plan_that_starts_only_small_jobs_is_never_refused_for_the_surge():
    snapshot = fleet(BLOCKED_TWICE, (FIRST, SECOND))
    plan = plan_for_pending(snapshot, report_of(snapshot), FIRST, NOW, SURGE, demand=surging())
    assert isinstance(plan, QueuePlan) and plan.lets_start == ("first", "second")
    assert plan.surge_gpus is None and plan.surge_rise_gpus is None and surge_gate(plan) is None


def test_the_planner_observes_every_evaluation_under_the_rule_and_the_engine_refuses():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    report = report_of(snapshot)
    planner = Planner(SURGE, demand=surging())
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, planner)
    assert advice.decision != "compact" and advice.plan is None
    assert any("small jobs' demand is forecast to rise by 28 GPUs" in r for r in advice.reasons)
    # the evaluation was recorded in the hour in progress (12 GPUs beside the history's 12)
    assert planner.demand.history._count == 2 and planner.demand.history._sum == 24.0
    assert len(planner.demand.history.hours) == 25
    # horizon-room plans it; its planner keeps no history
    other = Planner(PlanSettings(rule="horizon-room"))
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, other)
    assert advice.decision == "compact" and advice.plan is not None
    assert advice.plan.lets_start == ("big",)
    assert other.demand.history._count == 0 and len(other.demand.history.hours) == 0
    # a planner for a reloaded table keeps the history seen
    assert Planner(SURGE).keeping(planner).demand is planner.demand


def test_simulate_accepts_the_horizon_surge_rule():
    planner = simulated_planner("horizon-surge")
    assert planner.settings.rule == "horizon-surge" and planner.settings.max_migrations == 64
    assert isinstance(planner.demand, SmallDemand)


LULL = PlanSettings(rule="horizon-lull")


def test_the_lull_rule_counts_the_surge_only_while_no_small_job_is_queued():
    # the four small jobs queue: the room is contested now, horizon-room's account decides
    queued = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    plan = plan_for_pending(queued, report_of(queued), BIG, NOW, LULL, demand=surging())
    assert isinstance(plan, QueuePlan) and plan.lets_start == ("big",)
    assert plan.surge_gpus is None and surge_gate(plan) is None
    assert plan.small_wait_gpu_hours == 6.0 and queue_gate(plan, DecisionSettings()) is None
    # none queued (a lull before the rise): refused, as under horizon-surge
    lull = fleet(blocked_whole_node(10 * HOUR), (BIG,))
    report = report_of(lull)
    plan = plan_for_pending(lull, report, BIG, NOW, LULL, demand=surging())
    surge = plan_for_pending(lull, report, BIG, NOW, SURGE, demand=surging())
    assert isinstance(plan, QueuePlan) and isinstance(surge, QueuePlan)
    # 1 GPU of room off the reservation, filled by the flow (8 an hour) half the 6 h
    assert plan.small_wait_gpu_hours == surge.small_wait_gpu_hours == 3.0
    assert plan.surge_gpus == surge.surge_gpus == pytest.approx(28.0)
    assert surge_gate(plan) is not None and queue_gate(plan, DecisionSettings()) == surge_gate(plan)
    # a small job queued that would start now without the plan is no contest for later room:
    # the plan displaces it (the stray's move takes h3's free GPU), and takes 8 - 1 GPUs of the
    # 8 free, leaving 1 for the rise of 28
    one = JobRequest("small-fits", 1, 1.0, 4.0, 1, (), "gpu-h100", 0, NOW - HOUR)
    fits = fleet(blocked_whole_node(10 * HOUR), (BIG, one))
    plan = plan_for_pending(fits, report_of(fits), BIG, NOW, LULL, demand=surging())
    assert isinstance(plan, QueuePlan) and plan.lets_start == ("big",)
    assert plan.displaced == ("small-fits",) and plan.surge_gpus == pytest.approx(27.0)


def test_simulate_accepts_the_horizon_lull_rule_and_its_planner_observes():
    assert simulated_planner("horizon-lull").settings.rule == "horizon-lull"
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    planner = Planner(LULL)
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advise(engine, snapshot, report_of(snapshot), planner)
    assert planner.demand.history._count == 1 and planner.demand.history._sum == 12.0
