"""``gpufleet load``: replays an hourly demand series per pool under three scaling policies.

Reads --series (a CSV: an ``hour`` column of consecutive hours and a column of
demanded GPUs per pool) and --capacity (a row per pool: gpu_model or pool,
total_gpus, and optionally nodes and max_gpus, the GPUs a node adds; 8 when
absent). Per pool it computes the trailing-window statistics of the demand
ratio (demand over today's GPUs), flags change points (rolling std and CUSUM),
and replays three policies: static (today's capacity), reactive (the 0.8/0.3
rule with hysteresis and cooldown) and predictive (the same rule on the
forecast peak until a node started now is ready, so it pre-warms). Added nodes
serve only --startup after they are ordered. Writes DIR/load.csv and
DIR/load.png and prints, per pool and policy, the unmet, idle and provisioned
GPU-hours and the scaling actions.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

from exporter import logs
from exporter.durations import parse_duration
from exporter.errors import UsageError
from exporter.pool_load.backtest import POLICIES, PoolReplay, PredictiveSettings, replay_series
from exporter.pool_load.output import plot, write_csv
from exporter.pool_load.series import Capacity, read_capacity, read_series
from exporter.thresholds import ScalingSettings, ScalingTable, command_table
from exporter.thresholds.scaling import DEFAULT

DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else ""
EPILOG = """the rule: up, down, hysteresis and cooldowns from the threshold table's scaling: section
(per pool under scaling.pools, by the series' column names); --up and --down override them.

node bounds: min nodes --min-nodes (default 4, the reference profile's); max nodes
--max-nodes for every pool, else --max-factor times today's node count (default 4: the
reference profile's 32 is for a 32-node cluster, and the Alibaba H800 pool has 219 nodes
today). Hours a policy wanted more than the bound are counted in the 'at bound' column.

example:
  gpufleet load --series data/alibaba-spot-gpu-v2026/hourly_concurrency_top_models.csv \\
      --capacity data/alibaba-spot-gpu-v2026/fleet_by_model.csv --startup 1h --out out/"""

MAX_STARTUP_S = 23 * 3600.0  # the forecast reads the daily profile up to 24 h ahead


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--series", required=True, metavar="CSV", help="hourly demand: hour,<pool>...")
    parser.add_argument("--capacity", required=True, metavar="CSV",
                        help="a row per pool: gpu_model (or pool), total_gpus[, nodes, max_gpus]")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for load.csv and load.png")
    parser.add_argument("--startup", default="1h", metavar="DURATION",
                        help="how long an added node takes to serve, in whole hours (default 1h)")
    parser.add_argument("--pools", metavar="LIST", help="comma-separated pools (default: every column)")
    parser.add_argument("--up", type=float, metavar="RATIO",
                        help="scale up above this demand ratio (default: the threshold table's, 0.8)")
    parser.add_argument("--down", type=float, metavar="RATIO",
                        help="scale down below it (default: the threshold table's, 0.3)")
    parser.add_argument("--thresholds", metavar="FILE",
                        help="threshold table whose scaling: section gives up, down, hysteresis and "
                        "the cooldowns (default: rules/thresholds.yaml here, else the installed one)")
    parser.add_argument("--min-nodes", type=int, default=4, metavar="N", help="default 4")
    parser.add_argument("--max-nodes", type=int, metavar="N", help="for every pool (default: see below)")
    parser.add_argument("--max-factor", type=float, default=4.0, metavar="X",
                        help="max nodes = X times today's nodes, when --max-nodes is absent (4)")
    parser.add_argument("--window", default="24h", metavar="DURATION",
                        help="window of the load statistics, whole hours (default 24h)")
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def _hours(text: str, flag: str, low: int, high: int) -> int:
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a duration such as 1h, got {text[:40]!r}") from None
    if seconds % 3600 or not low <= seconds / 3600 <= high:
        raise UsageError(f"{flag}: must be whole hours from {low}h to {high}h, got {text[:40]!r}")
    return int(seconds // 3600)


def settings_for(capacity: Capacity, args: argparse.Namespace, startup_h: int,
                 table: ScalingTable = DEFAULT) -> ScalingSettings:
    """The rule for one pool: the table's thresholds, hysteresis and cooldowns (``up`` and
    ``down`` overridden by the flags), with the replay's node size and bounds."""
    today = math.ceil(capacity.gpus / capacity.node_gpus - 1e-9)
    if args.max_nodes is not None:
        max_nodes = args.max_nodes
    else:
        max_nodes = max(args.min_nodes, math.ceil(today * args.max_factor))
    base = table.for_pool(capacity.pool)
    up = base.up if args.up is None else args.up
    down = base.down if args.down is None else args.down
    try:
        return dataclasses.replace(base, up=up, down=down, target=up if args.up is not None else base.target,
                                   min_nodes=args.min_nodes, max_nodes=max_nodes,
                                   node_gpus=capacity.node_gpus, startup_s=startup_h * 3600.0)
    except ValueError as exc:
        raise UsageError(f"pool {capacity.pool}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from exporter.cli.replay import out_dir, write_out

    logs.setup("warning")
    startup_h = _hours(args.startup, "--startup", 0, int(MAX_STARTUP_S // 3600))
    window = _hours(args.window, "--window", 1, 24 * 31)
    if not 0 < args.max_factor <= 1000:
        raise UsageError(f"--max-factor: must be in (0, 1000], got {args.max_factor:g}")
    if not 0 <= args.min_nodes <= 1_000_000 or (args.max_nodes is not None
                                                and not 1 <= args.max_nodes <= 1_000_000):
        raise UsageError("--min-nodes and --max-nodes must be from 0 (1) to 1,000,000")
    pools = tuple(p.strip() for p in args.pools.split(",") if p.strip()) if args.pools else None
    thresholds, _ = command_table(args.thresholds)  # ThresholdError: one line, exit 2
    table = thresholds.scaling or DEFAULT
    series = read_series(args.series, pools)
    capacity = read_capacity(args.capacity)
    missing = [p for p in series.pools if p not in capacity]
    if missing:
        raise UsageError(f"{args.capacity}: no row for pool {missing[0]!r} (a column of {args.series})")
    out = out_dir(args.out, ("load.csv", "load.png"))

    started = time.monotonic()
    results: list[PoolReplay] = []
    for i, pool in enumerate(series.pools):
        if not args.no_progress:
            print(f"load: {pool} ({i + 1}/{len(series.pools)}), {len(series.hours):,} hours",
                  file=sys.stderr, flush=True)
        settings = settings_for(capacity[pool], args, startup_h, table)
        results.append(replay_series(pool, series.demand[:, i], capacity[pool].gpus, settings, window,
                                     PredictiveSettings()))
    elapsed = time.monotonic() - started
    hours = [int(h) for h in series.hours]
    title = f"{Path(args.series).name}: {len(hours):,} hours, startup {startup_h} h"
    write_out(out / "load.csv", lambda path: write_csv(results, hours, path))
    write_out(out / "load.png", lambda path: plot(results, hours, path, title))
    sys.stdout.write(report(results, startup_h, elapsed))
    sys.stdout.write(f"wrote {out / 'load.csv'} and {out / 'load.png'}\n")
    return 0


def report(results: list[PoolReplay], startup_h: int, elapsed: float) -> str:
    lines = [f"startup {startup_h} h; replay {elapsed:.2f} s",
             f"{'pool':<16} {'policy':<10} {'unmet GPU-h':>12} {'idle GPU-h':>12} "
             f"{'provisioned GPU-h':>18} {'actions':>8} {'at bound':>9}  nodes"]
    better = 0
    for p in results:
        s = p.settings
        for policy in POLICIES:
            run = p.runs[policy]
            bounds = "" if policy == "static" else f"{s.min_nodes}-{s.max_nodes} x {s.node_gpus} GPUs"
            lines.append(f"{p.pool:<16} {policy:<10} {run.unmet_gpu_hours:>12,.0f} "
                         f"{run.idle_gpu_hours:>12,.0f} {run.provisioned_gpu_hours:>18,.0f} "
                         f"{run.actions:>8} {run.capped_hours:>9}  {bounds}")
        reactive, predictive = p.runs["reactive"], p.runs["predictive"]
        better += (predictive.unmet_gpu_hours < reactive.unmet_gpu_hours
                   and predictive.provisioned_gpu_hours <= reactive.provisioned_gpu_hours)
    lines.append(f"predictive: less unmet at no more provisioned GPU-hours than reactive "
                 f"on {better} of {len(results)} pools")
    return "\n".join(lines) + "\n"
