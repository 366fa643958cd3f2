"""Time the FGD fragmentation measure on the openb cluster, against baselines run alongside it.

The setup is the issue's: the openb GPU node list (1,213 nodes, 6,212 GPUs),
the default trace's typical workload (35 shapes, CPU-only included) and a
partly allocated state (trace pods placed at random until about half of the
GPU capacity is held). It times:

- the full evaluation: F_n(M) for every node, pool and cluster sums, and the
  cluster and pool indices with tier penalties;
- the same with the reason breakdown (what /metrics and `gpufleet analyze` use);
- the update when one placement changes one node: the placement engine's
  ``Placer.apply`` (or ``release``), which recomputes that node's F_n(M), then
  the cluster's F(M); trace replay and the advisor's planner run it per move;

and, in the same run, a straightforward pure-Python per-node loop
(the baseline) and a direct numpy broadcast over nodes x shapes x GPUs.

Run: .venv/bin/python bench/fragmentation.py [--repeat N]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.analysis import fgd, index, openb
from exporter.analysis.state import EPS, FleetState, build
from exporter.analysis.workload import Workload, from_tasks
from exporter.placement.engine import Placement, Placer

TARGET_FULL_SECONDS = 2e-3
TARGET_SPEEDUP = 50.0
TARGET_UPDATE_SECONDS = 50e-6


def per_call(fn: Callable[[], object], repeat: int, number: int) -> float:
    """Median seconds per call over `repeat` batches of `number` calls (the machine is shared)."""
    fn()
    batches = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            fn()
        batches.append((time.perf_counter() - started) / number)
    return statistics.median(batches)


def partly_allocated(nodes: list[openb.OpenbNode], pods: list[openb.OpenbPod], target: float,
                     seed: int = 1) -> FleetState:
    """Trace pods placed at random on nodes where they fit, until `target` of the GPUs are held."""
    rng = np.random.default_rng(seed)
    cpu = np.array([n.cpus for n in nodes])
    free = [np.ones(n.gpus) for n in nodes]
    models = [n.model for n in nodes]
    total, held = sum(n.gpus for n in nodes), 0.0
    for pod in rng.permutation(len(pods)):
        p = pods[pod]
        if held >= target * total:
            break
        if p.gpus == 0:
            continue
        for n in rng.permutation(len(nodes))[:64]:
            if cpu[n] < p.cpus or (p.models and models[n] not in p.models):
                continue
            fitting = np.nonzero(free[n] >= p.gpu_share - EPS)[0]
            if len(fitting) < p.gpus:
                continue
            chosen = fitting[np.argsort(free[n][fitting])][: p.gpus]  # tightest GPUs first
            free[n][chosen] -= p.gpu_share
            cpu[n] -= p.cpus
            held += p.gpus * p.gpu_share
            break
    return build([n.name for n in nodes], models, [n.model for n in nodes], [n.cpus for n in nodes],
                 list(cpu), [list(f) for f in free])


def loop_evaluation(rows: list[tuple[float, list[float], str]], workload: Workload) -> float:
    """Baseline: F_n(M) node by node, shape by shape, GPU by GPU, in plain Python."""
    return sum(fgd.node_fragmentation_loop(rows, workload))


def broadcast_evaluation(state: FleetState, workload: Workload) -> float:
    """The obvious numpy version: one boolean cube of nodes x shapes x GPUs."""
    shapes = [s for s in workload.shapes if not s.cpu_only]
    weights = np.array([w for s, w in zip(workload.shapes, workload.weights, strict=True)
                        if not s.cpu_only])
    share = np.array([s.gpu_share for s in shapes])
    need = np.array([s.gpus for s in shapes])
    cpus = np.array([s.cpus for s in shapes])
    free = state.gpu_free[:, None, :]  # N x 1 x G
    big = free >= share[None, :, None] - EPS  # N x M x G
    fits = (big.sum(axis=2) >= need) & (state.cpu_free[:, None] >= cpus - EPS)
    small = np.where(big, 0.0, free).sum(axis=2)  # N x M
    idle = state.gpu_free.sum(axis=1)
    per_shape = np.where(fits, small, idle[:, None])
    cpu_only = sum(w for s, w in zip(workload.shapes, workload.weights, strict=True) if s.cpu_only)
    return float((per_shape @ weights).sum() + idle.sum() * cpu_only)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed batches per figure")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    trace = openb.named_trace(openb.DEFAULT_TRACE)
    mapper = openb.ModelMapper()
    nodes = openb.load_nodes(trace.nodes, mapper)
    pods = openb.load_pods(trace.pods, mapper)
    workload = from_tasks(p.shape for p in pods)
    state = partly_allocated(nodes, pods, target=0.5)
    compiled = fgd.compile_workload(workload, state.model_names)
    score = index.scorer(state)
    rows = [(float(state.cpu_free[i]), [float(x) for x in state.gpu_free[i, : state.gpu_count[i]]],
             state.model_names[state.model[i]]) for i in range(len(state))]

    # every implementation must give the same answer before any is timed
    fast = index.totals(state, compiled).cluster_fragmented
    assert abs(fast - loop_evaluation(rows, workload)) < 1e-6
    assert abs(fast - broadcast_evaluation(state, workload)) < 1e-6

    def full() -> float:
        return score.scores(index.totals(state, compiled))[0]

    # one whole-GPU, 8-core pod lands on the first node with more than one GPU idle
    node = int(np.argmax(state.gpu_free.sum(axis=1) > 1))
    slot = int(np.argmax(state.gpu_free[node, : state.gpu_count[node]]))
    assert state.gpu_free[node, slot] >= 1.0 - EPS and state.cpu_free[node] >= 8.0
    pod = Placement(node, state.names[node], (slot,), (slot,), 1.0, 8.0)
    placed_row = state.gpu_free[node, : state.gpu_count[node]].copy()
    placed_row[slot] -= 1.0
    placer = Placer(state, compiled)

    def update_pair() -> float:
        """Two one-node updates, as a move is: the pod placed, then taken off again."""
        placer.apply(pod)
        after = placer.fragmented_gpus
        placer.release(pod)
        return after + placer.fragmented_gpus

    t_loop = per_call(lambda: loop_evaluation(rows, workload), args.repeat, 3)
    t_broadcast = per_call(lambda: broadcast_evaluation(state, workload), args.repeat, 50)
    t_full = per_call(full, args.repeat, 200)
    t_report = per_call(lambda: index.evaluate(state, compiled), args.repeat, 50)
    t_update = per_call(update_pair, args.repeat, 1000) / 2
    t_single = per_call(lambda: fgd.one_node_fragmentation(
        float(state.cpu_free[node]), placed_row, int(state.model[node]), compiled), args.repeat, 5000)

    allocated = 1 - state.gpu_free.sum() / state.gpu_count.sum()
    report = index.evaluate(state, compiled)
    print(f"openb: {len(state)} nodes, {int(state.gpu_count.sum())} GPUs, {allocated:.0%} allocated; "
          f"workload {len(workload)} shapes ({compiled.gpu_shapes} with GPUs, "
          f"{len(compiled.levels)} distinct per-GPU shares), coverage {workload.coverage:.1%}")
    print(f"state: cluster index {report.cluster.index:.1f}, fragmented {report.cluster.fragmented_gpus:.1f}"
          f" of {report.cluster.idle_gpus:.1f} idle GPUs")
    print()
    print(f"baseline, pure-Python per-node loop   {t_loop * 1e3:9.2f} ms")
    print(f"direct numpy broadcast N x M x G      {t_broadcast * 1e3:9.3f} ms   "
          f"{t_loop / t_broadcast:6.1f}x the loop")
    full_met = t_full <= TARGET_FULL_SECONDS and t_loop / t_full >= TARGET_SPEEDUP
    print(f"full evaluation (F, sums, indices)    {t_full * 1e3:9.3f} ms   "
          f"{t_loop / t_full:6.1f}x the loop   target <= {TARGET_FULL_SECONDS * 1e3:g} ms and "
          f">= {TARGET_SPEEDUP:g}x: {'met' if full_met else 'NOT met'}")
    print(f"full report with reason breakdown     {t_report * 1e3:9.3f} ms   "
          f"{t_loop / t_report:6.1f}x the loop")
    print(f"one-node update                       {t_update * 1e6:9.1f} us   "
          f"target <= {TARGET_UPDATE_SECONDS * 1e6:g} us: "
          f"{'met' if t_update <= TARGET_UPDATE_SECONDS else 'NOT met'}")
    print("  (Placer.apply or release: the node's free shares and F_n(M), then the cluster's F(M))")
    print(f"  of which one node's F_n(M)          {t_single * 1e6:9.1f} us")
    print(f"  vs. a full evaluation per placement {t_full * 1e6:9.1f} us   "
          f"{t_full / t_update:6.1f}x the update")
    return 0


if __name__ == "__main__":
    sys.exit(main())
