"""``gpufleet replay``: what each placement policy costs on a pod trace, as a CSV and a picture.

Replays the openb pods of --pods on the openb nodes of --nodes (or on the
simulated reference fleet with --sim) by each policy and seed, as the FGD
paper does: pods shuffled by the seed, random copies appended until they ask
for --arrive times the cluster's GPUs, arrivals only; a pod that fits
nowhere fails. Pods need CPU, GPUs and memory; no policy scores memory, as
in the reference simulator. Writes DIR/replay.csv (a row per policy, seed
and whole percent of arrived workload) and DIR/replay.png, and prints where
each policy ended.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from exporter import logs
from exporter.analysis import openb
from exporter.analysis.fgd import compile_workload
from exporter.analysis.state import FleetState, from_snapshot
from exporter.analysis.workload import from_tasks
from exporter.config import Config, load
from exporter.errors import UsageError
from exporter.placement.plot import plot
from exporter.placement.policies import FGD_SECONDS, FGD_TIES, FgdTies
from exporter.placement.replay import NODE_ORDERS, Setup, replay_many, run_lengths, summary, write_csv
from exporter.placement.task import Task
from exporter.policy_names import POLICIES
from exporter.validate import flag_number

log = logging.getLogger("gpufleet")
MIB = 2**20  # the trace states memory in MiB

DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else ""
EPILOG = f"""policies: {", ".join(POLICIES)}

examples:
  gpufleet replay --out out/                          (the built-in openb-default trace)
  gpufleet replay --trace openb-gpuspec33 --out out/  (a variant, from $GPUFLEET_DATA)
  gpufleet replay --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv \\
      --policy fgd,bestfit,packing,dotprod,random,tiered --seeds 42,43 --arrive 1.3 --out out/
  gpufleet replay --sim --pods openb_pod_list_default.csv --policy fgd,bestfit --out out-sim/
  gpufleet replay --policy packing --seeds 42-51 --node-order seeded --out out/
                                                      (nodes ordered as the reference simulator does)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("fleet (one of)")
    fleet.add_argument("--nodes", metavar="NODES.csv", help="openb node list (.csv or .csv.gz)")
    fleet.add_argument("--sim", action="store_true",
                       help="the simulated reference fleet (sources.sim of --config), empty")
    parser.add_argument("--pods", metavar="PODS.csv",
                        help="openb pod list (any openb_pod_list_*.csv, or .csv.gz)")
    parser.add_argument("--trace", metavar="NAME",
                        help=f"a named openb trace instead of --nodes and --pods (default "
                        f"{openb.DEFAULT_TRACE}, built in; openb-<variant> is read from $GPUFLEET_DATA); "
                        "with --sim, only its pods are used")
    parser.add_argument("--policy", default=",".join(POLICIES), metavar="LIST",
                        help="comma-separated placement policies (default: all of them)")
    parser.add_argument("--seeds", default="42", metavar="LIST",
                        help="comma-separated seeds, or a range such as 42-44 (default 42)")
    parser.add_argument("--arrive", type=float, default=1.3, metavar="X",
                        help="pods arrive until they ask for X times the cluster's GPUs (default 1.3)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for replay.csv and replay.png")
    parser.add_argument("--node-order", default="name", metavar="name|seeded",
                        help="the order in which nodes are considered, which decides ties and where "
                        "CPU-only pods go: 'name' (the default) or 'seeded', a random order per seed "
                        "as the FGD paper's reference simulator uses (docs/replay.md)")
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="runs at a time, one core each (default: the number of cores)")
    research = parser.add_argument_group("fgd's near-ties (research knobs; docs/replay.md)")
    research.add_argument("--fgd-tie", type=float, default=FGD_TIES.gpus, metavar="GPUS",
                          help="fgd, tiered and lookahead treat growths of F within GPUS + REL x |least "
                          f"growth| of the least as near-ties (default {FGD_TIES.gpus:g})")
    research.add_argument("--fgd-tie-rel", type=float, default=FGD_TIES.relative, metavar="REL",
                          help=f"the relative part of that band (default {FGD_TIES.relative:g})")
    research.add_argument("--fgd-second", choices=FGD_SECONDS, default=FGD_TIES.second,
                          help=f"what decides among near-ties (default {FGD_TIES.second}; 'first' with "
                          "--fgd-tie 0 --fgd-tie-rel 0 is fgd as defined)")
    parser.add_argument("--config", metavar="FILE",
                        help="YAML config: analysis.coverage and include_cpu_only shape the target "
                        "workload; sources.sim the fleet of --sim")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    logs.setup("warning")
    policies = parse_policies(args.policy)
    seeds = parse_seeds(args.seeds)
    if not 0 < args.arrive <= 10:
        raise UsageError(f"--arrive: must be in (0, 10], got {args.arrive:g}")
    if not 0 <= args.fgd_tie <= 1:
        raise UsageError(f"--fgd-tie: must be in [0, 1] GPU, got {args.fgd_tie:g}")
    if not 0 <= args.fgd_tie_rel <= 1:
        raise UsageError(f"--fgd-tie-rel: must be in [0, 1], got {args.fgd_tie_rel:g}")
    ties = FgdTies(args.fgd_tie, args.fgd_tie_rel, args.fgd_second)
    if args.node_order not in NODE_ORDERS:
        raise UsageError(f"--node-order: one of {', '.join(NODE_ORDERS)}, got {args.node_order[:40]!r}")
    if args.jobs is not None:
        flag_number(args.jobs, "--jobs", 1, MAX_JOBS)
    _resolve_trace(args)
    config = load(args.config)
    out = out_dir(args.out, OUT_FILES)
    mapper = openb.ModelMapper()  # one for nodes and pods: each unknown model is reported once
    state, node_memory, fleet_name = _fleet(args, config, mapper)
    try:
        pods = openb.load_pods(args.pods, mapper)
    except openb.OpenbError as exc:
        raise UsageError(str(exc)) from None
    if not pods:
        raise UsageError(f"{args.pods}: no pods")
    workload = from_tasks((p.shape for p in pods), coverage=config.analysis.coverage,
                          include_cpu_only=config.analysis.include_cpu_only)
    tasks = tuple(Task.from_shape(p.shape, host_memory_bytes=p.memory_mib * MIB) for p in pods)
    setup = Setup(state, tasks, compile_workload(workload, state.model_names), args.arrive, ties,
                  node_memory, args.node_order)
    if setup.capacity <= 0:
        raise UsageError("the fleet has no GPUs to place pods on")
    if sum(t.gpu_demand for t in setup.tasks) <= 0:
        raise UsageError(f"{args.pods}: the pods ask for no GPUs, so no workload ever arrives")

    lengths = run_lengths(setup, seeds)
    bar = None if args.no_progress else ProgressBar(sum(lengths[s] for s in seeds) * len(policies),
                                                    len(policies) * len(seeds))
    started = time.monotonic()
    rows = replay_many(setup, policies, seeds, args.jobs, bar.update if bar else None)
    if bar is not None:
        bar.finish()
    elapsed = time.monotonic() - started

    write_out(out / "replay.csv", lambda path: write_csv(rows, path))
    title = (f"{Path(args.pods).name} on {fleet_name}: {len(state):,} nodes, {setup.capacity:,.0f} GPUs"
             + (", nodes in a seeded order" if args.node_order == "seeded" else ""))
    write_out(out / "replay.png", lambda path: plot(rows, path, title))
    sys.stdout.write(f"{title}\n")
    sys.stdout.write(report(rows, setup.capacity, len(seeds), elapsed))
    sys.stdout.write(f"wrote {out / 'replay.csv'} and {out / 'replay.png'}\n")
    return 0


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise UsageError(f"--policy: unknown {', '.join(unknown) or 'empty list'}; "
                         f"choose from {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


OUT_FILES = ("replay.csv", "replay.png")
MAX_SEEDS = 10_000  # a run per seed and policy: more is never one command's work
MAX_SEED = 2**63 - 1
MAX_JOBS = 1024  # runs at a time, one core each


def parse_seeds(text: str) -> list[int]:
    """``42,43`` or ``42-44`` (or both, comma-joined), at most :data:`MAX_SEEDS` of them,
    counted before a range is expanded (``1-1000000000`` was a MemoryError)."""
    seeds: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            if "-" in part.lstrip("-"):
                low, high = (int(x) for x in part.split("-", 1))
                if high < low:
                    raise ValueError
                if len(seeds) + high - low + 1 > MAX_SEEDS:
                    raise UsageError(f"--seeds: at most {MAX_SEEDS:,} seeds, got {text[:40]!r}")
                seeds += range(low, high + 1)
            else:
                seeds.append(int(part))
                if len(seeds) > MAX_SEEDS:
                    raise UsageError(f"--seeds: at most {MAX_SEEDS:,} seeds, got {text[:40]!r}")
    except ValueError:
        raise UsageError(f"--seeds: expected numbers such as 42,43 or 42-44, got {text[:40]!r}") from None
    if not seeds or any(not 0 <= s <= MAX_SEED for s in seeds):
        raise UsageError(f"--seeds: expected seeds from 0 to 2**63-1, got {text[:40]!r}")
    return list(dict.fromkeys(seeds))


def _resolve_trace(args: argparse.Namespace) -> None:
    """Fill --nodes and --pods from --trace, or from the built-in trace when no file is given."""
    if args.trace and (args.nodes or args.pods):
        raise UsageError("--trace names both the nodes and the pods: no --nodes or --pods with it")
    if args.nodes and args.sim:
        raise UsageError("give either --nodes NODES.csv or --sim, not both")
    if args.nodes and not args.pods:
        raise UsageError("--nodes needs --pods PODS.csv")
    if args.nodes or (args.sim and args.pods):
        return
    try:
        trace = openb.named_trace(args.trace or openb.DEFAULT_TRACE)
    except openb.OpenbError as exc:
        raise UsageError(f"--trace: {exc}") from None
    args.pods = str(trace.pods)
    if not args.sim:
        args.nodes = str(trace.nodes)


def out_dir(path: str, names: Sequence[str]) -> Path:
    """The ``--out`` folder, made if missing, refused (one line, exit 2) when one of the
    ``names`` this command writes there is already a symbolic link or not a regular file: a
    planted ``replay.csv -> /etc/...`` was written through, and a FIFO would hang the write.
    Checked before the run, so hours of work are not lost to it; :func:`write_out` then
    never writes through a link that appears meanwhile."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot create the folder: {exc.strerror}") from None
    for name in names:
        target = out / name
        if target.is_symlink() or (target.exists() and not target.is_file()):
            what = "a symbolic link" if target.is_symlink() else "not a regular file"
            raise UsageError(f"--out {path}: {name} is {what}; not written through it "
                             "(remove it, or pick another folder)")
    return out


def write_out(path: Path, write: Callable[[Path], None]) -> None:
    """``write(temp)`` into a new file beside ``path`` (created exclusively), then renamed
    over ``path``: a symbolic link at ``path`` is replaced, never written through, and a
    reader sees the old file or the new one."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(temp))
        os.chmod(temp, 0o644)  # mkstemp's 0600 would hide the results from the group
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _fleet(args: argparse.Namespace, config: Config,
           mapper: openb.ModelMapper) -> tuple[FleetState, np.ndarray | None, str]:
    """The empty fleet, its nodes' memory in bytes (None when unknown: then not checked), a name."""
    if args.sim:
        from exporter.fleet_sim.fleet import Simulation

        # the reference layout with nothing running: no jobs, no scenarios
        sim = dataclasses.replace(config.sources.sim, target_allocation=0.0, scenarios=())
        return from_snapshot(Simulation(sim, start_time=0.0).snapshot()), None, "the simulated fleet"
    try:
        nodes = openb.load_nodes(args.nodes, mapper)
    except openb.OpenbError as exc:
        raise UsageError(str(exc)) from None
    memory = np.array([n.memory_mib * MIB for n in nodes], dtype=float)
    return openb.empty_state(nodes), memory if (memory > 0).all() else None, Path(args.nodes).name


def report(rows, capacity: float, seeds: int, elapsed: float) -> str:  # type: ignore[no-untyped-def]
    last = max(r.arrived_pct for r in rows)
    lines = [f"At {last}% arrived workload, mean of {seeds} seed{'s' if seeds > 1 else ''}:",
             f"  {'policy':<9} {'allocated':>9} {'unallocated GPUs':>17} {'fragmented':>10} "
             f"{'frag ratio':>10} {'failed pods':>11}"]
    for policy, alloc, frag, ratio, failed in sorted(summary(rows), key=lambda s: -s[1]):
        lines.append(f"  {policy:<9} {alloc:8.2f}% {capacity * (100 - alloc) / 100:17.1f} {frag:9.2f}% "
                     f"{ratio:9.2f}% {failed:11.1f}")
    lines.append(f"{len({(r.policy, r.seed) for r in rows})} runs in {elapsed:.1f} s")
    return "\n".join(lines) + "\n"


class ProgressBar:
    """Pods placed, pods per second and time left, on stderr; redrawn in place on a terminal,
    a line every few seconds otherwise (a log file)."""

    def __init__(self, total: int, runs: int, stream: TextIO | None = None, width: int = 28) -> None:
        self.total = max(total, 1)
        self.runs = runs
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.drawn = 0.0
        self.placed = 0
        self.finished = 0

    def update(self, placed: dict[int, int], finished: int) -> None:
        self.placed = sum(placed.values())
        self.finished = finished
        now = time.monotonic()
        if now - self.drawn >= (0.25 if self.tty else 5.0):
            self.drawn = now
            self._draw(now)

    def finish(self) -> None:
        self._draw(time.monotonic(), last=True)

    def _draw(self, now: float, last: bool = False) -> None:
        elapsed = max(now - self.started, 1e-9)
        share = min(1.0, self.placed / self.total)
        rate = self.placed / elapsed
        left = (self.total - self.placed) / rate if rate > 0 else float("inf")
        filled = round(share * self.width)
        eta = "--:--" if left == float("inf") else f"{int(left) // 60}:{int(left) % 60:02d}"
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {100 * share:3.0f}%  "
                f"{self.placed:,}/{self.total:,} pods  {rate:,.0f} pods/s  {eta} left  "
                f"runs {self.finished}/{self.runs}")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if last else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


__all__ = ["MAX_SEEDS", "ProgressBar", "add_arguments", "out_dir", "parse_policies", "parse_seeds",
           "run", "write_out"]
