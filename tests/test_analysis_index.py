"""The 0-100 index and the tier-inversion penalty."""

from __future__ import annotations

import pytest

from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import IndexSettings, evaluate, fragmentation_index
from exporter.analysis.state import build
from exporter.analysis.workload import Shape, Workload

WHOLE = Workload((Shape(8, 1.0, 1),), (1.0,))


def fleet(pools: dict[str, tuple[str, list[list[float]]]]):
    """pool -> (model, [free shares per node]); every node 8 GPUs' worth of slots, 128 cores."""
    names, models, pool_of, rows = [], [], [], []
    for pool, (model, nodes) in pools.items():
        for i, row in enumerate(nodes):
            names.append(f"{pool}-{i}")
            models.append(model)
            pool_of.append(pool)
            rows.append(row)
    return build(names, models, pool_of, [128.0] * len(names), [128.0] * len(names), rows)


def test_index_formula_with_one_node_of_slack():
    assert fragmentation_index(fragmented=6, idle=10, slack_gpus=8) == pytest.approx(100 * 6 / 18)
    # a nearly full pool with two idle GPUs nobody can use is full, not 100% fragmented
    assert fragmentation_index(fragmented=2, idle=2, slack_gpus=8) == pytest.approx(20)
    assert fragmentation_index(0, 0, 0) == 0.0
    assert fragmentation_index(10, 10, 0, penalty=30) == 100.0  # capped
    assert fragmentation_index(1, 10, 0, penalty=30) == pytest.approx(40)


def test_pool_and_cluster_values_are_sums_over_nodes():
    state = fleet({"a": ("H100", [[0.5] * 8, [1.0] * 8]), "b": ("H100", [[0.25, 1.0]])})
    report = evaluate(state, compile_workload(WHOLE, state.model_names))
    a, b = report.pools
    assert (a.name, a.fragmented_gpus, a.idle_gpus, a.total_gpus) == ("a", 4.0, 12.0, 16.0)
    assert (b.fragmented_gpus, b.idle_gpus, b.total_gpus) == (0.25, 1.25, 2.0)
    assert a.index == pytest.approx(100 * 4 / (12 + 8))
    assert b.index == pytest.approx(100 * 0.25 / (1.25 + 2))  # slack: b's widest node has 2 GPUs
    assert report.cluster.fragmented_gpus == pytest.approx(4.25)
    assert report.cluster.idle_gpus == pytest.approx(13.25)
    assert report.cluster.index == pytest.approx(100 * 4.25 / (13.25 + 8))
    assert report.cluster.fragmentation_ratio == pytest.approx(4.25 / 13.25)
    assert a.breakdown["lacks_gpu"] == pytest.approx(4.0) and a.breakdown["fits"] == pytest.approx(8)
    assert report.worst_nodes(2) == [("a-0", 4.0, 4.0), ("b-0", 0.25, 1.25)]


def test_slack_is_configurable():
    state = fleet({"a": ("H100", [[0.5] * 8])})
    compiled = compile_workload(WHOLE, state.model_names)
    assert evaluate(state, compiled, IndexSettings(slack_nodes=0)).cluster.index == pytest.approx(100)
    assert evaluate(state, compiled, IndexSettings(slack_nodes=2)).cluster.index == pytest.approx(20)


def test_idle_upper_tier_with_busy_lower_tier_adds_the_penalty():
    busy_h100 = [[0.0] * 8, [0.0] * 8, [1.0] * 8]  # 2/3 allocated
    state = fleet({"h200": ("H200", [[1.0] * 8]), "h100": ("H100", busy_h100),
                   "a100": ("A100", [[1.0] * 8])})
    report = evaluate(state, compile_workload(WHOLE, state.model_names))
    inverted = {(i.upper, i.lower) for i in report.inversions if i.inverted}
    assert inverted == {("h200", "h100")}  # a100 is lower but idle; h100 > a100 is not idle
    assert {(i.upper, i.lower) for i in report.inversions} == {
        ("h200", "h100"), ("h200", "a100"), ("h100", "a100")}
    pools = {p.name: p for p in report.pools}
    assert pools["h200"].penalty == 30 and pools["h200"].index == pytest.approx(30)
    assert pools["h100"].penalty == 0 and pools["h100"].index == 0
    assert report.cluster.penalty == 30 and report.cluster.index == pytest.approx(30)


def test_tier_rule_thresholds_are_configurable_and_strict_where_the_issue_says():
    half = [[0.0] * 8, [1.0] * 8]  # exactly 0.5 allocated: not "above 0.5"
    state = fleet({"b200": ("B200", [[1.0] * 8]), "a100": ("A100", half)})
    compiled = compile_workload(WHOLE, state.model_names)
    assert evaluate(state, compiled).cluster.penalty == 0
    loose = IndexSettings(busy_above=0.4, tier_penalty=45)
    assert evaluate(state, compiled, loose).cluster.penalty == 45
    # the upper tier holding one job is no longer idle at idle_at_most 0 ...
    state = fleet({"b200": ("B200", [[0.5] + [1.0] * 7]), "a100": ("A100", half)})
    assert evaluate(state, compiled, loose).cluster.penalty == 0
    # ... but is at idle_at_most 0.1
    allowing = IndexSettings(busy_above=0.4, idle_at_most=0.1)
    assert evaluate(state, compiled, allowing).cluster.penalty == 30


def test_unknown_models_have_no_tier():
    state = fleet({"g2": ("G2", [[1.0] * 8]), "t4": ("T4", [[0.0] * 8])})
    report = evaluate(state, compile_workload(WHOLE, state.model_names))
    assert report.inversions == ()


def test_compaction_is_due_above_the_threshold():
    state = fleet({"a": ("H100", [[0.5] * 8] * 4)})
    compiled = compile_workload(WHOLE, state.model_names)
    assert evaluate(state, compiled).cluster.index == pytest.approx(100 * 16 / 24)
    assert evaluate(state, compiled).compaction_due
    assert not evaluate(state, compiled, IndexSettings(compaction_threshold=70)).compaction_due


def test_a_kept_scorer_is_the_layout_s_own_and_rebuilt_when_the_layout_changes():
    """The analyzer and a simulation keep the scorer of the fleet's layout; a report with it is
    the one without it, and a layout changed in place (GPUs per node, pools, models, the
    settings) gets a new scorer, not the kept one."""
    import dataclasses

    import numpy as np

    from exporter.analysis.index import KeptScorer, scorer

    def same(x, y):
        def equal(a, b):
            return np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        return all(equal(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))

    state = fleet({"a": ("H200", [[1.0] * 8, [0.0] * 8]), "b": ("A100-80GB", [[0.5] * 8])})
    cw = compile_workload(WHOLE, state.model_names)
    kept = KeptScorer()
    plain = evaluate(state, cw)
    with_kept = evaluate(state, cw, kept=kept)
    assert (with_kept.cluster, with_kept.pools, with_kept.inversions) == (
        plain.cluster, plain.pools, plain.inversions)
    first = kept.last
    assert first is not None and same(first[1], scorer(state, IndexSettings()))
    evaluate(state, cw, kept=kept)
    assert kept.last is first  # the same layout: kept
    state.gpu_count[2] = 4  # a node's GPUs changed in place: another layout
    assert same(kept(state, IndexSettings()), scorer(state, IndexSettings())) and kept.last is not first
    second = kept.last
    moved = dataclasses.replace(state, pool=np.zeros_like(state.pool))
    assert same(kept(moved, IndexSettings()), scorer(moved, IndexSettings())) and kept.last is not second
    slack = IndexSettings(slack_nodes=2.0)
    assert same(kept(moved, slack), scorer(moved, slack))
