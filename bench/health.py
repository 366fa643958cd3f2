"""Issue 31: what health costs per collection on the simulated fleet: ``HealthMonitor.observe``
(verdicts, remediation, stragglers) and ``families()`` (what ``/metrics`` adds), in the
steady state, after the clean window (a GPU's first snapshots are read in full).

    .venv/bin/python bench/health.py --scale 100          # 108,800 GPUs
    .venv/bin/python bench/health.py --scale 1 --snapshots 10

The snapshots are built first (the simulator's cost is not counted); each is then observed
in order and timed with ``time.perf_counter``. docs/health.md has the figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.fleet_sim.fleet import Simulation
from exporter.health.monitor import HealthMonitor
from exporter.sources.sim.options import SimSource

START = 1_764_547_200.0
SETTLED = 960  # past the 900 s clean window: every healthy GPU's verdict has settled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=100, help="SimSource scale (100: 108,800 GPUs)")
    parser.add_argument("--snapshots", type=int, default=3, help="steady snapshots timed")
    parser.add_argument("--interval", type=int, default=60, help="simulated seconds between them")
    args = parser.parse_args(argv)
    sim = Simulation(SimSource(seed=42, scale=args.scale), START)
    snapshots = [sim.snapshot()]
    for n in range(args.snapshots):
        sim.advance(START + SETTLED + n * args.interval)
        snapshots.append(sim.snapshot())
    monitor = HealthMonitor()
    started = time.perf_counter()
    monitor.observe(snapshots[0])
    print(f"first snapshot ({len(snapshots[0].gpus):,} GPUs): observe {time.perf_counter() - started:.3f} s")
    for snapshot in snapshots[1:]:
        started = time.perf_counter()
        monitor.observe(snapshot)
        observed = time.perf_counter() - started
        started = time.perf_counter()
        families = monitor.families()
        rendered = time.perf_counter() - started
        series = sum(len(f.samples) for f in families)
        print(f"t={snapshot.taken_at - START:.0f} s: observe {observed:.3f} s, families "
              f"{rendered:.3f} s, {series} series")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
