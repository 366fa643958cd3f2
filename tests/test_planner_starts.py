"""The starts rule: the queue rule, and no plan that starts fewer jobs than waiting would.

Under ``PlanSettings.rule == "starts"`` the plan is the queue rule's; its account also holds
the small jobs expected to start, before the next plan, in the room it takes
(:func:`~exporter.advisor.planner.backfill_lost`), and the engine refuses a plan whose jobs
started, less those displaced, are fewer.
"""

from __future__ import annotations

import dataclasses

from exporter.advisor.advise import Planner, advise
from exporter.advisor.engine import Advisor, DecisionSettings, starts_gate
from exporter.advisor.planner import PlanSettings, QueuePlan, backfill_lost, plan_for_pending
from tests.test_planner_queue import BLOCKED_TWICE, FIRST, HOUR, NOW, SECOND, alloc, fleet, report_of


def recent(jobs: tuple, ago: float) -> tuple:
    return tuple(dataclasses.replace(a, start_time=NOW - ago) for a in jobs)


def test_no_small_start_lately_costs_no_start():
    snapshot = fleet(BLOCKED_TWICE, (FIRST, SECOND))  # every job started 2 h ago
    assert backfill_lost(snapshot, 9.0, 8.0, NOW, 600.0) == 0.0


def test_the_small_jobs_flow_beyond_the_idle_gpus_left_is_the_starts_lost():
    # started 40 min ago (past the planner's min_runtime, so the strays may move):
    # 1 + 1 + 4 + 4 + 7 + 6 GPUs, six small jobs (mean 23/6 GPUs), an hour's flow
    snapshot = fleet(recent(BLOCKED_TWICE, 2400.0), (FIRST, SECOND))
    # over 600 s: 23/6 GPUs; 9 idle, 8 taken: the 1 left holds 1 of them
    assert backfill_lost(snapshot, 9.0, 8.0, NOW, 600.0) == round((23 / 6 - 1) / (23 / 6), 3)
    # over an hour: 23 GPUs, 22 beyond the idle one, but the plan takes only 8
    assert backfill_lost(snapshot, 9.0, 8.0, NOW, HOUR) == round(8 / (23 / 6), 3)
    # with room to spare the flow costs nothing
    assert backfill_lost(snapshot, 40.0, 8.0, NOW, HOUR) == 0.0
    # a gang or a whole node is no small job
    whole = fleet(recent((alloc("w", "h1", tuple(range(8))),), 60.0), ())
    assert backfill_lost(whole, 0.0, 8.0, NOW, HOUR) == 0.0


def test_the_starts_rule_plans_as_the_queue_rule_and_counts_the_starts_lost():
    snapshot = fleet(recent(BLOCKED_TWICE, 2400.0), (FIRST, SECOND))
    report = report_of(snapshot)
    queue = plan_for_pending(snapshot, report, FIRST, NOW)
    plan = plan_for_pending(snapshot, report, FIRST, NOW, PlanSettings(rule="starts"))
    assert isinstance(queue, QueuePlan) and isinstance(plan, QueuePlan)
    assert queue.starts_lost is None and starts_gate(queue) is None
    assert plan.lets_start == queue.lets_start == ("first", "second")
    assert plan.migrations == queue.migrations
    assert plan.starts_lost == round((23 / 6 - 1) / (23 / 6), 3)
    assert starts_gate(plan) is None  # 2 started against 0.74 lost


def test_a_plan_that_starts_fewer_jobs_than_the_small_ones_it_crowds_out_is_refused():
    snapshot = fleet(recent(BLOCKED_TWICE, 2400.0), (FIRST, SECOND))
    report = report_of(snapshot)
    hourly = PlanSettings(rule="starts", starts_horizon_seconds=HOUR)
    plan = plan_for_pending(snapshot, report, FIRST, NOW, hourly)
    assert isinstance(plan, QueuePlan) and plan.starts_lost == round(8 / (23 / 6), 3)
    why = starts_gate(plan)
    assert why is not None and "plan starts 2 more jobs than waiting would" in why
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner(hourly))
    assert advice.decision != "compact" and advice.plan is None
    assert any("small jobs are expected to start in the room it takes" in r for r in advice.reasons)
    # the queue rule, which counts no later starts, proposes it
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner(PlanSettings(starts_horizon_seconds=HOUR)))
    assert advice.decision == "compact" and advice.plan is not None
    # one displaced job counts against the starts too
    assert starts_gate(dataclasses.replace(plan, starts_lost=1.5, displaced=("x",))) is not None
    assert starts_gate(dataclasses.replace(plan, starts_lost=1.0, displaced=("x",))) is None
