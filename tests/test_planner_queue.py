"""The queue rule (issue 42): a plan goes on past the queue's head, and pays for itself.

Under ``PlanSettings.rule == "queue"`` (the default) the planner plans for the head and then
for the next blocked jobs the moves left in the budget can start; the engine refuses a plan
whose waiting ended, net of the waiting of the pending jobs it leaves no room for, does not
pay the work its moves cost. ``rule="head"`` is the rule before: the head alone.
"""

from __future__ import annotations

from exporter.advisor.advise import Planner, advise
from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.planner import PlanSettings, QueuePlan, plan_for_pending, plan_for_queue, work_cost
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import IndexSettings, evaluate
from exporter.analysis.state import from_snapshot
from exporter.analysis.workload import Shape, Workload
from exporter.gpu_catalogue import GB
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, Node, Placement, SourceStatus

NOW = 1_760_000_000.0
WORKLOAD = Workload((Shape(8, 1.0, 8), Shape(4, 1.0, 1)), (0.9, 0.1))
SLURM = (SourceStatus("slurm", True, 0.1, NOW),)
HOUR = 3600.0


def alloc(name: str, node: str, gpus: tuple[int, ...], priority: int = 10) -> Allocation:
    return Allocation(job=name, placements=(Placement(node, gpus, 1.0, 4.0 * len(gpus)),),
                      namespace="team", pod=f"{name}-0", priority=priority, start_time=NOW - 2 * HOUR,
                      last_checkpoint_time=NOW - 300, gpu_memory_need_bytes=int(30 * GB))


def fleet(jobs: tuple[Allocation, ...], pending: tuple[JobRequest, ...],
          names: tuple[str, ...] = ("h3", "h4", "h1", "h2")) -> FleetSnapshot:
    nodes = tuple(Node(n, "H100", 128, "gpu-h100", "hopper", 8) for n in names)
    gpus = tuple(Gpu(n, i, f"GPU-{n}-{i}", "H100", "gpu-h100") for n in names for i in range(8))
    return FleetSnapshot(NOW, nodes, gpus, jobs, pending, SLURM)


def report_of(snapshot: FleetSnapshot):
    state = from_snapshot(snapshot)
    return evaluate(state, compile_workload(WORKLOAD, state.model_names), IndexSettings())


def job(name: str, gpus: int, waited: float) -> JobRequest:
    return JobRequest(name, gpus, 1.0, 4.0 * gpus, 1, (), "gpu-h100", 0, NOW - waited)


# Four H100 nodes, 3, 3, 1 and 2 GPUs free: no node has room for a 4-GPU job, 9 GPUs idle.
# h1 and h2 each hold a stray one-GPU job that may move, beside a high-priority 4-GPU job
# that stays; h3 and h4 hold high-priority jobs only. FGD against the typical workload
# scores a stray's move to h2, h3 or h4 alike and takes the first node listed: h3 and h4 are
# listed first, so the head's move leaves h2 for the second (destinations are not chosen
# against the queue: listed last, the move for the head would take one of h2's free GPUs).
BLOCKED_TWICE = (
    alloc("stray-a", "h1", (0,)), alloc("keep-1", "h1", (1, 2, 3, 4), priority=1000),
    alloc("stray-b", "h2", (0,)), alloc("keep-2", "h2", (1, 2, 3, 4), priority=1000),
    alloc("keep-3", "h3", tuple(range(7)), priority=1000),
    alloc("keep-4", "h4", tuple(range(6)), priority=1000),
)
FIRST, SECOND = job("first", 4, 2 * HOUR), job("second", 4, 1 * HOUR)


def test_planning_past_the_head_starts_the_next_blocked_job_in_the_same_plan():
    snapshot = fleet(BLOCKED_TWICE, (FIRST, SECOND))
    report = report_of(snapshot)
    head_only = plan_for_pending(snapshot, report, FIRST, NOW, PlanSettings(rule="head"))
    assert head_only is not None and not isinstance(head_only, QueuePlan)
    assert head_only.lets_start == ("first",) and len(head_only.migrations) == 1
    assert head_only.gpu_hours_waiting_saved == 8.0  # 4 GPUs x 2 h
    plan = plan_for_pending(snapshot, report, FIRST, NOW)  # the queue rule, the default
    assert isinstance(plan, QueuePlan)
    assert plan.lets_start == ("first", "second")
    # one stray off each of h1 and h2: each then has the 4 GPUs one of them asks for
    assert sorted(m.job for m in plan.migrations) == ["stray-a", "stray-b"]
    assert {m.source.node for m in plan.migrations} == {"h1", "h2"}
    assert all(m.destination.node in ("h3", "h4") for m in plan.migrations)
    assert plan.gpu_hours_waiting_saved == 12.0  # 4 x 2 h + 4 x 1 h
    assert plan.gpus_started == 8.0 and plan.displaced == ()
    # each move: 300 s of work since the checkpoint and a 120 s restore, on one GPU
    assert plan.work_gpu_hours == round(2 * 420 / 3600, 3)
    assert plan_for_queue(snapshot, report, FIRST, NOW) == plan
    # through the engine, proposed as one plan
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner())
    assert advice.decision == "compact" and advice.plan is not None
    assert advice.plan.lets_start == ("first", "second")


def test_a_blocked_job_behind_the_head_is_planned_for_only_where_it_pays():
    # the second has waited a minute: 4 GPU-minutes of waiting for a move costing 7 GPU-minutes
    late = job("second", 4, 60.0)
    snapshot = fleet(BLOCKED_TWICE, (FIRST, late))
    plan = plan_for_pending(snapshot, report_of(snapshot), FIRST, NOW)
    assert isinstance(plan, QueuePlan)
    assert plan.lets_start == ("first",) and len(plan.migrations) == 1
    # the budget ends the planning too
    snapshot = fleet(BLOCKED_TWICE, (FIRST, SECOND))
    one = plan_for_pending(snapshot, report_of(snapshot), FIRST, NOW, PlanSettings(max_migrations=1))
    assert one is not None and one.lets_start == ("first",)


# h1 and h2 hold high-priority jobs with one GPU free each; h3 one stray job (7 free). The
# 8-GPU head fits nowhere; the one-GPU jobs behind it fit h1's and h2's last GPUs. The one
# move that frees h3 for the head takes one of those GPUs.
CROWDED = (
    alloc("keep-1", "h1", tuple(range(7)), priority=1000),
    alloc("keep-2", "h2", tuple(range(7)), priority=1000),
    alloc("stray", "h3", (0,)),
)


def test_a_plan_that_makes_a_smaller_queue_wait_more_than_it_saves_is_refused():
    big = job("big", 8, 600.0)  # waited 10 min: 8 x 1/6 h = 1.33 GPU-hours expected saved
    small = (job("small-1", 1, 5 * HOUR), job("small-2", 1, 5 * HOUR))
    snapshot = fleet(CROWDED, (big, *small), ("h1", "h2", "h3"))
    report = report_of(snapshot)
    plan = plan_for_pending(snapshot, report, big, NOW)
    assert isinstance(plan, QueuePlan)
    assert plan.lets_start == ("big",) and [m.job for m in plan.migrations] == ["stray"]
    assert plan.gpu_hours_waiting_saved == 1.333
    # of the two small jobs that start on the fleet as it is, one finds no room after the move
    assert plan.displaced == ("small-2",) and plan.displaced_gpu_hours == 5.0
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report, Planner())
    assert advice.decision != "compact" and advice.plan is None
    assert any("less 5 for the 1 pending job it would leave no room for" in r for r in advice.reasons)
    # the head rule, which counts no one else's waiting, proposes it
    head = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    proposed = advise(head, snapshot, report, Planner(PlanSettings(rule="head")))
    assert proposed.decision == "compact" and proposed.plan is not None
    assert proposed.plan.lets_start == ("big",)
    # the same plan, the small jobs queued a minute ago: what it costs them is less than it saves
    fresh = (job("small-1", 1, 60.0), job("small-2", 1, 60.0))
    snapshot = fleet(CROWDED, (big, *fresh), ("h1", "h2", "h3"))
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report_of(snapshot), Planner())
    assert advice.decision == "compact" and advice.plan is not None
    assert isinstance(advice.plan, QueuePlan) and advice.plan.displaced == ("small-2",)


def test_work_cost_counts_the_work_since_the_checkpoint_and_the_restore():
    snapshot = fleet(BLOCKED_TWICE, (FIRST, SECOND))
    plan = plan_for_queue(snapshot, report_of(snapshot), FIRST, NOW, PlanSettings(restore_seconds=0.0))
    assert plan is not None and plan.work_gpu_hours == round(2 * 300 / 3600, 3)
    assert work_cost((), PlanSettings()) == 0.0


def test_the_rule_is_an_option_of_the_advisor_config(tmp_path):
    import pytest

    from exporter.advisor.advise import plan_settings
    from exporter.config import load
    from exporter.errors import ConfigError

    assert plan_settings(load(None).advisor).rule == "queue"
    path = tmp_path / "config.yaml"
    path.write_text("advisor:\n  rule: head\n")
    assert plan_settings(load(path).advisor).rule == "head"
    path.write_text("advisor:\n  rule: everything\n")
    with pytest.raises(ConfigError, match="rule"):
        load(path)


def test_simulate_runs_either_rule():
    import argparse

    from exporter.cli import simulate as cli
    from exporter.outcome_sim.run import make_strategy
    from exporter.outcome_sim.sim import RunSettings

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args(["--out", "x"]).advisor_rule == "queue"
    assert parser.parse_args(["--out", "x", "--advisor-rule", "head"]).advisor_rule == "head"
    for rule in ("head", "queue"):
        strategy = make_strategy("advisor", RunSettings(advisor_rule=rule))
        strategy._setup()
        assert strategy._stages[1].planner.settings.rule == rule
