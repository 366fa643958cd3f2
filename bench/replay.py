"""Time one fgd replay of the default openb trace at 130% arrival, on one core, against a naive fgd.

The run is the paper's protocol (``gpufleet replay``'s): the default trace's
8,152 pods shuffled by the seed, random copies appended until they ask for
1.3 x the cluster's 6,212 GPUs, then placed one by one by ``fgd`` (CPU, GPU
and memory checked) with a row recorded at every whole percent. It prints the wall and CPU time, pods
per second and the process's peak memory (``ru_maxrss``).

``--policy lookahead`` (or any other) times that policy's run instead; the
baseline is always fgd as defined (exact ties, ``FgdTies(0, 0, "first")``),
whose choices the brute force below must reproduce.

The baseline, measured in the same run, is fgd written the obvious way: for
every candidate (each node, each GPU the pod fits on), build the cluster
with the pod placed there and re-evaluate the whole cluster's F(M), then
take the least. It is far too slow to run over the whole trace, so it is
timed on pods sampled evenly across the run (each on the cluster exactly as
the fast run left it when that pod arrived), its choice is checked against
the fast engine's, and its time for the whole run is extrapolated from the
mean per pod. The reference simulator's figures (about 2,470 s and 4 GB for
one run on a 2-core machine, from the issue) are quoted, not measured.

Run: .venv/bin/python bench/replay.py [--seed 42] [--naive-pods 12] [--policy fgd]
"""

from __future__ import annotations

import os

# one core: no BLAS threads, and the process pinned to a single CPU where the OS allows
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.analysis import fgd, openb  # noqa: E402
from exporter.analysis.state import EPS, FleetState, with_node  # noqa: E402
from exporter.analysis.workload import from_tasks  # noqa: E402
from exporter.placement.engine import Placer  # noqa: E402
from exporter.placement.policies import FgdTies  # noqa: E402
from exporter.placement.replay import Setup, arrivals, replay  # noqa: E402
from exporter.placement.task import Task  # noqa: E402

TARGET_SECONDS = 60.0
TARGET_PEAK_BYTES = 1 << 30
REFERENCE_SECONDS = 2470.0  # the reference simulator, one run, as the issue reports it
REFERENCE_PEAK_BYTES = 4 << 30


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def naive_choice(state: FleetState, memory_free: np.ndarray, task: Task,
                 cw: fgd.CompiledWorkload) -> tuple[int, tuple[int, ...]] | None:
    """fgd by brute force: the whole cluster's F(M) re-evaluated for every candidate."""
    before = float(fgd.node_fragmentation(state, cw).sum())
    best: tuple[float, int, tuple[int, ...]] | None = None
    for node in range(len(state)):
        if state.cpu_free[node] < task.cpus - EPS or memory_free[node] < task.host_memory_bytes - 0.5:
            continue
        row = state.gpu_free[node, : state.gpu_count[node]]
        if task.cpu_only:
            candidates: list[tuple[int, ...]] = [()]
        elif task.gpu_share >= 1 - EPS:
            free = np.flatnonzero(row >= 1 - EPS)
            candidates = [tuple(int(s) for s in free[: task.gpus])] if len(free) >= task.gpus else []
        else:  # one fractional GPU: every GPU it fits on, tightest first as the engine orders them
            roomy = np.flatnonzero(row >= task.gpu_share - EPS)
            candidates = [(int(s),) for s in roomy[np.argsort(row[roomy], kind="stable")]]
        for slots in candidates:
            placed = row.copy()
            placed[list(slots)] -= task.gpu_share if slots else 0.0
            after = with_node(state, node, float(state.cpu_free[node]) - task.cpus, placed)
            growth = float(fgd.node_fragmentation(after, cw).sum()) - before
            if best is None or growth < best[0] - 1e-9:
                best = (growth, node, slots)
    return None if best is None else (best[1], best[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--naive-pods", type=int, default=12, help="pods to time the naive fgd on")
    parser.add_argument("--policy", default="fgd", help="the policy whose run is timed (default fgd)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    rss_start = peak_rss_bytes()

    trace = openb.named_trace(openb.DEFAULT_TRACE)
    mapper = openb.ModelMapper()
    nodes = openb.load_nodes(trace.nodes, mapper)
    pods = openb.load_pods(trace.pods, mapper)
    state = openb.empty_state(nodes)
    workload = fgd.compile_workload(from_tasks(p.shape for p in pods), state.model_names)
    memory = np.array([n.memory_mib * 2**20 for n in nodes], dtype=float)
    tasks = tuple(Task.from_shape(p.shape, host_memory_bytes=p.memory_mib * 2**20) for p in pods)
    setup = Setup(state, tasks, workload, 1.3, node_memory=memory)
    order = arrivals(setup.tasks, setup.capacity, setup.arrive, args.seed)

    # the fast run, timed alone: what `gpufleet replay` runs per policy and seed
    wall, cpu = time.perf_counter(), time.process_time()
    rows = replay(setup, args.policy, args.seed)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = peak_rss_bytes()

    # the naive fgd on pods sampled across the same run, each on the cluster as the fast run had it
    sample = set(np.linspace(0, len(order) - 1, args.naive_pods).astype(int).tolist())
    exact = FgdTies(0.0, 0.0, "first")  # fgd as defined: what the brute force computes
    placer = Placer(state, workload, host_memory=memory, fgd_ties=exact)
    assert placer.memory_free is not None
    naive_times, agree = [], 0
    for i, index in enumerate(order):
        task = setup.tasks[index]
        if i in sample:
            now = placer.state
            started = time.perf_counter()
            expected = naive_choice(now, placer.memory_free, task, workload)
            naive_times.append(time.perf_counter() - started)
            found = placer.place(task, "fgd")
            agree += expected == (None if found is None else (found.node, found.slots))
        found = placer.place(task, "fgd")
        if found is not None:
            placer.apply(found)
    naive_per_pod = statistics.mean(naive_times)
    naive_run = naive_per_pod * len(order)

    end = rows[-1]
    print(f"openb default trace: {len(state):,} nodes, {setup.capacity:,.0f} GPUs; {len(pods):,} pods, "
          f"{len(order):,} arriving at {setup.arrive:g}x (seed {args.seed}), workload "
          f"{len(workload.workload)} shapes")
    print(f"end state: {end.alloc_pct:.2f}% of GPUs allocated, {end.frag_pct:.2f}% fragmented, "
          f"{end.failed_pods:,} pods failed")
    print()
    print(f"{args.policy + ' run, one core':<31} {wall:8.2f} s wall  {cpu:8.2f} s CPU  "
          f"{len(order) / wall:8,.0f} pods/s   target < {TARGET_SECONDS:g} s: "
          f"{'met' if wall < TARGET_SECONDS else 'NOT met'}")
    memory_met = "met" if peak < TARGET_PEAK_BYTES else "NOT met"
    print(f"peak memory (ru_maxrss)         {peak / 2**20:8.0f} MiB (process start {rss_start / 2**20:.0f} "
          f"MiB)   target < {TARGET_PEAK_BYTES / 2**30:g} GiB: {memory_met}")
    print(f"naive fgd, per pod              {naive_per_pod:8.3f} s  (mean of {len(naive_times)} pods "
          f"sampled across the run; {agree}/{len(naive_times)} same choice as the fast engine)")
    print(f"naive fgd, whole run            {naive_run:8.0f} s  (extrapolated: per pod x {len(order):,} pods)"
          f"   {naive_run / wall:8,.0f}x the fast run")
    print(f"reference simulator (quoted)    {REFERENCE_SECONDS:8.0f} s, {REFERENCE_PEAK_BYTES / 2**30:g} GiB"
          f"   {REFERENCE_SECONDS / wall:8,.0f}x the fast run's time, "
          f"{REFERENCE_PEAK_BYTES / peak:.0f}x its memory")
    return 0 if agree == len(naive_times) else 1


if __name__ == "__main__":
    sys.exit(main())
