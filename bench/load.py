"""Time of ``gpufleet load`` on the full 184-day Alibaba series: 6 pools, 4,419 hours each.

Two figures, each the median of --runs runs in one process:

- replay: reading both CSVs, then per pool the window statistics, both change-point
  detectors and the three policies (what the target, < 10 s, is about);
- command: the whole ``gpufleet load`` in a fresh interpreter, load.csv (26,514
  rows) and load.png included.

Usage: ``.venv/bin/python bench/load.py [--runs 3] [--startup 1h]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.load.replay import PredictiveSettings, replay_series  # noqa: E402
from exporter.load.series import read_capacity, read_series  # noqa: E402
from exporter.load_cmd import settings_for  # noqa: E402

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--startup", default="1h")
    args = parser.parse_args()
    startup_h = int(args.startup.rstrip("h"))
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
