"""The simulated advisor's snapshot kept from one evaluation to the next (``KeptAllocations``
and its ``PartCounts``), held to a snapshot built afresh at the same moment.

At every evaluation of busy random runs, and after each step of random starts, stops,
moves, relocations and restarts: the same allocations in the same order (``running``'s);
the same object where the job neither changed nor checkpointed since the last look (the
planner's caches know allocations by identity); the same shapes in the same order
(``typical`` breaks ties by it). Each check is also run with the memory broken (a change
notification dropped, the checkpoints forgotten, every allocation rebuilt, the shapes in
another order), and must then catch it; and a run that rebuilds the snapshot at every
evaluation gives every column and every start alike."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest

from exporter.analysis.workload import snapshot_shapes
from exporter.outcome_sim.advisor_loop import KeptAllocations, PartCounts, snapshot_of
from exporter.outcome_sim.cluster import MoveCost
from exporter.outcome_sim.sim import Sim
from exporter.snapshot import Allocation
from tests.test_simulate import sim_of
from tests.test_simulate_scheduler import fleet, random_job, run_row

BROKEN = ("dropped", "checkpoints", "rebuilt", "unordered")


class Check:
    """Holds each kept snapshot to a fresh one; counts the looks, the allocations kept (the
    same object as at the last look), and the looks that differ."""

    def __init__(self) -> None:
        self.looks = self.same = self.rebuilt = self.differ = 0
        self.before: dict[str, tuple[Allocation, int]] = {}  # job -> (allocation, version) last look

    def __call__(self, sim: Sim, now: float, kept: tuple[Allocation, ...], parts: PartCounts) -> bool:
        fresh = snapshot_of(sim, now)  # every allocation built
        running = list(sim.cluster.running.values())
        interval = sim.cluster.cost.checkpoint
        checkpoints = [j.last_checkpoint(now, interval) for j in running]
        ok = (kept == fresh.allocations
              and [a.job for a in kept] == [str(j.id) for j in running]
              and [a.last_checkpoint_time for a in kept] == checkpoints
              and list(parts.shapes().items()) == list(snapshot_shapes(fresh).items()))
        seen = {}
        for alloc, job in zip(kept, running, strict=False):
            was = self.before.get(alloc.job)
            if (was is not None and was[1] == job.version
                    and was[0].last_checkpoint_time == alloc.last_checkpoint_time):
                self.same += 1
                ok = ok and alloc is was[0]
            else:
                self.rebuilt += 1
            seen[alloc.job] = (alloc, job.version)
        self.before = seen
        self.looks += 1
        self.differ += not ok
        return ok


def looked(check: Check, update: Callable[[KeptAllocations, Sim, float], tuple[Allocation, ...]],
           kept: KeptAllocations, sim: Sim, now: float, broken: str = "") -> tuple[Allocation, ...]:
    """``kept`` updated to ``now`` (its memory first made to miss what changed, as ``broken``
    names) and checked; an update that fails on what it missed (a job it never heard of
    leaving) is caught too. Where they differ, the fresh allocations are given instead, so
    a run goes on as it would have."""
    if broken == "dropped" and kept.changed:
        kept.changed.discard(min(kept.changed))  # one start, stop or move never heard of
    elif broken == "checkpoints":
        kept.due.clear()  # no checkpoint ever due
    elif broken == "rebuilt":
        kept.stamp = -1  # every allocation built again: right values, new objects
    try:
        allocations = update(kept, sim, now)
    except KeyError:
        check.looks += 1
        check.differ += 1
        return snapshot_of(sim, now).allocations
    if not check(sim, now, allocations, kept.parts):
        return snapshot_of(sim, now).allocations
    return allocations


def unordered_shapes(self: PartCounts) -> Counter:
    """The right counts, in the shapes' numbering order instead of the order first met."""
    return Counter({self.shapes_seen[n]: self.counts[n] for n in sorted(self.counts)})


# -- random steps on a cluster -----------------------------------------------------


def random_steps(case: int, check: Check, broken: str = "") -> SimpleNamespace:
    """Random starts, stops, moves (stop and start: the end of ``running``), relocations (in
    place), restarts, and time passing over 300-s checkpoints; the kept allocations looked at
    after each step. Returns how many of each were done."""
    rng = np.random.default_rng([case, 1717])
    sim = sim_of(fleet(rng), cost=MoveCost(checkpoint=300.0, restore=30.0))
    cluster = sim.cluster
    kept = KeptAllocations(PartCounts())
    done = SimpleNamespace(starts=0, stops=0, moves=0, relocations=0, restarts=0)
    now, next_id = 0.0, 0
    for _ in range(150):
        now += float(rng.choice([0.0, 10.0, 100.0, 299.999, 300.0, 450.0]))
        for _ in range(int(rng.integers(0, 4))):
            kind = rng.random()
            jobs = list(cluster.running.values())
            if kind < 0.4 or not jobs:
                job = random_job(rng, next_id, gang=True)
                next_id += 1
                found = cluster.find(job)
                if found is not None:
                    cluster.start(job, found, now)
                    done.starts += 1
                continue
            job = jobs[int(rng.integers(len(jobs)))]
            elsewhere = cluster.find(job, exclude=[p.node for p in job.placements])
            if kind < 0.6:
                cluster.stop(job)
                done.stops += 1
            elif kind < 0.75 and elsewhere is not None:
                cluster.move(job, elsewhere, now)
                done.moves += 1
            elif kind < 0.9 and elsewhere is not None:
                cluster.relocate(job, elsewhere, now)
                done.relocations += 1
            else:  # stopped and started again where it was: it re-enters at the end
                where = job.placements
                cluster.stop(job)
                cluster.start(job, where, now)
                done.restarts += 1
        looked(check, KeptAllocations.update, kept, sim, now, broken)
    return done


@pytest.mark.parametrize("case", range(8))
def test_kept_allocations_are_the_fresh_ones_through_random_changes(case):
    check = Check()
    done = random_steps(case, check)
    assert check.differ == 0
    assert check.looks == 150 and check.same > 200 and check.rebuilt > 200
    assert min(done.starts, done.stops, done.moves, done.relocations, done.restarts) > 0, done


@pytest.mark.parametrize("broken", BROKEN)
def test_a_kept_memory_that_misses_a_change_is_caught_in_random_steps(broken, monkeypatch):
    if broken == "unordered":
        monkeypatch.setattr(PartCounts, "shapes", unordered_shapes)
    check = Check()
    for case in range(8):
        random_steps(case, check, "" if broken == "unordered" else broken)
        if check.differ:
            break
    assert check.differ > 0


def test_a_kept_memory_follows_another_cluster_and_a_clock_set_back():
    """Given another cluster, or an earlier time, the memory starts again: still the fresh one."""
    check = Check()
    kept = KeptAllocations(PartCounts())
    for case in range(3):
        rng = np.random.default_rng([case, 99])
        sim = sim_of(fleet(rng))
        for i in range(30):
            job = random_job(rng, i, gang=True)
            found = sim.cluster.find(job)
            if found is not None:
                sim.cluster.start(job, found, 0.0)
        for now in (2000.0, 100.0, 5000.0):
            check.before = {}
            check(sim, now, kept.update(sim, now), kept.parts)
        assert sum(w is kept.changed for w in sim.cluster.watchers) == 1
    assert check.looks == 9 and check.differ == 0


# -- busy runs with the advisor in the loop ----------------------------------------


def busy_run(case: int, strategy: str) -> tuple[dict, list[tuple[int, float | None]]]:
    """A random fleet under a stream of jobs longer than it can serve, the advisor evaluated
    every minute: the outcome's columns (but the wall time) and each job's first start."""
    return run_row(case, 1771, strategy, days=0.25, advisor_interval=60.0)


def checked_updates(monkeypatch: pytest.MonkeyPatch, check: Check, broken: str = "") -> None:
    update = KeptAllocations.update

    def checked(self: KeptAllocations, sim: Sim, now: float) -> tuple[Allocation, ...]:
        return looked(check, update, self, sim, now, broken)

    monkeypatch.setattr(KeptAllocations, "update", checked)


@pytest.mark.parametrize("strategy", ["advisor", "steer-pod+advisor"])
@pytest.mark.parametrize("case", range(3))
def test_the_loops_snapshot_is_a_fresh_one_at_every_evaluation(case, strategy, monkeypatch):
    check = Check()
    checked_updates(monkeypatch, check)
    row, _ = busy_run(case, strategy)
    assert check.differ == 0
    assert check.looks >= 300 and check.same > 1000 and check.rebuilt > 100
    assert row["jobs_started"] > 0


@pytest.mark.parametrize("broken", BROKEN)
def test_a_kept_snapshot_that_misses_a_change_is_caught_in_the_loop(broken, monkeypatch):
    if broken == "unordered":
        monkeypatch.setattr(PartCounts, "shapes", unordered_shapes)
    check = Check()
    checked_updates(monkeypatch, check, "" if broken == "unordered" else broken)
    for case in range(3):
        busy_run(case, "advisor")
        if check.differ:
            break
    assert check.differ > 0


@pytest.mark.parametrize("case", range(3))
def test_the_kept_snapshot_changes_no_outcome(case, monkeypatch):
    """The same run with every allocation built afresh at each evaluation (new objects, as
    serve's snapshots): every column and every start alike."""
    kept = busy_run(case, "advisor")
    update = KeptAllocations.update

    def forgetful(self: KeptAllocations, sim: Sim, now: float) -> tuple[Allocation, ...]:
        self.stamp = -1
        return update(self, sim, now)

    monkeypatch.setattr(KeptAllocations, "update", forgetful)
    fresh = busy_run(case, "advisor")
    assert kept[1] == fresh[1]
    assert kept[0] == fresh[0]
    assert sum(1 for _, start in kept[1] if start is not None) > 0
