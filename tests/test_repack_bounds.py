"""The engine's "fragments, not capacity" test answers from two bounds before it walks the
fleet's jobs; the answer must be the walk's in every case (busy random fleets), and each of
the three ways to an answer must be taken, so a wrong bound has cases to fail on."""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter

import numpy as np

from exporter.advisor import engine
from exporter.advisor.engine import repack_could_fit, repack_scope
from exporter.advisor.planner import destinations_by_value
from exporter.analysis.state import FleetState
from exporter.outcome_sim.advisor_loop import snapshot_of
from exporter.snapshot import FleetSnapshot, JobRequest
from tests.test_oracle import fleet_of, job, sim_of

MODELS = ("H100", "H200", "A100-80GB", "A100-40GB")
GIB = 1024 ** 3


def walked(snapshot: FleetSnapshot, state: FleetState, job: JobRequest) -> bool:
    """The test as it was written first: every wanted model's room from the walk over every job."""
    scope = repack_scope(state, job)
    free, nodes, big, whole, need, wanted = (scope.free, scope.nodes, scope.big, scope.whole, scope.need,
                                             scope.wanted)
    index = {name: i for i, name in enumerate(state.names)}
    for m in wanted:
        reach: set[str] = set()
        for alloc in snapshot.allocations:
            node = index.get(alloc.placements[0].node)
            if len(alloc.placements) == 1 and node is not None and state.model[node] == m and big[node]:
                reach.update(destinations_by_value(alloc.gpu_memory_need_bytes, tuple(alloc.allowed_models),
                                                   state.model_names[m], tuple(state.model_names)))
        on = big & (state.model == m)
        own = float(free[on].sum())
        to = nodes & ~on & np.isin(np.array(state.model_names)[state.model], sorted(reach))
        room = own + min(float(state.gpu_count[on].sum()) - own, float(free[to].sum()))
        if (math.floor(room + 1e-9) if whole else room) >= need - 1e-9:
            return True
    return False


def random_case(rng: random.Random) -> tuple[FleetSnapshot, FleetState, list[JobRequest]]:
    pools = ("a", "b") if rng.random() < 0.3 else ()
    count = rng.randint(2, 6)
    sim = sim_of(fleet_of(*((rng.choice(MODELS), rng.choice((4, 8))) for _ in range(count)),
                          pools=tuple(rng.choice(pools) for _ in range(count)) if pools else ()))
    for i in range(rng.randint(0, 14)):
        gpus = rng.choice((1, 1, 2, 4, 8))
        share = rng.choice((1.0, 1.0, 0.5))
        models = rng.choice(((), (), ("H200",), ("H100", "H200"), ("A100-40GB",)))
        j = job(100 + i, gpus, 1e7, models=models, share=share if gpus == 1 else 1.0)
        found = sim.cluster.find(j)
        if found is not None:
            sim.cluster.start(j, found, 0.0)
    snapshot = snapshot_of(sim, 1.0, one_partition=False)
    # memory needs vary which models a job may move to (destinations_by_value reads them)
    snapshot = dataclasses.replace(snapshot, allocations=tuple(
        dataclasses.replace(a, gpu_memory_need_bytes=rng.choice((None, 30 * GIB, 60 * GIB, 100 * GIB)))
        for a in snapshot.allocations))
    heads = [JobRequest("head", rng.choice((1, 2, 4, 8, 12, 16)), rng.choice((1.0, 1.0, 0.5)), 1.0,
                        rng.choice((1, 1, 2)), rng.choice(((), ("H200",), ("A100-80GB", "H100"))),
                        rng.choice(("", "a", "b")))
             for _ in range(6)]
    return snapshot, sim.cluster.placer.state, heads


def test_the_bounds_answer_as_the_walk_and_each_way_is_taken(monkeypatch):
    rng = random.Random(41)
    ways: Counter[str] = Counter()
    answers: Counter[bool] = Counter()
    walks = Counter[str]()
    real = engine.np.isin

    def counted(*args, **kwargs):  # the walk's last step: reached only by an undecided model
        walks["walk"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.np, "isin", counted)
    for _ in range(300):
        snapshot, state, heads = random_case(rng)
        for head in heads:
            before = walks["walk"]
            got = repack_could_fit(snapshot, state, head)
            ways["walked" if walks["walk"] > before else ("bound: fits" if got else "bound: no room")] += 1
            assert got == walked(snapshot, state, head), (head, state.gpu_free.sum(axis=1))
            answers[got] += 1
    assert answers[True] > 100 and answers[False] > 100, answers
    assert min(ways["walked"], ways["bound: fits"], ways["bound: no room"]) > 20, ways
