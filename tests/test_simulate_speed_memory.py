"""What the scheduler keeps between passes to run faster answers as the computation it spares.

- ``Scheduler._no_room``: a job shape that found no room at some placer clock finds none
  while no node changed since has room for a part (``Placer.changed_since``);
- ``FitTimes``: each node's fit time for a head's part, kept while the node is unchanged;
- the placer's change log, and the cluster's running jobs by node and in ``running``'s order,
  which both read.

Each is checked at every use in busy random runs against the unmemoised answer, and a run
with the memories forgotten at each use gives every column and every job's start alike.
Each check is also run with the memory broken, and must then catch it."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.outcome_sim import scheduler as scheduling
from exporter.outcome_sim.cluster import Cluster
from exporter.outcome_sim.scheduler import FitTimes, Scheduler, fit_end, reserve, reserve_per_node
from exporter.outcome_sim.timeline import Job
from exporter.placement import engine
from tests.test_simulate_scheduler import fleet, random_job, run_row

STRATEGIES = ("none", "oracle", "consolidate", "descheduler")


def busy_run(case: int, strategy: str) -> tuple[dict, list[tuple[int, float | None]]]:
    """A random fleet under a stream of jobs longer than it can serve: the outcome's columns
    (but the wall time) and each job's first start."""
    return run_row(case, 4242, strategy)


class Checked:
    """Wraps the scheduler's memories for one run: each answer they give is compared with the
    unmemoised one; ``broken`` names a memory to swap for one that ignores what changed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, broken: str = "") -> None:
        self.spared = self.reservations = self.differ = 0
        checked = self
        find, still = Scheduler._find, Scheduler._still_no_room

        def still_no_room(self: Scheduler, job: Job, seen: int) -> bool:
            return True if broken == "no_room" else still(self, job, seen)

        def checked_find(self: Scheduler, job: Job, exclude: tuple[int, ...] = (),
                         models: tuple[int, ...] = ()) -> list | None:
            query = (job.shape_key, exclude, models)
            seen = self._no_room.get(query)
            if seen is not None and self._still_no_room(job, seen):
                checked.spared += 1
                if self._has_room(job, exclude, self._model_names(job, models)):  # room after all
                    checked.differ += 1
            return find(self, job, exclude, models)

        def checked_reserve(cluster: Cluster, head: Job, now: float, models: tuple[str, ...] | None = None,
                            fit_times: FitTimes | None = None) -> scheduling.Reservation:
            if broken == "fit_times" and fit_times is not None:  # a memory that never sees a node change
                for seen, _ in fit_times._by_ask.values():
                    known = seen >= 0
                    seen[known] = cluster.placer.version[known]
            kept = reserve(cluster, head, now, models, fit_times)
            checked.reservations += 1
            fresh = reserve(cluster, head, now, models)
            if kept != fresh or kept != reserve_per_node(cluster, head, now, models):
                checked.differ += 1
            return kept

        monkeypatch.setattr(Scheduler, "_find", checked_find)
        monkeypatch.setattr(Scheduler, "_still_no_room", still_no_room)
        monkeypatch.setattr(scheduling, "reserve", checked_reserve)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", range(6))
def test_each_answer_the_scheduler_keeps_is_the_one_it_would_compute(case, strategy, monkeypatch):
    checked = Checked(monkeypatch)
    busy_run(case, strategy)
    assert checked.differ == 0
    assert checked.spared > 0 and checked.reservations > 0  # both memories were used


@pytest.mark.parametrize("broken", ["no_room", "fit_times"])
def test_a_memory_that_ignores_changes_is_caught(broken, monkeypatch):
    """The check above can fail: a memory that never sees a node change gives answers the
    computation does not, within a few of the same runs."""
    checked = Checked(monkeypatch, broken)
    for case in range(6):
        busy_run(case, "none")
        if checked.differ:
            break
    assert checked.differ > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", range(6))
def test_what_the_scheduler_keeps_changes_no_outcome(case, strategy, monkeypatch):
    """The same run with both memories forgotten before each use: every column and every start
    alike."""
    kept = busy_run(case, strategy)
    find, ends = Scheduler._find, FitTimes.ends

    def forgetful_find(self: Scheduler, job: Job, exclude: tuple[int, ...] = (),
                       models: tuple[int, ...] = ()) -> list | None:
        self._no_room.clear()
        return find(self, job, exclude, models)

    def forgetful_ends(self: FitTimes, *args):  # type: ignore[no-untyped-def]
        self._by_ask.clear()
        return ends(self, *args)

    monkeypatch.setattr(Scheduler, "_find", forgetful_find)
    monkeypatch.setattr(FitTimes, "ends", forgetful_ends)
    fresh = busy_run(case, strategy)
    assert kept[1] == fresh[1]
    assert kept[0] == fresh[0]
    assert sum(1 for _, start in kept[1] if start is not None) > 0


def test_a_fit_end_is_the_end_of_the_last_job_a_part_waits_for():
    """Jobs of one GPU each on node 0, of 100, 200 and 300 s of work: a part of all the node's
    GPUs fits once the last has ended; one GPU more never fits; one that fits now, at once."""
    rng = np.random.default_rng(5)
    cluster = Cluster(fleet(rng).empty_state(), "bestfit")
    others = [n for n in range(len(cluster.placer.names)) if n]
    size = int(cluster.placer.gpu_count[0])
    jobs = [Job(i, 0.0, 100.0 * (i + 1), 1.0, 1, 1.0, 1, (), False) for i in range(min(3, size))]
    for job in jobs:
        cluster.start(job, cluster.find(job, exclude=others), 0.0)
    assert fit_end(cluster, 0, 1.0, size, 1.0) == max(job.end() for job in jobs) > 0
    assert fit_end(cluster, 0, 1.0, size + 1, 1.0) == np.inf
    if size > 3:
        assert fit_end(cluster, 0, 1.0, size - 3, 1.0) == -np.inf


def test_the_placer_log_names_each_node_changed_since_a_clock_and_says_when_it_cannot(monkeypatch):
    monkeypatch.setattr(engine, "LOG_KEPT", 8)
    changes: list[tuple[int, int]] = []  # (the clock after the change, its node), as made
    changed = engine.Placer._changed

    def recorded(self: engine.Placer, node: int) -> None:
        changed(self, node)
        changes.append((self.changes, node))

    monkeypatch.setattr(engine.Placer, "_changed", recorded)
    rng = np.random.default_rng(11)
    cluster = Cluster(fleet(rng).empty_state(), "bestfit")
    placer = cluster.placer
    for i in range(80):
        job = random_job(rng, i, gang=True)
        found = cluster.find(job)
        if found is not None:
            cluster.start(job, found, 0.0)
        if rng.random() < 0.4 and cluster.running:
            cluster.stop(next(iter(cluster.running.values())))
    assert len(changes) > 40 and placer.changes == changes[-1][0]
    answered = 0
    for since in range(placer.changes + 1):
        got = placer.changed_since(since)
        if got is None:
            assert since < placer.changes - 8  # only before the last LOG_KEPT changes
            continue
        answered += 1
        assert got == [node for clock, node in changes if clock > since]
    assert answered >= 8
    assert placer.changed_since(0) is None  # the oldest were dropped


def where_moves_may_go(cluster: Cluster, job: Job, rule: str) -> tuple[str, ...] | None:
    """strategies._models as it was computed at every call, before it was kept by value."""
    from exporter.outcome_sim.strategies import destinations

    if rule == "unrestricted":
        return None
    models = destinations(cluster, job)
    if rule == "no-slower":
        index = {name: i for i, name in enumerate(cluster.placer.model_names)}
        models = tuple(m for m in models if cluster.speeds[index[m]] >= job.speed - 1e-9)
    return models


def models_differ(monkeypatch: pytest.MonkeyPatch, broken: bool) -> int:
    """Over running jobs of every kind, at speeds of every model (a relocated job runs at its
    new model's), how often the kept answer differs from the computation; ``broken``: a
    memory keyed without the job's speed."""
    import functools

    from exporter.outcome_sim import strategies
    from tests.test_simulate_index import cluster_of, filled

    if broken:
        plain = strategies._models_by_value.__wrapped__
        first = functools.lru_cache(maxsize=None)(
            lambda rule, allowed, current, names, speeds: plain(rule, allowed, current, 1.0, names, speeds))
        monkeypatch.setattr(strategies, "_models_by_value",
                            lambda rule, allowed, current, speed, names, speeds:
                            first(rule, allowed, current, names, speeds))
    rng = np.random.default_rng(3)
    cluster = cluster_of()
    filled(cluster, rng, 40)
    differ = 0
    for job in cluster.running.values():
        for speed in sorted(set(cluster.speeds)):
            job.speed = speed
            for rule in strategies.RULES:
                differ += strategies._models(cluster, job, rule) != where_moves_may_go(cluster, job, rule)
    return differ


def test_where_a_job_may_move_kept_by_value_is_what_it_was_computed_to_be(monkeypatch):
    assert models_differ(monkeypatch, broken=False) == 0


def test_where_a_job_may_move_kept_without_its_speed_is_caught(monkeypatch):
    assert models_differ(monkeypatch, broken=True) > 0
