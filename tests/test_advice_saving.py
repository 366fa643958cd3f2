"""The advice's expected and realised saving: each plan's GPU-hours of waiting beside the
oracle's bound, and what the delivered plans' jobs came to in the snapshots that followed.

On the hand-made fleet of tests/test_advisor_pending.py: three H100 nodes with 15 GPUs idle
in fragments (6, 2 and 7), and an 8-GPU job that has waited two hours.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from aiohttp import web
from jsonschema import Draft202012Validator

from exporter.advisor import openapi
from exporter.advisor.advise import Planner, advise, planner_for, what_if
from exporter.advisor.api import AdvisorApi, add_routes
from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.plan import CompactionPlan, Prediction
from exporter.advisor.realised import KEEP, Ledger, oracle_waiting_saved, summary
from exporter.advisor.saving import share
from exporter.advisor.wire import (
    advice_json,
    advisor_state_from_text,
    advisor_state_text,
    plan_from_json,
    plan_json,
)
from exporter.config import AdvisorConfig
from exporter.snapshot import FleetSnapshot, JobRequest
from tests.test_advisor_pending import NOW, SCHEMA, WHOLE, alloc, fragmented, report_of

DOC = openapi.document()


def advisor_at(clock: list[float]) -> Advisor:
    return Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: clock[0])


def later(snapshot: FleetSnapshot, at: float, running: dict[str, float], pending=()) -> FleetSnapshot:
    """``snapshot`` at ``at``: the plan's one move made (small-c from h3 to h1), each job of
    ``running`` on h3's 8 GPUs from its start time, ``pending`` queued."""
    jobs = [a for a in snapshot.allocations if a.job != "small-c"]
    jobs.append(dataclasses.replace(alloc("small-c", "h1", (1,)), start_time=NOW))
    for name, started in running.items():
        jobs.append(dataclasses.replace(alloc(name, "h3", tuple(range(8))), start_time=started))
    return dataclasses.replace(snapshot, taken_at=at, allocations=tuple(jobs), pending=tuple(pending))


def test_the_oracle_bound_packs_the_blocked_jobs_into_the_free_gpus():
    # one 8-GPU job waited 2 h: 15 GPUs idle would hold it, 16 GPU-hours
    one = fragmented((WHOLE,))
    assert oracle_waiting_saved(one, report_of(one), NOW) == 16.0
    # a second of its shape waited 1 h: the 7 GPUs left take 7/8 of its 8 GPU-hours; a
    # 2-GPU job fits as the fleet is (no repack needed: not counted), a B200 job has no node
    second = dataclasses.replace(WHOLE, job="train-2", submit_time=NOW - 3600)
    fits = JobRequest("two", 2, 1.0, 8.0, 1, (), "", 0, NOW - 5 * 3600)
    b200 = JobRequest("b200", 8, 1.0, 8.0, 1, ("B200",), "", 0, NOW - 9 * 3600)
    many = fragmented((fits, b200, second, WHOLE))
    # the longer wait first (2 h x 8 GPUs), then 7/8 of train-2's
    assert oracle_waiting_saved(many, report_of(many), NOW) == 23.0
    # a pool the fleet has not: any node, as the planner reads it; its own pool: that pool's room
    for pool in ("gpu-b200", "gpu-h100"):
        alone = fragmented((dataclasses.replace(WHOLE, pool=pool),))
        assert oracle_waiting_saved(alone, report_of(alone), NOW) == 16.0
    # nothing pending, or nothing blocked: 0
    assert oracle_waiting_saved(fragmented(), report_of(fragmented()), NOW) == 0.0
    just_fits = fragmented((fits,))
    assert oracle_waiting_saved(just_fits, report_of(just_fits), NOW) == 0.0


def test_a_plan_carries_the_oracles_bound_and_its_share_round_trips():
    clock = [NOW]
    snapshot = fragmented((WHOLE,))
    planner = Planner()
    advice = advise(advisor_at(clock), snapshot, report_of(snapshot), planner)
    plan = advice.plan
    assert advice.decision == "compact" and plan is not None
    assert (plan.gpu_hours_waiting_saved, plan.oracle_gpu_hours_waiting_saved) == (16.0, 16.0)
    data = plan_json(plan)
    Draft202012Validator(SCHEMA).validate(data)
    assert (data["oracle_gpu_hours_waiting_saved"], data["share_of_oracle_saving"]) == (16.0, 1.0)
    assert plan_from_json(data).oracle_gpu_hours_waiting_saved == 16.0
    # a plan an older process wrote has no bound: read back as None, its share null
    new_keys = ("oracle_gpu_hours_waiting_saved", "share_of_oracle_saving")
    old = {k: v for k, v in data.items() if k not in new_keys}
    assert plan_from_json(old).oracle_gpu_hours_waiting_saved is None
    assert plan_json(plan_from_json(old))["share_of_oracle_saving"] is None
    # the advisor's kept state keeps it over a restart
    state = advisor_state_from_text(advisor_state_text(advisor_at(clock).durable_state()))
    assert state is not None
    carrying = dataclasses.replace(state, carried=plan, carried_at=NOW)
    kept = advisor_state_from_text(advisor_state_text(carrying))
    assert kept is not None and kept.carried is not None
    assert kept.carried.oracle_gpu_hours_waiting_saved == 16.0
    # a state an older process wrote, its plan without the bound, restores the same plan
    written = json.loads(advisor_state_text(carrying))
    for key in new_keys:
        del written["carried"][key]
    before = advisor_state_from_text(json.dumps(written))
    assert before is not None and before.carried is not None
    assert before.carried.plan_id == plan.plan_id and before.carried.oracle_gpu_hours_waiting_saved is None
    # the what-if's plan carries it too
    plain = Advisor(DecisionSettings(dwell_seconds=0.0, require_pending=False), clock=lambda: NOW)
    proposed = what_if(plain, snapshot, report_of(snapshot), planner).plan
    assert proposed is not None and proposed.oracle_gpu_hours_waiting_saved == 16.0
    assert share(4.0, 16.0) == 0.25 and share(4.0, 0.0) is None and share(4.0, None) is None


def test_the_ledger_follows_a_delivered_plan_until_its_job_runs():
    clock = [NOW]
    snapshot = fragmented((WHOLE,))
    planner = Planner()
    advisor = advisor_at(clock)
    advice = advise(advisor, snapshot, report_of(snapshot), planner)
    assert advice.saving is not None
    (watched,) = advice.saving.plans
    assert advice.plan is not None and watched.plan_id == advice.plan.plan_id
    assert (watched.expected, watched.oracle, watched.closed, watched.realised) == (16.0, 16.0, False, None)
    (job,) = watched.jobs
    assert (job.job, job.gpus, job.waited, job.expected, job.started_at) == (
        "train-1", 8.0, 7200.0, 16.0, None)
    # 5 min on: the move is made and train-1 has run for a minute, since NOW + 240 s; it saved
    # its 2 h of waiting less the 4 min it took: 8 GPUs x 116 min
    clock[0] = NOW + 300
    next_one = later(snapshot, NOW + 300, {"train-1": NOW + 240})
    advice = advise(advisor, next_one, report_of(next_one), planner)
    assert advice.saving is not None
    (done,) = advice.saving.plans
    assert done.closed and done.jobs[0].started_at == NOW + 240
    assert done.realised == round(8 * (7200 - 240) / 3600, 3) == 15.467
    totals = advice.saving.totals
    assert (totals.plans, totals.jobs, totals.started, totals.expected, totals.realised) == (
        1, 1, 1, 16.0, 15.467)
    assert totals.ratio == round(15.467 / 16, 6)
    assert advisor.current() is not None and advisor.current().saving == advice.saving
    assert summary(planner.ledger) == ("plans closed 1: jobs started 1/1, GPU-h of waiting saved expected "
                                       "16.0, realised 15.5 (ratio 0.97)")
    # the JSON, and served by the real handler: it validates against the OpenAPI document
    data = advice_json(advice)["saving"]
    assert data["plans"][0]["jobs"][0] == {"job": "train-1", "gpus": 8.0, "waited_seconds": 7200.0,
                                           "expected_gpu_hours": 16.0, "started_at": NOW + 240,
                                           "realised_gpu_hours": 15.467}
    assert data["plans"][0]["share_of_oracle_saving"] == 1.0
    assert data["totals"]["realised_ratio"] == totals.ratio


def test_a_job_that_never_runs_saves_nothing_and_a_late_one_less():
    plan = _plan(("late", "never"), 8.0)
    ledger = Ledger()
    queue = fragmented((dataclasses.replace(WHOLE, job="late", submit_time=NOW - 1800),
                        dataclasses.replace(WHOLE, job="never", submit_time=NOW - 600)))
    ledger.record(plan, queue, NOW)
    ledger.record(plan, queue, NOW + 60)  # proposed again while watched (the outbox refused it): once
    (outcome,) = ledger.saving().plans
    # watched until the plan expires or the longest wait has passed, whichever is later
    assert outcome.closes_at == NOW + 1800
    # late runs from NOW + 1500 s: 8 GPUs x (1800 - 1500) s; "never" still waits
    ledger.observe(later(queue, NOW + 1600, {"late": NOW + 1500}), NOW + 1600)
    (outcome,) = ledger.saving().plans
    assert not outcome.closed and outcome.realised is None
    assert [j.realised for j in outcome.jobs] == [round(8 * 300 / 3600, 3), None]
    ledger.observe(later(queue, NOW + 1800, {"late": NOW + 1500}), NOW + 1800)
    (outcome,) = ledger.saving().plans
    assert outcome.closed and outcome.started == 1
    assert [j.realised for j in outcome.jobs] == [0.667, 0.0] and outcome.realised == 0.667
    assert outcome.jobs[1].started_at is None
    t = ledger.totals
    assert (t.plans, t.jobs, t.started, t.expected, t.realised) == (1, 2, 1, 8.0, 0.667)
    # a job that started after its whole expected saving had passed saved nothing
    ledger = Ledger()
    ledger.record(plan, queue, NOW)
    ledger.observe(later(queue, NOW + 4000, {"late": NOW + 3900, "never": NOW + 300}), NOW + 4000)
    (outcome,) = ledger.saving().plans
    assert [j.realised for j in outcome.jobs] == [0.0, round(8 * 300 / 3600, 3)]


def test_the_ledger_is_bounded_and_counts_what_it_forgets():
    ledger = Ledger()
    queue = fragmented((WHOLE,))
    for i in range(KEEP + 5):
        ledger.record(_plan(("train-1",), 16.0, scope=f"pool:p{i}"), queue, NOW + i)
    plans = ledger.saving().plans
    assert len(plans) == KEEP and plans[0].proposed_at == NOW + 5
    # the five pushed out while watched are counted as they stood: nothing started
    assert (ledger.totals.plans, ledger.totals.expected, ledger.totals.realised) == (5, 80.0, 0.0)
    # every job of the remaining ones starts: all closed, all counted
    ledger.observe(later(queue, NOW + 100, {"train-1": NOW + 50}), NOW + 100)
    assert all(p.closed for p in ledger.saving().plans)
    assert ledger.totals.plans == KEEP + 5 and ledger.totals.started == KEEP
    # closed plans pushed out are not counted twice
    ledger.record(_plan(("train-1",), 16.0, scope="pool:new"), queue, NOW + 200)
    assert ledger.totals.plans == KEEP + 5


def test_a_reloaded_table_keeps_the_ledger():
    old = Planner()
    old.ledger.record(_plan(("train-1",), 16.0), fragmented((WHOLE,)), NOW)
    new = Planner().keeping(old)
    assert new.ledger is old.ledger and len(new.ledger.plans) == 1
    assert Planner().keeping(lambda *a: None).ledger is not old.ledger  # not a planner: its own
    # as serve's reload builds it (exporter/cli/serve.py)
    reloaded = planner_for(AdvisorConfig(), None, old)
    assert isinstance(reloaded, Planner) and reloaded.ledger is old.ledger
    assert isinstance(fresh := planner_for(AdvisorConfig()), Planner) and fresh.ledger is not old.ledger


async def test_get_advice_serves_the_saving_as_documented(aiohttp_client):
    clock = [NOW]
    snapshot = fragmented((WHOLE,))
    planner = Planner()
    advisor = advisor_at(clock)
    advise(advisor, snapshot, report_of(snapshot), planner)
    clock[0] = NOW + 300
    after = later(snapshot, NOW + 300, {}, pending=(WHOLE,))  # not started yet
    advise(advisor, after, report_of(after), planner)

    api = AdvisorApi(evaluate=_no_evaluation, what_if=lambda s: pytest.fail("no what-if"),
                     current=advisor.current, token=b"t", max_body_bytes=1024)
    app = web.Application()
    add_routes(app, api)
    client = await aiohttp_client(app)
    resp = await client.get("/v1/advice")
    assert resp.status == 200
    body = await resp.json()
    answer = DOC["paths"]["/v1/advice"]["get"]["responses"]["200"]["content"]["application/json"]
    schema = {**answer["schema"], "components": DOC["components"]}
    assert [e.message for e in Draft202012Validator(schema).iter_errors(body)] == []
    saving = body["saving"]
    assert saving["basis"] == "wait_so_far"
    (watched,) = saving["plans"]
    assert (watched["closed"], watched["realised_gpu_hours"], watched["expected_gpu_hours"]) == (
        False, None, 16.0)
    assert watched["jobs"][0]["started_at"] is None
    assert saving["totals"] == {"plans": 0, "jobs": 0, "started": 0, "expected_gpu_hours": 0.0,
                                "realised_gpu_hours": 0.0, "realised_ratio": None}
    json.dumps(body, allow_nan=False)


async def _no_evaluation(reason: str):
    return None


def _plan(lets_start: tuple[str, ...], saved: float, scope: str = "cluster") -> CompactionPlan:
    return CompactionPlan(scope, NOW, NOW + 900, "compact", ("test",), Prediction(60, 10), Prediction(40, 2),
                          lets_start=lets_start, gpu_hours_waiting_saved=saved,
                          oracle_gpu_hours_waiting_saved=16.0)
