"""Properties of the measure and the index over generated fleets and workloads (hypothesis).

"Freeing a whole node never raises that node's F" holds for the part of F the
node's occupancy causes. It does not hold for raw F under a workload with
shapes the node could not run even when empty (CPU-only shapes, too many GPUs
or CPUs, another GPU model): for those every free share is a fragment by
definition, so freeing the node adds free shares and adds fragments.
:func:`test_raw_f_can_rise_when_a_node_is_freed` pins that down, and the
properties below state what does hold.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.analysis.fgd import compile_workload, node_fragmentation, shape_fragmentation
from exporter.analysis.index import IndexSettings, evaluate
from exporter.analysis.state import build, with_node
from exporter.analysis.workload import Shape, Workload

MODELS = ("H200", "H100", "A100", "T4", "G2")
SHARES = (0.0, 0.1, 0.25, 0.3, 0.5, 0.75, 1.0)

shares = st.one_of(st.sampled_from(SHARES), st.floats(0, 1).map(lambda x: round(x, 3)))


@st.composite
def nodes(draw):
    gpus = draw(st.integers(0, 8))
    cpu_total = draw(st.sampled_from([8.0, 32.0, 64.0, 128.0]))
    return (draw(st.sampled_from(MODELS[:4])), draw(st.sampled_from(["p1", "p2", "p3"])), cpu_total,
            draw(st.floats(0, cpu_total)), draw(st.lists(shares, min_size=gpus, max_size=gpus)))


@st.composite
def fleets(draw):
    drawn = draw(st.lists(nodes(), min_size=1, max_size=12))
    return build([f"n{i}" for i in range(len(drawn))], [d[0] for d in drawn], [d[1] for d in drawn],
                 [d[2] for d in drawn], [d[3] for d in drawn], [d[4] for d in drawn])


shapes = st.builds(
    Shape,
    cpus=st.sampled_from([0.0, 1.0, 4.0, 16.0, 64.0, 200.0]),
    gpu_share=st.sampled_from(SHARES),
    gpus=st.integers(0, 9),
    models=st.one_of(st.just(()), st.lists(st.sampled_from(MODELS), min_size=1, max_size=2,
                                           unique=True).map(tuple)),
)


@st.composite
def workloads(draw):
    drawn = draw(st.lists(shapes, min_size=1, max_size=8))
    weights = draw(st.lists(st.floats(0.01, 1), min_size=len(drawn), max_size=len(drawn)))
    total = sum(weights)
    return Workload(tuple(drawn), tuple(w / total for w in weights))


index_settings = st.builds(
    IndexSettings,
    slack_nodes=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    tier_penalty=st.sampled_from([0.0, 30.0, 100.0]),
    idle_at_most=st.sampled_from([0.0, 0.2]),
    busy_above=st.sampled_from([0.0, 0.5]),
)


@settings(max_examples=150, deadline=None)
@given(fleets(), workloads(), index_settings)
def test_index_is_between_0_and_100(state, workload, index):
    compiled = compile_workload(workload, state.model_names)
    report = evaluate(state, compiled, index)
    assert 0.0 <= report.cluster.index <= 100.0
    assert all(0.0 <= p.index <= 100.0 for p in report.pools)


@settings(max_examples=150, deadline=None)
@given(fleets(), workloads())
def test_fragmented_gpus_never_exceed_idle_gpus(state, workload):
    report = evaluate(state, compile_workload(workload, state.model_names))
    assert report.cluster.fragmented_gpus <= report.cluster.idle_gpus + 1e-9
    assert (report.totals.node_fragmented <= report.totals.node_idle + 1e-9).all()
    assert (report.totals.node_fragmented >= -1e-9).all()
    for pool in report.pools:
        assert pool.fragmented_gpus <= pool.idle_gpus + 1e-9
        assert sum(pool.breakdown.values()) == pytest.approx(pool.idle_gpus, abs=1e-9)
    assert 0.0 <= report.cluster.fragmentation_ratio <= 1.0 + 1e-12


def _freed(state, node):
    return with_node(state, node, float(state.cpu_total[node]), [1.0] * int(state.gpu_count[node]))


def _never_fits(state, node, shape) -> bool:
    """The shape cannot run on this node even when the node is empty."""
    if shape.cpu_only:
        return True
    empty = [1.0] * int(state.gpu_count[node])
    model = state.model_names[state.model[node]]
    # on an empty node a shape that fits leaves no fragment; one that does not leaves all
    return bool(empty) and shape_fragmentation(float(state.cpu_total[node]), empty, model, shape) > 0


@settings(max_examples=150, deadline=None)
@given(fleets(), workloads(), st.data())
def test_freeing_a_whole_node_never_raises_its_f_for_shapes_it_can_run(state, workload, data):
    node = data.draw(st.integers(0, len(state) - 1))
    runnable = [(s, w) for s, w in zip(workload.shapes, workload.weights, strict=True)
                if not _never_fits(state, node, s)]
    workload = Workload(tuple(s for s, _ in runnable), tuple(w for _, w in runnable))
    compiled = compile_workload(workload, state.model_names)
    before = node_fragmentation(state, compiled)[node]
    after = node_fragmentation(_freed(state, node), compiled)[node]
    assert after <= before + 1e-9
    assert after == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(fleets(), workloads(), st.data())
def test_freeing_a_whole_node_never_raises_the_f_its_occupancy_causes(state, workload, data):
    """Any workload: F minus the fragments of shapes the node can never run does not rise,
    and neither does the node's fragmented share of its idle GPUs."""
    node = data.draw(st.integers(0, len(state) - 1))
    compiled = compile_workload(workload, state.model_names)
    freed = _freed(state, node)
    never = sum(w for s, w in zip(workload.shapes, workload.weights, strict=True)
                if _never_fits(state, node, s))
    idle_before, idle_after = float(state.idle[node]), float(freed.idle[node])
    before = node_fragmentation(state, compiled)[node]
    after = node_fragmentation(freed, compiled)[node]
    assert after - never * idle_after <= before - never * idle_before + 1e-9
    if idle_before > 0:
        assert after / idle_after <= before / idle_before + 1e-9


def test_raw_f_can_rise_when_a_node_is_freed():
    """Why the property above is stated with care: CPU-only tasks can never use a GPU."""
    state = build(["n"], ["H100"], ["p"], [64.0], [32.0], [[1.0, 0.0, 0.0, 0.0]])
    workload = Workload((Shape(4, 0.0, 0),), (1.0,))
    compiled = compile_workload(workload, state.model_names)
    assert node_fragmentation(state, compiled)[0] == 1.0
    assert node_fragmentation(_freed(state, 0), compiled)[0] == 4.0
