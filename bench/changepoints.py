"""Change-point detectors on the six Alibaba pools, against PELT's offline optimum.

Each pool's series is its hourly demand ratio (GPUs asked for over today's GPUs,
data/alibaba-spot-gpu-v2026). The reference change points are PELT's (ruptures,
``Pelt(model="l2", min_size=3, jump=1)``) with a fixed penalty of 0.05 in
squared-ratio units: a split is kept when it lowers the squared error by more,
i.e. a shift of 0.1 of capacity held about 10 h on each side, or of 0.32 held 1 h.
PELT sees the whole series at once; the detectors see one hour at a time.

A detector's alarm is a true positive when an unmatched PELT point lies within
±2 h (the nearest one is taken); precision = true alarms / alarms, recall =
matched points / points, delay = alarm hour - PELT hour over the matches.

Rows: the reference's rolling std (tuned: window 2 h, threshold 0.07; and a
6-hour window at 0.1, closer to how the reference practice states it), CUSUM
(the live detector, tuned). Tuning was a grid over the same six series (the
grids are in docs/load.md), so the figures are in-sample for both.

ruptures is a bench-only dependency (``pip install -e '.[bench]'``).

Usage: ``.venv/bin/python bench/changepoints.py [--penalty 0.05] [--tolerance 2]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.pool_load.changepoint import Cusum, RollingStd, detect  # noqa: E402
from exporter.pool_load.series import read_capacity, read_series  # noqa: E402

DATA = REPO / "data" / "alibaba-spot-gpu-v2026"


def match(alarms: list[int], truth: list[int], tolerance: int) -> list[int]:
    """Delays (alarm - point) of the alarms matched to a PELT point within tolerance, each point once."""
    used: set[int] = set()
    delays: list[int] = []
    for alarm in alarms:
        best = None
        for j, point in enumerate(truth):
            if j in used or abs(alarm - point) > tolerance:
                continue
            if best is None or abs(alarm - point) < abs(alarm - truth[best]):
                best = j
        if best is not None:
            used.add(best)
            delays.append(alarm - truth[best])
    return delays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--penalty", type=float, default=0.05)
    parser.add_argument("--tolerance", type=int, default=2)
    args = parser.parse_args()
    try:
        import ruptures
    except ImportError:
        print("bench/changepoints.py needs ruptures: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    series = read_series(DATA / "hourly_concurrency_top_models.csv")
    capacity = read_capacity(DATA / "fleet_by_model.csv")
    detectors = {
        "rolling std (2 h, 0.07)": lambda: RollingStd(),
        "rolling std (6 h, 0.1)": lambda: RollingStd(window=6, threshold=0.1),
        "CUSUM (live)": lambda: Cusum(),
    }
    totals = {name: [0, 0, 0, []] for name in detectors}  # matched, alarms, points, delays
    print(f"PELT l2, min_size 3, penalty {args.penalty}; tolerance ±{args.tolerance} h")
    print("| pool | PELT points | detector | alarms | precision | recall | F1 | median delay (h) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for i, pool in enumerate(series.pools):
        ratio = series.demand[:, i] / capacity[pool].gpus
        started = time.monotonic()
        truth = ruptures.Pelt(model="l2", min_size=3, jump=1).fit(ratio).predict(pen=args.penalty)[:-1]
        pelt_s = time.monotonic() - started
        for name, make in detectors.items():
            alarms = [index for index, _ in detect(make(), ratio)]
            delays = match(alarms, truth, args.tolerance)
            t = totals[name]
            t[0] += len(delays)
            t[1] += len(alarms)
            t[2] += len(truth)
            t[3] += delays
            print(f"| {pool} | {len(truth)} | {name} | {len(alarms)} | "
                  f"{len(delays) / max(len(alarms), 1):.2f} | {len(delays) / max(len(truth), 1):.2f} | "
                  f"{2 * len(delays) / max(len(alarms) + len(truth), 1):.2f} | "
                  f"{np.median(delays) if delays else float('nan'):.0f} |")
        print(f"  (PELT {pelt_s:.1f} s)", file=sys.stderr)
    for name, (matched, alarms, points, delays) in totals.items():
        f1 = 2 * matched / (alarms + points)
        print(f"| **all six** | {points} | {name} | {alarms} | {matched / alarms:.2f} | "
              f"{matched / points:.2f} | {f1:.2f} | {np.median(delays):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
