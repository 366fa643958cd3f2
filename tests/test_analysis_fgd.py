"""The FGD measure: the reference simulator's check values, then our own cases.

Check values come from hkust-adsl/kubernetes-scheduler-simulator
``pkg/utils/frag_test.go`` (``TestNodeGpuShareFragAmount``,
``TestGetGpuFragMilliByNodeResAndPodRes``,
``TestNodeGpuShareFragAmountWithNonGpu``). It counts GPU shares in
thousandths; we count GPUs, so its 251.91 is our 0.25191.
"""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.fgd import (
    REASONS,
    breakdown,
    compile_workload,
    node_fragmentation,
    node_fragmentation_loop,
    one_node_fragmentation,
    shape_fragmentation,
)
from exporter.analysis.state import FleetState, build
from exporter.analysis.workload import Shape, Workload


def node(cpu_free: float, gpu_free: list[float], model: str = "1080", cpu_total: float = 64.0
         ) -> FleetState:
    return build(["n"], [model], ["p"], [cpu_total], [cpu_free], [gpu_free])


def frag(state: FleetState, workload: Workload) -> float:
    compiled = compile_workload(workload, state.model_names)
    value = float(node_fragmentation(state, compiled)[0])
    # the single-node path the placement engine uses must agree with the vectorised one
    single = one_node_fragmentation(float(state.cpu_free[0]), state.gpu_free[0],
                                    int(state.model[0]), compiled)
    assert single == pytest.approx(value, abs=1e-12)
    return value


def reasons(state: FleetState, workload: Workload) -> dict[str, float]:
    row = breakdown(state, compile_workload(workload, state.model_names))[0]
    return {r: round(float(v), 9) for r, v in zip(REASONS, row, strict=True)}


def one(shape: Shape, weight: float = 1.0) -> Workload:
    return Workload((shape,), (weight,))


# The reference's TestingGenerateGetTypicalPods: (milli CPU, milli GPU, GPUs, model), percent.
REFERENCE_TYPICAL = [
    (6000, 465, 1, "", 9.33), (8000, 440, 1, "2080", 9.15), (8000, 475, 1, "T4", 8.76),
    (8000, 440, 1, "P100", 8.72), (2000, 465, 1, "", 8.68), (12000, 900, 1, "", 8.65),
    (4000, 900, 1, "", 8.43), (16000, 678, 1, "T4", 8.36), (8000, 500, 1, "", 8.29),
    (6000, 511, 1, "", 8.11), (14000, 1000, 2, "2080", 0.54), (4000, 1000, 1, "2080", 0.43),
    (32000, 1000, 2, "T4", 0.43), (16000, 1000, 1, "V100M16", 0.40), (64000, 1000, 2, "", 0.40),
    (10000, 1000, 2, "", 0.40), (11400, 1000, 1, "T4", 0.36), (16000, 1000, 1, "T4", 0.36),
    (4000, 1000, 2, "", 0.36), (14000, 1000, 2, "V100M16", 0.36), (8000, 1000, 4, "", 0.36),
    (16000, 1000, 2, "", 0.32), (2000, 1000, 1, "T4", 0.32), (6000, 1000, 1, "", 0.32),
    (4000, 1000, 1, "", 0.32), (5000, 1000, 1, "", 0.32), (32000, 1000, 4, "V100M16", 0.32),
    (32000, 1000, 2, "", 0.32), (24000, 1000, 8, "2080", 0.32), (40000, 1000, 4, "", 0.29),
    (32000, 1000, 8, "", 0.29), (32000, 1000, 1, "T4", 0.29), (16000, 1000, 1, "", 0.25),
    (7000, 1000, 1, "V100M16", 0.25), (24000, 1000, 1, "T4", 0.25),
]

# The reference's TestingGenerateGetTypicalPodsWithNonGpu (CPU-only shapes have 0 GPUs).
REFERENCE_WITH_CPU_ONLY = [
    (15700, 1000, 1, 28.69), (11900, 1000, 1, 18.93), (11400, 1000, 1, 12.27), (1000, 0, 0, 7.36),
    (18710, 1000, 1, 4.85), (8200, 1000, 1, 3.79), (16400, 1000, 1, 3.31), (9810, 1000, 1, 1.97),
    (15200, 1000, 1, 1.87), (11200, 1000, 1, 1.81), (14200, 1000, 1, 1.76), (12000, 0, 0, 1.65),
    (14900, 1000, 1, 1.39), (60200, 1000, 4, 1.23), (64200, 1000, 8, 1.07), (32200, 1000, 4, 1.01),
    (17400, 1000, 2, 0.91), (30200, 1000, 2, 0.69), (16000, 1000, 1, 0.64), (15000, 1000, 1, 0.59),
    (64000, 1000, 8, 0.53), (15000, 0, 0, 0.53), (11910, 1000, 1, 0.53), (120200, 1000, 8, 0.48),
    (11300, 1000, 1, 0.37), (30000, 1000, 2, 0.32), (9800, 1000, 1, 0.32), (8000, 1000, 1, 0.32),
    (2000, 1000, 1, 0.27), (2000, 80, 1, 0.27), (1000, 1000, 1, 0.27),
]


def reference_typical() -> Workload:
    shapes = tuple(Shape(c / 1000, g / 1000, n, (m,) if m else ()) for c, g, n, m, _ in REFERENCE_TYPICAL)
    return Workload(shapes, tuple(p / 100 for *_, p in REFERENCE_TYPICAL))


def reference_with_cpu_only() -> Workload:
    shapes = tuple(Shape(c / 1000, g / 1000, n) for c, g, n, _ in REFERENCE_WITH_CPU_ONLY)
    return Workload(shapes, tuple(p / 100 for *_, p in REFERENCE_WITH_CPU_ONLY))


# --- the check values -------------------------------------------------------------


def test_node_lacking_cpu_counts_every_idle_share():
    state = node(1.0, [0.2, 1.0, 1.0, 0.5])  # 2,700 thousandths idle
    workload = one(Shape(6.0, 0.465, 1), 0.0933)
    assert float(state.idle[0]) == pytest.approx(2.7)
    assert frag(state, workload) * 1000 == pytest.approx(251.91, abs=0.01)
    assert reasons(state, workload)["lacks_cpu"] == pytest.approx(0.25191)


def test_whole_two_gpu_shape_that_fits_counts_only_the_partly_used_gpus():
    state = node(1.0, [0.2, 1.0, 1.0, 0.5])
    assert frag(state, one(Shape(0.1, 1.0, 2, ("1080",)))) * 1000 == pytest.approx(700)
    # the reference's neighbours of that case: nothing partly used, or a small share
    assert frag(node(1.0, [1.0] * 4), one(Shape(0.1, 1.0, 2, ("1080",)))) == 0.0
    assert frag(node(1.0, [1.0] * 8), one(Shape(0.1, 1.0, 2, ("1080",)))) == 0.0
    assert frag(state, one(Shape(0.1, 0.2, 2, ("1080",)))) == 0.0


def test_p100_node_without_cpu_under_a_mixed_workload_is_all_fragment():
    state = node(0.0, [1.0] * 4 + [0.0] * 4, model="P100")
    assert frag(state, reference_with_cpu_only()) == pytest.approx(4.0, abs=1e-9)


def test_reference_typical_workload_on_nodes_lacking_cpu():
    workload = reference_typical()
    assert frag(node(1.0, [0.2, 1.0, 1.0, 0.5]), workload) * 1000 == pytest.approx(2566.62, abs=0.01)
    assert frag(node(1.0, [1.0] * 4), workload) * 1000 == pytest.approx(3802.40, abs=0.01)
    assert frag(node(1.0, [1.0] * 8), workload) * 1000 == pytest.approx(7604.80, abs=0.01)


def test_reference_workload_with_cpu_only_shapes_on_p100_nodes():
    workload = reference_with_cpu_only()
    assert frag(node(64.0, [1.0] * 8, "P100"), workload) * 1000 == pytest.approx(887.20, abs=0.01)
    halved = node(32.0, [1.0] * 4 + [0.0] * 4, "P100")
    assert frag(halved, workload) * 1000 == pytest.approx(554.4, abs=0.01)


# --- our own cases, one per kind of shape ----------------------------------------------------


def test_whole_gpu_shape_counts_every_partly_used_gpu():
    state = node(32.0, [1.0, 0.75, 0.5, 0.0, 1.0, 0.1, 0.0, 0.0], "H100")
    assert frag(state, one(Shape(8, 1.0, 1))) == pytest.approx(0.75 + 0.5 + 0.1)
    assert reasons(state, one(Shape(8, 1.0, 1))) == {
        "fits": 2.0, "lacks_gpu": 1.35, "lacks_cpu": 0.0, "lacks_both": 0.0,
        "no_access": 0.0, "cpu_only": 0.0}


def test_multi_gpu_shape_lacking_gpus_counts_all_idle_shares():
    state = node(128.0, [1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0], "H100")
    assert frag(state, one(Shape(16, 1.0, 3))) == pytest.approx(0.5)  # fits on the 3 whole GPUs
    assert frag(state, one(Shape(16, 1.0, 4))) == pytest.approx(3.5)  # lacks a 4th whole GPU
    assert reasons(state, one(Shape(16, 1.0, 4)))["lacks_gpu"] == pytest.approx(3.5)
    lacking_both = node(8.0, [1.0, 1.0, 0.0, 0.0], "H100")
    assert frag(lacking_both, one(Shape(16, 1.0, 4))) == pytest.approx(2.0)
    assert reasons(lacking_both, one(Shape(16, 1.0, 4)))["lacks_both"] == pytest.approx(2.0)


def test_fractional_shape_counts_only_shares_too_small_for_it():
    state = node(16.0, [0.3, 0.25, 0.2, 1.0], "A100-80GB")
    assert frag(state, one(Shape(2, 0.25, 1))) == pytest.approx(0.2)
    assert frag(state, one(Shape(2, 0.3, 2))) == pytest.approx(0.45)
    # MIG-style sevenths: 1 - 3/7 - 4/7 must read as a full GPU, not float noise
    sevenths = node(16.0, [1 - 3 / 7 - 4 / 7, 1 - 2 / 7, 1 / 7], "A100-80GB")
    assert frag(sevenths, one(Shape(1, 1 / 7, 2))) == pytest.approx(0.0)
    assert frag(sevenths, one(Shape(1, 2 / 7, 1))) == pytest.approx(1 / 7)


def test_model_constrained_shape_has_no_access_to_other_models():
    shape = Shape(8, 1.0, 1, ("H200", "B200"))
    assert frag(node(64.0, [1.0, 1.0, 0.5], "H100"), one(shape)) == pytest.approx(2.5)
    assert reasons(node(64.0, [1.0, 1.0, 0.5], "H100"), one(shape))["no_access"] == pytest.approx(2.5)
    assert frag(node(64.0, [1.0, 1.0, 0.5], "H200"), one(shape)) == pytest.approx(0.5)


def test_cpu_only_shape_makes_every_idle_share_a_fragment():
    state = node(64.0, [1.0, 0.5, 0.0], "T4")
    assert frag(state, one(Shape(4, 0.0, 0))) == pytest.approx(1.5)
    assert reasons(state, one(Shape(4, 0.0, 0)))["cpu_only"] == pytest.approx(1.5)
    # a GPU count with no share is CPU-only too, as in the reference (gpu_milli == 0)
    assert frag(state, one(Shape(4, 0.0, 1))) == pytest.approx(1.5)


def test_weights_combine_shapes_linearly():
    state = node(64.0, [1.0, 0.5, 0.25, 0.0], "H100")
    shapes = (Shape(8, 1.0, 1), Shape(4, 0.5, 1), Shape(2, 0.0, 0))
    workload = Workload(shapes, (0.5, 0.3, 0.2))
    expected = 0.5 * 0.75 + 0.3 * 0.25 + 0.2 * 1.75
    assert frag(state, workload) == pytest.approx(expected)
    split = reasons(state, workload)
    assert sum(split.values()) == pytest.approx(1.75)
    assert sum(v for r, v in split.items() if r != "fits") == pytest.approx(expected)


def test_empty_workload_and_gpu_less_nodes_have_no_fragments():
    assert frag(node(64.0, [1.0, 0.5], "H100"), Workload((), ())) == 0.0
    assert frag(build(["c"], [""], ["cpu"], [32], [32], [[]]), one(Shape(1, 0, 0))) == 0.0


def test_vectorised_measure_matches_the_plain_loop_on_a_mixed_fleet():
    rng = np.random.default_rng(4)
    models = ["H100", "A100", "T4"]
    rows = [list(rng.choice([0.0, 0.125, 0.25, 0.5, 0.75, 1.0], size=rng.integers(1, 9)))
            for _ in range(300)]
    names = [f"n{i}" for i in range(300)]
    chosen = [models[i % 3] for i in range(300)]
    cpus = list(rng.uniform(0, 64, 300))
    state = build(names, chosen, ["p"] * 300, [64.0] * 300, cpus, rows)
    shapes = tuple(Shape(float(rng.uniform(0, 40)), float(rng.choice([0.0, 0.1, 0.25, 0.5, 1.0])),
                         int(rng.integers(0, 9)), () if rng.random() < 0.6 else ("H100", "T4"))
                   for _ in range(40))
    weights = rng.random(40)
    workload = Workload(shapes, tuple(weights / weights.sum()))
    compiled = compile_workload(workload, state.model_names)
    loop = node_fragmentation_loop(
        [(c, list(map(float, r)), m) for c, r, m in zip(cpus, rows, chosen, strict=True)], workload)
    assert node_fragmentation(state, compiled) == pytest.approx(loop, abs=1e-9)
    assert breakdown(state, compiled)[:, 1:].sum(axis=1) == pytest.approx(loop, abs=1e-9)
    for i in range(0, 300, 37):
        assert one_node_fragmentation(float(state.cpu_free[i]), state.gpu_free[i],
                                      int(state.model[i]), compiled) == pytest.approx(loop[i])


def test_a_workload_compiled_for_another_fleet_is_refused():
    compiled = compile_workload(one(Shape(1, 1.0, 1)), ("H100",))
    with pytest.raises(ValueError, match="compile it again"):
        node_fragmentation(node(1.0, [1.0], "T4"), compiled)


def test_shape_fragmentation_is_the_readable_definition():
    assert shape_fragmentation(1.0, [0.2, 1.0, 1.0, 0.5], "1080", Shape(6, 0.465, 1)) == pytest.approx(2.7)
    assert shape_fragmentation(1.0, [0.2, 1.0, 1.0, 0.5], "1080", Shape(0.1, 1.0, 2)) == pytest.approx(0.7)


@pytest.mark.parametrize("case", range(20))
def test_reweighting_a_compiled_workload_is_compiling_it_again(case):
    """The live analyzer's workload keeps its shapes between snapshots while their weights
    move: reweight() reuses the shapes' arrays and must give compile_workload's every field
    (the weights' order among CPU-only shapes included); other shapes are refused."""
    from exporter.analysis.fgd import reweight

    rng = np.random.default_rng([case, 7])
    models = ("A100", "H100", "H200")
    def allowed() -> tuple[str, ...]:
        return tuple(rng.choice(models, size=int(rng.integers(0, 3)), replace=False).tolist())

    shapes = tuple(Shape(cpus=float(rng.choice([0, 1, 4])), gpus=int(g),
                         gpu_share=float(rng.choice([0.5, 1.0])) if g else 0.0, models=allowed())
                   for g in rng.choice([0, 1, 1, 2, 8], size=int(rng.integers(1, 12))))

    def workload() -> Workload:
        return Workload(shapes, tuple(float(w) for w in rng.random(len(shapes))))

    before, after = workload(), workload()
    again = reweight(compile_workload(before, models), after)
    fresh = compile_workload(after, models)
    for name in ("workload", "model_names", "total_weight", "cpu_only_weight"):
        assert getattr(again, name) == getattr(fresh, name), name
    for name in ("levels", "thresholds", "level", "cpus", "gpus", "weight", "access"):
        assert np.array_equal(getattr(again, name), getattr(fresh, name)), name
    with pytest.raises(ValueError):
        reweight(fresh, Workload((*shapes, Shape(cpus=2.0, gpu_share=0.25, gpus=1)), (*after.weights, 1.0)))
