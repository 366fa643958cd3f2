"""The cluster's index of running single-node jobs by node (what the baselines and the oracle
look for jobs to move in) stays in step with a scan of every running job, through starts,
ends, moves, evictions and the oracle's free moves, to the last bit of each node's sum. And
the test that skips a node without trying to empty it says so only where the trial fails."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.workload import Shape
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.run import RunSettings, Sim, target_workload
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.strategies import (
    RULES,
    _evacuate_for,
    _movable_by_node,
    _Room,
    _stuck,
    any_single_node,
    movable,
)
from exporter.outcome_sim.timeline import Job
from exporter.placement.task import Ask, Task
from exporter.snapshot import Gpu, Node

MODELS = ("H100", "H100", "A100-80GB", "H200", "H100", "A100-80GB")
SHARES = (1.0, 1.0, 0.1, 0.3, 0.7, 0.25, 0.45)


def fleet_of(models: tuple[str, ...]) -> SimFleet:
    listed = tuple(Node(f"n{i}", model, 64.0, "one", "any", 8) for i, model in enumerate(models))
    return SimFleet("index", listed, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                           for n in listed for i in range(8)),
                    (Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(32, 1.0, 8)))


def cluster_of(models: tuple[str, ...] = MODELS, policy: str = "bestfit") -> Cluster:
    fleet = fleet_of(models)
    state = fleet.empty_state()
    return Cluster(state, policy, target_workload(fleet, state.model_names), MoveCost(900.0, 120.0))


def filled(cluster: Cluster, rng: np.random.Generator, jobs: int) -> None:
    """Single-node jobs of mixed sizes and shares, started where the cluster puts them."""
    for number in range(jobs):
        gpus = int(rng.choice((1, 1, 1, 2, 4)))
        share = 1.0 if gpus > 1 else float(rng.choice(SHARES))
        models = () if rng.random() < 0.7 else (str(rng.choice(("H100", "A100-80GB", "H200"))),)
        job = Job(number, 0.0, 1e6, float(rng.choice((1.0, 4.0, 8.0))), gpus, share, 1, models,
                  bool(rng.random() < 0.3))
        where = cluster.find(job)
        if where is not None:
            cluster.start(job, where, 0.0)


def scanned(cluster: Cluster, may_move, moved: frozenset[int] = frozenset()):  # type: ignore[no-untyped-def]
    """What the strategies gathered before the index: a scan of every running job."""
    share = np.zeros(len(cluster.placer.names))
    count = np.zeros(len(cluster.placer.names), dtype=np.int64)
    on_node: dict[int, list[int]] = {}
    for job in cluster.running.values():
        if may_move(job) and job.id not in moved:
            node = job.placements[0].node
            on_node.setdefault(node, []).append(job.id)
            share[node] += job.demand
            count[node] += 1
    return share, count, on_node


def assert_in_step(cluster: Cluster, rng: np.random.Generator) -> None:
    running = [j for j in cluster.running.values() if j.parts == 1]
    moved = frozenset(int(j.id) for j in running if rng.random() < 0.2)
    for may_move in (movable, any_single_node, lambda j: j.parts == 1 and j.gpus >= 2, movable):
        for without in (frozenset(), moved):
            share, count, on_node = scanned(cluster, may_move, without)
            got_share, got_count, got_on = _movable_by_node(cluster, may_move, without)
            assert got_share.tolist() == share.tolist()  # the same sums, bit for bit
            assert got_count.tolist() == count.tolist()
            for node in range(len(cluster.placer.names)):
                largest = sorted(on_node.get(node, []), key=lambda i: (-cluster.running[i].demand, i))
                assert [j.id for j in got_on(node)] == largest
    index = cluster.single
    assert sorted(index.order) == sorted(j.id for j in running)
    # every running job (gangs too) by the nodes of its parts, and in ``running``'s order
    parts_on: dict[int, set[int]] = {}
    for job in cluster.running.values():
        for p in job.placements:
            parts_on.setdefault(p.node, set()).add(job.id)
    assert {node: set(jobs) for node, jobs in cluster.parts_on.items()} == parts_on
    assert sorted(cluster.entered, key=cluster.entered.__getitem__) == list(cluster.running)
    assert sum(len(jobs) for jobs in index.jobs.values()) == len(running)


def test_the_index_of_single_node_jobs_follows_random_events_as_a_scan_sees_them():
    rng = np.random.default_rng(7)
    cluster = cluster_of()
    now, next_id, events = 0.0, 0, 0
    kinds = {"start": 0, "end": 0, "move": 0, "relocate": 0, "evict": 0}
    evicted: list[Job] = []
    while events < 600:
        now += float(rng.uniform(1.0, 600.0))
        running = list(cluster.running.values())
        roll = rng.random()
        if roll < 0.45 or not running:
            if evicted and rng.random() < 0.3:
                job = evicted.pop(0)  # an evicted job starts again
            else:
                gpus = int(rng.choice((1, 1, 2, 4, 8)))
                share = 1.0 if gpus > 1 else float(rng.choice(SHARES))
                parts = 2 if gpus == 8 and rng.random() < 0.3 else 1
                job = Job(next_id, now, 1e6, 2.0, gpus, share, parts, (), bool(rng.random() < 0.3))
                next_id += 1
            where = cluster.find(job)
            if where is None:
                continue
            cluster.start(job, where, now)
            kind = "start"
        elif roll < 0.65:
            job = running[int(rng.integers(len(running)))]
            cluster.stop(job)
            kind = "end"
        else:
            singles = [j for j in running if j.parts == 1]
            if not singles:
                continue
            job = singles[int(rng.integers(len(singles)))]
            there = job.placements[0].node
            destination = cluster.find(job, exclude=[there])
            if roll < 0.8 and destination is not None:
                cluster.relocate(job, destination, now)  # keeps its place in ``running``
                kind = "relocate"
            elif roll < 0.9 and destination is not None:
                cluster.move(job, destination, now)  # leaves ``running`` and enters it again, last
                kind = "move"
            else:
                cluster.interrupt(job, now)
                evicted.append(job)
                kind = "evict"
        kinds[kind] += 1
        events += 1
        assert_in_step(cluster, rng)
    assert min(kinds.values()) >= 20, kinds  # every kind of event happened, many times


def test_a_relocated_job_keeps_its_place_among_the_jobs_of_its_new_node():
    """Three jobs started in order on two nodes; the first, moved for free onto the other node,
    comes first there again, as a scan of ``running`` (in start order) lists them."""
    cluster = cluster_of(("H100", "H100"))
    jobs = [Job(i, 0.0, 1e6, 1.0, 1, share, 1, (), False) for i, share in enumerate((0.1, 0.7, 0.3))]
    for job, node in zip(jobs, (0, 1, 1), strict=True):
        cluster.start(job, cluster.find(job, exclude=[1 - node]), 0.0)
    cluster.relocate(jobs[0], cluster.find(jobs[0], exclude=[0]), 10.0)
    assert [j.id for j in cluster.single.on(1)] == [0, 1, 2]
    assert cluster.single.demand[1] == (0.1 + 0.7) + 0.3  # added in that order
    assert cluster.single.demand[0] == 0.0 and cluster.single.count[0] == 0


@pytest.mark.parametrize("policy", ["bestfit", "fgd"])
def test_a_node_is_skipped_as_stuck_only_where_emptying_it_fails(policy):
    """Over random fleets, heads, budgets and move rules: wherever ``_stuck`` says a node cannot
    be emptied for the head's part, ``_evacuate_for`` (the trial that places each job elsewhere)
    finds nothing there, and ``_stuck`` changes nothing in the placer. It must also say so
    often, or it saves nothing."""
    rng = np.random.default_rng(11)
    stuck = tried = 0
    for _ in range(12):
        cluster = cluster_of(policy=policy)
        filled(cluster, rng, int(rng.integers(20, 70)))
        sim = Sim(fleet_of(MODELS), cluster, Scheduler(cluster), RunSettings(), cluster.workload)
        placer = cluster.placer
        for _ in range(15):
            gpus = int(rng.choice((1, 2, 4, 8)))
            share = 1.0 if gpus > 1 else float(rng.choice(SHARES))
            head = Job(10_000, 0.0, 1.0, float(rng.choice((1.0, 16.0))), gpus, share, 1, (), False)
            task = cluster.task(head)
            rule = str(rng.choice(RULES))
            same_model = bool(rng.random() < 0.3)
            may_move = movable if rng.random() < 0.5 else any_single_node
            room = _Room(cluster, rule)
            _, _, on_node = _movable_by_node(cluster, may_move)
            for node in range(len(placer.names)):
                jobs = on_node(node)
                if not jobs:
                    continue
                limit = int(rng.integers(1, 6))
                before = (placer.gpu_free.copy(), placer.cpu_free.copy(), placer.changes)
                leaving = sorted(jobs, key=lambda j: (-j.demand, j.id))
                said = _stuck(cluster, node, leaving, limit, Ask.of(task), same_model, room)
                assert np.array_equal(placer.gpu_free, before[0])
                assert np.array_equal(placer.cpu_free, before[1])
                assert placer.changes == before[2]
                tried += 1
                if said:
                    stuck += 1
                    assert _evacuate_for(sim, node, jobs, limit, task, same_model, rule) is None
    assert tried > 500 and stuck > tried // 10, (stuck, tried)


def test_the_room_mask_is_where_the_placer_could_place_a_task():
    """``Placer.room``: a node it leaves out is never where ``place`` puts the task; with every
    node it lists but one excluded, ``place`` still finds one (bestfit scores every fitting node)."""
    rng = np.random.default_rng(5)
    cluster = cluster_of()
    filled(cluster, rng, 25)
    placer = cluster.placer
    seen = []
    for gpus in (1, 2, 4, 8):
        for share in (SHARES if gpus == 1 else (1.0,)):
            for models in ((), ("H100",), ("A100-80GB", "H200")):
                task = Task(4.0, gpus, share, models)
                fits = placer.room(task, "bestfit")
                for node in range(len(placer.names)):
                    others = [n for n in range(len(placer.names)) if n != node]
                    found = placer.place(task, "bestfit", exclude=others)
                    assert (found is not None) == bool(fits[node])
                    seen.append(bool(fits[node]))
    assert len(seen) == 180 and 20 < sum(seen) < 160  # both answers, many times
