"""How long ``gpufleet simulate`` takes per strategy: CPU seconds per 14 simulated days, beside the goal.

The goals (issue 41): 14 days per strategy in at most 60 s on the default fleet and
in at most 10 min on openb and on the GFS fleet, on one core. CPU time is measured
(process time), not wall time, because this machine's cores are shared: wall time
there says more about the neighbours than about the code. A run shorter than 14
days is scaled to 14 (warm-up days included in both, so a short run's figure is
rough: the queue, and with it the scheduler's work, builds over the first days).

``--against DIR`` runs the same strategies from another checkout (``git worktree add``
or ``git archive``) too, in alternating order, each in its own interpreter, so two
commits are compared on the same machine under the same neighbours, and says whether
their outcomes are the same (every column but ``wall_seconds``); it ends with one table,
a row per strategy, before (the other checkout) and after (this one), as docs/performance.md
keeps it.

The default strategies include both oracles: ``oracle`` unblocks the first head only,
``oracle-heads`` every partition's head, and is the one ``simulate --matrix`` runs.

``--priority 19`` runs the bench and every run it starts at that nice, in a session of its
own (bench/priority.py), so that a bench on a shared machine yields to the rest.

Usage: ``.venv/bin/python bench/simulate.py [--fleet default] [--days 14] [--load 1.1]
[--strategies none,advisor] [--against /tmp/base] [--repeat 2] [--priority 19]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.priority import prioritise  # noqa: E402

GOALS = {"default": 60.0, "openb": 600.0, "gfs": 600.0}  # CPU s per strategy per 14 days, one core

# one run in a fresh interpreter of the checkout at argv[1]: CPU seconds and the outcome's columns
CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from exporter.outcome_sim.fleets import load_fleet
from exporter.outcome_sim.run import RunSettings, simulate
from exporter.outcome_sim.timeline import TimelineSettings, arrivals_path, read_arrivals
a = json.loads(sys.argv[2])
fleet = load_fleet(a["fleet"])
series = read_arrivals(arrivals_path())
extra = {"demand": a["demand"]} if a["demand"] else {}
settings = RunSettings(timeline=TimelineSettings(a["days"], a["warmup_days"], a["load"]),
                       advisor_interval=a["advisor_interval"], **extra)
cpu = time.process_time()
out = simulate(fleet, series, a["strategy"], a["seed"], settings)
cpu = time.process_time() - cpu
row = out.row()
row.pop("wall_seconds")
print(json.dumps({"cpu": cpu, "row": row}))
"""


def one(checkout: Path, args: argparse.Namespace, strategy: str) -> dict:
    spec = {"fleet": args.fleet, "demand": args.demand, "days": args.days, "warmup_days": args.warmup_days,
            "load": args.load, "seed": args.seed, "advisor_interval": args.advisor_interval,
            "strategy": strategy}
    done = subprocess.run([sys.executable, "-c", CHILD, str(checkout), json.dumps(spec)], cwd=REPO,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout} {strategy}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", default="default", choices=sorted(GOALS))
    parser.add_argument("--demand", default="", help="openb or gfs (default: the fleet's)")
    parser.add_argument("--days", type=float, default=14.0)
    parser.add_argument("--warmup-days", type=float, default=1.0)
    parser.add_argument("--load", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--advisor-interval", type=float, default=60.0)
    parser.add_argument("--strategies", default="none,descheduler,consolidate,oracle,oracle-heads,advisor",
                        help="comma-separated; oracle-heads is the matrix's oracle")
    parser.add_argument("--against", type=Path, help="another checkout to run alternately (the baseline)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per strategy and checkout")
    parser.add_argument("--priority", type=int, default=None,
                        help="nice for the bench and its runs, in a session of its own (-20 to 19)")
    args = parser.parse_args()
    if args.priority is not None:
        if not -20 <= args.priority <= 19:
            parser.error(f"--priority must be -20 to 19, got {args.priority}")
        prioritise(args.priority)
    goal = GOALS[args.fleet]
    scale = 14 / (args.days + args.warmup_days)
    trees = [("this", REPO)] + ([("against", args.against.resolve())] if args.against else [])
    print(f"{args.fleet} fleet, demand {args.demand or 'default'}, {args.days:g} + {args.warmup_days:g} "
          f"days at load {args.load:g}, seed {args.seed}, advisor interval {args.advisor_interval:g} s; "
          f"goal {goal:g} CPU s per strategy per 14 days")
    print("| strategy | tree | CPU s | CPU s per 14 days | goal | met | whole-node GPU-h | migrations |"
          " same outcome as the baseline |")
    print("|---|---|---:|---:|---:|---|---:|---:|---|")
    summary: list[tuple[str, dict[str, list[float]], bool]] = []
    for strategy in args.strategies.split(","):
        rows: dict[str, dict] = {}
        cpus: dict[str, list[float]] = {name: [] for name, _ in trees}
        agree = True
        for i in range(args.repeat):
            order = trees if i % 2 == 0 else trees[::-1]  # alternate who runs first
            for name, tree in order:
                got = one(tree, args, strategy)
                per14 = got["cpu"] * scale
                cpus[name].append(got["cpu"])
                same = ""
                other = rows.get("against" if name == "this" else "this")
                if other is not None:
                    same = "yes" if other == got["row"] else "NO"
                    agree = agree and other == got["row"]
                rows[name] = got["row"]
                whole, met = got["row"]["gpu_hours_waited_whole_node"], "yes" if per14 <= goal else "no"
                print(f"| {strategy} | {name} | {got['cpu']:.1f} | {per14:.0f} | {goal:g} | {met} | "
                      f"{whole:,.1f} | {got['row']['migrations']} | {same} |", flush=True)
        summary.append((strategy, cpus, agree))
    if args.against:
        print_summary(args, summary, scale, goal)


def print_summary(args: argparse.Namespace, summary: list[tuple[str, dict[str, list[float]], bool]],
                  scale: float, goal: float) -> None:
    """docs/performance.md's table: per strategy, the baseline's CPU s and this tree's, each the
    least of its runs (the one the neighbours disturbed least) and per 14 days, beside the goal."""
    days = f"{args.days:g} + {args.warmup_days:g}"
    print()
    print("| fleet, days | strategy | before: CPU s (per 14 days) | after: CPU s (per 14 days) | goal | "
          "after/before | same outcome |")
    print("|---|---|---:|---:|---:|---:|---|")
    for strategy, cpus, agree in summary:
        before, after = min(cpus["against"]), min(cpus["this"])
        met = "met" if after * scale <= goal else "**not met**"
        print(f"| {args.fleet}, {days} | {strategy} | {before:.1f} ({before * scale:.0f}) | "
              f"{after:.1f} ({after * scale:.0f}) | {goal:g} {met} | {after / before:.2f} | "
              f"{'yes' if agree else 'NO'} |")


if __name__ == "__main__":
    main()
