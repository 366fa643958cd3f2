"""The placement engine on small hand-built clusters: each policy's node and GPUs, worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis import fgd
from exporter.analysis.index import evaluate, scorer, totals
from exporter.analysis.state import build, from_snapshot
from exporter.analysis.workload import Shape, Workload
from exporter.gpu_catalogue import GB
from exporter.placement.engine import Placer, place_all
from exporter.placement.policies import FgdTies
from exporter.placement.task import Task
from exporter.policy_names import POLICIES
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, Node, Placement

# The target workload of the fractional cases: whole GPUs and half GPUs, equally often.
HALVES = Workload((Shape(1, 1.0, 1), Shape(1, 0.5, 1)), (0.5, 0.5))
HALF = Task(cpus=1, gpus=1, gpu_share=0.5)


def half_cluster():
    """n0 empty; n1 a 0.75 GPU left; n2 a half GPU and a whole one; n3 two quarters (too small).

    F_n growth of the half-GPU task, with HALVES (W whole, H half, weight 1/2 each):
    n0 either GPU: [0.5, 1]: W's fragment 0.5 -> +0.25.
    n1: [0.25, 0]: before W can't (0.375), H fits (0) = 0.375; after 0.125 + 0.125 -> -0.125.
    n2 slot 0: [0, 1]: before W leaves 0.5 (0.25) = 0.25; after 0 -> -0.25 (the least).
    n2 slot 1: [0.5, 0.5]: W can't: 0.5 -> +0.25.
    """
    return build(["n0", "n1", "n2", "n3"], ["A"] * 4, ["p"] * 4, [32] * 4, [32] * 4,
                 [[1, 1], [0.75, 0], [0.5, 1], [0.25, 0.25]])


def test_fgd_takes_the_choice_where_fragmentation_grows_least():
    state = half_cluster()
    placer = Placer(state, HALVES)
    found = placer.place(HALF, "fgd")
    assert (found.node_name, found.slots, found.gpus) == ("n2", (0,), (0,))
    assert (found.gpu_share, found.cpus) == (0.5, 1)
    cw = fgd.compile_workload(HALVES, state.model_names)
    before = fgd.node_fragmentation(state, cw)
    placer.apply(found)
    after = fgd.node_fragmentation(placer.state, cw)
    assert after.sum() - before.sum() == pytest.approx(-0.25)


def test_bestfit_leaves_the_least_free_and_dotprod_the_least_overlap():
    state = half_cluster()
    # bestfit: GPU left after placing is 1.5, 0.25, 1.0 (CPU equal) -> n1
    assert Placer(state).place(HALF, "bestfit").node_name == "n1"
    # dotprod: free GPUs 2, 0.75, 1.5 times the same request -> n1 has the smallest product
    assert Placer(state).place(HALF, "dotprod").node_name == "n1"


def test_packing_prefers_the_fullest_shared_gpu():
    # n1's GPU has 0.75 free, n2's shared one 0.5: the reference scores 100 - 7 and 100 - 5
    found = Placer(half_cluster()).place(HALF, "packing")
    assert (found.node_name, found.slots) == ("n2", (0,))


def cpu_cluster():
    """Whole-GPU nodes that differ in free CPU and GPUs (largest node: 64 cores, 4 GPUs)."""
    return build(["a", "b", "c"], ["A"] * 3, ["p"] * 3, [64, 64, 64], [64, 12, 64],
                 [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]])


def test_whole_gpu_policies_on_cpu_and_gpu_differences():
    task = Task(cpus=8, gpus=1)
    state = cpu_cluster()
    # bestfit, 0.5 * CPU left / 64 + 0.5 * GPUs left / 4: a 0.8125, b 0.40625, c 0.4375
    assert Placer(state).place(task, "bestfit").node_name == "b"
    # dotprod, CPU free / 64 * 8 / 64 + GPUs free / 4 * 1 / 4: a 0.375, b 0.273, c 0.1875
    assert Placer(state).place(task, "dotprod").node_name == "c"
    # packing: c is in use (fresh GPUs on a used node) before the empty a and b
    found = Placer(state).place(task, "packing")
    assert (found.node_name, found.slots) == ("c", (0,))


def test_packing_order_shared_then_used_node_then_smallest_empty_node():
    state = build(["big", "small", "used", "shared"], ["A"] * 4, ["p"] * 4, [32] * 4, [32] * 4,
                  [[1] * 8, [1, 1], [1, 0, 0, 0], [1, 0.6, 0, 0]])
    assert Placer(state).place(HALF, "packing").node_name == "shared"
    whole = Task(cpus=1, gpus=1)
    # used and shared both give one fresh GPU of a node in use: the first of them
    assert Placer(state).place(whole, "packing").node_name == "used"
    two = Task(cpus=1, gpus=2)
    # only the empty nodes have two whole GPUs; the one with fewer GPUs goes first
    assert Placer(state).place(two, "packing").node_name == "small"


def test_whole_gpu_tasks_take_fully_free_gpus_in_slot_order():
    state = build(["n"], ["A"], ["p"], [32], [32], [[0.5, 1, 0, 1, 1]])
    found = Placer(state).place(Task(cpus=2, gpus=2), "bestfit")
    assert found.slots == (1, 3)
    assert Placer(state).place(Task(cpus=2, gpus=4), "bestfit") is None


def test_fractional_tasks_take_the_smallest_gpu_they_fit_on():
    state = build(["n"], ["A"], ["p"], [32], [32], [[1, 0.6, 0.3, 0.5]])
    for policy in ("bestfit", "packing", "dotprod"):
        assert Placer(state).place(HALF, policy).slots == (3,), policy
    # two fractional GPUs: the two tightest that fit
    assert Placer(state).place(Task(cpus=1, gpus=2, gpu_share=0.5), "bestfit").slots == (3, 1)


def test_random_policy_picks_any_fitting_node_and_gpu():
    state = half_cluster()
    rng = np.random.default_rng(5)
    seen = set()
    for _ in range(200):
        found = Placer(state).place(HALF, "random", rng)
        row = state.gpu_free[found.node]
        assert row[found.slots[0]] >= 0.5
        seen.add((found.node_name, found.slots))
    # every GPU with half a GPU free, and never n3
    assert seen == {("n0", (0,)), ("n0", (1,)), ("n1", (0,)), ("n2", (0,)), ("n2", (1,))}
    with pytest.raises(ValueError, match="random generator"):
        Placer(state).place(HALF, "random")


def test_ties_go_to_the_first_node():
    state = build(["x", "y", "z"], ["A"] * 3, ["p"] * 3, [16] * 3, [16] * 3, [[1, 1]] * 3)
    for policy in ("fgd", "bestfit", "packing", "dotprod"):
        assert Placer(state, HALVES).place(Task(cpus=1, gpus=1), policy).node_name == "x", policy


def test_fgd_near_ties_go_to_the_fuller_node():
    """x: 16 cores, two free GPUs; y: 8 cores, a free GPU and a half. A whole-GPU task on y leaves
    7 cores, too few for the workload's 8-core shape, so F on y grows by that shape's weight x 0.5
    GPU; on x it does not grow. Within the near-tie band (0.02 GPU here) the fuller node, y, wins."""
    state = build(["x", "y"], ["A", "A"], ["p", "p"], [16, 16], [16, 8], [[1, 1], [1, 0.5]])
    task = Task(cpus=1, gpus=1)
    near = Workload((Shape(1, 0.5, 1), Shape(8, 0.5, 1)), (0.98, 0.02))  # y grows F by 0.01
    assert Placer(state, near).place(task, "fgd").node_name == "y"
    assert Placer(state, near, fgd_ties=FgdTies(0.0, 0.0, "first")).place(task, "fgd").node_name == "x"
    assert Placer(state, near, fgd_ties=FgdTies(0.0, 0.0, "fuller")).place(task, "fgd").node_name == "x"
    far = Workload((Shape(1, 0.5, 1), Shape(8, 0.5, 1)), (0.5, 0.5))  # y grows F by 0.25
    assert Placer(state, far).place(task, "fgd").node_name == "x"
    # exact ties (both grow F by 0): the fuller node by default, the first one as defined
    even = build(["x", "y"], ["A", "A"], ["p", "p"], [16, 16], [16, 16], [[1, 1], [1, 0]])
    whole = Workload((Shape(1, 1.0, 1),), (1.0,))
    assert Placer(even, whole).place(task, "fgd").node_name == "y"
    assert Placer(even, whole, fgd_ties=FgdTies(0.0, 0.0, "first")).place(task, "fgd").node_name == "x"
    with pytest.raises(ValueError, match="second must be one of fuller, first"):
        FgdTies(second="nearest")


def test_cpu_only_and_cpu_limits():
    state = build(["a", "b"], ["A", "A"], ["p", "p"], [16, 16], [3, 10], [[1], [1]])
    cpu_task = Task(cpus=4)
    assert Placer(state).place(cpu_task, "bestfit").node_name == "b"  # a has 3 cores free
    found = Placer(state, HALVES).place(cpu_task, "fgd")
    assert (found.node_name, found.slots, found.gpus, found.gpu_share) == ("b", (), (), 0.0)
    assert Placer(state).place(Task(cpus=11), "bestfit") is None


def test_fgd_moves_cpu_only_tasks_off_nodes_whose_gpus_they_would_strand():
    # a: 10 cores and a free GPU the workload's 8-core task can use; b: same but no free GPU.
    # Taking 4 cores on a strands its GPU (F_n grows by 1); on b it changes nothing.
    workload = Workload((Shape(8, 1.0, 1),), (1.0,))
    state = build(["a", "b"], ["A", "A"], ["p", "p"], [16, 16], [10, 10], [[1], [0]])
    assert Placer(state, workload).place(Task(cpus=4), "fgd").node_name == "b"


def test_models_restrict_the_nodes():
    state = build(["v", "t"], ["V100M32", "T4"], ["v", "t"], [32, 32], [32, 32], [[1], [0.5]])
    found = Placer(state).place(Task(cpus=1, gpus=1, gpu_share=0.5, models=("V100M32",)), "bestfit")
    assert found.node_name == "v"  # t is tighter, but the task may not use a T4
    assert Placer(state).place(Task(cpus=1, gpus=1, models=("A100",)), "bestfit") is None


def tier_fleet(models=("A100-80GB", "H100", "H200", "B200")):
    return build([m.lower() for m in models], list(models), list(models), [128] * len(models),
                 [128] * len(models), [[1] * 8] * len(models))


@pytest.mark.parametrize(("need_gb", "node"), [
    (150, "b200"), (120.5, "b200"), (120, "h200"), (100, "h200"), (80.5, "h200"), (80, "h100"),
    (40, "h100"), (39, "a100-80gb"), (10, "a100-80gb"),
])
def test_tiered_picks_the_model_by_memory_need(need_gb, node):
    task = Task(cpus=8, gpus=1, gpu_memory_need_bytes=int(need_gb * GB))
    assert Placer(tier_fleet(), HALVES).place(task, "tiered").node_name == node


def test_tiered_under_40_gb_uses_fgd_between_a100_and_h100():
    # the A100 node is full, so fgd's choice among the tier's models is the H100
    state = build(["a100", "h100", "h200"], ["A100-80GB", "H100", "H200"], ["a", "h", "g"],
                  [64] * 3, [64] * 3, [[0, 0], [1, 1], [1, 1]])
    task = Task(cpus=1, gpus=1, gpu_memory_need_bytes=20 * GB)
    assert Placer(state, HALVES).place(task, "tiered").node_name == "h100"
    # 60 GB may only go to H100
    state = build(["a100", "h100"], ["A100-80GB", "H100"], ["a", "h"], [64] * 2, [64] * 2, [[1], [0]])
    assert Placer(state, HALVES).place(Task(cpus=1, gpus=1, gpu_memory_need_bytes=60 * GB), "tiered") is None


def test_tiered_without_a_need_is_fgd_and_a_missing_tier_moves_up():
    state = tier_fleet()
    plain = Task(cpus=8, gpus=1)
    assert Placer(state, HALVES).place(plain, "tiered") == Placer(state, HALVES).place(plain, "fgd")
    no_h200 = tier_fleet(("A100-80GB", "H100", "B200"))
    task = Task(cpus=8, gpus=1, gpu_memory_need_bytes=100 * GB)
    assert Placer(no_h200, HALVES).place(task, "tiered").node_name == "b200"
    # the rule is strict where the tier exists: a full H200 tier does not spill into B200,
    # and a 100 GB job that names only B200 fits nowhere
    full_h200 = build(["h200", "b200"], ["H200", "B200"], ["g", "b"], [64] * 2, [64] * 2, [[0], [1]])
    assert Placer(full_h200, HALVES).place(task, "tiered") is None
    limited = Task(cpus=8, gpus=1, models=("B200",), gpu_memory_need_bytes=100 * GB)
    assert Placer(tier_fleet(), HALVES).place(limited, "tiered") is None


def test_tiered_matches_node_models_through_the_catalogue():
    # the simulated fleet's MIG nodes are "A100-80GB MIG": still the A100 tier
    state = build(["mig"], ["A100-80GB MIG"], ["a"], [64], [64], [[1, 1]])
    task = Task(cpus=1, gpus=1, gpu_share=0.5, models=("A100-80GB MIG",), gpu_memory_need_bytes=10 * GB)
    assert Placer(state, HALVES).place(task, "tiered").node_name == "mig"


def test_apply_and_release_are_inverse_and_check_room():
    state = half_cluster()
    placer = Placer(state, HALVES)
    found = placer.place(HALF, "fgd")
    placer.apply(found)
    held = placer.state
    assert held.gpu_free[2].tolist() == [0.0, 1.0]
    assert held.cpu_free[2] == 31
    assert state.gpu_free[2].tolist() == [0.5, 1.0]  # the input state is untouched
    with pytest.raises(ValueError, match="no longer fits"):
        placer.apply(found)
    placer.release(found)
    back = placer.state
    np.testing.assert_allclose(back.gpu_free, state.gpu_free)
    np.testing.assert_allclose(back.cpu_free, state.cpu_free)


def test_placements_report_real_gpu_indices_when_a_gpu_is_down():
    nodes = (Node("n", "H100", 64, "p", "hopper", 4),)
    gpus = tuple(Gpu("n", i, f"u{i}", "H100", "p", up=(i != 0)) for i in range(4))
    alloc = Allocation("j", (Placement("n", (1,), 1.0, 8),))
    state = from_snapshot(FleetSnapshot(0.0, nodes, gpus, (alloc,)))
    found = Placer(state).place(Task(cpus=1, gpus=2), "bestfit")
    assert found.slots == (1, 2)  # slots 0..2 are GPUs 1..3
    assert found.gpus == (2, 3)
    # the running job's part, as a task the advisor could re-place
    assert Task.from_allocation(alloc, alloc.placements[0]) == Task(8, 1, 1.0, (), None)


def test_bad_requests_fail_clearly():
    state = half_cluster()
    with pytest.raises(ValueError, match="unknown placement policy 'worst'"):
        Placer(state).place(HALF, "worst")
    with pytest.raises(ValueError, match="needs a target workload"):
        Placer(state).place(HALF, "fgd")
    with pytest.raises(ValueError, match="gpu_share"):
        Task(cpus=1, gpus=1, gpu_share=1.5)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_placer_remembers_choices_yet_places_as_a_fresh_engine_would(policy):
    """The per-shape cache must never change a decision: compare with a fresh engine each time."""
    rng = np.random.default_rng(3)
    cpus = rng.choice([8, 16, 32], 12)
    free = [list(rng.choice([0.0, 0.25, 0.5, 1.0], 4)) for _ in range(12)]
    state = build([f"n{i:02d}" for i in range(12)], ["A", "B"] * 6, ["p"] * 12, [32] * 12, cpus, free)
    shapes = [Task(2, 1, 0.25), Task(4, 1), Task(1, 1, 0.5), Task(3), Task(8, 2), Task(2, 2, 0.25),
              Task(1, 1, 0.5, ("B",))]
    tasks = [shapes[i] for i in rng.integers(len(shapes), size=60)]
    placer = Placer(state, HALVES)
    fresh = state
    draws_a, draws_b = np.random.default_rng(9), np.random.default_rng(9)
    for task in tasks:
        cached = placer.place(task, policy, draws_a)
        engine = Placer(fresh, HALVES)  # nothing remembered
        expected = engine.place(task, policy, draws_b)
        assert cached == expected
        if cached is not None:
            placer.apply(cached)
            engine.apply(expected)
            fresh = engine.state
    np.testing.assert_allclose(placer.state.gpu_free, fresh.gpu_free)
    cw = fgd.compile_workload(HALVES, state.model_names)
    np.testing.assert_allclose(placer.node_fragmented, fgd.node_fragmentation(fresh, cw))


def test_place_all_counts_what_fits_nowhere():
    state = build(["n"], ["A"], ["p"], [4], [4], [[1, 1]])
    final, failed = place_all(state, [Task(1, 1)] * 3 + [Task(8)], "bestfit")
    assert failed == 2
    assert final.gpu_free[0].tolist() == [0.0, 0.0]
    assert final.cpu_free[0] == 2


def test_host_memory_filters_when_the_placer_knows_it():
    # bestfit would take n0 (least left), but the task's 40 GiB only fit n1's memory
    state = build(["n0", "n1"], ["A", "A"], ["p", "p"], [16, 16], [16, 16], [[1], [1, 1]])
    task = Task(cpus=2, gpus=1, host_memory_bytes=40 * 2**30)
    placer = Placer(state, host_memory=[32 * 2**30, 64 * 2**30])
    found = placer.place(task, "bestfit")
    assert (found.node_name, found.host_memory_bytes) == ("n1", 40 * 2**30)
    placer.apply(found)
    assert placer.memory_free.tolist() == [32 * 2**30, 24 * 2**30]
    assert placer.place(task, "bestfit") is None  # n1 now has 24 GiB left
    placer.release(found)
    assert placer.memory_free.tolist() == [32 * 2**30, 64 * 2**30]
    # without node memory, memory is not checked
    assert Placer(state).place(task, "bestfit").node_name == "n0"


def test_one_node_changes_keep_the_placers_fragmentation_equal_to_a_full_recompute():
    """What the simulated fleet does between placements (set_node), checked against evaluate()."""
    rng = np.random.default_rng(9)
    rows = [list(rng.choice([0.0, 0.5, 1.0], size=8)) for _ in range(40)]
    state = build([f"n{i}" for i in range(40)], ["H100"] * 20 + ["H200"] * 20,
                  ["p1"] * 20 + ["p2"] * 20, [64.0] * 40, list(rng.uniform(0, 64, 40)), rows)
    workload = Workload((Shape(8, 1.0, 1), Shape(4, 0.5, 1), Shape(32, 1.0, 4), Shape(1, 0, 0)),
                        (0.5, 0.2, 0.2, 0.1))
    compiled = fgd.compile_workload(workload, state.model_names)
    score = scorer(state)
    placer = Placer(state, compiled)
    for node in (3, 25, 3):
        now = placer.state
        new_row = np.clip(now.gpu_free[node] - rng.choice([0.0, 0.5, 1.0], size=8), 0, 1)
        placer.set_node(node, float(now.cpu_free[node]) - 4, new_row)
        now = placer.state
        fresh = totals(now, compiled)
        assert placer.node_fragmented == pytest.approx(fgd.node_fragmentation(now, compiled))
        assert placer.fragmented_gpus == pytest.approx(fresh.cluster_fragmented)
        assert placer.idle_gpus == pytest.approx(fresh.cluster_idle)
        kept = totals(now, compiled, node_fragmented=placer.node_fragmented)
        assert kept.pool_fragmented == pytest.approx(fresh.pool_fragmented)
        cluster, pools, _ = score.scores(kept)
        report = evaluate(now, compiled)
        assert cluster == pytest.approx(report.cluster.index)
        assert pools == pytest.approx([p.index for p in report.pools])


def test_the_parts_of_a_multi_node_job_stay_on_one_nvlink_generation():
    """Issue 17: B200's NVLink 5 does not interconnect with Hopper's NVLink 4, so a gang's
    later parts go only where its first part's generation is (catalogue nvlink_generation)."""
    state = build(["b0", "b1", "h0", "x0"], ["B200", "B200", "H100", "H200"], ["p"] * 4,
                  [64.0] * 4, [64.0] * 4, [[1.0] * 8] * 4)
    gang = Task(8, 8, 1.0, ("B200", "H100", "H200"))
    placer = Placer(state)
    first = placer.place(gang, "bestfit")
    assert first is not None and first.node_name == "b0"  # name order: B200 first
    placer.apply(first)
    assert placer.place(gang, "bestfit").node_name == "b1"
    # Hopper parts (H100 and H200 are both NVLink 4) never land on a B200, and the reverse
    assert {placer.place(gang, p, np.random.default_rng(1), nvlink_generation=4).node_name
            for p in POLICIES if p not in ("fgd", "tiered", "lookahead")} <= {"h0", "x0"}
    second = placer.place(gang, "bestfit", nvlink_generation=5)
    assert second is not None and second.node_name == "b1"
    placer.apply(second)
    assert placer.place(gang, "bestfit", nvlink_generation=5) is None  # no B200 left: nowhere
    assert placer.place(gang, "bestfit", nvlink_generation=3) is None  # no Ampere here


def test_dotprod_scores_in_whole_points_as_the_reference_and_ties_go_to_the_first_node():
    """y's product is a hair smaller (127 free cores against 128), but both score
    int(100 * (1 - 0.1328 / 2)) = 93, so the first node wins, as in the reference simulator."""
    state = build(["x", "y"], ["A"] * 2, ["p"] * 2, [128, 128], [128, 127], [[1] * 8, [1] * 8])
    assert Placer(state).place(Task(cpus=1, gpus=1), "dotprod").node_name == "x"
    # a product several points smaller still wins: y has 4 of its 8 GPUs free
    state = build(["x", "y"], ["A"] * 2, ["p"] * 2, [128, 128], [128, 128], [[1] * 8, [1] * 4 + [0] * 4])
    assert Placer(state).place(Task(cpus=1, gpus=1), "dotprod").node_name == "y"


def test_room_after_moves_bounds_what_an_evacuation_can_free():
    from exporter.placement.engine import room_after_moves

    whole8 = Task(4, 8, 1.0)
    assert not room_after_moves(3.0, [2.0, 1.0, 0.5], 1, whole8)  # 3 + 2 < 8
    assert not room_after_moves(3.0, [2.0, 1.0, 0.5], 3, whole8)  # 3 + 3.5 < 8, all of them
    assert room_after_moves(6.0, [0.5, 2.0, 1.0], 1, whole8)  # the largest first: 6 + 2
    assert not room_after_moves(5.0, [0.5, 2.0, 1.0], 1, whole8)
    assert room_after_moves(8.0, [], 0, whole8)  # room already
    half = Task(1, 1, 0.5)
    assert room_after_moves(0.25, [0.25], 1, half) and not room_after_moves(0.25, [0.25], 0, half)
