"""The horizon-room rule: the horizon rule, with the room the head's reservation holds anyway
not counted against a plan.

A FIFO scheduler with backfill keeps small jobs off the nodes it reserves for a blocked head
(but those that end by the head's start), so the free GPUs there are not the small jobs' to
lose: under ``PlanSettings.rule == "horizon-room"`` the room a plan takes is its jobs' GPUs
less :func:`~exporter.advisor.planner.reservation_held`, and the small jobs' waiting over the
head's run is counted on that room alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from exporter.advisor.advise import Planner, advise
from exporter.advisor.engine import Advisor, DecisionSettings, horizon_gate
from exporter.advisor.planner import (
    PlanSettings,
    QueuePlan,
    _pending,
    plan_for_pending,
    reservation_held,
)
from exporter.snapshot import JobRequest
from tests.helpers.advisor_rules import simulated_planner
from tests.test_planner_horizon import BIG, blocked_whole_node, started
from tests.test_planner_queue import HOUR, NOW, alloc, fleet, report_of
from tests.test_planner_starts import SMALL


def held(snapshot, job: JobRequest) -> float:
    state = report_of(snapshot).state
    p = _pending(state, job, np.zeros(len(state.names), dtype=bool))
    assert p is not None
    return reservation_held(state, p)


def half_free() -> tuple:
    """h1 holds four stray 1-GPU jobs (movable) and 4 free GPUs; h3 a high-priority 4-GPU job
    and 4 free GPUs; h2 and h4 each an 8-GPU job, started 10 h ago. No node has more than 4
    GPUs free: the 8-GPU head's reservation holds 4 of the 8 it takes."""
    strays = tuple(started(alloc(f"stray-{i}", "h1", (i,)), 2400.0) for i in range(4))
    return (*strays,
            started(alloc("keep-3", "h3", (0, 1, 2, 3), priority=1000), 2400.0),
            started(alloc("long-2", "h2", tuple(range(8)), priority=1000), 10 * HOUR),
            started(alloc("long-4", "h4", tuple(range(8)), priority=1000), 10 * HOUR))


def test_the_reservation_holds_the_free_gpus_of_the_nodes_the_head_could_start_on():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    # h1's 7 free GPUs (h3 has 1, h2 and h4 none)
    assert held(snapshot, BIG) == 7.0
    # a 2-node head of 4 GPUs a node: h1's 4 of its 7, and h3's 1
    gang = JobRequest("gang", 8, 1.0, 32.0, 2, (), "gpu-h100", 0, NOW - HOUR)
    assert held(snapshot, gang) == 5.0
    # half a GPU each of 2 GPUs: 2 usable GPUs on h1, as 1 GPU of room
    halves = JobRequest("halves", 2, 0.5, 4.0, 1, (), "gpu-h100", 0, NOW - HOUR)
    assert held(snapshot, halves) == 1.0
    # a head of a model the fleet lacks may start nowhere: it holds nothing
    assert held(snapshot, SMALL[0]) == 0.0
    assert held(fleet(half_free(), (BIG, *SMALL)), BIG) == 4.0


def test_a_plan_that_frees_the_reserved_node_costs_only_the_room_its_moves_take():
    snapshot = fleet(blocked_whole_node(10 * HOUR), (BIG, *SMALL))
    report = report_of(snapshot)
    horizon = plan_for_pending(snapshot, report, BIG, NOW, PlanSettings(rule="horizon"))
    plan = plan_for_pending(snapshot, report, BIG, NOW, PlanSettings(rule="horizon-room"))
    assert isinstance(horizon, QueuePlan) and isinstance(plan, QueuePlan)
    assert plan.lets_start == horizon.lets_start == ("big",)
    assert [m.job for m in plan.migrations] == [m.job for m in horizon.migrations] == ["stray-a"]
    assert horizon.reserved_gpus is None and horizon.small_wait_gpu_hours == 36.0
    assert horizon_gate(horizon) is not None  # 16 ended against 36 caused: refused
    # 8 GPUs taken, 7 of them held by the reservation: 1 GPU of room, one queued small GPU
    # waiting the 6 h
    assert plan.reserved_gpus == 7.0 and plan.horizon_seconds == 6 * HOUR
    assert plan.small_wait_gpu_hours == 6.0
    assert horizon_gate(plan) is None
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner(PlanSettings(rule="horizon-room")))
    assert advice.decision == "compact" and advice.plan is not None
    assert advice.plan.lets_start == ("big",)


def test_a_plan_that_takes_room_off_the_reservation_is_still_refused():
    snapshot = fleet(half_free(), (BIG, *SMALL))
    report = report_of(snapshot)
    plan = plan_for_pending(snapshot, report, BIG, NOW, PlanSettings(rule="horizon-room"))
    horizon = plan_for_pending(snapshot, report, BIG, NOW, PlanSettings(rule="horizon"))
    assert isinstance(plan, QueuePlan) and isinstance(horizon, QueuePlan)
    assert sorted(m.job for m in plan.migrations) == [f"stray-{i}" for i in range(4)]
    assert {m.destination.node for m in plan.migrations} == {"h3"}
    assert plan.gpu_hours_waiting_saved == 16.0
    # 8 taken, 4 held: the 4 queued small GPUs wait the 6 h (24); horizon counts all 8: the
    # 4 queued ones, and 4 more the flow (4 GPUs an hour) brings, half the 6 h (24 + 12)
    assert plan.reserved_gpus == 4.0 and plan.small_wait_gpu_hours == 24.0
    assert horizon.small_wait_gpu_hours == 36.0
    why = horizon_gate(plan)
    assert why is not None and "16 GPU-hours of waiting" in why and "24 GPU-hours" in why
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner(PlanSettings(rule="horizon-room")))
    assert advice.decision != "compact" and advice.plan is None
    # a head that waited 4 h (32 GPU-hours) ends more than the 24: proposed
    patient = dataclasses.replace(BIG, submit_time=NOW - 4 * HOUR)
    long = fleet(half_free(), (patient, *SMALL))
    plan = plan_for_pending(long, report_of(long), patient, NOW, PlanSettings(rule="horizon-room"))
    assert isinstance(plan, QueuePlan) and plan.small_wait_gpu_hours == 24.0
    assert horizon_gate(plan) is None


def test_simulate_and_serve_accept_the_horizon_room_rule():
    from exporter.config import Config, build

    settings = simulated_planner("horizon-room").settings
    assert settings.rule == "horizon-room" and settings.max_migrations == 64
    assert build(Config, {"advisor": {"rule": "horizon-room"}}).advisor.rule == "horizon-room"
