"""Every published openb workload, every policy, ten seeds: the FGD paper's Sec. 6 sweep, resumable.

For each workload (the 17 pod lists the reference simulator published results
for), each policy and each seed, one ``gpufleet replay`` run: the pods
shuffled by the seed, random copies appended until they ask for 1.3 x the
cluster's GPUs, arrivals only (:func:`exporter.placement.replay.replay`).
Each finished run is appended as one JSON line to OUT/runs.jsonl (workload,
policy, seed, allocation and fragmentation ratio at every whole percent,
failed pods, seconds), and runs already there are skipped, so the sweep can
be stopped and started again, or run in parts (--workloads, --policies,
--seeds). Every invocation then writes OUT/table.md from all the runs the
file holds: median allocation at 100/110/120/130% arrival and fragmentation
ratio at 90%, per workload and policy, beside the reference simulator's
published medians, and each workload's ranking beside the paper's.

The nodes are considered in a seeded random order (``node_order="seeded"``), as
the reference does: it prefixes each node's name with a seeded permutation
before scheduling, so its "first node by name", where ties and CPU-only pods
go, is a random node (docs/replay.md). Runs recorded in another node order
(lines without ``node_order``, from before it) are not reused.

The reference figures are the medians over seeds 42-51 of
hkust-adsl/kubernetes-scheduler-simulator at commit 8f3d641,
``experiments/analysis/expected_results/analysis_allo_discrete.csv`` (column
130) and ``analysis_frag_ratio_discrete.csv`` (column 90), tune 1.3.

Run: .venv/bin/python bench/replay_all.py --out /tmp/replay_all [--jobs 2]
"""

from __future__ import annotations

import os

# one core per run: no BLAS threads under the worker processes
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable, Sequence  # noqa: E402
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.analysis import openb  # noqa: E402
from exporter.analysis.fgd import compile_workload  # noqa: E402
from exporter.analysis.workload import from_tasks  # noqa: E402
from exporter.placement.replay import Setup, replay  # noqa: E402
from exporter.placement.task import Task  # noqa: E402
from exporter.policy_names import POLICIES  # noqa: E402

MIB = 2**20
WORKLOADS = ("default", "multigpu20", "multigpu30", "multigpu40", "multigpu50",
             "gpushare40", "gpushare60", "gpushare80", "gpushare100",
             "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
             "cpu050", "cpu100", "cpu200", "cpu250")
# tiered is fgd on openb (the trace states no GPU-memory need), so it is left out by default
DEFAULT_POLICIES = tuple(p for p in POLICIES if p != "tiered")
SEEDS = tuple(range(42, 52))
ARRIVE = 1.3
ALLOC_AT = (100, 110, 120, 130)
RATIO_AT = 90
MAX_RUNS = 20_000  # a bound on what one invocation may be asked to do
NODE_ORDER = "seeded"  # the reference's node order (see the docstring)

# The reference's policies, in the order of these tuples; it has no tiered and we have no clustering.
REFERENCE_POLICIES = ("fgd", "bestfit", "packing", "clustering", "dotprod", "random")
REFERENCE_ALLOC_130: dict[str, tuple[float, ...]] = {
    "cpu050": (95.20, 93.82, 93.79, 93.79, 93.29, 91.16),
    "cpu100": (95.34, 93.47, 92.81, 92.81, 92.02, 89.17),
    "cpu200": (95.08, 92.42, 90.38, 90.02, 88.00, 83.70),
    "cpu250": (93.41, 91.50, 88.31, 87.74, 84.04, 80.31),
    "default": (95.40, 93.11, 92.06, 91.79, 90.80, 87.38),
    "gpushare100": (86.91, 85.00, 82.64, 82.70, 82.47, 79.47),
    "gpushare40": (94.14, 91.73, 90.07, 90.06, 89.58, 86.03),
    "gpushare60": (91.41, 89.35, 87.52, 87.23, 87.17, 83.65),
    "gpushare80": (89.31, 87.06, 85.06, 84.92, 84.47, 81.25),
    "gpuspec10": (94.94, 93.33, 92.44, 92.19, 90.44, 87.51),
    "gpuspec20": (94.86, 93.26, 93.05, 92.22, 89.97, 87.40),
    "gpuspec25": (94.81, 93.22, 93.03, 92.00, 89.66, 86.88),
    "gpuspec33": (94.56, 93.09, 93.23, 92.03, 89.11, 86.43),
    "multigpu20": (95.65, 93.90, 93.75, 93.59, 92.02, 88.66),
    "multigpu30": (96.48, 94.64, 94.96, 94.73, 93.23, 89.20),
    "multigpu40": (97.00, 95.22, 95.75, 95.63, 94.22, 90.02),
    "multigpu50": (97.17, 95.70, 96.19, 95.78, 94.88, 90.23),
}
REFERENCE_RATIO_90: dict[str, tuple[float, ...]] = {
    "cpu050": (45.66, 64.72, 64.82, 64.67, 69.41, 92.41),
    "cpu100": (48.28, 69.74, 76.28, 75.61, 83.57, 95.07),
    "cpu200": (54.43, 82.14, 98.14, 98.61, 99.41, 98.51),
    "cpu250": (57.38, 90.28, 99.54, 99.22, 99.38, 99.17),
    "default": (49.87, 73.62, 83.42, 84.48, 94.44, 96.73),
    "gpushare100": (99.18, 99.80, 99.52, 99.43, 99.81, 98.92),
    "gpushare40": (60.91, 87.24, 98.98, 98.55, 99.50, 96.96),
    "gpushare60": (86.15, 99.39, 99.21, 98.70, 99.38, 97.99),
    "gpushare80": (98.79, 99.59, 99.34, 98.92, 99.62, 98.37),
    "gpuspec10": (43.46, 53.64, 59.76, 61.33, 69.48, 96.04),
    "gpuspec20": (49.38, 48.55, 51.39, 53.66, 60.22, 92.50),
    "gpuspec25": (50.50, 48.23, 50.84, 53.18, 58.69, 86.48),
    "gpuspec33": (51.16, 49.93, 51.47, 53.27, 58.23, 77.37),
    "multigpu20": (47.14, 66.38, 67.90, 68.53, 82.17, 88.92),
    "multigpu30": (42.01, 58.86, 56.10, 56.82, 72.07, 70.21),
    "multigpu40": (37.37, 53.27, 48.84, 47.94, 62.19, 58.95),
    "multigpu50": (34.42, 47.31, 42.59, 43.18, 55.33, 49.90),
}


def reference(table: dict[str, tuple[float, ...]], workload: str, policy: str) -> float | None:
    row = table.get(workload)
    if row is None or policy not in REFERENCE_POLICIES:
        return None
    return row[REFERENCE_POLICIES.index(policy)]


def load_setup(workload: str) -> Setup:
    """The empty openb cluster and one pod list, as ``gpufleet replay --trace openb-<name>`` builds them."""
    trace = openb.named_trace(f"openb-{workload}")
    mapper = openb.ModelMapper()
    nodes = openb.load_nodes(trace.nodes, mapper)
    pods = openb.load_pods(trace.pods, mapper)
    state = openb.empty_state(nodes)
    workload_shapes = from_tasks(p.shape for p in pods)
    tasks = tuple(Task.from_shape(p.shape, host_memory_bytes=p.memory_mib * MIB) for p in pods)
    memory = np.array([n.memory_mib * MIB for n in nodes], dtype=float)
    return Setup(state, tasks, compile_workload(workload_shapes, state.model_names), ARRIVE,
                 node_memory=memory, node_order=NODE_ORDER)


_SETUPS: dict[str, Setup] = {}


def run_one(workload: str, policy: str, seed: int) -> dict[str, Any]:
    """One run in a worker; each worker loads each workload once."""
    setup = _SETUPS.get(workload)
    if setup is None:
        _SETUPS.clear()  # runs come workload by workload: keep one in memory
        setup = _SETUPS[workload] = load_setup(workload)
    started = time.perf_counter()
    rows = replay(setup, policy, seed)
    seconds = time.perf_counter() - started
    return {"workload": workload, "policy": policy, "seed": seed, "arrive": ARRIVE,
            "node_order": NODE_ORDER, "alloc_pct": [round(r.alloc_pct, 4) for r in rows],
            "frag_ratio_pct": [round(r.frag_ratio_pct, 4) for r in rows],
            "failed_pods": rows[-1].failed_pods, "seconds": round(seconds, 3)}


def read_runs(path: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Runs already done; a line cut short by an interrupted write, or a run in another
    node order, is skipped (and re-run)."""
    done: dict[tuple[str, str, int], dict[str, Any]] = {}
    if not path.exists():
        return done
    with path.open() as handle:
        for line in handle:
            try:
                run = json.loads(line)
                key = (str(run["workload"]), str(run["policy"]), int(run["seed"]))
                if len(run["alloc_pct"]) != round(ARRIVE * 100) + 1:
                    continue
                if run.get("node_order", "name") != NODE_ORDER:
                    continue
            except (ValueError, KeyError, TypeError):
                continue
            done[key] = run
    return done


def sweep(todo: Sequence[tuple[str, str, int]], out: Path, jobs: int) -> int:
    """Run ``todo``, appending each result to OUT/runs.jsonl as it finishes; the number of runs done."""
    path = out / "runs.jsonl"
    finished = 0
    started = time.monotonic()

    def record(run: dict[str, Any], handle: Any) -> None:
        nonlocal finished
        handle.write(json.dumps(run, separators=(",", ":")) + "\n")
        handle.flush()
        finished += 1
        elapsed = time.monotonic() - started
        print(f"[{finished}/{len(todo)} {elapsed:6.0f} s] {run['workload']} {run['policy']} {run['seed']}: "
              f"{run['alloc_pct'][-1]:.2f}% in {run['seconds']:.1f} s", flush=True)

    with path.open("a+") as handle:
        if handle.tell() > 0:
            handle.seek(handle.tell() - 1)
            if handle.read(1) != "\n":  # a line cut short by an interrupted write: end it
                handle.write("\n")
        if jobs == 1:
            for key in todo:
                record(run_one(*key), handle)
            return finished
        # spawn, not fork: a forked child of a process with threads can deadlock
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            queue = iter(todo)
            pending = set()
            for key in queue:  # keep the pool a little ahead, not the whole sweep queued
                pending.add(pool.submit(run_one, *key))
                if len(pending) >= 2 * jobs:
                    break
            try:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        record(future.result(), handle)
                        nxt = next(queue, None)
                        if nxt is not None:
                            pending.add(pool.submit(run_one, *nxt))
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    return finished


def medians(runs: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (workload, policy): median allocation at ALLOC_AT, median ratio at RATIO_AT, seeds, seconds."""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["workload"], run["policy"]), []).append(run)
    out: dict[tuple[str, str], dict[str, float]] = {}
    for key, group in grouped.items():
        row = {f"alloc{p}": statistics.median(r["alloc_pct"][p] for r in group) for p in ALLOC_AT}
        row[f"ratio{RATIO_AT}"] = statistics.median(r["frag_ratio_pct"][RATIO_AT] for r in group)
        row["seeds"] = len(group)
        row["seconds_max"] = max(r["seconds"] for r in group)
        row["seconds_mean"] = statistics.mean(r["seconds"] for r in group)
        out[key] = row
    return out


def ranking(table: dict[tuple[str, str], dict[str, float]], workload: str,
            policies: Sequence[str]) -> list[str]:
    """Policies by median allocation at 130%, best first."""
    present = [p for p in policies if (workload, p) in table]
    return sorted(present, key=lambda p: -table[(workload, p)]["alloc130"])


def reference_ranking(workload: str, policies: Sequence[str]) -> list[str]:
    row = REFERENCE_ALLOC_130.get(workload)
    if row is None:
        return []
    present = [p for p in policies if p in REFERENCE_POLICIES]
    return sorted(present, key=lambda p: -row[REFERENCE_POLICIES.index(p)])


def render(runs: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    """OUT/table.md: the medians beside the reference's, each workload's ranking beside the paper's."""
    table = medians(runs.values())
    workloads = [w for w in WORKLOADS if any(k[0] == w for k in table)]
    workloads += sorted({k[0] for k in table} - set(workloads))
    policies = [p for p in POLICIES if any(k[1] == p for k in table)]
    policies += sorted({k[1] for k in table} - set(policies))
    lines = ["| workload | policy | seeds | alloc 100% | 110% | 120% | 130% | reference 130% "
             "| frag ratio 90% | reference | s/run (max) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for w in workloads:
        for p in policies:
            row = table.get((w, p))
            if row is None:
                continue
            ref = reference(REFERENCE_ALLOC_130, w, p)
            ref_ratio = reference(REFERENCE_RATIO_90, w, p)
            lines.append(f"| {w} | `{p}` | {row['seeds']:.0f} | "
                         + " | ".join(f"{row[f'alloc{a}']:.2f}" for a in ALLOC_AT)
                         + f" | {'' if ref is None else f'{ref:.2f}'} | {row[f'ratio{RATIO_AT}']:.1f} | "
                         f"{'' if ref_ratio is None else f'{ref_ratio:.1f}'} | "
                         f"{row['seconds_mean']:.1f} ({row['seconds_max']:.1f}) |")
    lines += ["", "| workload | our ranking at 130% | the reference's (same policies) | same order |",
              "|---|---|---|---|"]
    shared = [p for p in policies if p in REFERENCE_POLICIES]
    for w in workloads:
        ours = ranking(table, w, shared)
        theirs = reference_ranking(w, ours)
        lines.append(f"| {w} | {' > '.join(ours)} | {' > '.join(theirs)} | "
                     f"{'yes' if ours == theirs else 'no'} |")
    for policy in [p for p in policies if p not in REFERENCE_POLICIES and p != "tiered"]:
        lines += gains(runs, table, workloads, policy)
    return "\n".join(lines) + "\n"


def gains(runs: dict[tuple[str, str, int], dict[str, Any]], table: dict[tuple[str, str], dict[str, float]],
          workloads: Sequence[str], policy: str) -> list[str]:
    """``policy``'s median allocation at 130% against our fgd's and the reference's FGD, and on
    how many seeds it beat our fgd on the same pod order."""
    lines = ["", f"| workload | `{policy}` at 130% | our `fgd` | gain | reference FGD | gain over it "
             f"| seeds where `{policy}` > `fgd` |", "|---|---:|---:|---:|---:|---:|---:|"]
    for w in workloads:
        mine, base = table.get((w, policy)), table.get((w, "fgd"))
        if mine is None or base is None:
            continue
        ref = reference(REFERENCE_ALLOC_130, w, "fgd")
        seeds = sorted(s for (ww, p, s) in runs if ww == w and p == policy and (w, "fgd", s) in runs)
        wins = sum(runs[(w, policy, s)]["alloc_pct"][-1] > runs[(w, "fgd", s)]["alloc_pct"][-1] + 1e-9
                   for s in seeds)
        over_ref = "" if ref is None else f"{mine['alloc130'] - ref:+.2f}"
        lines.append(f"| {w} | {mine['alloc130']:.2f} | {base['alloc130']:.2f} | "
                     f"{mine['alloc130'] - base['alloc130']:+.2f} | {'' if ref is None else f'{ref:.2f}'} | "
                     f"{over_ref} | {wins}/{len(seeds)} |")
    return lines


def parse_list(text: str | None, default: Sequence[str], known: Sequence[str] | None, what: str) -> list[str]:
    if text is None:
        return list(default)
    items = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in items if known is not None and x not in known]
    if unknown or not items:
        raise SystemExit(f"replay_all: --{what}: unknown {', '.join(unknown) or 'empty list'}; "
                         f"choose from {', '.join(known or ())}")
    return items


def parse_seeds(text: str | None) -> list[int]:
    if text is None:
        return list(SEEDS)
    seeds: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            low, _, high = part.partition("-")
            seeds += range(int(low), int(high or low) + 1)
    except ValueError:
        raise SystemExit(f"replay_all: --seeds: expected numbers such as 42,43 or 42-51, "
                         f"got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds):
        raise SystemExit(f"replay_all: --seeds: expected seeds >= 0, got {text!r}")
    return list(dict.fromkeys(seeds))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for runs.jsonl (the cache) and table.md")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, one core each (default 2)")
    parser.add_argument("--workloads", help=f"comma-separated (default the 17: {','.join(WORKLOADS)})")
    parser.add_argument("--policies", help=f"comma-separated (default {','.join(DEFAULT_POLICIES)})")
    parser.add_argument("--seeds", help="comma-separated or ranges (default 42-51)")
    parser.add_argument("--table-only", action="store_true",
                        help="write table.md from the cache, run nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if not 1 <= args.jobs <= 64:
        raise SystemExit("replay_all: --jobs: must be in 1..64")
    workloads = parse_list(args.workloads, WORKLOADS, None, "workloads")
    for w in workloads:
        try:
            openb.named_trace(f"openb-{w}")
        except openb.OpenbError as exc:
            raise SystemExit(f"replay_all: --workloads: {exc}") from None
    policies = parse_list(args.policies, DEFAULT_POLICIES, POLICIES, "policies")
    seeds = parse_seeds(args.seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = read_runs(out / "runs.jsonl")
    todo = [(w, p, s) for w in workloads for s in seeds for p in policies if (w, p, s) not in done]
    if len(todo) > MAX_RUNS:
        raise SystemExit(f"replay_all: {len(todo)} runs asked for; at most {MAX_RUNS} per invocation")
    print(f"{len(done)} runs cached in {out / 'runs.jsonl'}; {len(todo)} to run, {args.jobs} at a time "
          f"({platform.machine()}, {os.cpu_count()} cores)", flush=True)
    started = time.monotonic()
    if todo and not args.table_only:
        sweep(todo, out, args.jobs)
        print(f"{len(todo)} runs in {time.monotonic() - started:.0f} s wall", flush=True)
    done = read_runs(out / "runs.jsonl")
    if done:
        text = render(done)
        (out / "table.md").write_text(text)
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
