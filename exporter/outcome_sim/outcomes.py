"""What the jobs got, per run: waits, GPU-hours, migrations and their cost; the CSV and the figure.

Only jobs submitted after the warm-up count, and only time after it. A job that
never started by the end waits until the end (its wait is censored there, so
waits at high load are lower bounds); a job evicted back into the queue waits
again, and that wait is its too. Size classes: ``small`` a fraction of a GPU
or one, ``mid`` 2-7 GPUs, ``node`` 8 GPUs on one node, ``multi_node`` a gang;
``whole_node`` is 8 GPUs or more (``node`` and ``multi_node`` together).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from exporter.outcome_sim.timeline import Job

CLASSES = ("small", "mid", "node", "multi_node")
COLUMNS = (
    "strategy", "seed", "load", "preemption", "jobs", "jobs_started", "jobs_rejected", "gpu_hours_delivered",
    "gpu_hours_waited", "gpu_hours_waited_fragmentation", "gpu_hours_waited_capacity",
    "wait_p50_s", "wait_p95_s", "wait_p95_s_whole_node", "gpu_hours_waited_whole_node",
    "gpu_hours_waited_whole_node_fragmentation", "gpu_hours_waited_whole_node_capacity",
    "share_of_oracle_saving", "wait_p95_s_high", "gpu_hours_waited_high",
    *(f"wait_p95_s_{c}" for c in CLASSES), *(f"gpu_hours_waited_{c}" for c in CLASSES),
    "jobs_never_started_whole_node", "migrations", "migration_overhead_pct", "mean_allocation_pct",
    "mean_fragmentation_index", "mean_queued_gpus", "plans", "moves_dropped",
    "preemptions", "spot_evictions_per_1000", "lost_gpu_hours", "lost_pct", "wait_p50_s_spot",
    "wait_p95_s_spot", "wait_p50_s_high", "spot_jobs_never_finished", "spot_quota", "spot_quota_pct",
    "high_forecast_mae_pct", "high_forecast_breach_pct", "lookahead_reserved_nodes", "whole_forecast_mae_pct",
    "whole_forecast_breach_pct", "wall_seconds",
)


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at one instant, for the timeline figure."""

    at: float  # seconds since the start of the measured window
    queued_jobs: int
    queued_gpus: float
    allocation_pct: float
    fragmentation_index: float
    # whole-node GPU-hours waited in the window so far, by why (blocked.py): the picture's lines
    whole_node_waited_fragmentation: float = 0.0
    whole_node_waited_capacity: float = 0.0


@dataclass
class Outcome:
    strategy: str
    seed: int
    load: float
    preemption: str = "none"  # who high-priority jobs preempt (preemption.py)
    jobs: int = 0
    jobs_started: int = 0
    jobs_rejected: int = 0
    gpu_hours_delivered: float = 0.0
    gpu_hours_waited: float = 0.0
    # the waiting split by why (exporter/outcome_sim/blocked.py): enough room after a perfect
    # repack but no placement, or not enough room
    gpu_hours_waited_fragmentation: float = 0.0
    gpu_hours_waited_capacity: float = 0.0
    wait_p50_s: float = 0.0
    wait_p95_s: float = 0.0
    wait_p95_s_whole_node: float = 0.0
    gpu_hours_waited_whole_node: float = 0.0
    gpu_hours_waited_whole_node_fragmentation: float = 0.0
    gpu_hours_waited_whole_node_capacity: float = 0.0
    # the whole-node GPU-hours waited this row saves against ``none``'s of its seed and load, over
    # what the every-head oracle's saves (:func:`oracle_shares`); None without both rows, or no oracle saving
    share_of_oracle_saving: float | None = None
    wait_p95_s_high: float = 0.0
    gpu_hours_waited_high: float = 0.0
    wait_p95_s_small: float = 0.0
    wait_p95_s_mid: float = 0.0
    wait_p95_s_node: float = 0.0
    wait_p95_s_multi_node: float = 0.0
    gpu_hours_waited_small: float = 0.0
    gpu_hours_waited_mid: float = 0.0
    gpu_hours_waited_node: float = 0.0
    gpu_hours_waited_multi_node: float = 0.0
    jobs_never_started_whole_node: int = 0
    migrations: int = 0
    migration_overhead_pct: float = 0.0
    mean_allocation_pct: float = 0.0
    mean_fragmentation_index: float = 0.0
    mean_queued_gpus: float = 0.0
    plans: int = 0  # plans a strategy carried out (the advisor's, consolidation's)
    moves_dropped: int = 0  # planned moves not carried out: stale, expired, no longer free
    preemptions: int = 0  # spot jobs preempted in the window (preemption.fill sets these)
    spot_evictions_per_1000: float = 0.0
    lost_gpu_hours: float = 0.0
    lost_pct: float = 0.0
    wait_p50_s_spot: float = 0.0
    wait_p95_s_spot: float = 0.0
    wait_p50_s_high: float = 0.0
    spot_jobs_never_finished: int = 0
    # the advisor's spot quota (--spot-quota; preemption.fill_quota sets these): the mean quota
    # over the fleet's GPUs, the high-priority forecast's error beside it, and how often the
    # high-priority peak rose above the forecast and its margin
    spot_quota: str = "none"
    spot_quota_pct: float = 100.0
    high_forecast_mae_pct: float | None = None
    high_forecast_breach_pct: float | None = None
    # the look-ahead's (lookahead.fill): the mean nodes it reserved, its whole-node forecast's
    # error and how often the peak came more than a node above the forecast
    lookahead_reserved_nodes: float | None = None
    whole_forecast_mae_pct: float | None = None
    whole_forecast_breach_pct: float | None = None
    wall_seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list, repr=False)

    def row(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("samples")
        return data


def _p(values: Sequence[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def job_outcomes(out: Outcome, jobs: Iterable[Job], rejected: Iterable[Job], since: float,
                 until: float) -> None:
    """Fill the per-job figures of ``out``: jobs submitted in [since, until)."""
    refused = {j.id for j in rejected}
    counted = [j for j in jobs if since <= j.submit < until]
    out.jobs = len(counted)
    out.jobs_rejected = sum(1 for j in counted if j.id in refused)
    waiting = [j for j in counted if j.id not in refused]
    waits = np.array([j.waited(until) for j in waiting])
    demand = np.array([j.demand for j in waiting])
    out.jobs_started = sum(1 for j in waiting if j.start is not None and j.start < until)
    out.gpu_hours_waited = float((waits * demand).sum() / 3600)
    out.wait_p50_s = _p(waits, 50)
    out.wait_p95_s = _p(waits, 95)

    def part(mask: np.ndarray) -> tuple[float, float]:
        return _p(waits[mask], 95), float((waits[mask] * demand[mask]).sum() / 3600)

    if len(waiting):
        whole = np.array([j.whole_node for j in waiting])
        out.wait_p95_s_whole_node, out.gpu_hours_waited_whole_node = part(whole)
        high = np.array([j.high for j in waiting])
        out.wait_p95_s_high, out.gpu_hours_waited_high = part(high)
        out.wait_p50_s_high = _p(waits[high], 50)
        out.wait_p50_s_spot, out.wait_p95_s_spot = _p(waits[~high], 50), _p(waits[~high], 95)
        classes = np.array([j.size_class for j in waiting])
        for c in CLASSES:
            p95, hours = part(classes == c)
            setattr(out, f"wait_p95_s_{c}", p95)
            setattr(out, f"gpu_hours_waited_{c}", hours)
        out.jobs_never_started_whole_node = sum(1 for j in waiting if j.whole_node
                                                and (j.start is None or j.start >= until))


MIN_ORACLE_SAVING = 1e-6  # GPU-hours: an oracle saving below this is none, and no share is given
# the bound the shares are against: the oracle that searches every partition's blocked head.
# ``oracle`` searches the queue's first only, and where each job is pinned to its model (the
# GFS fleet) that head is often of a full model no repack helps: it planned nothing there, so
# a share against it was undefined; where every job may use every model there is one
# partition and the two plan alike
ORACLE = "oracle-heads"


def oracle_shares(outcomes: Sequence[Outcome]) -> None:
    """Set each row's :attr:`Outcome.share_of_oracle_saving`: its whole-node GPU-hours waited
    saved against ``none`` of the same seed and load, over the :data:`ORACLE`'s saving there
    (``none`` 0, the oracle 1; the first-head ``oracle`` gets its share of it too). None where
    the seed and load lack either row or the oracle saved nothing: no compaction could have
    helped there, so no share means anything."""
    by_run: dict[tuple[int, float], dict[str, Outcome]] = {}
    for o in outcomes:
        by_run.setdefault((o.seed, o.load), {}).setdefault(o.strategy, o)
    for o in outcomes:
        run = by_run[(o.seed, o.load)]
        none, oracle = run.get("none"), run.get(ORACLE)
        o.share_of_oracle_saving = None
        if none is None or oracle is None:
            continue
        base = none.gpu_hours_waited_whole_node
        best = base - oracle.gpu_hours_waited_whole_node
        if best > MIN_ORACLE_SAVING:
            o.share_of_oracle_saving = (base - o.gpu_hours_waited_whole_node) / best


def write_csv(outcomes: Sequence[Outcome], path: str | os.PathLike[str]) -> None:
    """The rows, their shares of the oracle's saving set first (:func:`oracle_shares`)."""
    names = [f.name for f in fields(Outcome) if f.name != "samples"]
    assert tuple(names) == COLUMNS, "COLUMNS and Outcome disagree"
    oracle_shares(outcomes)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for o in outcomes:
            row = o.row()
            writer.writerow([_cell(row[c]) for c in COLUMNS])


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def plot(outcomes: Sequence[Outcome], path: str | os.PathLike[str], title: str) -> None:
    """Queued GPUs and the fragmentation index over time, a line per strategy (mean over seeds),
    a column per load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted({o.load for o in outcomes})
    strategies = list(dict.fromkeys(o.strategy for o in outcomes))
    fig, axes = plt.subplots(2, len(loads), figsize=(5.5 * len(loads), 7), squeeze=False, sharex=True)
    for col, load in enumerate(loads):
        for strategy in strategies:
            runs = [o for o in outcomes if o.load == load and o.strategy == strategy and o.samples]
            if not runs:
                continue
            length = min(len(o.samples) for o in runs)
            hours = np.array([s.at / 3600 for s in runs[0].samples[:length]])
            queued = np.mean([[s.queued_gpus for s in o.samples[:length]] for o in runs], axis=0)
            index = np.mean([[s.fragmentation_index for s in o.samples[:length]] for o in runs], axis=0)
            axes[0][col].plot(hours / 24, queued, label=strategy, linewidth=1)
            axes[1][col].plot(hours / 24, index, label=strategy, linewidth=1)
        axes[0][col].set_title(f"load {load:g}")
        axes[1][col].set_xlabel("day")
    axes[0][0].set_ylabel("GPUs queued")
    axes[1][0].set_ylabel("cluster fragmentation index")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["CLASSES", "COLUMNS", "ORACLE", "Outcome", "Sample", "job_outcomes", "oracle_shares", "plot",
           "write_csv"]
