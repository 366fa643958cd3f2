"""What the pending planner keeps between calls, and the searches it spares, answer as the
computation they replace.

- ``_Layout``: each job's answer and the movable jobs that have run ``min_runtime``, per
  node in the snapshot's order with the GPUs they hold, kept by job from call to call;
- ``_room_elsewhere``: an evacuation's move ends where its job has room on no other node;
- ``_parts_could_fit``: a gang's search is not made where no model has nodes enough.

Each is held to the fresh computation at every use: the kept movable jobs through random
changes (jobs that come, leave, checkpoint, move, restart, are listed again in another
order or twice; a clock set back) and in busy random runs of the simulated advisor; each
spared search is made anyway and must agree. Each check is also run with the memory or
the test broken, and must then catch it; and runs with the kept state forgotten at every
call, or without the tests, give every column and every start alike."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from exporter.advisor import planner
from exporter.advisor.planner import PlanSettings, mig_nodes
from exporter.analysis.state import from_snapshot
from exporter.outcome_sim.run import RunSettings, simulate
from exporter.outcome_sim.timeline import HourlyArrivals, TimelineSettings
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, Node, Placement
from tests.test_simulate_scheduler import fleet, random_job

NOW = 1_760_000_000.0
MODELS = ("H100", "A100-SXM4-80GB")


# -- the kept movable jobs against a walk of every job -------------------------------


def fresh_movable(snapshot: FleetSnapshot, settings: PlanSettings, now: float
                  ) -> dict[int, list[tuple[Allocation, planner._Where]]]:
    """The movable jobs that have run ``min_runtime`` at ``now`` per node, each job looked at,
    as the planner gathered them before it kept them."""
    state = from_snapshot(snapshot)
    index = {name: i for i, name in enumerate(state.names)}
    mig = mig_nodes(snapshot)
    rows: dict[int, dict[int, int]] = {}
    out: dict[int, list[tuple[Allocation, planner._Where]]] = {}
    for alloc in snapshot.allocations:
        where = planner._where(alloc, state, index, mig, settings, rows)
        began = now if alloc.start_time is None else alloc.start_time
        if where is not None and max(0.0, now - began) >= settings.min_runtime_seconds:
            out.setdefault(where.node, []).append((alloc, where))
    return out


def differs(kept: planner._Movable, fresh: dict[int, list[tuple[Allocation, planner._Where]]]) -> bool:
    """Whether the kept answer is not the fresh one: each node's jobs, the same allocations
    in the same order with equal answers, and their GPUs summed to the same float."""
    if set(kept.by_node) != set(fresh) or set(kept.demand) != set(fresh):
        return True
    for node, jobs in fresh.items():
        mine = [(kept.allocs.get(key), where) for key, where in kept.by_node[node]]
        if [a for a, _ in mine] != [a for a, _ in jobs] or any(
                a is not b or w != v for (a, w), (b, v) in zip(mine, jobs, strict=True)):
            return True
        if kept.demand[node] != sum(where.demand for _, where in jobs):
            return True
    return False


def small_fleet(rng: np.random.Generator) -> tuple[tuple[Node, ...], tuple[Gpu, ...]]:
    nodes = tuple(Node(f"h{i}", MODELS[int(rng.integers(2))], 64.0, "p", "x", 8) for i in range(6))
    gpus = tuple(Gpu(n.name, g, f"GPU-{n.name}-{g}", n.model, n.pool, mig=("1g",) if n.name == "h5" and g == 0
                     else ()) for n in nodes for g in range(8))
    return nodes, gpus


def random_alloc(rng: np.random.Generator, name: str, now: float) -> Allocation:
    node = f"h{int(rng.integers(6))}"
    gpus = tuple(sorted(rng.choice(8, size=int(rng.choice([0, 1, 2, 4])), replace=False).tolist()))
    share = 1.0 if len(gpus) != 1 or rng.random() < 0.7 else 0.5
    parts = (Placement(node, gpus, share, float(rng.choice([2, 8, 16]))),)
    if rng.random() < 0.1:  # a multi-node job: never movable
        parts += (Placement(f"h{int(rng.integers(6))}", (0,), 1.0, 4.0),)
    start = None if rng.random() < 0.05 else now - float(rng.integers(-10, 240)) * 60.0
    return Allocation(name, parts, namespace="team", priority=1000 if rng.random() < 0.1 else 0,
                      start_time=start, last_checkpoint_time=None if start is None else start)


def random_steps(case: int, broken: bool = False) -> tuple[int, int]:
    """Random snapshots of one fleet, one after another, each planned for with one kept layout:
    (looks at a kept answer, those that differed from the walk). ``broken``: a memory broken
    on purpose, which may also fail outright: that counts as differing."""
    rng = np.random.default_rng([case, 1717])
    nodes, gpus = small_fleet(rng)
    now = NOW
    allocs = [random_alloc(rng, f"j{k}", now) for k in range(int(rng.integers(10, 40)))]
    settings = PlanSettings()
    layout = planner._Layout()
    looks = differ = 0
    for step in range(60):
        now += float(rng.integers(0, 20)) * 60.0
        if rng.random() < 0.05:
            now -= 3600.0  # a clock set back
        if rng.random() < 0.05:
            settings = PlanSettings(min_runtime_seconds=float(rng.choice([0.0, 900.0, 1800.0])))
        for k in range(len(allocs)):
            r = rng.random()
            if r < 0.15:  # a checkpoint: a new allocation of a job that has not moved
                allocs[k] = dataclasses.replace(allocs[k], last_checkpoint_time=now)
            elif r < 0.2:  # moved, or restarted
                moved = random_alloc(rng, allocs[k].job, now)
                allocs[k] = moved if rng.random() < 0.5 else dataclasses.replace(moved, start_time=now)
        gone = set(rng.integers(0, max(1, len(allocs)), size=int(rng.integers(0, 4))).tolist())
        allocs = [a for k, a in enumerate(allocs) if k not in gone]
        for _ in range(int(rng.integers(0, 4))):
            new = random_alloc(rng, f"j{step}-{rng.integers(99)}", now)
            allocs.insert(int(rng.integers(len(allocs) + 1)), new)
        listed = list(allocs)
        if rng.random() < 0.05:
            rng.shuffle(listed)  # type: ignore[arg-type]
        if rng.random() < 0.05 and listed:
            listed.append(dataclasses.replace(listed[0]))  # one job listed twice
        snapshot = FleetSnapshot(now, nodes, gpus, tuple(listed))
        state = from_snapshot(snapshot)
        mig = mig_nodes(snapshot)
        layout.start(state, mig, settings)
        looks += 1
        try:
            kept = layout.update(snapshot, state, mig, settings, now)
        except KeyError:
            if not broken:
                raise
            differ += 1
            layout.forget()
            continue
        differ += differs(kept, fresh_movable(snapshot, settings, now))
        walked = planner._movable_jobs(snapshot, state, settings, layout, now)
        index = {n: i for i, n in enumerate(state.names)}
        every = [(a, w) for a in snapshot.allocations
                 if (w := planner._where(a, state, index, mig, settings, {})) is not None]
        differ += ([a for a, _ in walked] != [a for a, _ in every]
                   or [w for _, w in walked] != [w for _, w in every])
    return looks, differ


@pytest.mark.parametrize("case", range(20))
def test_the_kept_movable_jobs_are_a_fresh_walks_through_random_changes(case):
    looks, differ = random_steps(case)
    assert looks == 60 and differ == 0


BROKEN_LAYOUT = ("left_stay", "young_stay", "moves_kept", "checkpoints_kept")


def break_layout(monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    """A kept state that misses one kind of change."""
    after = planner._Ripe.after
    if broken == "left_stay":  # a job that left stays listed on its node
        monkeypatch.setattr(planner._Ripe, "after",
                            lambda self, names, allocs, kept, left, came, now:
                            after(self, names, allocs, kept, [], came, now))
    elif broken == "young_stay":  # a young job never ripens
        monkeypatch.setattr(planner._Ripe, "after",
                            lambda self, names, allocs, kept, left, came, now:
                            after(dataclasses.replace(self, young=[]), names, allocs, kept, left, came, now))
    elif broken == "moves_kept":  # a job that moved keeps its old answer
        monkeypatch.setattr(planner, "_same_layout", lambda kept, alloc: True)
    elif broken == "checkpoints_kept":  # a job's new allocation not taken: its old checkpoint
        update = planner._Layout.update

        def stale(self: planner._Layout, snapshot: FleetSnapshot, *args: object) -> planner._Movable:
            last = dict(self.allocs)
            movable = update(self, snapshot, *args)  # type: ignore[arg-type]
            self.allocs.update({k: v for k, v in last.items() if k in self.allocs})
            return dataclasses.replace(movable, allocs=self.allocs)

        monkeypatch.setattr(planner._Layout, "update", stale)


@pytest.mark.parametrize("broken", BROKEN_LAYOUT)
def test_a_kept_layout_that_misses_a_change_is_caught_in_random_steps(broken, monkeypatch):
    break_layout(monkeypatch, broken)
    differ = 0
    for case in range(20):
        differ += random_steps(case, broken=True)[1]
        if differ:
            break
    assert differ > 0


# -- the planner's plans on a fleet that changes from call to call ----------------------


def packed_fleet(rng: np.random.Generator) -> tuple[tuple[Node, ...], tuple[Gpu, ...]]:
    nodes = tuple(Node(f"g{i}", MODELS[int(rng.integers(2))], 64.0, "p", "x", 8) for i in range(8))
    return nodes, tuple(Gpu(n.name, g, f"GPU-{n.name}-{g}", n.model, n.pool) for n in nodes for g in range(8))


def start_job(rng: np.random.Generator, nodes: tuple[Node, ...], held: dict[str, set[int]], name: str,
              now: float) -> Allocation | None:
    """A job of 1, 2 or 4 GPUs (or a share of one) on the first node with room, from a random one."""
    gpus = int(rng.choice([1, 1, 2, 4]))
    first = int(rng.integers(len(nodes)))
    for node in nodes[first:] + nodes[:first]:
        idle = [g for g in range(8) if g not in held[node.name]]
        if len(idle) >= gpus:
            taken = tuple(idle[:gpus])
            held[node.name].update(taken)
            started = now - float(rng.integers(0, 180)) * 60.0
            share = 0.5 if gpus == 1 and rng.random() < 0.2 else 1.0
            return Allocation(name, (Placement(node.name, taken, share, 4.0 * gpus),),
                              namespace=f"ns{rng.integers(3)}", priority=1000 if rng.random() < 0.1 else 0,
                              start_time=started, last_checkpoint_time=started)
    return None


def planner_steps(case: int, checked: Checked | None = None) -> tuple[int, int]:
    """Random fleets, changed a little between calls (jobs end, start, checkpoint; time goes
    on), each with a gang or a whole-node job at the head: the plan of a planner that keeps
    its state against one that starts afresh. (Calls, plans that differed.)"""
    from exporter.advisor.advise import Planner
    from exporter.analysis.fgd import compile_workload
    from exporter.analysis.index import IndexSettings, evaluate
    from exporter.analysis.workload import Shape, Workload
    from exporter.snapshot import JobRequest

    rng = np.random.default_rng([case, 1919])
    nodes, gpus = packed_fleet(rng)
    held: dict[str, set[int]] = {n.name: set() for n in nodes}
    now = NOW
    running: list[Allocation] = []
    for k in range(40):
        if (job := start_job(rng, nodes, held, f"r{k}", now)) is not None:
            running.append(job)
    kept, calls, differ = Planner(), 0, 0
    workload = Workload((Shape(8, 1.0, 8), Shape(2, 1.0, 1)), (0.6, 0.4))
    for step in range(40):
        now += float(rng.integers(1, 10)) * 60.0
        for k, job in enumerate(running):
            r = rng.random()
            if r < 0.2:  # a checkpoint
                running[k] = dataclasses.replace(job, last_checkpoint_time=now)
            elif r < 0.23:  # moved to another node (the operator's, or a plan carried out), or restarted
                part = job.placements[0]
                held[part.node].difference_update(part.gpus)
                moved = start_job(rng, nodes, held, job.job, now)
                if moved is None:
                    held[part.node].update(part.gpus)
                else:
                    running[k] = moved if rng.random() < 0.5 else dataclasses.replace(moved, start_time=now)
        for job in [j for j in running if rng.random() < 0.08]:
            running.remove(job)
            held[job.placements[0].node].difference_update(job.placements[0].gpus)
        for k in range(int(rng.integers(0, 4))):
            if (job := start_job(rng, nodes, held, f"s{step}-{k}", now)) is not None:
                running.append(job)
        heads = (JobRequest(f"gang{step}", 8 * 2, 1.0, 16.0, 2, submit_time=now - 3600.0),
                 JobRequest(f"wide{step}", 8 * 4, 1.0, 32.0, 4, submit_time=now - 7200.0),
                 JobRequest(f"whole{step}", 8, 1.0, 8.0, 1, submit_time=now - 600.0),
                 JobRequest(f"four{step}", 4, 1.0, 4.0, 1, submit_time=now - 60.0))
        pending = tuple(heads[i] for i in rng.permutation(len(heads)))
        snapshot = FleetSnapshot(now, nodes, gpus, tuple(running), pending)
        state = from_snapshot(snapshot)
        report = evaluate(state, compile_workload(workload, state.model_names), IndexSettings())
        for head in pending:
            calls += 1
            mine = kept.for_pending(snapshot, report, head, now)
            fresh = Planner().for_pending(snapshot, report, head, now)
            differ += mine != fresh
    return calls, differ


# -- busy runs of the simulated advisor -----------------------------------------------


def busy_jobs(rng: np.random.Generator) -> list:
    """300 random jobs, gangs among them, submitted over ten hours, each running half an hour to
    three: more than a small fleet serves at times, and movable once they have run
    ``min_runtime``."""
    jobs = []
    for i in range(300):
        j = random_job(rng, i, gang=True)
        j.submit = float(rng.integers(0, 1200)) * 30.0
        j.work = float(rng.integers(30, 180)) * 60.0
        j.high = bool(rng.random() < 0.1)
        jobs.append(j)
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


def busy_run(case: int) -> tuple[dict, list[tuple[int, float | None]]]:
    """A random fleet under a stream of jobs longer than it can serve, the advisor evaluated
    every minute: the outcome's columns (but the wall time) and each job's first start."""
    rng = np.random.default_rng([case, 1818])
    sim_fleet = fleet(rng)
    jobs = busy_jobs(rng)
    series = HourlyArrivals(np.array([3600.0] * 48), np.array([1.0] * 48))
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.0), advisor_interval=60.0)
    out = simulate(sim_fleet, series, "advisor", 1, settings, jobs=jobs)
    row = out.row()
    row.pop("wall_seconds")
    return row, [(j.id, j.start) for j in jobs]


class Checked:
    """Holds, at every call of one run, the kept movable jobs to a fresh walk, and each search
    a test spares to the search made anyway; ``broken`` names one to break."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, broken: str = "") -> None:
        self.looks = self.differ = 0
        self.seen: Counter[str] = Counter()
        checked = self
        movable, room, parts = planner._movable, planner._room_elsewhere, planner._parts_could_fit
        plan_job = planner._plan_job
        if broken in BROKEN_LAYOUT:
            break_layout(monkeypatch, broken)

        def checked_movable(working, snapshot, state, mig, is_mig, now, settings):  # type: ignore[no-untyped-def]
            kept, barred = movable(working, snapshot, state, mig, is_mig, now, settings)
            checked.looks += 1
            checked.differ += differs(kept, fresh_movable(snapshot, settings, now))
            checked.last = (kept, barred, now)
            return kept, barred

        def checked_room(placer, task, barred, node):  # type: ignore[no-untyped-def]
            if broken == "room":  # no node after this one asked
                fits = placer.room(task, "fgd")
                fits[barred] = False
                fits[node:] = False
                found = bool(fits.any())
            else:
                found = room(placer, task, barred, node)
            checked.seen[f"room {found}"] += 1
            if not found and placer.place(task, "fgd", exclude=[*barred, node]) is not None:
                checked.differ += 1
            return found

        def checked_parts(placer, target, movable, settings):  # type: ignore[no-untyped-def]
            asked = target
            if broken == "parts":  # each part taken to ask a GPU more than it does
                more = dataclasses.replace(target.task, gpus=target.task.gpus + 1)
                asked = dataclasses.replace(target, task=more)
            could = parts(placer, asked, movable, settings)
            checked.seen[f"parts {target.parts > 1} {could}"] += 1
            if not could:
                moved, barred, now = checked.last
                log: list = []
                if plan_job(placer, target, moved, now, settings, [], Counter(), barred, log):
                    checked.differ += 1
                planner._undo(placer, log)
            return could

        monkeypatch.setattr(planner, "_movable", checked_movable)
        monkeypatch.setattr(planner, "_room_elsewhere", checked_room)
        monkeypatch.setattr(planner, "_parts_could_fit", checked_parts)


BUSY = (0, 2, 4, 5)  # runs whose advisor carries out moves


@pytest.mark.parametrize("case", BUSY)
def test_each_answer_the_planner_keeps_or_spares_is_the_one_it_would_compute(case, monkeypatch):
    checked = Checked(monkeypatch)
    row, _ = busy_run(case)
    assert checked.differ == 0
    assert checked.looks >= 10 and row["migrations"] > 0


@pytest.mark.parametrize("broken", [*BROKEN_LAYOUT, "room", "parts"])
def test_a_broken_memory_or_test_is_caught_on_a_changing_fleet(broken, monkeypatch):
    checked = Checked(monkeypatch, broken)
    for case in range(6):
        try:
            planner_steps(case)
        except (KeyError, ValueError):  # a memory broken so that a plan fails outright: caught as well
            checked.differ += 1
        if checked.differ:
            break
    assert checked.differ > 0


@pytest.mark.parametrize("case", BUSY)
def test_the_kept_state_and_the_spared_searches_change_no_outcome(case, monkeypatch):
    """The same run with the planner's kept state forgotten before every call (a fresh one,
    as serve's new allocations each cycle) and no search spared: every column and every
    start alike."""
    kept = busy_run(case)
    borrow = planner.KeptState.borrow

    def forgetful(self: planner.KeptState):  # type: ignore[no-untyped-def]
        self.layout = planner._Layout()
        self.placer = None
        return borrow(self)

    monkeypatch.setattr(planner.KeptState, "borrow", forgetful)
    monkeypatch.setattr(planner, "_room_elsewhere", lambda placer, task, barred, node: True)
    monkeypatch.setattr(planner, "_parts_could_fit", lambda placer, target, movable, settings: True)
    fresh = busy_run(case)
    assert kept[1] == fresh[1]
    assert kept[0] == fresh[0]
    assert kept[0]["migrations"] > 0


@pytest.mark.parametrize("case", range(6))
def test_a_planner_that_keeps_its_state_plans_as_a_fresh_one_on_a_changing_fleet(case, monkeypatch):
    checked = Checked(monkeypatch)
    calls, differ = planner_steps(case)
    assert calls == 160 and differ == 0 and checked.differ == 0
    assert checked.looks > 50
    # each test answered both ways over the cases: searches spared and searches made
    assert checked.seen["room False"] > 0 and checked.seen["room True"] > 0
    assert checked.seen["parts True True"] > 0
