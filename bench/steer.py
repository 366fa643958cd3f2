"""Time the steering preferences (:func:`exporter.advisor.steer.preferences`: one FGD
evaluation per workload GPU shape over every node, then the weight levels) on a large fleet.

The fleet is the openb trace's node list repeated until it holds at least ``--gpus`` GPUs
(108,800 by default: the 13,600 8-GPU nodes of the largest fleet the docs size), partly
allocated by the trace's own pods as bench/fragmentation.py does; the workload is the
trace's typical one (its GPU shapes). The advisor computes the preferences once per
evaluation; the goal is 1 s at this size (above it, they would be computed less often).

Run: .venv/bin/python bench/steer.py [--gpus N] [--repeat N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fragmentation import partly_allocated
from exporter.advisor import steer
from exporter.advisor.advise import steering_of
from exporter.advisor.wire import steering_json
from exporter.analysis import fgd, index, openb
from exporter.analysis.workload import from_tasks

GOAL_SECONDS = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=108_800, help="fleet size in GPUs (default 108,800)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (median)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    trace = openb.named_trace(openb.DEFAULT_TRACE)
    mapper = openb.ModelMapper()
    base = [n for n in openb.load_nodes(trace.nodes, mapper) if n.gpus == 8]
    pods = openb.load_pods(trace.pods, mapper)
    nodes, total, copy = [], 0, 0
    while total < args.gpus:
        for n in base:
            if total >= args.gpus:
                break
            nodes.append(dataclasses.replace(n, name=f"{n.name}-{copy}"))
            total += n.gpus
        copy += 1
    state = partly_allocated(nodes, pods * max(1, copy), target=0.5)
    compiled = fgd.compile_workload(from_tasks(p.shape for p in pods), state.model_names)
    shapes = sum(1 for s in compiled.workload.shapes if not s.cpu_only)
    steer.preferences(state, compiled)
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        prefs = steer.preferences(state, compiled)
        times.append(time.perf_counter() - started)
    took = statistics.median(times)
    moved = sum(p.weight != steer.WEIGHT_BEST for p in prefs)
    print(f"steer.preferences: {len(state):,} nodes, {total:,} GPUs, {shapes} GPU shapes: "
          f"{took:.3f} s (median of {args.repeat}; goal {GOAL_SECONDS:g} s); "
          f"{moved:,} nodes off the default weight")
    # what the advice carries: the same, grouped by level, and its size on the wire
    report = index.evaluate(state, compiled)
    started = time.perf_counter()
    steering = steering_of(report, 0.0, 0.0)
    grouped = time.perf_counter() - started
    size = len(json.dumps(steering_json(steering)))
    print(f"advise.steering_of (preferences and levels): {grouped:.3f} s; /v1/advice's steering "
          f"section {size:,} bytes ({size / len(state):.1f} a node)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
