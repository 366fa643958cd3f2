"""The horizon rule: the queue rule, and no plan that costs the small jobs more waiting, while
the head it starts holds the room, than it ends.

Under ``PlanSettings.rule == "horizon"`` the plan is the queue rule's; its account also holds
the small jobs' waiting the room it takes causes over the head's expected run time
(:func:`~exporter.advisor.planner.small_wait_caused`, :func:`~exporter.advisor.planner.expected_runtime`),
and the engine refuses a plan whose waiting ended, less its displaced jobs', is no more.
"""

from __future__ import annotations

import dataclasses

from exporter.advisor.advise import Planner, advise
from exporter.advisor.engine import Advisor, DecisionSettings, horizon_gate
from exporter.advisor.planner import (
    PlanSettings,
    QueuePlan,
    expected_runtime,
    plan_for_pending,
    small_wait_caused,
)
from exporter.snapshot import JobRequest
from tests.helpers.advisor_rules import simulated_planner
from tests.test_planner_queue import HOUR, NOW, alloc, fleet, job, report_of
from tests.test_planner_starts import SMALL


def started(a, ago: float):
    return dataclasses.replace(a, start_time=NOW - ago)


def blocked_whole_node(whole_node_age: float) -> tuple:
    """h1 holds a stray 1-GPU job (movable) and 7 free GPUs: an 8-GPU job waits. h3 has one
    GPU free beside 7 GPUs of small jobs that stay; h2 and h4 each run an 8-GPU job, started
    ``whole_node_age`` seconds ago. Small jobs started 40 min ago: 1 + 4 + 3 GPUs, 8 an hour."""
    return (
        started(alloc("stray-a", "h1", (0,)), 2400.0),
        started(alloc("small-run-1", "h3", (0, 1, 2, 3), priority=1000), 2400.0),
        started(alloc("small-run-2", "h3", (4, 5, 6), priority=1000), 2400.0),
        started(alloc("long-2", "h2", tuple(range(8)), priority=1000), whole_node_age),
        started(alloc("long-4", "h4", tuple(range(8)), priority=1000), whole_node_age),
    )


BIG = job("big", 8, 2 * HOUR)  # 16 GPU-hours waited


def test_the_head_runs_as_long_as_the_running_jobs_of_its_kind_have_capped():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    assert expected_runtime(snapshot, BIG, NOW, 6 * HOUR) == 6 * HOUR  # 10 h, capped
    assert expected_runtime(snapshot, BIG, NOW, 12 * HOUR) == 10 * HOUR
    short = fleet(blocked_whole_node(HOUR / 2), (BIG, *SMALL))
    assert expected_runtime(short, BIG, NOW, 6 * HOUR) == HOUR / 2
    # a small job's kind: the small jobs running, 40 min
    assert expected_runtime(short, SMALL[0], NOW, 6 * HOUR) == 2400.0
    # none of its kind runs: the cap
    assert expected_runtime(fleet((), (BIG,)), BIG, NOW, 6 * HOUR) == 6 * HOUR


def test_the_small_jobs_wait_for_the_room_the_head_holds():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    # 4 GPUs of small jobs queued wait the 6 h; 4 more GPUs of room the flow (8 an hour)
    # fills, half of the 6 h on average: 24 + 12
    assert small_wait_caused(snapshot, 8.0, ("big",), NOW, 6 * HOUR) == 36.0
    # half an hour: the flow brings 4 GPUs, just the room left: 2 + 1
    assert small_wait_caused(snapshot, 8.0, ("big",), NOW, HOUR / 2) == 3.0
    # a quarter of an hour: the flow brings 2: 1 + 0.25
    assert small_wait_caused(snapshot, 8.0, ("big",), NOW, HOUR / 4) == 1.25
    # room for 2 GPUs: two of the queued ones, the whole 6 h
    assert small_wait_caused(snapshot, 2.0, ("big",), NOW, 6 * HOUR) == 12.0
    # queued jobs that start anyway wait for nothing
    assert small_wait_caused(snapshot, 8.0, ("small-0", "small-1"), NOW, 6 * HOUR) == 2 * 6 + 6 * 3
    # no room taken, no horizon, or no small job queued nor started lately: nothing
    assert small_wait_caused(snapshot, 0.0, (), NOW, 6 * HOUR) == 0.0
    assert small_wait_caused(snapshot, 8.0, (), NOW, 0.0) == 0.0
    old = fleet(blocked_whole_node(10 * HOUR)[3:], (BIG,))
    assert small_wait_caused(old, 8.0, (), NOW, 6 * HOUR) == 0.0


def test_a_long_head_in_room_many_small_jobs_would_use_is_refused():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    report = report_of(snapshot)
    queue = plan_for_pending(snapshot, report, BIG, NOW)
    plan = plan_for_pending(snapshot, report, BIG, NOW, PlanSettings(rule="horizon"))
    assert isinstance(queue, QueuePlan) and isinstance(plan, QueuePlan)
    assert queue.small_wait_gpu_hours is None and horizon_gate(queue) is None
    assert plan.lets_start == queue.lets_start == ("big",)
    assert [m.job for m in plan.migrations] == [m.job for m in queue.migrations] == ["stray-a"]
    assert plan.gpu_hours_waiting_saved == 16.0
    assert plan.horizon_seconds == 6 * HOUR and plan.small_wait_gpu_hours == 36.0
    why = horizon_gate(plan)
    assert why is not None and "16 GPU-hours of waiting" in why and "36 GPU-hours" in why
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner(PlanSettings(rule="horizon")))
    assert advice.decision != "compact" and advice.plan is None
    assert any("would cost the small jobs 36 GPU-hours of waiting" in r for r in advice.reasons)
    # the queue rule, which counts no small job, proposes it
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner())
    assert advice.decision == "compact" and advice.plan is not None


def test_a_short_head_or_one_that_waited_long_is_proposed():
    short = fleet(blocked_whole_node(HOUR / 2), (BIG, *SMALL))
    report = report_of(short)
    plan = plan_for_pending(short, report, BIG, NOW, PlanSettings(rule="horizon"))
    assert isinstance(plan, QueuePlan)
    assert plan.horizon_seconds == HOUR / 2 and plan.small_wait_gpu_hours == 3.0
    assert horizon_gate(plan) is None
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, short, report, Planner(PlanSettings(rule="horizon")))
    assert advice.decision == "compact" and advice.plan is not None
    assert advice.plan.lets_start == ("big",)
    # a long head that has waited 5 h (40 GPU-hours) ends more than the 36 it costs
    patient = JobRequest("big", 8, 1.0, 32.0, 1, (), "gpu-h100", 0, NOW - 5 * HOUR)
    long = fleet(blocked_whole_node(10 * HOUR), (patient, *SMALL))
    plan = plan_for_pending(long, report_of(long), patient, NOW, PlanSettings(rule="horizon"))
    assert isinstance(plan, QueuePlan) and plan.small_wait_gpu_hours == 36.0
    assert horizon_gate(plan) is None
    # the displaced jobs' waiting counts against it, and a tie is refused
    assert horizon_gate(dataclasses.replace(plan, displaced_gpu_hours=4.0)) is not None
    assert horizon_gate(dataclasses.replace(plan, small_wait_gpu_hours=40.0)) is not None


def test_simulate_and_serve_accept_the_horizon_rule():
    from exporter.config import Config, build
    from exporter.errors import ConfigError

    settings = simulated_planner("horizon").settings
    assert settings.rule == "horizon" and settings.horizon_cap_seconds == 6 * HOUR
    assert settings.max_migrations == 64  # the freedoms still apply
    for rule in ("queue", "head", "starts", "horizon"):
        assert build(Config, {"advisor": {"rule": rule}}).advisor.rule == rule
    try:
        build(Config, {"advisor": {"rule": "forever"}})
    except ConfigError as err:
        assert "horizon" in str(err)
    else:
        raise AssertionError("an unknown rule was accepted")
