"""``gpufleet simulate``: the fleet over days, jobs arriving, queueing and leaving, per strategy.

A discrete-event replay (docs/simulate.md): the Alibaba spot-GPU trace's hourly
rhythm sets when jobs arrive, the openb pods what they ask for, --load how much
(offered GPU-hours over the fleet's). The scheduler queues them (FIFO with
backfill, or Kubernetes' per-pod retry) and places them with the placement
engine; each strategy acts on the running fleet: nothing, a periodic
descheduler (HighNodeUtilization), KAI-like consolidation for the queue's head,
or the advisor in the loop (the serve's engine and planner, its plans carried
out as a receiver would). Every strategy sees the same jobs for a seed.
Writes DIR/outcomes.csv (a row per strategy, seed and load) and
DIR/timeline.png (whole-node GPU-hours waited over time, by why: fragmentation
or capacity). --matrix runs the pre-registered matrix (seeds 101-110 at loads
0.8, 1.0 and 1.2, 7 days after a warm-up day; --seeds, --load, --days and
--warmup-days override it for a smaller run), ``none`` again on each seed's
jobs with submit times jittered by a few seconds (the noise band), and writes
DIR/summary.csv: per load and strategy, the median and worst cut in whole-node
waiting against none, the band, and the share of the oracle's saving.
"""

from __future__ import annotations

import argparse
import sys
import time

from exporter.errors import UsageError
from exporter.validate import flag_number

MAX_DAYS = 366.0  # measured days, and warm-up days: a year of the trace's rhythm
DAY_SECONDS = 86400.0
DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else ""
STRATEGY_NAMES = ("none", "descheduler", "consolidate", "advisor", "advisor-current", "oracle",
                  "oracle-heads", "consolidate-heads", "consolidate-unrestricted",
                  "descheduler-unrestricted", "steer",
                  "steer+advisor", "steer-pod", "steer-pod-flat",
                  "steer-pod-fresh", "steer-pod+advisor", "steer-pod+advisor-freedoms",
                  "steer-pod+lookahead",
                  "steer-pod+lookahead+advisor", "steer-pod+reserve")  # simulate.strategies
EPILOG = f"""strategies: {", ".join(STRATEGY_NAMES)}

examples:
  gpufleet simulate --days 14 --load 0.9,1.1,1.3 --seeds 1-5 --out out/
  gpufleet simulate --fleet openb --days 2 --load 1.1 --strategies none,advisor --out out-openb/
  gpufleet simulate --matrix --jobs 2 --out out-matrix/"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fleet", choices=("default", "openb", "gfs"), default="default",
                        help="default: the simulated reference fleet (1,088 GPUs); openb: the trace's "
                        "1,213 nodes; gfs: the Alibaba spot-GPU trace's 4,278 nodes (10,412 GPUs)")
    # the names of exporter.outcome_sim.demand.DEMANDS, spelled out so that --help need not
    # import the simulator (a test holds the two equal)
    parser.add_argument("--demand", choices=("openb", "gfs", "gfs-hourly", "gfs-hourly-capped"), default="",
                        help="openb: jobs shaped as the openb trace's pods; gfs: jobs drawn from the "
                        "spot-GPU trace's job mix (its sizes, gangs, models, durations, priorities); "
                        "gfs-hourly: the same, each hour's models in the trace's mix of that hour; "
                        "gfs-hourly-capped: as gfs-hourly, no model offered more than the load "
                        "times its pool's GPUs in any hour, the rest not offered "
                        "(default: gfs on the gfs fleet, openb elsewhere)")
    parser.add_argument("--days", type=float, default=None,
                        help="measured days, at most 366 (default 14; the matrix's 7)")
    parser.add_argument("--warmup-days", type=float, default=None,
                        help="days simulated first and not measured, while the fleet fills, at "
                        "most 366 (default 1; the matrix's 1)")
    parser.add_argument("--load", default=None, metavar="LIST",
                        help="offered GPU-hours over the fleet's GPU-hours, comma-separated (default 1.1; "
                        "the matrix's 0.8,1.0,1.2)")
    parser.add_argument("--seeds", default=None, metavar="LIST",
                        help="seeds, e.g. 1,2 or 1-5 (default 1; the matrix's 101-110)")
    parser.add_argument("--matrix", action="store_true",
                        help="run the pre-registered matrix against none, with the noise band; writes "
                        "summary.csv too")
    parser.add_argument("--strategies", default=None, metavar="LIST",
                        help="comma-separated (default none,descheduler,consolidate,advisor; the matrix's "
                        "none,descheduler,consolidate,oracle-heads,advisor)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for outcomes.csv and timeline.png")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="runs at a time, one core each")
    parser.add_argument("--scheduler", choices=("fifo", "fifo-one-head", "kube"), default="fifo",
                        help="fifo: FIFO with backfill (Slurm), a head per partition (one per GPU "
                             "model); fifo-one-head: the whole fleet one partition, as before "
                             "2026-12-06; kube: per-pod retry (Kubernetes)")
    parser.add_argument("--policy", default="bestfit",
                        help="the scheduler's placement policy (default bestfit, as sources.sim)")
    parser.add_argument("--high-share", type=float, default=0.3,
                        help="share of jobs that are high-priority, the rest spot (default 0.3)")
    parser.add_argument("--gang-share", type=float, default=0.3,
                        help="share of 8-GPU jobs that are multi-node gangs of 2 or 4 nodes (default 0.3)")
    parser.add_argument("--restore", type=float, default=120.0, metavar="SECONDS",
                        help="time to restore a checkpoint after a move (default 120)")
    parser.add_argument("--preemption", choices=("none", "slurm", "kube", "advisor"), default="none",
                        help="a high-priority job that does not fit preempts spot jobs (past the "
                        "exemption; they resume from their last checkpoint), victims chosen as "
                        "Slurm, the Kubernetes scheduler or the advisor would (default none: nothing "
                        "preempts)")
    parser.add_argument("--preempt-exempt", type=float, default=1800.0, metavar="SECONDS",
                        help="seconds a spot job runs after a (re)start before it may be preempted, "
                        "0 to 86400 (default 1800)")
    # the names of exporter.outcome_sim.preemption.SPOT_QUOTAS, spelled out so that --help
    # need not import the simulator (a test holds the two equal)
    parser.add_argument("--spot-quota", choices=("none", "advisor", "borrow", "borrow-short", "borrow-fit"),
                        default="none",
                        help="advisor: spot jobs beyond the advisor's spot quota per GPU model (from "
                        "its forecast of high-priority demand) wait to enter the queue; borrow: as "
                        "advisor, but spot jobs beyond it are lent GPUs while no single-node "
                        "high-priority job waits for the pool, and are the first victims; "
                        "borrow-short: as borrow, and a spot job that ends within the exemption is "
                        "lent GPUs even while high-priority jobs wait; borrow-fit: as borrow-short, but "
                        "a pool lends unless a queued high-priority job could start there by "
                        "preempting spot jobs (default none)")
    parser.add_argument("--advisor-interval", type=float, default=60.0, metavar="SECONDS",
                        help="simulated seconds between the advisor's evaluations, 1 to 86400 "
                        "(default 60)")
    parser.add_argument("--advisor-rule",
                        choices=("queue", "head", "starts", "horizon", "horizon-room", "horizon-surge",
                                 "horizon-lull"),
                        default="queue",
                        help="which pending jobs the advisor plans for: queue, the head and the next "
                        "blocked jobs the same budget of moves starts, where it pays; head, the head "
                        "alone (the rule before); starts, as queue, refusing a plan that starts fewer "
                        "jobs than the small ones expected to start in the room it takes before the "
                        "next evaluation; horizon, as queue, refusing a plan whose waiting ended is "
                        "no more than the small jobs' waiting the room it takes causes while its head "
                        "runs; horizon-room, as horizon, the room the head's reservation holds "
                        "anyway not counted; horizon-surge, as horizon-room, refusing a plan that "
                        "starts a whole-node job where the free GPUs it leaves hold less than the "
                        "small jobs' demand is forecast to rise over its head's run; horizon-lull, as "
                        "horizon-surge, only while no small job is queued (default queue)")
    parser.add_argument("--advisor-pools-by-model", action="store_true",
                        help="the advisor's snapshot lists a pool per GPU model, as serve's simulated "
                        "fleet does, so its planner keeps each job on its model, as the fifo scheduler's "
                        "partitions do; by default it lists one partition for the whole fleet, and "
                        "the planner may move a job to another model where destination_models allows")


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--load: expected numbers such as 0.9,1.1, got {text!r}") from None
    if not loads or any(not 0 < x <= 10 for x in loads):
        raise UsageError(f"--load: each must be in (0, 10], got {text!r}")
    return loads


def with_defaults(args: argparse.Namespace) -> None:
    """Fill what the command line left out: the stated matrix's seeds, loads, days and
    strategies under --matrix (each overridable), a single run's otherwise."""
    from exporter.outcome_sim.matrix import MATRIX, MATRIX_STRATEGIES

    if args.matrix:
        defaults = {"days": MATRIX.days, "warmup_days": MATRIX.warmup_days,
                    "load": ",".join(f"{x:g}" for x in MATRIX.loads),
                    "seeds": f"{MATRIX.seeds[0]}-{MATRIX.seeds[-1]}",
                    "strategies": ",".join(MATRIX_STRATEGIES)}
    else:
        defaults = {"days": 14.0, "warmup_days": 1.0, "load": "1.1", "seeds": "1",
                    "strategies": "none,descheduler,consolidate,advisor"}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def run(args: argparse.Namespace) -> int:
    from exporter.cli.replay import MAX_JOBS, out_dir, parse_seeds, write_out
    from exporter.policy_names import POLICIES

    with_defaults(args)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGY_NAMES]
    if unknown or not strategies:
        raise UsageError(f"--strategies: unknown {', '.join(unknown) or 'empty list'}; "
                         f"choose from {', '.join(STRATEGY_NAMES)}")
    if args.policy not in POLICIES or args.policy == "random":
        raise UsageError(f"--policy: one of {', '.join(p for p in POLICIES if p != 'random')}")
    # each bound keeps the run within what a run may take: --days 1e9 asked for 179 GiB, an
    # --advisor-interval of 1e-9 s ran on for minutes evaluating nothing new
    for name in ("high_share", "gang_share"):
        flag_number(getattr(args, name), f"--{name.replace('_', '-')}", 0, 1)
    flag_number(args.restore, "--restore", 0, DAY_SECONDS, unit=" seconds")
    flag_number(args.advisor_interval, "--advisor-interval", 1, DAY_SECONDS, unit=" seconds")
    flag_number(args.preempt_exempt, "--preempt-exempt", 0, DAY_SECONDS, unit=" seconds")
    flag_number(args.jobs, "--jobs", 1, MAX_JOBS)
    if args.matrix and "none" not in strategies:  # every cut is against it
        strategies.insert(0, "none")
    flag_number(args.days, "--days", 0, MAX_DAYS, above=True)
    flag_number(args.warmup_days, "--warmup-days", 0, MAX_DAYS)
    loads = _loads(args.load)
    seeds = parse_seeds(args.seeds)
    out = out_dir(args.out, ("outcomes.csv", "timeline.png", "summary.csv") if args.matrix
                  else ("outcomes.csv", "timeline.png"))

    from exporter.outcome_sim.cluster import MoveCost
    from exporter.outcome_sim.fleets import load_fleet
    from exporter.outcome_sim.outcomes import write_csv
    from exporter.outcome_sim.picture import plot
    from exporter.outcome_sim.run import RunSettings, simulate_many
    from exporter.outcome_sim.timeline import TimelineSettings, arrivals_path, read_arrivals

    path = arrivals_path()
    try:
        series = read_arrivals(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"arrivals {path}: {exc} (set GPUFLEET_DATA to a folder holding "
                         "alibaba-spot-gpu-v2026/hourly_summary.csv)") from None
    fleet = load_fleet(args.fleet)
    settings = RunSettings(
        timeline=TimelineSettings(args.days, args.warmup_days, loads[0], args.high_share, args.gang_share),
        policy=args.policy, mode=args.scheduler, cost=MoveCost(restore=args.restore),
        advisor_interval=args.advisor_interval, advisor_one_partition=not args.advisor_pools_by_model,
        advisor_rule=args.advisor_rule,
        demand=args.demand, preemption=args.preemption, preempt_exempt=args.preempt_exempt,
        spot_quota=args.spot_quota)
    started = time.monotonic()

    finished = []

    def progress(o) -> None:  # type: ignore[no-untyped-def]
        finished.append(o)
        # a long sweep keeps what it has, run by run
        write_out(out / "outcomes.csv", lambda path: write_csv(finished, path))
        sys.stdout.write(f"  {o.strategy:16} seed {o.seed:<3} load {o.load:<4g} whole-node GPU-h waited "
                         f"{o.gpu_hours_waited_whole_node:9.1f}  overhead {o.migration_overhead_pct:5.2f}%  "
                         f"{o.wall_seconds:6.1f} s\n")
        sys.stdout.flush()

    title = (f"{fleet.name} fleet ({fleet.capacity:,} GPUs), {args.days:g} days, "
             f"seeds {args.seeds}, scheduler {args.scheduler}/{args.policy}")
    if args.matrix:
        return _matrix(args, fleet, series, settings, strategies, seeds, loads, out, title, progress, started)
    outcomes = simulate_many(fleet, series, strategies, seeds, loads, settings, args.jobs, progress)
    write_out(out / "outcomes.csv", lambda path: write_csv(outcomes, path))
    write_out(out / "timeline.png", lambda path: plot(outcomes, path, title))
    sys.stdout.write(f"{len(outcomes)} runs in {time.monotonic() - started:.1f} s\n"
                     f"wrote {out / 'outcomes.csv'} and {out / 'timeline.png'}\n")
    return 0


def _matrix(args, fleet, series, settings, strategies, seeds, loads, out, title, progress,  # type: ignore[no-untyped-def]
            started) -> int:
    """The matrix's runs, outcomes.csv as they finish, then summary.csv and the picture."""
    from exporter.cli.replay import write_out
    from exporter.outcome_sim.matrix import PERTURBED, Matrix, run_matrix, runs, summarise, write_summary
    from exporter.outcome_sim.outcomes import write_csv
    from exporter.outcome_sim.picture import plot

    matrix = Matrix(tuple(seeds), tuple(loads), args.days, args.warmup_days)
    outcomes = run_matrix(fleet, series, settings, runs(matrix, strategies), args.jobs, progress)
    rows = summarise(outcomes)
    write_out(out / "outcomes.csv", lambda path: write_csv(outcomes, path))
    write_out(out / "summary.csv", lambda path: write_summary(rows, path))
    write_out(out / "timeline.png", lambda path: plot(outcomes, path, title, skip=(PERTURBED,)))
    sys.stdout.write("load  strategy           seeds  median cut  worst cut  noise band        "
                     "oracle share\n")
    for r in rows:
        sys.stdout.write(f"{r.load:<5g} {r.strategy:18} {r.seeds:5}  {r.cut_median_pct:+9.1f}%  "
                         f"{r.cut_worst_pct:+8.1f}%  [{r.noise_low_pct:+.1f}%, {r.noise_high_pct:+.1f}%]  "
                         f"{r.oracle_share_median_pct:6.1f}%\n")
    sys.stdout.write(f"{len(outcomes)} runs in {time.monotonic() - started:.1f} s\n"
                     f"wrote {out / 'outcomes.csv'}, {out / 'summary.csv'} and {out / 'timeline.png'}\n")
    return 0
