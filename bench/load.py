"""Time of ``gpufleet load`` on the full 184-day Alibaba series: 6 pools, 4,419 hours each.

Two figures, each the median of --runs runs in one process:

- replay: reading both CSVs, then per pool the window statistics, both change-point
  detectors and the three policies (what the target, < 10 s, is about);
- command: the whole ``gpufleet load`` in a fresh interpreter, load.csv (26,514
  rows) and load.png included.

With ``--holdout`` it instead checks the predictive policy's tuning out of sample: the
grid docs/load.md names is searched on the first half of the series (92 days) for the
most pools where predictive has less unmet demand at no more provisioned GPU-hours than
reactive, and the winner is scored on the second half, beside the shipped defaults.

Usage: ``.venv/bin/python bench/load.py [--runs 3] [--startup 1h] [--holdout]``
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.cli.load import settings_for  # noqa: E402
from exporter.pool_load.backtest import PredictiveSettings, replay_pool, replay_series  # noqa: E402
from exporter.pool_load.scaling import ScalingSettings  # noqa: E402
from exporter.pool_load.series import read_capacity, read_series  # noqa: E402

DATA = REPO / "data" / "alibaba-spot-gpu-v2026"
SERIES = DATA / "hourly_concurrency_top_models.csv"
CAPACITY = DATA / "fleet_by_model.csv"
TARGET_S = 10.0


def replay_once(startup_h: int) -> float:
    started = time.perf_counter()
    series = read_series(SERIES)
    capacity = read_capacity(CAPACITY)
    args = argparse.Namespace(max_nodes=None, min_nodes=4, max_factor=4.0, up=None, down=None)
    for i, pool in enumerate(series.pools):
        replay_series(pool, series.demand[:, i], capacity[pool].gpus,
                      settings_for(capacity[pool], args, startup_h), 24, PredictiveSettings())
    return time.perf_counter() - started


def command_once(startup: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "exporter", "load", "--series", str(SERIES), "--capacity",
                        str(CAPACITY), "--startup", startup, "--out", out, "--no-progress"],
                       cwd=REPO, check=True, capture_output=True, timeout=300)
        return time.perf_counter() - started


def holdout(startup_h: int) -> None:
    series = read_series(SERIES)
    capacity = read_capacity(CAPACITY)
    half = len(series.hours) // 2

    def score(rows: slice, predictive: PredictiveSettings) -> tuple[int, list[str]]:
        wins, lines = 0, []
        for i, pool in enumerate(series.pools):
            c = capacity[pool]
            settings = ScalingSettings(node_gpus=c.node_gpus, min_nodes=4, startup_s=startup_h * 3600.0,
                                       max_nodes=4 * math.ceil(c.gpus / c.node_gpus))
            runs = replay_pool(series.demand[rows, i], c.gpus, settings, predictive)
            r, p = runs["reactive"], runs["predictive"]
            win = p.unmet_gpu_hours < r.unmet_gpu_hours and p.provisioned_gpu_hours <= r.provisioned_gpu_hours
            wins += win
            lines.append(f"| {pool} | {r.unmet_gpu_hours:,.0f} | {p.unmet_gpu_hours:,.0f} | "
                         f"{r.provisioned_gpu_hours:,.0f} | {p.provisioned_gpu_hours:,.0f} | "
                         f"{'yes' if win else 'no'} |")
        return wins, lines

    grid = itertools.product((7, 14), (0.0, 0.5, 1.0), (0.33, 0.35, 0.4, 0.45, 0.5))
    ranked = sorted(((score(slice(0, half), PredictiveSettings(days=d, trend_weight=t, down=dn))[0],
                      d, t, dn) for d, t, dn in grid), reverse=True)
    best = ranked[0]
    print(f"first {half} hours: best days {best[1]}, trend {best[2]}, down {best[3]}: "
          f"{best[0]} of {len(series.pools)} pools")
    header = ("| pool | reactive unmet | predictive unmet | reactive provisioned | "
              "predictive provisioned | less unmet, no more provisioned |\n|---|---:|---:|---:|---:|---|")
    for name, chosen in (("the first half's best", PredictiveSettings(days=best[1], trend_weight=best[2],
                                                                    down=best[3])),
                         ("the shipped defaults", PredictiveSettings())):
        wins, lines = score(slice(half, None), chosen)
        print(f"\nlast {len(series.hours) - half} hours, {name}: {wins} of {len(series.pools)} pools")
        print(header)
        print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--startup", default="1h")
    parser.add_argument("--holdout", action="store_true")
    args = parser.parse_args()
    startup_h = int(args.startup.rstrip("h"))
    if args.holdout:
        holdout(startup_h)
        return 0
    replay = [replay_once(startup_h) for _ in range(args.runs)]
    command = [command_once(args.startup) for _ in range(args.runs)]
    rows = len(read_series(SERIES).hours)
    print(f"6 pools x {rows:,} hours, startup {args.startup}, {args.runs} runs")
    print(f"replay (read, statistics, detectors, 3 policies): median {statistics.median(replay):.2f} s, "
          f"min {min(replay):.2f} s, max {max(replay):.2f} s")
    print(f"gpufleet load command (with load.csv and load.png): median {statistics.median(command):.2f} s, "
          f"min {min(command):.2f} s, max {max(command):.2f} s")
    verdict = "PASS" if max(command) < TARGET_S else "FAIL"
    print(f"{verdict}: every whole command under {TARGET_S:g} s")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
