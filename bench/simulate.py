"""How long ``gpufleet simulate`` takes per strategy: CPU seconds for N simulated days.

The issue's goal: 14 days on the default fleet in at most 60 s per strategy. CPU
time is measured (process time), not wall time, because this machine's cores are
shared: wall time there says more about the neighbours than about the code.

Usage: ``.venv/bin/python bench/simulate.py [--days 14] [--load 1.1] [--strategies none,advisor]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.outcome_sim.fleets import load_fleet  # noqa: E402
from exporter.outcome_sim.run import RunSettings, simulate  # noqa: E402
from exporter.outcome_sim.timeline import TimelineSettings, arrivals_path, build, read_arrivals  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", default="default")
    parser.add_argument("--days", type=float, default=14.0)
    parser.add_argument("--warmup-days", type=float, default=1.0)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--advisor-interval", type=float, default=60.0)
    parser.add_argument("--strategies", default="none,descheduler,consolidate,advisor,advisor-current")
    args = parser.parse_args()
    fleet = load_fleet(args.fleet)
    series = read_arrivals(arrivals_path())
    settings = RunSettings(timeline=TimelineSettings(args.days, args.warmup_days, args.load),
                           advisor_interval=args.advisor_interval)
    jobs = build(list(fleet.shapes), series, fleet.capacity, settings.timeline, args.seed)
    print(f"{fleet.name}: {fleet.capacity} GPUs, {args.days:g} + {args.warmup_days:g} days, load "
          f"{args.load:g}: {len(jobs)} jobs")
    print("| strategy | CPU s | wall s | CPU s per 14 days | migrations |")
    print("|---|---:|---:|---:|---:|")
    for name in args.strategies.split(","):
        cpu, wall = time.process_time(), time.perf_counter()
        out = simulate(fleet, series, name, args.seed, settings,
                       jobs=build(list(fleet.shapes), series, fleet.capacity, settings.timeline, args.seed))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        per14 = cpu * 14 / (args.days + args.warmup_days)
        print(f"| {name} | {cpu:.1f} | {wall:.1f} | {per14:.0f} | {out.migrations} |", flush=True)


if __name__ == "__main__":
    main()
