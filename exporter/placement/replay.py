"""Trace replay: what a placement policy costs, measured the way the FGD paper measures it.

The protocol (Weng et al., ATC'23, Sec. 6; the reference simulator's
``workloadTuningConfig``): shuffle the pods with a seed, append random copies
of them until the GPUs they ask for reach ``arrive`` times the cluster's GPU
capacity, then let them arrive one by one. Nothing departs; a pod that fits
nowhere fails and is counted. At every whole percent of arrived workload
(GPUs asked for by the pods that arrived so far, over the cluster's GPUs)
one row records the GPU allocation and the fragmented GPUs, both in % of all
GPUs, the fragmentation ratio in % of idle GPUs, and the failed pods so far.

All policies see the same pod order for the same seed. Fragmentation is
measured against the pods' typical workload, the one ``fgd`` minimises.

The nodes are considered in name order (``node_order="name"``), or in a random
order drawn per seed (``"seeded"``), as the reference simulator does: it
prefixes every node's name with a seeded random permutation before scheduling,
so its "lexicographically first node", where ties and CPU-only pods go, is a
random node (docs/replay.md, "packing and dotprod, line by line"). All
policies see the same node order for the same seed.
Several policies and seeds run in parallel processes, one run per process.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from queue import Empty

import numpy as np

from exporter.analysis.fgd import CompiledWorkload
from exporter.analysis.state import FleetState
from exporter.placement.engine import Placer
from exporter.placement.policies import FGD_TIES, FgdTies
from exporter.placement.task import Task

COLUMNS = ("policy", "seed", "arrived_pct", "alloc_pct", "frag_pct", "frag_ratio_pct", "failed_pods")
PROGRESS_EVERY = 256  # pods between progress reports from a run
NODE_ORDERS = ("name", "seeded")  # see the module's docstring


@dataclass(frozen=True, slots=True)
class Row:
    policy: str
    seed: int
    arrived_pct: int
    alloc_pct: float
    frag_pct: float
    frag_ratio_pct: float
    failed_pods: int

    def csv(self) -> str:
        return (f"{self.policy},{self.seed},{self.arrived_pct},{self.alloc_pct:.4f},{self.frag_pct:.4f},"
                f"{self.frag_ratio_pct:.4f},{self.failed_pods}")


@dataclass(frozen=True, eq=False)
class Setup:
    """What every run shares: the empty fleet, the pods, the target workload, the arrival ratio."""

    state: FleetState
    tasks: tuple[Task, ...]
    workload: CompiledWorkload
    arrive: float = 1.3
    fgd_ties: FgdTies = FGD_TIES  # see policies.FgdTies
    node_memory: np.ndarray | None = None  # bytes per node; None: memory is not checked
    node_order: str = "name"  # one of NODE_ORDERS

    def __post_init__(self) -> None:
        if self.node_order not in NODE_ORDERS:
            raise ValueError(f"node_order: one of {', '.join(NODE_ORDERS)}, got {self.node_order!r}")

    @property
    def capacity(self) -> float:
        return float(self.state.gpu_count.sum())

    @property
    def last_pct(self) -> int:
        return round(self.arrive * 100)


def arrivals(tasks: Sequence[Task], capacity: float, arrive: float, seed: int) -> list[int]:
    """Indices of the pods in arrival order: shuffled, then random copies up to ``arrive`` x capacity."""
    if capacity <= 0:
        raise ValueError("the cluster has no GPUs")
    demand = np.array([t.gpu_demand for t in tasks], dtype=float)
    if demand.sum() <= 0:
        raise ValueError("the pods ask for no GPUs, so no workload ever arrives")
    rng = np.random.default_rng(seed)
    order = [int(i) for i in rng.permutation(len(tasks))]
    asked = float(demand.sum())
    target = arrive * capacity
    while asked < target - 1e-9:
        i = int(rng.integers(len(tasks)))
        order.append(i)
        asked += demand[i]
    return order


def node_permutation(names: Sequence[str], seed: int) -> np.ndarray:
    """The seeded node order: position p holds node ``order[p]``.

    The names are sorted first, so the order depends on the fleet and the seed, not on
    the order of the file; then a permutation from its own stream of the seed (apart
    from the pod order's and the random policy's), so the pods each seed sees are the
    same in both node orders. The reference draws its permutation from Go's math/rand
    after its pod shuffle; this is the same protocol, not the same draw.
    """
    by_name = np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.intp)
    return by_name[np.random.default_rng([seed, 2]).permutation(len(names))]


def permuted(state: FleetState, order: np.ndarray) -> FleetState:
    """``state`` with its nodes in ``order`` (models and pools keep their ids)."""
    return dataclasses.replace(
        state, names=tuple(state.names[i] for i in order), model=state.model[order],
        pool=state.pool[order], cpu_total=state.cpu_total[order], cpu_free=state.cpu_free[order],
        gpu_free=state.gpu_free[order], gpu_count=state.gpu_count[order],
        gpu_index=None if state.gpu_index is None else state.gpu_index[order])


def fleet_for(setup: Setup, seed: int) -> tuple[FleetState, np.ndarray | None]:
    """The empty fleet and its nodes' memory in the order a run of ``seed`` considers them."""
    if setup.node_order == "name":
        return setup.state, setup.node_memory
    order = node_permutation(setup.state.names, seed)
    memory = None if setup.node_memory is None else setup.node_memory[order]
    return permuted(setup.state, order), memory


def replay(setup: Setup, policy: str, seed: int,
           progress: Callable[[int], None] | None = None) -> list[Row]:
    """One policy, one seed: a row per whole percent of arrived workload, 0 to ``setup.last_pct``."""
    state, memory = fleet_for(setup, seed)
    placer = Placer(state, setup.workload, fgd_ties=setup.fgd_ties, host_memory=memory)
    rng = np.random.default_rng([seed, 1])  # the random policy's draws, apart from the pod order
    capacity = setup.capacity
    last = setup.last_pct
    rows: list[Row] = []
    failed = 0

    def record(pct: int) -> None:
        idle = placer.idle_gpus
        frag = placer.fragmented_gpus
        rows.append(Row(policy, seed, pct, 100.0 * (capacity - idle) / capacity, 100.0 * frag / capacity,
                        100.0 * frag / idle if idle > 1e-9 else 0.0, failed))

    record(0)
    arrived = 0.0
    order = arrivals(setup.tasks, capacity, setup.arrive, seed)
    for done, index in enumerate(order, start=1):
        task = setup.tasks[index]
        # the pod behind this one, which a scheduler with a queue of two knows (lookahead reads it)
        queued = setup.tasks[order[done]] if policy == "lookahead" and done < len(order) else None
        found = placer.place(task, policy, rng, queued=queued)
        if found is None:
            failed += 1
        else:
            placer.apply(found)
        arrived += task.gpu_demand
        # a row at each whole percent the arrival just reached (1e-9: 1.3 x 6212 is not exact)
        while len(rows) <= last and arrived * 100 >= len(rows) * capacity - 1e-6:
            record(len(rows))
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done)
    while len(rows) <= last:  # float rounding can leave the last percent unrecorded
        record(len(rows))
    return rows


def run_lengths(setup: Setup, seeds: Iterable[int]) -> dict[int, int]:
    """Pods each seed's run places (for a progress bar's total)."""
    return {seed: len(arrivals(setup.tasks, setup.capacity, setup.arrive, seed)) for seed in seeds}


_SETUP: Setup | None = None
_QUEUE = None


def _init_worker(setup: Setup, queue) -> None:  # type: ignore[no-untyped-def]
    global _SETUP, _QUEUE
    _SETUP, _QUEUE = setup, queue


def _run(run: int, policy: str, seed: int) -> tuple[int, list[Row]]:
    assert _SETUP is not None
    queue = _QUEUE

    def report(done: int) -> None:
        if queue is not None:
            queue.put((run, done))

    rows = replay(_SETUP, policy, seed, report)
    return run, rows


def replay_many(setup: Setup, policies: Sequence[str], seeds: Sequence[int], jobs: int | None = None,
                progress: Callable[[dict[int, int], int], None] | None = None) -> list[Row]:
    """Every policy x seed, ``jobs`` runs at a time in worker processes (one core each).

    ``progress`` is called with {run: pods placed so far} and the number of runs
    finished, a few times a second while runs are going. Rows come back in
    ``policies`` x ``seeds`` order.
    """
    runs = [(policy, seed) for policy in policies for seed in seeds]
    lengths = run_lengths(setup, seeds)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(runs)))
    results: dict[int, list[Row]] = {}
    placed: dict[int, int] = {}
    if jobs == 1:
        for i, (policy, seed) in enumerate(runs):
            def report(n: int, i: int = i) -> None:
                placed[i] = n
                if progress is not None:
                    progress(placed, len(results))
            results[i] = replay(setup, policy, seed, report)
            placed[i] = lengths[seed]
            if progress is not None:
                progress(placed, len(results))
        return [row for i in range(len(runs)) for row in results[i]]
    # spawn, not fork: forking a process that has threads can deadlock the child
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker,
                             initargs=(setup, queue)) as pool:
        pending = {pool.submit(_run, i, policy, seed) for i, (policy, seed) in enumerate(runs)}
        try:
            while pending:
                finished, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                for future in finished:
                    run, rows = future.result()
                    results[run] = rows
                    placed[run] = lengths[runs[run][1]]
                _drain(queue, placed, results)
                if progress is not None:
                    progress(placed, len(results))
        except BaseException:
            # a failed run (or Ctrl-C) ends the replay: the queued runs would be for nothing
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [row for i in range(len(runs)) for row in results[i]]


def _drain(queue, placed: dict[int, int], finished: dict[int, list[Row]]) -> None:  # type: ignore[no-untyped-def]
    while True:
        try:
            run, done = queue.get_nowait()
        except Empty:
            return
        if run not in finished:
            placed[run] = max(placed.get(run, 0), done)


def write_csv(rows: Iterable[Row], path: str | os.PathLike[str]) -> None:
    with open(path, "w") as out:
        out.write(",".join(COLUMNS) + "\n")
        for row in rows:
            out.write(row.csv() + "\n")


def summary(rows: Sequence[Row], pct: int | None = None) -> list[tuple[str, float, float, float, float]]:
    """Per policy at ``pct`` (the last row by default), averaged over seeds:
    (policy, alloc %, frag %, frag ratio %, failed pods)."""
    out: list[tuple[str, float, float, float, float]] = []
    policies = list(dict.fromkeys(r.policy for r in rows))
    pct = max(r.arrived_pct for r in rows) if pct is None else pct
    for policy in policies:
        at = [r for r in rows if r.policy == policy and r.arrived_pct == pct]
        alloc, frag, ratio, failed = (float(np.mean([getattr(r, c) for r in at]))
                                      for c in ("alloc_pct", "frag_pct", "frag_ratio_pct", "failed_pods"))
        out.append((policy, alloc, frag, ratio, failed))
    return out


__all__ = ["COLUMNS", "NODE_ORDERS", "Row", "Setup", "arrivals", "fleet_for", "node_permutation", "permuted",
           "replay", "replay_many", "summary", "write_csv"]
