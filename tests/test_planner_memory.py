"""The searches the pending planner spares, and the answers it keeps for them, are the
computation they replace.

- ``_room_elsewhere``: an evacuation's move ends where its job has room on no other node,
  each task's answer kept while the rows it read are as they were;
- ``_parts_could_fit``: a gang's search is not made where no model has nodes enough.

Each spared search is made anyway at every use, on a fleet that changes from call to call
(jobs end, start, checkpoint, move, restart) and in busy random runs of the simulated
advisor, and must agree; a planner that keeps its state plans as a fresh one. Each test is
also run broken, and must then be caught; and runs with the kept state forgotten at every
call and no search spared give every column and every start alike."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from exporter.advisor import planner
from exporter.analysis.state import from_snapshot
from exporter.placement.engine import Placer
from exporter.placement.task import Task
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, Node, Placement
from tests.test_simulate_scheduler import busy_jobs, run_row

NOW = 1_760_000_000.0
MODELS = ("H100", "A100-SXM4-80GB")


# -- a room answer kept while the rows it read are as they were ------------------------


def kept_blindly(rooms: planner._Rooms, task: Task, barred: list[int], node: int) -> bool:
    """_room_elsewhere with its answers kept on the placer's own arrays, not copies: every
    later comparison finds them unchanged."""
    placer = rooms.placer
    if task not in rooms.kept:
        rooms.kept[task] = (placer.room(task, "fgd"), placer.cpu_free, placer.gpu_free, None)
    fits = rooms.kept[task][0].copy()
    fits[barred] = False
    fits[node] = False
    return bool(fits.any())


@pytest.mark.parametrize("broken", [False, True])
def test_a_room_answer_is_read_again_once_a_node_not_excluded_changes(broken, monkeypatch):
    """Three full nodes: a four-GPU task has room nowhere. A change on the node excluded keeps
    the answer read; a job leaving another node makes room there, and the answer is read
    again. With answers kept on the live arrays, the room that came is missed."""
    if broken:
        monkeypatch.setattr(planner, "_room_elsewhere", kept_blindly)
    placer = Placer.for_nodes(["a", "b", "c"], ["H100"] * 3, ["p"] * 3, [64.0] * 3, [8, 8, 8],
                              target=[(Task(8.0, 8, 1.0, ()), 1.0)])
    task = Task(8.0, 4, 1.0, ())
    held = []
    for _ in range(6):
        part = placer.place(task, "bestfit")
        assert part is not None
        placer.apply(part)
        held.append(part)
    rooms = planner._Rooms(placer)
    answers = [planner._room_elsewhere(rooms, task, [], 0)]
    on_a = next(p for p in held if p.node == 0)
    placer.release(on_a)  # room on the node excluded only: still none elsewhere
    answers.append(planner._room_elsewhere(rooms, task, [], 0))
    placer.apply(on_a)
    placer.release(next(p for p in held if p.node == 2))  # room on c
    answers += [planner._room_elsewhere(rooms, task, [], 0), planner._room_elsewhere(rooms, task, [2], 0)]
    expected = [False, False, True, False]
    assert (answers != expected) if broken else (answers == expected)


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


def planner_steps(case: int) -> tuple[int, int]:
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


def long_jobs(rng: np.random.Generator) -> list:
    """300 random jobs, gangs among them, submitted over ten hours, each running half an hour to
    three: more than a small fleet serves at times, and movable once they have run
    ``min_runtime``."""
    return busy_jobs(rng, count=300, slots=1200, minutes=(30, 180), high=0.1)


def busy_run(case: int) -> tuple[dict, list[tuple[int, float | None]]]:
    """A random fleet under a stream of jobs longer than it can serve, the advisor evaluated
    every minute: the outcome's columns (but the wall time) and each job's first start."""
    return run_row(case, 1818, "advisor", advisor_interval=60.0, jobs_of=long_jobs)


class Checked:
    """Holds, at every call of one run, each search a test spares to the search made anyway;
    ``broken`` names a test to break."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, broken: str = "") -> None:
        self.looks = self.differ = 0
        self.seen: Counter[str] = Counter()
        checked = self
        movable, room, parts = planner._movable, planner._room_elsewhere, planner._parts_could_fit
        plan_job = planner._plan_job

        def kept_movable(working, snapshot, state, mig, is_mig, now, settings):  # type: ignore[no-untyped-def]
            found, barred = movable(working, snapshot, state, mig, is_mig, now, settings)
            checked.looks += 1
            checked.last = (found, barred, now)
            return found, barred

        def checked_room(rooms, task, barred, node):  # type: ignore[no-untyped-def]
            placer = rooms.placer
            if broken == "room":  # no node after this one asked
                fits = placer.room(task, "fgd")
                fits[barred] = False
                fits[node:] = False
                found = bool(fits.any())
            else:
                found = room(rooms, task, barred, node)
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
                rooms = planner._Rooms(placer)
                if plan_job(placer, target, moved, now, settings, [], Counter(), barred, log, rooms):
                    checked.differ += 1
                planner._undo(placer, log)
            return could

        monkeypatch.setattr(planner, "_movable", kept_movable)
        monkeypatch.setattr(planner, "_room_elsewhere", checked_room)
        monkeypatch.setattr(planner, "_parts_could_fit", checked_parts)


BUSY = (0, 2, 4, 5)  # runs whose advisor carries out moves


@pytest.mark.parametrize("case", BUSY)
def test_each_search_the_planner_spares_would_find_nothing(case, monkeypatch):
    checked = Checked(monkeypatch)
    row, _ = busy_run(case)
    assert checked.differ == 0
    assert checked.looks >= 10 and row["migrations"] > 0


@pytest.mark.parametrize("broken", ["room", "parts"])
def test_a_broken_test_is_caught_on_a_changing_fleet(broken, monkeypatch):
    checked = Checked(monkeypatch, broken)
    for case in range(6):
        planner_steps(case)
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
    monkeypatch.setattr(planner, "_room_elsewhere", lambda rooms, task, barred, node: True)
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
