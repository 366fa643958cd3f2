"""The ``none`` baseline on the GFS fleet with the trace's own job mix, in the GFS paper's terms.

    .venv/bin/python bench/gfs_baseline.py --days 7 --load 1.0 --seeds 1,2,3

Per seed: P90 and P99 of the runtimes of the jobs submitted in the measured window,
the median queueing of jobs whose workers ask for 8 GPUs (a job never started waits
until the horizon), and each GPU model's allocation over the window (GPUs held over
GPUs). docs/simulate.md ("The GFS fleet beside the paper's cluster") sets them beside
what Duan et al. report of the cluster.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.outcome_sim.fleets import load_fleet
from exporter.outcome_sim.run import RunSettings, seed_jobs, simulate
from exporter.outcome_sim.timeline import TimelineSettings, arrivals_path, read_arrivals

HOUR = 3600.0


def figures(fleet, jobs, since: float, horizon: float) -> dict[str, float]:  # type: ignore[no-untyped-def]
    demand = fleet.gfs_demand
    speed = {models[0]: float(s) for models, s in zip(demand.models, demand.speeds, strict=True) if models}
    gpus = defaultdict(float)
    for node in fleet.nodes:
        gpus[node.model] += node.gpu_count
    held = defaultdict(float)
    window = horizon - since
    for job in jobs:
        if job.start is None or not job.models:
            continue
        end = job.start + job.work / speed[job.models[0]]  # `none` never moves a job
        held[job.models[0]] += job.demand * max(0.0, min(end, horizon) - max(job.start, since))
    counted = [j for j in jobs if since <= j.submit < horizon]
    runtime = np.array([j.work / speed[j.models[0]] for j in counted if j.models])
    eight = np.array([(j.start if j.start is not None and j.start < horizon else horizon) - j.submit
                      for j in counted if j.gpus == 8])
    out = {"jobs": float(len(counted)), "runtime_p90_h": float(np.percentile(runtime, 90)) / HOUR,
           "runtime_p99_d": float(np.percentile(runtime, 99)) / 86400,
           "wait_8gpu_median_h": float(np.median(eight)) / HOUR if len(eight) else 0.0,
           "jobs_8gpu": float(len(eight)),
           "never_started_8gpu": float(sum(1 for j in counted if j.gpus == 8
                                           and (j.start is None or j.start >= horizon)))}
    for model in sorted(gpus):
        out[f"alloc_{model}"] = 100.0 * held[model] / (gpus[model] * window)
    out["alloc_all"] = 100.0 * sum(held.values()) / (sum(gpus.values()) * window)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--warmup-days", type=float, default=1.0)
    parser.add_argument("--load", type=float, default=1.0)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--scheduler", choices=("fifo", "kube"), default="fifo")
    parser.add_argument("--backfill-depth", type=int, default=100)
    args = parser.parse_args()
    fleet = load_fleet("gfs")
    series = read_arrivals(arrivals_path())
    settings = RunSettings(timeline=TimelineSettings(args.days, args.warmup_days, args.load), demand="gfs",
                           mode=args.scheduler, backfill_depth=args.backfill_depth)
    for seed in (int(s) for s in args.seeds.split(",")):
        started = time.process_time()
        jobs = seed_jobs(fleet, series, settings, seed)
        outcome = simulate(fleet, series, "none", seed, settings, jobs=jobs)
        row = figures(fleet, jobs, settings.timeline.measured_from, settings.timeline.horizon)
        row.update(seed=float(seed), load=args.load, kube=float(args.scheduler == "kube"),
                   backfill_depth=float(args.backfill_depth),
                   cpu_s=time.process_time() - started,
                   whole_node_gpu_h_waited=outcome.gpu_hours_waited_whole_node,
                   mean_allocation_pct=outcome.mean_allocation_pct)
        sys.stdout.write(" ".join(f"{k}={v:.4g}" for k, v in row.items()) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
