"""The starts rule: the queue rule, and no plan that starts fewer jobs than waiting would.

Under ``PlanSettings.rule == "starts"`` the plan is the queue rule's; its account also holds
the small jobs queued that are expected to start, before the next plan, in the room it takes
(:func:`~exporter.advisor.planner.backfill_lost`), and the engine refuses a plan whose jobs
started, less those displaced, are fewer.
"""

from __future__ import annotations

import dataclasses

from exporter.advisor.advise import Planner, advise
from exporter.advisor.engine import Advisor, DecisionSettings, starts_gate
from exporter.advisor.planner import PlanSettings, QueuePlan, backfill_lost, plan_for_pending
from exporter.snapshot import JobRequest
from tests.helpers.advisor_rules import simulated_planner
from tests.test_planner_queue import BLOCKED_TWICE, FIRST, HOUR, NOW, SECOND, alloc, fleet, report_of


def recent(jobs: tuple, ago: float) -> tuple:
    return tuple(dataclasses.replace(a, start_time=NOW - ago) for a in jobs)


# small jobs no node holds now, with or without a plan: they ask a model the fleet lacks
SMALL = tuple(JobRequest(f"small-{i}", 1, 1.0, 4.0, 1, ("A100",), "gpu-h100", 0, NOW - HOUR)
              for i in range(4))
# started 40 min ago (past the planner's min_runtime, so the strays may move):
# 1 + 1 + 4 + 4 + 7 + 6 GPUs of small jobs, 23 GPUs an hour
RECENT = recent(BLOCKED_TWICE, 2400.0)


def test_the_small_jobs_queued_that_the_flow_would_start_are_the_starts_lost():
    snapshot = fleet(RECENT, (FIRST, SECOND, *SMALL))
    started = ("first", "second")
    # 600 s of the flow: 23/6 GPUs, fewer than the 4 queued and the 8 taken; 1 GPU a job
    assert backfill_lost(snapshot, 8.0, started, NOW, 600.0) == round(23 / 6, 3)
    assert backfill_lost(snapshot, 8.0, started, NOW, 60.0) == round(23 / 60, 3)
    # no more than are queued, nor than the plan takes
    assert backfill_lost(snapshot, 8.0, started, NOW, HOUR) == 4.0
    assert backfill_lost(snapshot, 1.5, started, NOW, HOUR) == 1.5
    # those that start now anyway are not lost
    assert backfill_lost(snapshot, 8.0, (*started, "small-0", "small-1"), NOW, HOUR) == 2.0


def test_without_small_jobs_queued_or_started_lately_no_start_is_lost():
    started = ("first", "second")  # 4-GPU jobs: small ones, started by the plan
    assert backfill_lost(fleet(RECENT, (FIRST, SECOND)), 8.0, started, NOW, HOUR) == 0.0
    assert backfill_lost(fleet(RECENT, (FIRST, SECOND)), 8.0, (), NOW, HOUR) == 2.0
    # every job started 2 h ago: no flow
    assert backfill_lost(fleet(BLOCKED_TWICE, (FIRST, SECOND, *SMALL)), 8.0, started, NOW, HOUR) == 0.0
    # a whole node's job is no small job, queued or started
    whole_node = JobRequest("whole", 8, 1.0, 32.0, 1, (), "gpu-h100", 0, NOW - HOUR)
    whole = fleet(recent((alloc("w", "h1", tuple(range(8))),), 60.0), (whole_node, *SMALL))
    assert backfill_lost(whole, 8.0, (), NOW, HOUR) == 0.0
    assert backfill_lost(fleet(RECENT, (whole_node,)), 8.0, (), NOW, HOUR) == 0.0
    assert backfill_lost(fleet(RECENT, (FIRST, SECOND, *SMALL)), 0.0, started, NOW, HOUR) == 0.0


def test_the_starts_rule_plans_as_the_queue_rule_and_counts_the_starts_lost():
    snapshot = fleet(RECENT, (FIRST, SECOND, *SMALL))
    report = report_of(snapshot)
    queue = plan_for_pending(snapshot, report, FIRST, NOW)
    plan = plan_for_pending(snapshot, report, FIRST, NOW, PlanSettings(rule="starts"))
    assert isinstance(queue, QueuePlan) and isinstance(plan, QueuePlan)
    assert queue.starts_lost is None and starts_gate(queue) is None
    assert plan.lets_start == queue.lets_start == ("first", "second")
    assert plan.migrations == queue.migrations
    assert plan.starts_lost == round(23 / 6, 3)


def test_a_plan_that_starts_fewer_jobs_than_the_small_ones_it_crowds_out_is_refused():
    snapshot = fleet(RECENT, (FIRST, SECOND, *SMALL))
    report = report_of(snapshot)
    plan = plan_for_pending(snapshot, report, FIRST, NOW, PlanSettings(rule="starts"))
    assert isinstance(plan, QueuePlan)
    why = starts_gate(plan)
    assert why is not None and "plan starts 2 more jobs than waiting would" in why
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner(PlanSettings(rule="starts")))
    assert advice.decision != "compact" and advice.plan is None
    assert any("small jobs are expected to start in the room it takes" in r for r in advice.reasons)
    # the queue rule, which counts no later starts, proposes it
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner())
    assert advice.decision == "compact" and advice.plan is not None
    # with the next plan a minute away, the flow fills less of the room: proposed
    soon = PlanSettings(rule="starts", starts_horizon_seconds=60.0)
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner(soon))
    assert advice.decision == "compact" and advice.plan is not None
    # a displaced job counts against the starts too
    assert starts_gate(dataclasses.replace(plan, starts_lost=1.5, displaced=("x",))) is not None
    assert starts_gate(dataclasses.replace(plan, starts_lost=1.0, displaced=("x",))) is None


def test_simulate_runs_the_starts_rule_with_the_advisors_interval_as_its_horizon():
    settings = simulated_planner("starts", advisor_interval=600.0).settings
    assert settings.rule == "starts" and settings.starts_horizon_seconds == 600.0
    assert settings.max_migrations == 64  # the freedoms still apply
