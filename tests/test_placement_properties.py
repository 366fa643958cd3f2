"""Properties of the placement engine on random small clusters, checked against brute force.

Every feasible choice (each node, each set of GPUs the task fits on) is listed
by hand and measured with the plain-Python definition of F_n(M)
(``fgd.node_fragmentation_loop``), independent of the vectorised code.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.analysis import fgd
from exporter.analysis.state import EPS, build
from exporter.analysis.workload import Shape, Workload
from exporter.placement.engine import Placer
from exporter.placement.policies import FGD_TIES, FgdTies
from exporter.placement.task import Task
from exporter.policy_names import POLICIES

SHARES = (0.0, 0.25, 0.4, 0.5, 0.75, 1.0)
MODELS = ("A", "B")


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 5))
    rows = [draw(st.lists(st.sampled_from(SHARES), min_size=1, max_size=4)) for _ in range(n)]
    cpus = [float(draw(st.sampled_from((2, 4, 8, 16)))) for _ in range(n)]
    models = [draw(st.sampled_from(MODELS)) for _ in range(n)]
    return build([f"n{i}" for i in range(n)], models, ["p"] * n, [16.0] * n, cpus, rows)


@st.composite
def workloads(draw):
    shapes = []
    for _ in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from((0, 1, 1, 2)))
        share = 1.0 if gpus != 1 else draw(st.sampled_from((0.25, 0.5, 0.75, 1.0)))
        models = draw(st.sampled_from(((), ("A",), ("B",))))
        shapes.append(Shape(float(draw(st.sampled_from((1, 4, 8)))), share if gpus else 0.0, gpus,
                            models if gpus else ()))
    weights = [draw(st.floats(0.05, 1.0)) for _ in shapes]
    return Workload(tuple(shapes), tuple(w / sum(weights) for w in weights))


@st.composite
def tasks(draw):
    """CPU-only, one fractional GPU, or whole GPUs: the task kinds fgd places optimally."""
    kind = draw(st.sampled_from(("cpu", "fraction", "whole")))
    cpus = float(draw(st.sampled_from((1, 2, 4, 8))))
    models = draw(st.sampled_from(((), ("A",))))
    if kind == "cpu":
        return Task(cpus)
    if kind == "fraction":
        return Task(cpus, 1, draw(st.sampled_from((0.25, 0.4, 0.5, 0.6))), models)
    return Task(cpus, draw(st.integers(1, 3)), 1.0, models)


def feasible_choices(state, task):
    """(node, GPU slots) for every way the task fits, found by trying every subset of GPUs."""
    for n in range(len(state)):
        if state.cpu_free[n] < task.cpus - EPS:
            continue
        if task.models and not task.cpu_only and state.model_names[state.model[n]] not in task.models:
            continue
        if task.cpu_only:
            yield n, ()
            continue
        row = state.gpu_free[n, : state.gpu_count[n]]
        roomy = [s for s in range(len(row)) if row[s] >= task.gpu_share - EPS]
        for slots in combinations(roomy, task.gpus):
            yield n, slots


def cluster_fragmentation(state, workload, node=None, slots=(), task=None) -> float:
    """F(M) of the cluster, with the task placed on ``node``'s ``slots`` if given (plain Python)."""
    rows = []
    for n in range(len(state)):
        cpu = float(state.cpu_free[n])
        free = [float(x) for x in state.gpu_free[n, : state.gpu_count[n]]]
        if n == node:
            cpu -= task.cpus
            for s in slots:
                free[s] -= task.gpu_share
        rows.append((cpu, free, state.model_names[state.model[n]]))
    return sum(fgd.node_fragmentation_loop(rows, workload))


@settings(max_examples=300, deadline=None)
@given(clusters(), workloads(), tasks())
def test_fgd_never_grows_fragmentation_more_than_any_other_feasible_choice(state, workload, task):
    """fgd as defined (exact ties) takes the least growth; by default, a growth within its near-tie band."""
    choices = list(feasible_choices(state, task))
    exact = Placer(state, workload, fgd_ties=FgdTies(0.0, 0.0, "first")).place(task, "fgd")
    found = Placer(state, workload).place(task, "fgd")
    if not choices:
        assert found is None and exact is None
        return
    assert found is not None and (found.node, found.slots) in choices
    assert exact is not None and (exact.node, exact.slots) in choices
    before = cluster_fragmentation(state, workload)
    best = min(cluster_fragmentation(state, workload, n, s, task) for n, s in choices)
    assert cluster_fragmentation(state, workload, exact.node, exact.slots, task) <= best + 1e-9
    chosen = cluster_fragmentation(state, workload, found.node, found.slots, task)
    assert chosen <= best + FGD_TIES.band(best - before) + 1e-9


@settings(max_examples=150, deadline=None)
@given(clusters(), tasks(), st.sampled_from(POLICIES), st.integers(0, 2**32 - 1))
def test_every_policy_places_only_where_the_task_fits_and_fails_only_when_nothing_fits(
        state, task, policy, seed):
    workload = Workload((Shape(1, 0.5, 1), Shape(4, 1.0, 1)), (0.5, 0.5))
    choices = list(feasible_choices(state, task))
    found = Placer(state, workload).place(task, policy, np.random.default_rng(seed))
    assert (found is None) == (not choices)
    if found is not None:
        assert (found.node, found.slots) in choices
        assert found.gpus == found.slots  # no GPU is down in these states


@settings(max_examples=200, deadline=None)
@given(clusters(), workloads(), tasks(), tasks())
def test_lookahead_leaves_the_two_tasks_no_more_fragmented_than_fgd(state, workload, task, queued):
    """lookahead's choice, then the queued task's best, fragments no more than fgd's choice then the
    queued task's best (brute force; a queued task that fits nowhere counts its GPUs as fragments)."""
    first = Placer(state, workload).place(task, "fgd")
    ahead = Placer(state, workload).place(task, "lookahead", queued=queued)
    assert (first is None) == (ahead is None)
    if first is None:
        return

    def two_steps(found) -> float:
        placer = Placer(state, workload)
        placer.apply(found)
        now = placer.state
        after = [cluster_fragmentation(now, workload, n, s, queued) for n, s in feasible_choices(now, queued)]
        return min(after, default=cluster_fragmentation(now, workload) + queued.gpu_demand)

    assert (ahead.node, ahead.slots) in list(feasible_choices(state, task))
    assert two_steps(ahead) <= two_steps(first) + 1e-9
    # without a queued task it is fgd
    assert Placer(state, workload).place(task, "lookahead") == first


@settings(max_examples=200, deadline=None)
@given(clusters(), workloads(), tasks(), st.sampled_from([p for p in POLICIES if p != "random"]),
       st.integers(0, 4))
def test_place_on_one_node_is_place_with_every_other_node_excluded(state, workload, task, policy, node):
    """The advisor asks node by node whether a job fits there (place_on); the answer must be the
    whole placer's with the rest of the fleet excluded, including after the placer's memo of
    scores has seen other placements."""
    node %= len(state.names)
    others = [n for n in range(len(state.names)) if n != node]
    placer = Placer(state, workload)
    assert placer.place_on(task, node, policy) == placer.place(task, policy, exclude=others)
    moved = placer.place(task, policy)  # a change elsewhere: the memo and the arrays move on
    if moved is not None:
        placer.apply(moved)
    assert placer.place_on(task, node, policy) == placer.place(task, policy, exclude=others)
