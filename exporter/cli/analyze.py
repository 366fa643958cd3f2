"""``gpufleet analyze``: fragmentation of a fleet snapshot or of the openb trace cluster, offline.

Input is either a snapshot (``--snapshot FILE.json``, as ``GET /v1/snapshot``
serves it) or the openb node and pod CSVs: ``--empty`` measures the empty
cluster, the pods defining only the target workload; ``--placed-by POLICY``
places the pods first, in trace order, by that placement policy. Prints a
readable report, or JSON with ``--json``.

A snapshot file is held to ``POST /v1/plan``'s bounds (:mod:`exporter.advisor.bounds`):
at most ``advisor.max_body_bytes`` (16 MiB by default, from ``--config``), 100,000 nodes,
64 GPUs a node, finite numbers, checked before anything is built from it. Before, a node
claiming a billion GPUs made ``from_snapshot`` build a set of a billion indices.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from exporter import logs
from exporter.advisor import bounds
from exporter.analysis import configure, openb
from exporter.analysis.fgd import FRAGMENT_REASONS, REASONS, compile_workload
from exporter.analysis.index import Report, Scope, evaluate
from exporter.analysis.options import AnalysisConfig
from exporter.analysis.state import FleetState, from_snapshot
from exporter.analysis.workload import Workload, from_tasks, snapshot_shapes, typical
from exporter.bounded_file import USAGE, read_bounded
from exporter.config import ConfigError, load
from exporter.errors import UsageError, one_line
from exporter.placement.engine import place_all
from exporter.placement.task import Task
from exporter.policy_names import POLICIES
from exporter.snapshot import from_json
from exporter.validate import flag_number

DESCRIPTION = __doc__.split("\n\n", 1)[1].replace("``", "") if __doc__ else ""
MAX_TOP = 100_000  # worst nodes listed
MAX_SEED = 2**63 - 1
EPILOG = f"""examples:
  gpufleet analyze --trace {openb.DEFAULT_TRACE}
  gpufleet analyze --trace openb-gpuspec33 --placed-by fgd
  gpufleet analyze --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv --empty
  curl -s localhost:9874/v1/snapshot > snapshot.json
  gpufleet analyze --snapshot snapshot.json --json

workload: --pods gives the trace's typical shapes; without it a snapshot is
measured against its own allocations' shapes, or the analysis.workload of
--config when that is trace or shapes."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_argument_group("input (one of)")
    source.add_argument("--snapshot", metavar="FILE.json",
                        help="fleet snapshot as served at GET /v1/snapshot")
    source.add_argument("--nodes", metavar="NODES.csv", help="openb node list (.csv or .csv.gz)")
    source.add_argument("--trace", metavar="NAME",
                        help=f"a named openb trace: its GPU nodes and pods ({openb.DEFAULT_TRACE} is "
                        "built in; openb-<variant> is read from $GPUFLEET_DATA); measures the empty "
                        "cluster unless --placed-by")
    parser.add_argument("--pods", metavar="PODS.csv",
                        help="openb pod list: the target workload (and, with --placed-by, the pods)")
    parser.add_argument("--empty", action="store_true",
                        help="with --nodes: measure the empty cluster")
    parser.add_argument("--placed-by", metavar="POLICY",
                        help=f"with --nodes: place the pods by this policy first ({', '.join(POLICIES)})")
    parser.add_argument("--seed", type=int, default=0, metavar="N",
                        help="seed of the placement policy (default 0)")
    parser.add_argument("--config", metavar="FILE",
                        help="YAML config; its analysis: section sets slack, tier penalty, coverage")
    parser.add_argument("--coverage", type=float, metavar="X",
                        help="keep the most common shapes covering this share of tasks (default 0.95)")
    parser.add_argument("--no-cpu-only", action="store_true",
                        help="leave CPU-only tasks out of the target workload")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a report")
    parser.add_argument("--top", type=int, default=10, metavar="N",
                        help="worst nodes to list (default 10)")


def run(args: argparse.Namespace) -> int:
    logs.setup("warning")
    config = _analysis_config(args)
    state, workload = _inputs(args, config)
    report = evaluate(state, compile_workload(workload, state.model_names),
                      configure.index_settings(config))
    if args.json:
        json.dump(report_json(report, top=args.top), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(report_text(report, top=args.top))
    return 0


def _analysis_config(args: argparse.Namespace) -> AnalysisConfig:
    config = load(args.config).analysis
    if args.coverage is not None:
        if not 0 < args.coverage <= 1:
            raise UsageError(f"--coverage: must be in (0, 1], got {args.coverage:g}")
        config = replace(config, coverage=args.coverage)
    if args.no_cpu_only:
        config = replace(config, include_cpu_only=False)
    flag_number(args.top, "--top", 0, MAX_TOP)
    flag_number(args.seed, "--seed", 0, MAX_SEED)  # a negative one was numpy's ValueError
    return config


def _inputs(args: argparse.Namespace, config: AnalysisConfig) -> tuple[FleetState, Workload]:
    if sum(map(bool, (args.snapshot, args.nodes, args.trace))) != 1:
        raise UsageError("give one of --snapshot FILE.json, --nodes NODES.csv or --trace NAME")
    if args.trace:
        if args.nodes or args.pods:
            raise UsageError("--trace names both the nodes and the pods: no --nodes or --pods with it")
        try:
            trace = openb.named_trace(args.trace)
        except openb.OpenbError as exc:
            raise UsageError(f"--trace: {exc}") from None
        args.nodes, args.pods = str(trace.nodes), str(trace.pods)
        args.empty = args.empty or not args.placed_by
    if args.snapshot:
        if args.empty or args.placed_by:
            raise UsageError("--empty and --placed-by go with --nodes, not --snapshot")
        snapshot = _read_snapshot(Path(args.snapshot), load(args.config).advisor.max_body_bytes)
        if args.pods:
            workload = configure.trace_workload(args.pods, config, key="--pods")
        elif (fixed := configure.fixed_workload(config)) is not None:  # None: the live window
            workload = fixed
        else:
            # a single snapshot is a window of one: measure it against its own jobs
            workload = typical(snapshot_shapes(snapshot), coverage=config.coverage,
                               include_cpu_only=config.include_cpu_only, source="snapshot")
        return from_snapshot(snapshot), workload
    if not args.pods:
        raise UsageError("--nodes needs --pods PODS.csv (the target workload)")
    if args.empty == bool(args.placed_by):
        raise UsageError("with --nodes, give either --empty or --placed-by POLICY")
    if args.placed_by:
        _check_policy(args.placed_by)
    mapper = openb.ModelMapper()
    try:
        nodes = openb.load_nodes(args.nodes, mapper)
        pods = openb.load_pods(args.pods, mapper)
    except openb.OpenbError as exc:
        raise UsageError(str(exc)) from None
    workload = _trace(pods, config)
    if args.placed_by:
        return _placed(nodes, pods, args.placed_by, args.seed, workload), workload
    return openb.empty_state(nodes), workload


def _trace(pods: list[openb.OpenbPod], config: AnalysisConfig) -> Workload:
    return from_tasks((p.shape for p in pods), coverage=config.coverage,
                      include_cpu_only=config.include_cpu_only)


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise UsageError(f"--placed-by {policy}: unknown policy; one of {', '.join(POLICIES)}")


def _placed(nodes: list[openb.OpenbNode], pods: list[openb.OpenbPod], policy: str,
            seed: int, workload: Workload) -> FleetState:
    """The cluster after the pods arrived in trace order and ``policy`` placed each where it
    fit (the ones that fit nowhere are left out); ``seed`` drives the random policy."""
    state = openb.empty_state(nodes)
    placed, _ = place_all(state, [Task.from_shape(p.shape) for p in pods], policy,
                          np.random.default_rng(seed), workload=workload)
    return placed


def _read_snapshot(path: Path, max_bytes: int):
    """The snapshot in ``path``, within /v1/plan's bounds: the size first (of a regular file
    before reading; of a pipe while reading, at most one byte past it), then the schema."""
    body = read_bounded(path, max_bytes, USAGE, setting="advisor.max_body_bytes")
    try:
        data = bounds.parse_json(body)
    except bounds.Invalid as exc:
        raise UsageError(one_line(f"{path}: {_unbodied(str(exc))}")) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not a snapshot (expected a JSON object from /v1/snapshot)")
    try:
        bounds.check_snapshot(data)
        return from_json(data)
    except bounds.Invalid as exc:
        raise UsageError(one_line(f"{path}: not a valid snapshot: {exc}")) from None
    except (TypeError, ValueError, KeyError) as exc:  # the schema passed: should not happen
        raise UsageError(one_line(f"{path}: not a valid snapshot: {exc}")) from None


def _unbodied(reason: str) -> str:
    """bounds' parse errors speak of a request "body"; here it is the file."""
    for prefix in ("body is ", "body: "):
        if reason.startswith(prefix):
            return reason[len(prefix):]
    return reason


def _scope_json(scope: Scope) -> dict[str, Any]:
    return {
        "index": round(scope.index, 4),
        "fragmented_gpus": round(scope.fragmented_gpus, 4),
        "idle_gpus": round(scope.idle_gpus, 4),
        "total_gpus": round(scope.total_gpus, 4),
        "fragmentation_ratio": round(scope.fragmentation_ratio, 6),
        "allocated_ratio": round(scope.allocated_ratio, 6),
        "tier_penalty": scope.penalty,
        "breakdown": {r: round(scope.breakdown.get(r, 0.0), 4) for r in REASONS},
    }


def report_json(report: Report, top: int = 10) -> dict[str, Any]:
    workload = report.workload.workload
    return {
        **_scope_json(report.cluster),
        "compaction_due": report.compaction_due,
        "compaction_threshold": report.settings.compaction_threshold,
        "nodes": len(report.state),
        "workload": {
            "source": workload.source,
            "shapes": len(workload),
            "coverage": round(workload.coverage, 6),
            "cpu_only_share": round(workload.cpu_only_share, 6),
            "include_cpu_only": workload.include_cpu_only,
            "list": [
                {"cpus": s.cpus, "gpus": s.gpus, "gpu_share": s.gpu_share,
                 "models": list(s.models), "weight": round(w, 6)}
                for s, w in zip(workload.shapes, workload.weights, strict=True)
            ],
        },
        "pools": {
            p.name: {"model": p.model, **_scope_json(p)}
            for p in sorted(report.pools, key=lambda p: (-p.index, p.name))
        },
        "tier_inversions": [
            {"upper": i.upper, "lower": i.lower, "upper_allocated": round(i.upper_allocated, 6),
             "lower_allocated": round(i.lower_allocated, 6)}
            for i in report.inversions if i.inverted
        ],
        "worst_nodes": [
            {"node": name, "fragmented_gpus": round(frag, 4), "idle_gpus": round(idle, 4)}
            for name, frag, idle in report.worst_nodes(top)
        ],
    }


def report_text(report: Report, top: int = 10) -> str:
    c = report.cluster
    w = report.workload.workload
    due = "yes" if report.compaction_due else "no"
    lines = [
        f"Fragmentation index {c.index:.1f} / 100 "
        f"(compaction due above {report.settings.compaction_threshold:g}: {due})",
        f"Idle GPUs {c.idle_gpus:.1f} of {c.total_gpus:g} on {len(report.state)} nodes; "
        f"fragmented {c.fragmented_gpus:.1f} ({100 * c.fragmentation_ratio:.1f}% of idle)",
        f"Workload: {len(w)} shapes ({w.source}) covering {100 * w.coverage:.1f}% of tasks; "
        f"CPU-only {100 * w.cpu_only_share:.1f}% "
        f"({'included' if w.include_cpu_only else 'excluded'})",
        "",
        "Idle GPUs by reason:",
    ]
    for reason in REASONS:
        gpus = c.breakdown.get(reason, 0.0)
        share = 100 * gpus / c.idle_gpus if c.idle_gpus > 0 else 0.0
        mark = "" if reason in FRAGMENT_REASONS else "  (usable)"
        lines.append(f"  {reason:<11} {gpus:10.1f}  {share:5.1f}%{mark}")
    lines += ["", "Pools, worst first:",
              f"  {'pool':<14} {'model':<10} {'index':>6} {'fragmented':>11} {'idle':>9} "
              f"{'total':>7} {'allocated':>9}"]
    for p in sorted(report.pools, key=lambda p: (-p.index, p.name)):
        lines.append(f"  {p.name:<14} {p.model:<10} {p.index:6.1f} {p.fragmented_gpus:11.1f} "
                     f"{p.idle_gpus:9.1f} {p.total_gpus:7g} {100 * p.allocated_ratio:8.1f}%")
    inverted = [i for i in report.inversions if i.inverted]
    lines += ["", "Tier inversions: " + (", ".join(
        f"{i.upper} idle ({100 * i.upper_allocated:.0f}%) while {i.lower} busy "
        f"({100 * i.lower_allocated:.0f}%)" for i in inverted) or "none")]
    worst = report.worst_nodes(top)
    if worst:
        lines += ["", "Most fragmented nodes:"]
        lines += [f"  {name:<20} {frag:6.2f} of {idle:5.2f} idle GPUs" for name, frag, idle in worst]
    return "\n".join(lines) + "\n"


__all__ = ["ConfigError", "add_arguments", "report_json", "report_text", "run"]
