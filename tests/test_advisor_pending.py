"""The revised rule (issue 28): compaction pays when it lets a pending job start.

The planner's second mode (``plan_for_pending``) and the engine reading ``snapshot.pending``:
a compaction plan that starts no pending job is held, a pending job blocked by fragments
gets a plan of its own, and ``require_pending=False`` keeps the index rule alone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema

from exporter.advisor.advise import Planner, advise
from exporter.advisor.engine import Advisor, DecisionSettings
from exporter.advisor.planner import PlanSettings, plan_for_pending
from exporter.advisor.wire import advice_json, plan_from_json, plan_json
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import IndexSettings, evaluate
from exporter.analysis.state import from_snapshot
from exporter.analysis.workload import Shape, Workload
from exporter.gpu_catalogue import GB
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, Node, Placement, SourceStatus

NOW = 1_760_000_000.0
SCHEMA = json.loads((Path(__file__).parent.parent / "docs" / "advisor-plan.schema.json").read_text())
WORKLOAD = Workload((Shape(8, 1.0, 8), Shape(4, 1.0, 1)), (0.9, 0.1))
SLURM = (SourceStatus("slurm", True, 0.1, NOW),)


def alloc(name: str, node: str, gpus: tuple[int, ...], age: float = 7200, priority: int = 10) -> Allocation:
    return Allocation(job=name, placements=(Placement(node, gpus, 1.0, 4.0 * len(gpus)),),
                      namespace="team", pod=f"{name}-0", priority=priority, start_time=NOW - age,
                      last_checkpoint_time=NOW - 300, gpu_memory_need_bytes=int(30 * GB))


def fragmented(pending: tuple[JobRequest, ...] = (), age: float = 7200,
               sources: tuple[SourceStatus, ...] = SLURM) -> FleetSnapshot:
    """Three H100 nodes: h1 holds two stray one-GPU jobs (6 GPUs free), h2 a high-priority
    six-GPU job (2 free, and it stays), h3 one stray job (7 free): 15 GPUs idle, no node has 8."""
    spec = {"h1": "H100", "h2": "H100", "h3": "H100"}
    nodes = tuple(Node(n, m, 128, "gpu-h100", "hopper", 8) for n, m in spec.items())
    gpus = tuple(Gpu(n, i, f"GPU-{n}-{i}", m, "gpu-h100") for n, m in spec.items() for i in range(8))
    jobs = (alloc("small-a", "h1", (0,), age), alloc("small-b", "h1", (5,), age),
            alloc("big", "h2", (0, 1, 2, 3, 4, 5), priority=1000), alloc("small-c", "h3", (3,), age))
    return FleetSnapshot(NOW, nodes, gpus, jobs, pending, sources)


def report_of(snapshot: FleetSnapshot):
    state = from_snapshot(snapshot)
    return evaluate(state, compile_workload(WORKLOAD, state.model_names), IndexSettings())


WHOLE = JobRequest("train-1", 8, 1.0, 32.0, 1, (), "gpu-h100", 0, NOW - 2 * 3600)


def test_plan_for_pending_frees_a_node_for_the_blocked_job_and_states_its_gain():
    snapshot = fragmented((WHOLE,))
    plan = plan_for_pending(snapshot, report_of(snapshot), WHOLE, NOW)
    assert plan is not None
    # the fewest moves: h3 needs one (h1 two; h2's job is high-priority and stays)
    assert [(m.job, m.source.node) for m in plan.migrations] == [("small-c", "h3")]
    assert plan.migrations[0].destination.node in ("h1", "h2")
    assert plan.lets_start == ("train-1",)
    assert plan.gpu_hours_waiting_saved == 16.0  # 8 GPUs x the 2 h waited so far
    data = plan_json(plan)
    jsonschema.validate(data, SCHEMA)
    assert (data["lets_start"], data["gpu_hours_waiting_saved"]) == (["train-1"], 16.0)
    back = plan_from_json(data)
    assert (back.lets_start, back.gpu_hours_waiting_saved) == (("train-1",), 16.0)


def test_plan_for_pending_is_none_when_the_job_fits_or_no_allowed_move_makes_room():
    snapshot = fragmented((WHOLE,))
    fits = JobRequest("two", 2, 1.0, 8.0)
    assert plan_for_pending(snapshot, report_of(snapshot), fits, NOW) is None
    young = fragmented((WHOLE,), age=600)  # under min_runtime: a plan for a waiting job does not wait
    assert plan_for_pending(young, report_of(young), WHOLE, NOW) is None
    assert plan_for_pending(snapshot, report_of(snapshot), WHOLE, NOW, PlanSettings(max_migrations=0)) is None
    # a two-node job of 7 GPUs a node: h3 holds one part as it is, h1 the other after one move
    gang = JobRequest("gang", 14, 1.0, 56.0, 2, (), "", 0, NOW - 3600)
    two = plan_for_pending(snapshot, report_of(snapshot), gang, NOW)
    assert two is not None and [m.source.node for m in two.migrations] == ["h1"]
    assert two.lets_start == ("gang",) and two.gpu_hours_waiting_saved == 14.0
    # 16 GPUs on two nodes: 15 are idle, so no moves can make room
    too_big = JobRequest("too-big", 16, 1.0, 64.0, 2, (), "", 0, NOW - 3600)
    assert plan_for_pending(snapshot, report_of(snapshot), too_big, NOW) is None


def advisor(**settings) -> Advisor:
    return Advisor(DecisionSettings(dwell_seconds=0.0, **settings), clock=lambda: NOW)


def test_with_the_queue_known_the_index_plans_nothing_and_the_head_decides():
    def no_compaction(*args):  # the index's planner must not even be asked
        raise AssertionError("plan_compaction called with the queue known")

    # the queue is known (Slurm is up) and empty: compaction is held before any planning
    snapshot = fragmented()
    rep = report_of(snapshot)
    assert rep.cluster.index > 50
    held = advise(advisor(), snapshot, rep, no_compaction)
    assert held.decision == "hold" and held.plan is None
    assert any("starts no pending job" in r for r in held.reasons)
    # a pending job no move lets start (it asks for B200s): still no index plan, where
    # before 2026-12-05 a compaction plan was made and held for starting none
    b200 = JobRequest("b200-job", 4, 1.0, 16.0, 1, ("B200",), "", 0, NOW - 600)
    snapshot = fragmented((b200,))
    held = advise(advisor(), snapshot, report_of(snapshot), no_compaction)
    assert held.decision == "hold" and held.plan is None
    assert any(r.startswith("the index plans nothing while the queue is known") for r in held.reasons)
    assert any("b200-job" in r and "no plan" in r for r in held.reasons)
    # the head blocked by fragments: its own plan, and still no index plan
    snapshot = fragmented((WHOLE,))
    planned = advise(advisor(), snapshot, report_of(snapshot), no_compaction,
                     plan_pending=Planner().for_pending)
    assert planned.decision == "compact" and planned.plan is not None
    assert planned.plan.lets_start == ("train-1",)


def test_require_pending_false_keeps_the_index_rule():
    for snapshot in (fragmented(), fragmented((JobRequest("b200-job", 4, 1.0, 16.0, 1, ("B200",)),))):
        advice = advise(advisor(require_pending=False), snapshot, report_of(snapshot), Planner())
        assert advice.decision == "compact" and advice.plan is not None
        assert advice.plan.lets_start == ()


def test_without_a_queue_source_the_index_rule_stands():
    # GPU telemetry alone says nothing of what waits: no hold for starting none
    snapshot = fragmented(sources=())
    advice = advise(advisor(), snapshot, report_of(snapshot), Planner())
    assert advice.decision == "compact"


def test_a_blocked_pending_job_gets_its_plan_whatever_the_index_and_the_dwell():
    snapshot = fragmented((WHOLE,))
    strict = DecisionSettings(dwell_seconds=3600.0, trigger=99.0, clear_below=98.0)
    engine = Advisor(strict, clock=lambda: NOW)
    advice = advise(engine, snapshot, report_of(snapshot), Planner())
    assert advice.decision == "compact" and advice.scope == "cluster"
    assert advice.plan is not None and advice.plan.lets_start == ("train-1",)
    assert advice.reasons[0].startswith(
        "pending job train-1 waits for 8 GPUs while 15 are idle, in fragments;")
    assert "expected to save 16 GPU-hours of waiting" in advice.reasons[0]
    served = advice_json(advice)["plan"]
    assert served["lets_start"] == ["train-1"] and served["gpu_hours_waiting_saved"] == 16.0
    # the plan in force already lets it start: the next evaluation plans nothing new
    again = advise(engine, snapshot, report_of(snapshot), Planner())
    assert again.decision != "compact" and again.plan is not None
    assert again.plan.plan_id == advice.plan.plan_id
    # the index rule alone would not act here
    current = Advisor(DecisionSettings(dwell_seconds=3600.0, trigger=99.0, clear_below=98.0,
                                       require_pending=False), clock=lambda: NOW)
    assert advise(current, snapshot, report_of(snapshot), Planner()).decision == "none"


def test_each_partitions_head_is_planned_for_not_only_the_queues_first():
    """Slurm's main scheduler skips a partition once its first job cannot start, and the
    others go on: a job first in the queue that waits for capacity in its own partition (every
    A100 held by a job that stays) leaves the H100 partition's head, blocked by fragments, its
    plan. With the two in one partition, the first blocks the second, and nothing is planned."""
    base = fragmented()
    a100 = Node("a1", "A100-80GB", 128, "gpu-a100", "ampere", 8)
    held = Allocation("hp-a100", (Placement("a1", tuple(range(8)), 1.0, 32.0),), namespace="team",
                      pod="hp-a100-0", priority=1000, start_time=NOW - 7200,
                      last_checkpoint_time=NOW - 300)
    waiting = JobRequest("a100-wait", 8, 1.0, 32.0, 1, ("A100-80GB",), "gpu-a100", 0, NOW - 3 * 3600)

    def with_queue(*pending: JobRequest) -> FleetSnapshot:
        return dataclasses.replace(
            base, nodes=(*base.nodes, a100),
            gpus=(*base.gpus, *(Gpu("a1", i, f"GPU-a1-{i}", "A100-80GB", "gpu-a100") for i in range(8))),
            allocations=(*base.allocations, held), pending=pending)

    snapshot = with_queue(waiting, WHOLE)
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report_of(snapshot), Planner())
    assert advice.decision == "compact"
    assert advice.plan is not None and advice.plan.lets_start == ("train-1",)
    assert advice.reasons[0].startswith("pending job train-1 waits for 8 GPUs")

    one = with_queue(dataclasses.replace(waiting, pool=""), dataclasses.replace(WHOLE, pool=""))
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, one, report_of(one), Planner())
    assert advice.decision != "compact" and advice.plan is None
    assert "pending job a100-wait (8 GPUs) waits: no plan of allowed moves lets it start" in \
        advice.reasons
    # the next evaluation, the same free GPUs within the dwell: the head is not asked again,
    # and the job behind it in its partition is no head
    engine.settings = dataclasses.replace(engine.settings, dwell_seconds=3600.0)
    again = advise(engine, one, report_of(one), Planner())
    assert again.decision != "compact" and again.plan is None


def test_a_head_no_allowed_move_starts_leaves_the_next_partitions_head_its_plan_at_once():
    """The A100 partition's head could fit after a repack (8 GPUs free, 4 on each of two
    nodes) but only by moving high-priority jobs, which stay: no plan starts it. The H100
    partition's head is planned for in the same evaluation."""
    base = fragmented()
    a100 = tuple(Node(n, "A100-80GB", 128, "gpu-a100", "ampere", 8) for n in ("a1", "a2"))
    held = tuple(Allocation(f"hp-{n}", (Placement(n, (0, 1, 2, 3), 1.0, 16.0),), namespace="team",
                            pod=f"hp-{n}-0", priority=1000, start_time=NOW - 7200,
                            last_checkpoint_time=NOW - 300) for n in ("a1", "a2"))
    waiting = JobRequest("a100-wait", 8, 1.0, 32.0, 1, ("A100-80GB",), "gpu-a100", 0, NOW - 3 * 3600)
    snapshot = dataclasses.replace(
        base, nodes=(*base.nodes, *a100),
        gpus=(*base.gpus, *(Gpu(n.name, i, f"GPU-{n.name}-{i}", "A100-80GB", "gpu-a100")
                            for n in a100 for i in range(8))),
        allocations=(*base.allocations, *held), pending=(waiting, WHOLE))
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    assert [j.job for j in engine.assess(snapshot, report_of(snapshot)).other_heads] == ["train-1"]
    engine = Advisor(DecisionSettings(dwell_seconds=0.0), clock=lambda: NOW)
    advice = advise(engine, snapshot, report_of(snapshot), Planner())
    assert advice.decision == "compact"
    assert advice.plan is not None and advice.plan.lets_start == ("train-1",)
    assert all(m.job.startswith("small-") for m in advice.plan.migrations)


# -- tier inversion: an alert on it starts no plan, and the advice names the remedy ----------


def default_fleet_inverted() -> FleetSnapshot:
    """The default fleet (sources.sim's reference layout, no MIG) with its H200 pool idle
    beside busy H100 and A100 pools, all jobs whole nodes: two inverted pairs, nothing
    fragmented."""
    from exporter.gpu_catalogue import default_catalogue
    from exporter.sources.sim.options import SimSource

    catalogue = default_catalogue()
    nodes = tuple(Node(name, catalogue.get(pool.model).name, float(pool.cpu_cores), pool.name,
                       catalogue.get(pool.model).architecture, pool.gpus_per_node)
                  for name, pool in SimSource(mig_nodes=0).node_names())
    gpus = tuple(Gpu(n.name, i, f"GPU-{n.name}-{i}", n.model, n.pool)
                 for n in nodes for i in range(n.gpu_count))
    busy = {"gpu-h100": 55, "gpu-a100": 20, "gpu-b200": 4, "gpu-h200": 0}  # nodes with a job
    jobs, seen = [], dict.fromkeys(busy, 0)
    for n in nodes:
        if seen[n.pool] < busy[n.pool]:
            seen[n.pool] += 1
            jobs.append(Allocation(f"train-{n.name}", (Placement(n.name, tuple(range(8)), 1.0, 32.0),),
                                   namespace="team", pod=f"train-{n.name}-0", priority=10,
                                   start_time=NOW - 7200, last_checkpoint_time=NOW - 300))
    return FleetSnapshot(NOW, nodes, gpus, tuple(jobs), (), SLURM)


class CountingPlanner(Planner):
    calls = 0

    def __call__(self, *args):  # type: ignore[no-untyped-def]
        type(self).calls += 1
        return super().__call__(*args)


def test_the_default_fleets_tier_inversion_starts_no_plan_and_names_its_remedy():
    from exporter.advisor.advise import decision_settings
    from exporter.analysis.analyzer import LiveAnalyzer
    from exporter.config import load

    config = load(None)
    snapshot = default_fleet_inverted()
    rep = LiveAnalyzer.from_config(config.analysis).analyze(snapshot)
    assert {(i.upper, i.lower) for i in rep.inversions if i.inverted} == {
        ("gpu-h200", "gpu-h100"), ("gpu-h200", "gpu-a100")}
    assert rep.cluster.index >= 60 and rep.cluster.fragmented_gpus < 1  # the penalty, not fragments
    clock = [NOW]
    for require_pending in (True, False):
        clock[0] = NOW
        engine = Advisor(DecisionSettings(**{**vars_of(decision_settings(config.advisor)),
                                             "require_pending": require_pending}), clock=lambda: clock[0])
        planner = CountingPlanner()
        CountingPlanner.calls = 0
        advise(engine, snapshot, rep, planner)
        # Alertmanager's GpuFleetFragmentationHigh fires on the index: it serves no dwell here
        engine.alert_firing([{"labels": {"alertname": "GpuFleetFragmentationHigh"}, "status": "firing"}])
        answers = []
        for step in range(0, 3600, 300):  # an hour of evaluations, the alert's and the snapshots'
            clock[0] = NOW + step
            trigger = "alertmanager" if step == 0 else "snapshot"
            answers.append(advise(engine, snapshot, rep, planner, trigger))
        assert {a.decision for a in answers} == {"none"} and CountingPlanner.calls == 0
        remedy = [r for r in answers[-1].reasons if "tier inversion" in r]
        assert remedy and "gpu-h200 idle while gpu-h100 is 86% allocated" in remedy[0]
        assert "steer the next jobs that fit gpu-h200 there" in remedy[0]
        assert answers[-1].scopes["cluster"].index == round(rep.cluster.index, 2)  # shown as measured


def vars_of(settings: DecisionSettings) -> dict:
    import dataclasses

    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}


def test_a_job_stating_no_memory_need_moves_only_to_a_model_with_as_much_memory_per_gpu():
    from exporter.advisor.planner import destination_models

    fleet = ("A100", "A100-80GB", "H100", "H200", "B200", "Mystery-GPU")
    free = Allocation(job="j", placements=(Placement("n", (0,), 1.0, 4.0),))
    # the A100-80GB and the H100 both hold 80 GB: each may go to the other, and up
    assert destination_models(free, "H100", fleet) == ("H100", "A100-80GB", "H200", "B200")
    assert destination_models(free, "H200", fleet) == ("H200", "B200")
    assert destination_models(free, "B200", fleet) == ("B200",)
    # an unknown model's memory is unknown: a job on one stays, and none goes to one
    assert destination_models(free, "Mystery-GPU", fleet) == ("Mystery-GPU",)
    # its own allowed list still bounds it, and a job off its list goes nowhere
    listed = Allocation(job="j", placements=free.placements, allowed_models=("H100", "A100", "B200"))
    assert destination_models(listed, "H100", fleet) == ("H100", "B200")
    assert destination_models(listed, "H200", fleet) == ("B200",)


def test_a_pending_job_in_a_mixed_partition_gets_moves_to_larger_models_only():
    """One Slurm partition of two H100 nodes, an A100 (40 GB) and an H200 (141 GB), each with
    one GPU free but h2, which holds one stray one-GPU job (no memory need stated) beside 7
    free GPUs. The one move that lets an 8-GPU H100 job start sends it to the H200's free
    GPU, never the A100's (less memory than it holds now), although the A100 is listed first
    and its GPU is as free; under the rule before, it could go nowhere (h1 is full)."""
    spec = {"h1": "H100", "h2": "H100", "small": "A100", "big": "H200"}
    nodes = tuple(Node(n, m, 128, "gpu", "hopper", 8) for n, m in spec.items())
    gpus = tuple(Gpu(n, i, f"GPU-{n}-{i}", m, "gpu") for n, m in spec.items() for i in range(8))

    def stray(name: str, node: str, gpus: tuple[int, ...]) -> Allocation:
        return Allocation(job=name, placements=(Placement(node, gpus, 1.0, 4.0 * len(gpus)),),
                          namespace="team", pod=f"{name}-0", priority=10, start_time=NOW - 7200,
                          last_checkpoint_time=NOW - 300)

    jobs = (stray("full", "h1", tuple(range(8))), stray("one", "h2", (0,)),
            stray("seven-a100", "small", tuple(range(7))), stray("seven-h200", "big", tuple(range(7))))
    want = JobRequest("train", 8, 1.0, 32.0, 1, ("H100",), "gpu", 0, NOW - 3600)
    snapshot = FleetSnapshot(NOW, nodes, gpus, jobs, (want,), SLURM)
    plan = plan_for_pending(snapshot, report_of(snapshot), want, NOW)
    assert plan is not None and plan.lets_start == ("train",)
    assert [(m.job, m.source.node, m.destination.node) for m in plan.migrations] == [("one", "h2", "big")]


def test_a_cpu_only_job_holding_the_cpus_a_pending_job_needs_is_moved_for_it():
    """h1 has its 8 GPUs free but a CPU-only job holds 100 of its 128 CPUs; h2 is busy with 4
    one-GPU jobs and has CPUs to spare. An 8-GPU job asking 64 CPUs fits nowhere; the one move
    is the CPU-only job, to h2 (it asks no GPU: its endpoints list none). Before 2026-12-05
    the planner never moved a CPU-only job: its plan moved h2's four GPU jobs instead."""
    spec = {"h1": "H100", "h2": "H100"}
    nodes = tuple(Node(n, m, 128, "gpu-h100", "hopper", 8) for n, m in spec.items())
    gpus = tuple(Gpu(n, i, f"GPU-{n}-{i}", m, "gpu-h100") for n, m in spec.items() for i in range(8))
    cpu_job = Allocation(job="etl", placements=(Placement("h1", (), 1.0, 100.0),), namespace="data",
                         pod="etl-0", start_time=NOW - 7200, last_checkpoint_time=NOW - 300)
    jobs = (cpu_job, *(alloc(f"one-{i}", "h2", (i,)) for i in range(4)))
    want = JobRequest("train", 8, 1.0, 64.0, 1, (), "gpu-h100", 0, NOW - 1800)
    snapshot = FleetSnapshot(NOW, nodes, gpus, jobs, (want,), SLURM)
    plan = plan_for_pending(snapshot, report_of(snapshot), want, NOW)
    assert plan is not None and plan.lets_start == ("train",)
    (move,) = plan.migrations
    assert (move.job, move.source.node, move.source.gpus, move.destination.node, move.destination.gpus) == (
        "etl", "h1", (), "h2", ())
    assert move.cost_gpu_seconds == 0.0 and move.gpu_share == 1.0 and move.cpus == 100.0
    jsonschema.validate(plan_json(plan), SCHEMA)
    from exporter.advisor.kube_render import _resources

    assert _resources(move) == {"requests": {"cpu": "100"}, "limits": {}}  # no GPU asked for


# -- advisor.require_pending: the config key that selects the rule -----------------------------


def engine_from(data: dict) -> Advisor:
    """The engine as ``serve`` builds it from an ``advisor`` config section (no dwell, so one
    evaluation of a high index is due)."""
    from exporter.advisor.advise import decision_settings
    from exporter.config import Config, build

    config = build(Config, {"advisor": {"dwell": "0s", **data}})
    return Advisor(decision_settings(config.advisor), clock=lambda: NOW)


def test_the_require_pending_key_selects_the_rule_in_the_engine():
    snapshot = fragmented()  # Slurm up, nobody pending, the index above the trigger
    rep = report_of(snapshot)
    assert rep.cluster.index > 50
    # false: the index rule alone, a compaction plan that starts nobody is proposed
    current = advise(engine_from({"require_pending": False}), snapshot, rep, Planner())
    assert current.decision == "compact" and current.plan is not None
    assert current.plan.lets_start == () and current.plan.migrations
    # true, and left out (the default): held before any planning
    for data in ({"require_pending": True}, {}):
        held = advise(engine_from(data), snapshot, rep, Planner())
        assert held.decision == "hold" and held.plan is None
        assert any(r.startswith("starts no pending job: none is pending") for r in held.reasons)


def test_a_bad_require_pending_is_one_line():
    import pytest

    from exporter.config import Config, ConfigError, build

    for bad, shown in (("no", "'no'"), (0, "0"), (None, "None")):
        with pytest.raises(ConfigError) as info:
            build(Config, {"advisor": {"require_pending": bad}})
        assert str(info.value) == f"advisor.require_pending: must be true or false, got {shown}"


def test_the_default_fleets_inversion_is_exported_as_penalty_so_the_alert_leaves_it_out():
    """GpuFleetFragmentationHigh compares gpufleet_cluster_fragmentation_index less
    gpufleet_cluster_tier_inversion_penalty (rules/tests/gpu_fleet_fragmentation_high.yaml),
    GpuClusterFragmentationHigh each pool's index less its own penalty:
    on the default fleet's inversion the exporter serves an index of 60 or more, almost all
    of it penalty, so the difference the alert reads stays far under its level of 50."""
    from exporter.analysis.analyzer import LiveAnalyzer, report_families
    from exporter.config import load

    rep = LiveAnalyzer.from_config(load(None).analysis).analyze(default_fleet_inverted())
    served = {f.name: f.samples[0][1] for f in report_families(rep) if f.samples and not f.samples[0][0]}
    index = served["gpufleet_cluster_fragmentation_index"]
    penalty = served["gpufleet_cluster_tier_inversion_penalty"]
    assert index >= 60 and penalty == 60.0
    assert index - penalty < 1
    # GpuClusterFragmentationHigh likewise, per pool: the idle H200 pool carries the penalty
    pools = {dict(labels)["pool"]: value for f in report_families(rep)
             if f.name == "gpufleet_pool_tier_inversion_penalty" for labels, value in f.samples}
    assert pools == {"gpu-h200": 60.0, "gpu-h100": 0.0, "gpu-a100": 0.0, "gpu-b200": 0.0}
    h200 = next(p for p in rep.pools if p.name == "gpu-h200")
    assert h200.index >= 60 and h200.index - pools["gpu-h200"] < 1


def test_the_planners_kept_state_serves_one_thread_and_another_gets_its_own():
    """The pending planner keeps its working copy of the fleet and each job's layout between
    calls, in the planner instance; a second thread planning meanwhile (a what-if past its
    limit runs on) must neither use nor disturb them, and must get the same plan."""
    held = Planner()
    snapshot = fragmented((WHOLE,))
    report = report_of(snapshot)
    alone = held.for_pending(snapshot, report, WHOLE, NOW)
    kept = held.kept.placer
    assert kept is not None and alone is not None
    assert alone == plan_for_pending(snapshot, report, WHOLE, NOW)  # without a planner: the same
    # a plan applies and releases moves on its placer (each bumps the node's version) and
    # replaces the layout's per-job dict: the kept ones must see neither
    versions, layout = kept.version.copy(), held.kept.layout.kept
    with held.kept.lock:  # another thread is planning
        beside = held.for_pending(snapshot, report, WHOLE, NOW)
        compaction = held(snapshot, report, "cluster", NOW)
    assert beside == alone
    assert compaction == Planner()(snapshot, report, "cluster", NOW)
    assert held.kept.placer is kept and (kept.version == versions).all()
    assert held.kept.layout.kept is layout
    again = held.for_pending(snapshot, report, WHOLE, NOW)  # the lock free: the kept ones again
    assert again == alone
    assert (kept.version != versions).any() and held.kept.layout.kept is not layout
    # and a fleet of another layout gets a placer of its own layout, not the kept one
    other = dataclasses.replace(snapshot, nodes=snapshot.nodes[:2],
                                gpus=tuple(g for g in snapshot.gpus if g.node != "h3"),
                                allocations=snapshot.allocations[:3])
    held.for_pending(other, report_of(other), WHOLE, NOW)
    assert held.kept.placer is not kept
    assert held.kept.placer.names == ("h1", "h2")


def test_each_planner_keeps_its_own_state():
    """Two planners (two simulations in one process, or a serve's planner before and after a
    table reload) share nothing: planning with one leaves the other's kept state as it was."""
    snapshot = fragmented((WHOLE,))
    report = report_of(snapshot)
    first, second = Planner(), Planner()
    assert first == second and first.kept is not second.kept  # equal settings, own state
    first.for_pending(snapshot, report, WHOLE, NOW)
    assert first.kept.placer is not None and first.kept.layout.kept
    assert second.kept.placer is None and second.kept.layout.kept == {}
    second.for_pending(snapshot, report, WHOLE, NOW)
    assert second.kept.placer is not first.kept.placer
    assert second.kept.layout.kept is not first.kept.layout.kept


class RecordingAdvisor(Advisor):
    """The engine, recording which of its halves advise() calls, in order, into ``calls``;
    ``also_scope``: its assessment asks for that scope's plan besides."""

    def __init__(self, calls: list[str], also_scope: str | None = None, **settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(DecisionSettings(dwell_seconds=0.0, **settings), clock=lambda: NOW)
        self.calls, self.also_scope = calls, also_scope

    def assess(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("assess")
        asked = super().assess(*args, **kwargs)
        return asked if self.also_scope is None else dataclasses.replace(asked, plan_scope=self.also_scope)

    def decide(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("decide")
        return super().decide(*args, **kwargs)


class RecordingPlanner(Planner):
    calls: list[str] = []

    def __call__(self, *args):  # type: ignore[no-untyped-def]
        type(self).calls.append("plan scope")
        return super().__call__(*args)

    def for_pending(self, *args):  # type: ignore[no-untyped-def]
        type(self).calls.append("plan pending")
        return super().for_pending(*args)


def test_the_engine_asks_the_planner_plans_the_engine_decides_in_one_direction():
    """advise() runs the engine's assessment, then the planner on each plan it asks for, then
    the engine's decision with all of them in hand: the engine is never asked between plans."""
    calls: list[str] = []
    RecordingPlanner.calls = calls
    # the queue's head blocked by fragments: its plan alone
    snapshot = fragmented((WHOLE,))
    rep = report_of(snapshot)
    pending = advise(RecordingAdvisor(calls), snapshot, rep, RecordingPlanner())
    assert calls == ["assess", "plan pending", "decide"]
    assert pending.decision == "compact" and pending.plan is not None
    assert pending.plan.lets_start == ("train-1",)
    # the index rule alone: the scope's plan alone
    calls.clear()
    index = advise(RecordingAdvisor(calls, require_pending=False), fragmented(), report_of(fragmented()),
                   RecordingPlanner())
    assert calls == ["assess", "plan scope", "decide"]
    assert index.decision == "compact" and index.scope == "cluster"
    # neither: nothing planned
    calls.clear()
    assert advise(RecordingAdvisor(calls), fragmented(), report_of(fragmented()),
                  RecordingPlanner()).decision == "hold"
    assert calls == ["assess", "decide"]
    # both asked for (the rules as they stand never ask both at once: a pending job makes the
    # queue known, and then the index plans nothing): both are planned, and the pending job's
    # plan, which pays, is proposed as when it was the only one
    calls.clear()
    both = advise(RecordingAdvisor(calls, also_scope="cluster"), snapshot, rep, RecordingPlanner())
    assert calls == ["assess", "plan pending", "plan scope", "decide"]
    assert both == pending
    # and when the pending job's plan does not pay, the scope's plan is judged
    calls.clear()
    strict = RecordingAdvisor(calls, also_scope="cluster", min_recovered_per_migration=1000.0)
    held = advise(strict, snapshot, rep, RecordingPlanner())
    assert calls == ["assess", "plan pending", "plan scope", "decide"]
    assert held.decision == "hold" and held.scope == "cluster" and held.plan is None
    assert held.reasons == (
        "cluster index 59 > 50 for 0 s",
        "plan recovers 7.2 fragmented GPUs with 1 migrations (7.20 per migration < 1000)",
        "plan lets pending job train-1 (8 GPUs) start with 1 migrations (8.00 GPUs per migration < 1000)")
