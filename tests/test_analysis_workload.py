"""Target workloads: the typical-shape cut, renormalisation, and the live window."""

from __future__ import annotations

import pytest

from exporter.analysis.workload import (
    Shape,
    ShapeWindow,
    Workload,
    from_tasks,
    from_weighted,
    snapshot_shapes,
    typical,
)
from exporter.snapshot import Allocation, FleetSnapshot, Placement

WHOLE = Shape(8, 1.0, 1)
HALF = Shape(4, 0.5, 1)
EIGHT = Shape(64, 1.0, 8)
CPU = Shape(2, 0.0, 0)


def test_most_common_shapes_until_coverage_then_renormalised():
    tasks = [WHOLE] * 50 + [HALF] * 30 + [CPU] * 15 + [EIGHT] * 5
    workload = from_tasks(tasks, coverage=0.9)
    assert workload.shapes == (WHOLE, HALF, CPU)
    assert workload.weights == pytest.approx((50 / 95, 30 / 95, 15 / 95))
    assert workload.coverage == pytest.approx(0.95)
    assert workload.cpu_only_share == pytest.approx(15 / 95)
    assert sum(workload.weights) == pytest.approx(1.0)
    assert from_tasks(tasks, coverage=1.0).shapes == (WHOLE, HALF, CPU, EIGHT)
    # the cut stops as soon as coverage is reached, not one shape later
    assert from_tasks(tasks, coverage=0.8).shapes == (WHOLE, HALF)


def test_cpu_only_shapes_can_be_left_out_and_that_is_recorded():
    workload = from_tasks([WHOLE] * 6 + [CPU] * 4, coverage=1.0, include_cpu_only=False)
    assert workload.shapes == (WHOLE,)
    assert workload.weights == (1.0,)
    assert workload.cpu_only_share == 0.0
    assert workload.include_cpu_only is False


def test_equal_counts_keep_first_seen_order_so_a_trace_gives_one_workload():
    assert from_tasks([HALF, WHOLE, WHOLE, HALF], coverage=1.0).shapes == (HALF, WHOLE)


def test_float_noise_does_not_split_a_shape():
    tasks = [Shape(1.0000000001, 1 / 7, 1), Shape(1.0, 0.142857142857, 1)]
    assert len(from_tasks(tasks, coverage=1.0)) == 1


def test_weighted_shapes_from_config_are_renormalised_not_cut():
    workload = from_weighted([(WHOLE, 3.0), (HALF, 1.0), (CPU, 0.0)])
    assert workload.weights == pytest.approx((0.75, 0.25, 0.0))
    assert workload.coverage == 1.0
    with pytest.raises(ValueError, match="negative"):
        from_weighted([(WHOLE, -1.0)])


def test_invalid_coverage_and_empty_inputs():
    with pytest.raises(ValueError, match="coverage"):
        typical({WHOLE: 1}, coverage=0)
    empty = from_tasks([])
    assert len(empty) == 0 and empty.coverage == 0.0
    with pytest.raises(ValueError, match="one weight per shape"):
        Workload((WHOLE,), ())


def _snapshot(*allocations: Allocation) -> FleetSnapshot:
    return FleetSnapshot(taken_at=0.0, allocations=allocations)


def test_allocation_shapes_are_per_node_parts():
    two_nodes = Allocation("train", (Placement("a", tuple(range(8)), 1.0, 64),
                                     Placement("b", tuple(range(8)), 1.0, 64)),
                           allowed_models=("H200",))
    cpu_job = Allocation("etl", (Placement("c", (), 0.0, 16),))
    counts = snapshot_shapes(_snapshot(two_nodes, cpu_job))
    assert counts == {Shape(64, 1.0, 8, ("H200",)): 2, Shape(16, 0.0, 0): 1}


def test_window_counts_what_it_saw_over_its_last_snapshots():
    window = ShapeWindow(snapshots=2, coverage=1.0)
    whole = Allocation("w", (Placement("a", (0,), 1.0, 8),))
    half = Allocation("h", (Placement("a", (1,), 0.5, 4),))
    window.observe(_snapshot(whole, half))
    window.observe(_snapshot(whole))
    workload = window.workload()
    assert workload.source == "window"
    assert dict(zip(workload.shapes, workload.weights, strict=True)) == pytest.approx(
        {WHOLE: 2 / 3, HALF: 1 / 3})
    window.observe(_snapshot(whole))  # the first snapshot leaves the window, and HALF with it
    assert window.workload().shapes == (WHOLE,)
    window.observe(_snapshot())
    window.observe(_snapshot())
    assert len(window.workload()) == 0
