"""The planner on hand-built fleets: verified destinations, constraints never broken."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.advisor.engine import nvlink_generations
from exporter.advisor.planner import PlanSettings, apply_plan, candidates, plan_compaction
from exporter.advisor.right_sizing import right_sizing
from exporter.advisor.wire import plan_json, right_sizing_json
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import IndexSettings, evaluate
from exporter.analysis.state import from_snapshot
from exporter.analysis.workload import Shape, Workload
from exporter.gpu_catalogue import GB, default_catalogue
from exporter.placement.task import Task
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, MigInstance, Node, Placement
from exporter.sources.slurm.parse import node_threads, parse_sinfo_json, parse_squeue_json, to_snapshot

NOW = 1_760_000_000.0
SCHEMA = json.loads((Path(__file__).parent.parent / "docs" / "advisor-plan.schema.json").read_text())
# an 8-GPU job is what fragmentation keeps from starting; single GPUs fit anywhere
WORKLOAD = Workload((Shape(8, 1.0, 8), Shape(4, 1.0, 1)), (0.5, 0.5))


def fleet(spec: dict[str, tuple[str, str]], jobs: list[Allocation], cpus: float = 128) -> FleetSnapshot:
    """``spec``: node -> (model, pool); 8 GPUs each."""
    nodes = tuple(Node(name, model, cpus, pool, "hopper", 8) for name, (model, pool) in spec.items())
    gpus = tuple(Gpu(name, i, f"GPU-{name}-{i}", model, pool)
                 for name, (model, pool) in spec.items() for i in range(8))
    return FleetSnapshot(NOW, nodes, gpus, tuple(jobs))


def job(name: str, node: str, gpus: tuple[int, ...], *, share: float = 1.0, need_gb: float | None = 30,
        age: float = 7200, priority: int = 10, namespace: str = "team", models: tuple[str, ...] = (),
        checkpoint_age: float | None = 300.0, extra: tuple[Placement, ...] = ()) -> Allocation:
    return Allocation(
        job=name, placements=(Placement(node, gpus, share, 4.0 * len(gpus)), *extra),
        namespace=namespace, pod=f"{name}-0", priority=priority, start_time=NOW - age,
        last_checkpoint_time=None if checkpoint_age is None else NOW - checkpoint_age,
        gpu_memory_need_bytes=None if need_gb is None else int(need_gb * GB), allowed_models=models,
    )


def report_of(snapshot: FleetSnapshot, workload: Workload = WORKLOAD):
    state = from_snapshot(snapshot)
    return evaluate(state, compile_workload(workload, state.model_names), IndexSettings())


def plan(snapshot: FleetSnapshot, scope: str = "cluster", **kw):
    return plan_compaction(snapshot, report_of(snapshot), scope, NOW, PlanSettings(**kw))


def test_frees_a_whole_node_by_moving_two_small_jobs():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    # h1: two stray one-GPU jobs; h2: six GPUs busy, two free for them
    snapshot = fleet(spec, [job("small-a", "h1", (0,)), job("small-b", "h1", (5,)),
                            job("big", "h2", (0, 1, 2, 3, 4, 5), need_gb=60)])
    result = plan(snapshot)
    moves = {(m.job, m.source.node, m.destination.node) for m in result.migrations}
    assert moves == {("small-a", "h1", "h2"), ("small-b", "h1", "h2")}
    assert sorted(g for m in result.migrations for g in m.destination.gpus) == [6, 7]
    assert result.nodes_freed == {"gpu-h100": 1}
    assert result.after.fragmented_gpus < result.before.fragmented_gpus
    assert all(m.action == "checkpoint_then_migrate" for m in result.migrations)
    jsonschema.validate(plan_json(result), SCHEMA)


def test_a_candidate_is_re_placed_as_its_part_on_its_tiers_models():
    spec = {"a": ("A100-80GB", "gpu-a100"), "h": ("H100", "gpu-h100"), "g": ("H200", "gpu-h200")}
    snapshot = fleet(spec, [job("half", "h", (3,), share=0.5, need_gb=30, models=("H100", "H200"))])
    state = from_snapshot(snapshot)
    (c,) = candidates(snapshot, state, NOW, PlanSettings())[state.names.index("h")]
    # 4 cores, one half GPU, 30 GB: the under-40 GB tier is A100 and H100; the job allows H100
    assert c.task == Task(4.0, 1, 0.5, ("H100",), 30 * GB)


def test_no_move_without_a_destination():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    # h2 is full: the stray jobs on h1 have nowhere to go
    snapshot = fleet(spec, [job("small-a", "h1", (0,)), job("small-b", "h1", (5,)),
                            job("big", "h2", tuple(range(8)), need_gb=60)])
    result = plan(snapshot)
    assert result.migrations == ()
    assert result.after == result.before


def test_never_to_a_model_the_memory_need_forbids():
    spec = {"h1": ("H100", "gpu-h100"), "a1": ("A100-80GB", "gpu-a100")}
    # a 60 GB job may only use H100 (40-80 GB tier); the A100 node is empty and inviting
    snapshot = fleet(spec, [job("needs-h100", "h1", (3,), need_gb=60)])
    assert plan(snapshot).migrations == ()
    # a 30 GB job may use A100 or H100: moving it empties nothing here either (both nodes stay
    # partly used), but its destination would be allowed; a 130 GB job only fits B200
    spec = {"b1": ("B200", "gpu-b200"), "b2": ("B200", "gpu-b200"), "h1": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("huge", "b1", (2,), need_gb=130),
                            job("fill", "b2", tuple(range(6)), need_gb=130)])
    result = plan(snapshot)
    for m in result.migrations:
        assert m.destination.node.startswith("b")


def test_allowed_models_list_applies():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100"), "h3": ("H200", "gpu-h200")}
    snapshot = fleet(spec, [job("pinned", "h1", (0,), need_gb=None),
                            job("fill", "h2", tuple(range(6)), need_gb=None)])
    result = plan(snapshot)
    assert [(m.job, m.destination.node) for m in result.migrations] == [("pinned", "h2")]


def with_mig(snapshot: FleetSnapshot, node: str) -> FleetSnapshot:
    """``node``'s GPUs in MIG mode, seven 1g.10gb slices each."""
    slices = tuple(MigInstance(i, "1g.10gb", 10 * GB) for i in range(7))
    gpus = tuple(dataclasses.replace(g, mig=slices) if g.node == node else g for g in snapshot.gpus)
    return dataclasses.replace(snapshot, gpus=gpus)


def test_never_onto_a_mig_gpu_or_into_another_pool():
    # the issue's move: a quarter-share pod off an H100 node onto a MIG-mode node of another pool
    spec = {"gpu-066": ("H100", "pool-a"), "gpu-128": ("A100-80GB", "pool-b"),
            "h2": ("H100", "pool-b"), "m1": ("H100", "pool-a")}
    jobs = [job("quarter", "gpu-066", (0,), share=0.25, need_gb=10),
            job("big", "gpu-128", tuple(range(6)), need_gb=60, priority=1000),
            job("half", "m1", (0,), share=0.5, priority=1000),
            job("half-b", "h2", (0,), share=0.5, priority=1000)]
    snapshot = with_mig(fleet(spec, jobs), "m1")
    assert plan(snapshot).migrations == ()
    # without MIG, m1 (same pool) takes it; h2 and gpu-128 (pool-b) never do
    (move,) = plan(fleet(spec, jobs)).migrations
    assert (move.job, move.destination.node) == ("quarter", "m1")


def test_misplaced_on_the_real_slurm_samples():
    # data/slurm-samples job 4, --gres=gpu:h100:1, as if its comment said 100Gi
    from tests.test_slurm_parse import MODELS, sample

    data = json.loads(sample("squeue.json"))
    for j in data["jobs"]:
        if j["job_id"] == 4:
            j["comment"] = "gpu-memory-required=100Gi"
    nodes = parse_sinfo_json(sample("sinfo.json"))
    snapshot = to_snapshot(NOW, nodes, parse_squeue_json(json.dumps(data), node_threads(nodes)),
                           MODELS, default_catalogue())
    (wrong,) = plan(snapshot).tier_misplacements
    assert (wrong.job, wrong.node, wrong.model, wrong.memory_need_gb) == ("4", "gpu-005", "H100", 107.4)
    # it allows only H100 (its GRES type), so no model of this fleet is suitable for it
    assert wrong.suitable_models == ()
    assert wrong.reason == "needs 107 GB per GPU, more than H100's 80 GB; fits no model here"


def test_real_slurm_jobs_are_movable_with_default_settings():
    """Slurm's own priorities (4294901759 and down under priority/basic) order its queue:
    read as importance, every job was above advisor.high_priority (1000) and none moved.
    The source maps the QOS instead: the samples' jobs have none (no accounting), so 0."""
    from tests.test_slurm_parse import MODELS, sample

    data = json.loads(sample("squeue.json"))
    for j in data["jobs"]:
        if j["job_id"] == 7:
            j["qos"] = "high"
    nodes = parse_sinfo_json(sample("sinfo.json"))
    jobs = parse_squeue_json(json.dumps(data), node_threads(nodes))
    assert jobs[0].priority == 4294901759  # Slurm's number is still read, not used
    later = 1795961057.0 + 3600  # an hour after the samples' jobs started
    snapshot = to_snapshot(later, nodes, jobs, MODELS, default_catalogue())
    assert {a.job: a.priority for a in snapshot.allocations} == \
        {"1": 0, "2": 0, "3": 0, "4": 0, "5": 0, "6": 0, "7": 1000, "8": 0}
    movable = candidates(snapshot, from_snapshot(snapshot), later, PlanSettings())
    assert sorted(c.alloc.job for node in movable.values() for c in node) == \
        ["1", "2", "3", "4", "6"]  # 5 and 8 span two nodes; 7 is QOS high
    # a site's own QOS names
    mapped = to_snapshot(later, nodes, jobs, MODELS, default_catalogue(), {"urgent": 5000})
    assert {a.priority for a in mapped.allocations} == {0}


def test_right_sizing_lists_jobs_whose_declared_and_measured_need_fit_a_lower_tier():
    spec = {"x1": ("H200", "gpu-h200"), "x2": ("H200", "gpu-h200"), "a1": ("H100", "gpu-h100")}
    jobs = [job("small", "x1", (0, 1), need_gb=30, age=7200),  # 2 GPUs for 2 h
            job("used-more", "x1", (2,), need_gb=30),  # declares 30 GB, was seen using 100
            job("silent", "x1", (3,), need_gb=None),  # declares nothing: never on a peak alone
            job("fits", "x1", (4, 5, 6, 7), need_gb=100),
            job("thrifty", "a1", (0,), need_gb=30)]  # already on the lowest tier it fits
    peaks = {"small": 28 * GB, "used-more": 100 * GB, "silent": 10 * GB}
    calm = fleet(spec, jobs)  # gpu-h200 is half allocated, nothing waits: no pressure
    assert right_sizing(calm, report_of(calm), peaks, NOW) == ()
    waiting = dataclasses.replace(calm, pending=(JobRequest("big", 8, pool="gpu-h200"),))
    (entry,) = right_sizing(waiting, report_of(waiting), peaks, NOW)
    assert right_sizing_json(entry) == {
        "job": "small", "namespace": "team", "account": "", "pool": "gpu-h200", "model": "H200",
        "gpus": 2.0, "declared_need_gb": 30.0, "measured_peak_gb": 28.0,
        "suitable_models": ["H100"], "gpu_hours_held": 4.0, "action": "right_size",
        "reason": "needs 30 GB per GPU (declared 30, measured peak 28), fits H100; holds 2 H200 "
                  "GPUs in pool gpu-h200 under pressure (4 GPU-hours so far); never moved "
                  "automatically"}
    # not measured (no telemetry): the declared need alone, and it says so; "used-more" is
    # listed too then, as nothing shows it uses more than it declares
    unmeasured = right_sizing(waiting, report_of(waiting), {}, NOW)
    assert [(e.job, e.measured_peak_gb, e.gpu_hours_held) for e in unmeasured] == \
        [("small", None, 4.0), ("used-more", None, 2.0)]
    assert "(declared 30, not measured)" in unmeasured[0].reason


def test_multi_node_jobs_are_never_split_or_moved():
    spec = {f"n{i}": ("H100", "gpu-h100") for i in range(3)}
    gang = job("gang", "n0", (0, 1), extra=(Placement("n1", (0, 1), 1.0, 8.0),))
    snapshot = fleet(spec, [gang, job("fill", "n2", tuple(range(4)))])
    result = plan(snapshot)
    assert "gang" not in {m.job for m in result.migrations}


def test_young_job_waits_until_it_is_30_minutes_old():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("young", "h1", (0,), age=1200),
                            job("big", "h2", tuple(range(6)), need_gb=60)])
    result = plan(snapshot)
    (move,) = result.migrations
    assert move.job == "young" and move.action == "wait_until"
    assert move.wait_until == NOW - 1200 + 1800
    assert move.wait_until <= result.expires_at


def test_a_job_too_young_to_move_before_the_plan_expires_is_deferred():
    # the issue's plan: 5 young jobs whose waits all ended 869 s after expires_at
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("young", "h1", (0,), age=31),
                            job("big", "h2", tuple(range(6)), need_gb=60, priority=1000)])
    result = plan(snapshot)
    assert result.migrations == ()
    assert result.reasons[1] == ("1 job younger than 30 min could not move before the plan "
                                 "expires (15 min): left to a later plan")
    # a longer validity lets the same wait into the plan
    (move,) = plan(snapshot, ttl_seconds=1800).migrations
    assert move.action == "wait_until" and move.wait_until == NOW - 31 + 1800


def test_high_priority_job_stays_put_unless_configured():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("vip", "h1", (0,), priority=1000),
                            job("big", "h2", tuple(range(6)), need_gb=60, priority=1000)])
    assert plan(snapshot).migrations == ()
    assert "vip" in [m.job for m in plan(snapshot, move_high_priority=True).migrations]


def test_budgets_cap_migrations():
    spec = {f"h{i}": ("H100", "gpu-h100") for i in range(4)}
    jobs = [job(f"s{i}", f"h{i}", (0,), namespace="ns") for i in range(3)]
    jobs.append(job("big", "h3", tuple(range(4)), need_gb=60))
    snapshot = fleet(spec, jobs)
    assert len(plan(snapshot).migrations) == 3
    assert len(plan(snapshot, max_migrations=2).migrations) <= 2
    assert len([m for m in plan(snapshot, max_per_namespace=1).migrations if m.namespace == "ns"]) <= 1


def test_a_job_stating_no_checkpoint_is_taken_to_checkpoint_every_interval():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("train", "h1", (0, 1), checkpoint_age=None, age=4000),
                            job("big", "h2", tuple(range(6)), need_gb=60)])
    (move,) = plan(snapshot).migrations
    # 4000 s in, checkpoints every 900 s: the last at 3600 s, 400 s of work on 2 GPUs lost
    assert move.action == "checkpoint_then_migrate" and move.cost_gpu_seconds == 800.0


def test_a_stated_checkpoint_wins_over_the_interval():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("train", "h1", (0,), checkpoint_age=600, age=4000),
                            job("big", "h2", tuple(range(6)), need_gb=60)])
    (move,) = plan(snapshot).migrations
    assert move.action == "checkpoint_then_migrate" and move.cost_gpu_seconds == 600.0


def test_never_checkpointing_job_migrates_and_costs_work_since_start():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("svc", "h1", (0,), checkpoint_age=None, age=3600),
                            job("big", "h2", tuple(range(6)), need_gb=60)])
    (move,) = plan(snapshot, checkpoint_interval_seconds=0).migrations
    assert move.action == "migrate" and move.cost_gpu_seconds == 3600.0


def test_plan_id_is_stable_for_the_same_plan():
    spec = {"h1": ("H100", "gpu-h100"), "h2": ("H100", "gpu-h100")}
    snapshot = fleet(spec, [job("a", "h1", (0,)), job("big", "h2", tuple(range(6)), need_gb=60)])
    assert plan(snapshot).plan_id == plan(snapshot).plan_id


def test_tier_misplacement_is_listed_under_pressure():
    spec = {"b1": ("B200", "gpu-b200"), "h1": ("H100", "gpu-h100")}
    jobs = [job("small-on-b200", "b1", tuple(range(8)), need_gb=30)]
    result = plan(fleet(spec, jobs))
    assert [m.job for m in result.tier_misplacements] == ["small-on-b200"]
    assert result.tier_misplacements[0].suitable_models == ("H100",)


# -- property: any plan, applied to its snapshot, is valid and lands where predicted ----------

# B200 shares gpu-h200 with H200 (a training partition of both): a pool over two NVLink generations
MODELS = [("H100", "gpu-h100"), ("H200", "gpu-h200"), ("A100-80GB", "gpu-a100"), ("B200", "gpu-h200")]


@st.composite
def random_fleets(draw):
    nodes = draw(st.integers(2, 7))
    spec = {f"n{i}": MODELS[draw(st.integers(0, 3))] for i in range(nodes)}
    free = {name: list(range(8)) for name in spec}
    jobs = []
    for j in range(draw(st.integers(0, 14))):
        node = draw(st.sampled_from(sorted(spec)))
        if not free[node]:
            continue
        count = draw(st.integers(1, min(4, len(free[node]))))
        gpus = tuple(free[node][:count])
        free[node] = free[node][count:]
        share = draw(st.sampled_from([1.0, 1.0, 0.5]))
        need = draw(st.sampled_from([None, 20, 30, 60, 100]))
        jobs.append(job(f"j{j}", node, gpus, share=share, need_gb=need,
                        age=draw(st.sampled_from([600, 7200])),
                        priority=draw(st.sampled_from([10, 10, 1000]))))
    # a two-node job on GPUs left free, on one generation or (as a scheduler might) two
    spare = [name for name in sorted(spec) if free[name]]
    if len(spare) >= 2 and draw(st.booleans()):
        a, b = spare[:2]
        jobs.append(job("gang", a, (free[a][0],), need_gb=100,
                        extra=(Placement(b, (free[b][0],), 1.0, 4.0),)))
    snapshot = fleet(spec, jobs, cpus=draw(st.sampled_from([32, 128])))
    for name in spec:
        if draw(st.integers(0, 5)) == 0:
            snapshot = with_mig(snapshot, name)
    return snapshot


def expected_models(need: int, fleet_models: set[str]) -> set[str]:
    """The reference tiers, written out: the need's own tier, or the next one up this fleet has;
    else the largest tier below whose GPUs hold the need (over capacity)."""
    tiers = [(40 * GB, False, {"A100-80GB", "A100", "H100"}), (80 * GB, True, {"H100"}),
             (120 * GB, True, {"H200"}), (float("inf"), True, {"B200"})]
    memory = {"A100-80GB": 80 * GB, "A100": 40 * GB, "H100": 80 * GB, "H200": 141 * GB,
              "B200": 192 * GB}
    first = next(i for i, (top, inclusive, _) in enumerate(tiers)
                 if need < top or (inclusive and need == top))
    for _, _, models in tiers[first:]:
        if models & fleet_models:
            return models & fleet_models
    for _, _, models in reversed(tiers[:first]):
        if holding := {m for m in models & fleet_models if memory[m] >= need}:
            return holding
    return set()


@given(random_fleets())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_applied_plans_are_valid_and_match_the_prediction(snapshot):
    result = plan(snapshot)
    assert result.after.fragmented_gpus <= result.before.fragmented_gpus + 1e-9
    data = plan_json(result)
    jsonschema.validate(data, SCHEMA) if result.migrations else None
    after = apply_plan(snapshot, result)
    held, cpus = after.held()
    assert all(v <= 1.0 + 1e-9 for v in held.values()), "a GPU over-allocated"
    assert all(used <= n.cpu_cores + 1e-9 for n in after.nodes for used in [cpus.get(n.name, 0)])
    nodes = after.node_map()
    mig = {g.node for g in snapshot.gpus if g.mig}
    for m in result.migrations:
        assert m.source.node not in mig and m.destination.node not in mig
        assert nodes[m.destination.node].pool == nodes[m.source.node].pool
        assert m.wait_until is None or m.wait_until <= result.expires_at
        alloc = next(a for a in after.allocations if a.job == m.job)
        assert len(alloc.placements) == 1
        assert alloc.priority < 1000
        model = nodes[m.destination.node].model
        need = alloc.gpu_memory_need_bytes
        if need is None:
            assert model == nodes[m.source.node].model
        else:
            assert model in expected_models(need, {n.model for n in after.nodes})
    measured = report_of(after).cluster.fragmented_gpus
    assert np.isclose(measured, result.after.fragmented_gpus, atol=1e-6)
    # no plan spreads a job over more NVLink generations than it had (issue 17)
    spans = {a.job: len(g) for a, g in nvlink_generations(snapshot)}
    assert {a.job: len(g) for a, g in nvlink_generations(after)} == spans


def test_assume_checkpointing_sets_the_interval_the_planner_and_metric_use():
    from exporter.advisor.advise import decision_settings, plan_settings
    from exporter.config import AdvisorConfig
    from exporter.options import Duration

    config = AdvisorConfig(checkpoint_interval=Duration(600))
    assert plan_settings(config).checkpoint_interval_seconds == 600
    assert decision_settings(config).checkpoint_interval_seconds == 600
    off = AdvisorConfig(checkpoint_interval=Duration(600), assume_checkpointing=False)
    assert plan_settings(off).checkpoint_interval_seconds == 0
    assert decision_settings(off).checkpoint_interval_seconds == 0
