"""The pre-registered matrix: fixed seeds and loads, each strategy against ``none``, and the noise.

A result is only as good as the seeds it was not chosen on. ``gpufleet simulate
--matrix`` runs the seeds, loads and days stated here (:data:`MATRIX`), fixed
before any result was seen, and summarises each strategy per load by the cut
in whole-node GPU-hours waited against ``none``, seed by seed:
``(strategy - none) / none``, its median and its worst (the largest, a cut
that went the wrong way if positive).

The noise band says how much of a cut chance alone makes: ``none`` runs again
on the same seed's jobs with each submit time moved by at most
:data:`JITTER_SECONDS` (:func:`jittered`); what that moves ``none`` by, over
the seeds, is the band. A strategy's cut inside the band is not told apart from
a trajectory's change. When the oracle ran (:data:`ORACLE`, ``oracle-heads``: every
partition's blocked head searched), each strategy's saving is also given as a share of
the oracle's, seed by seed: ``(none - strategy) / (none - oracle)``.
"""

from __future__ import annotations

import csv
import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields

import numpy as np

from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.outcomes import ORACLE, Outcome
from exporter.outcome_sim.run import seed_jobs, simulate, with_load
from exporter.outcome_sim.sim import RunSettings
from exporter.outcome_sim.timeline import HourlyArrivals, Job

BASELINE = "none"
PERTURBED = "none-jittered"  # none on the same jobs, submit times moved a few seconds
JITTER_SECONDS = 5.0  # each submit moves by up to this, either way: a trajectory's change, not a new load


@dataclass(frozen=True, slots=True)
class Matrix:
    """What a matrix runs: every (load, seed) with every strategy, and ``none`` jittered."""

    seeds: tuple[int, ...]
    loads: tuple[float, ...]
    days: float
    warmup_days: float


# stated before the results: never the seeds the docs tuned on (1-5, 31, 32)
MATRIX = Matrix(seeds=tuple(range(101, 111)), loads=(0.8, 1.0, 1.2), days=7.0, warmup_days=1.0)
# what it compares by default: the baselines and the advisor against none, and the oracle's bound
# (the every-head oracle: the first-head one planned nothing where jobs are pinned to a model)
MATRIX_STRATEGIES = ("none", "descheduler", "consolidate", ORACLE, "advisor")


def jittered(jobs: list[Job], seed: int, seconds: float = JITTER_SECONDS) -> list[Job]:
    """``jobs`` (fresh, not yet run) with each submit moved by up to ``seconds`` either way (never
    before 0), drawn from the seed; in the new submit order, ids kept."""
    rng = np.random.default_rng([seed, 41])
    for job, shift in zip(jobs, rng.uniform(-seconds, seconds, len(jobs)), strict=True):
        job.submit = max(0.0, job.submit + float(shift))
    return sorted(jobs, key=lambda j: (j.submit, j.id))


@dataclass(frozen=True, slots=True)
class Run:
    strategy: str  # PERTURBED: none on the jittered jobs
    seed: int
    load: float


def runs(matrix: Matrix, strategies: Sequence[str]) -> list[Run]:
    """Every run of the matrix, by load, then seed, then strategy, the perturbed none last."""
    return [Run(s, seed, load) for load in matrix.loads for seed in matrix.seeds
            for s in (*strategies, PERTURBED)]


def run_one(fleet: SimFleet, series: HourlyArrivals, settings: RunSettings, run: Run) -> Outcome:
    settings = with_load(settings, run.load)
    if run.strategy != PERTURBED:
        return simulate(fleet, series, run.strategy, run.seed, settings)
    jobs = jittered(seed_jobs(fleet, series, settings, run.seed), run.seed)
    out = simulate(fleet, series, BASELINE, run.seed, settings, jobs=jobs)
    out.strategy = PERTURBED
    return out


def run_matrix(fleet: SimFleet, series: HourlyArrivals, settings: RunSettings, planned: Sequence[Run],
               jobs: int = 1, progress: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every planned run, ``jobs`` at a time (one core each); outcomes in the planned order."""
    outcomes: list[Outcome] = []
    if jobs <= 1:
        for run in planned:
            outcomes.append(run_one(fleet, series, settings, run))
            if progress is not None:
                progress(outcomes[-1])
        return outcomes
    context = multiprocessing.get_context("spawn")
    # each run gets the fleet and settings with it: a second's pickling against minutes of running
    with ProcessPoolExecutor(min(jobs, len(planned), os.cpu_count() or 1), mp_context=context) as pool:
        for future in [pool.submit(run_one, fleet, series, settings, run) for run in planned]:
            outcomes.append(future.result())
            if progress is not None:
                progress(outcomes[-1])
    return outcomes


# -- the summary ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One strategy at one load, over the seeds: percentages of ``none``'s whole-node waiting."""

    load: float
    strategy: str
    seeds: int  # seeds with both this strategy and none (none waiting > 0)
    whole_node_gpu_hours_median: float
    cut_median_pct: float  # (strategy - none) / none: negative is less waiting
    cut_worst_pct: float  # the largest cut, the seed where it did worst
    cut_best_pct: float
    noise_low_pct: float  # the band: none jittered against none, the least and the largest
    noise_high_pct: float
    # seeds whose cut is larger than any the jitter made either way (below -max(|low|, |high|)):
    # the jitter's sign is chance, so the band is read as symmetric
    seeds_beyond_noise: int
    oracle_share_median_pct: float  # (none - strategy) / (none - oracle); nan without the oracle
    oracle_share_worst_pct: float


SUMMARY_COLUMNS = tuple(f.name for f in fields(SummaryRow))


def _cut(value: float, base: float) -> float:
    return 100.0 * (value - base) / base


def summarise(outcomes: Sequence[Outcome]) -> list[SummaryRow]:
    """A row per (load, strategy), the perturbed none among them, in the order they ran."""
    whole: dict[tuple[float, str, int], float] = {
        (o.load, o.strategy, o.seed): o.gpu_hours_waited_whole_node for o in outcomes}
    rows = []
    for load in dict.fromkeys(o.load for o in outcomes):
        seeds = [s for s in dict.fromkeys(o.seed for o in outcomes if o.load == load)
                 if whole.get((load, BASELINE, s), 0.0) > 0]
        noise = [_cut(whole[(load, PERTURBED, s)], whole[(load, BASELINE, s)])
                 for s in seeds if (load, PERTURBED, s) in whole]
        low, high = (min(noise), max(noise)) if noise else (math.nan, math.nan)
        for strategy in dict.fromkeys(o.strategy for o in outcomes if o.load == load):
            mine = [s for s in seeds if (load, strategy, s) in whole]
            cuts = [_cut(whole[(load, strategy, s)], whole[(load, BASELINE, s)]) for s in mine]
            shares = []
            for s in mine if strategy != PERTURBED else ():  # its share of a saving means nothing
                oracle = whole.get((load, ORACLE, s))
                saved = whole[(load, BASELINE, s)] - oracle if oracle is not None else 0.0
                if saved > 0:
                    shares.append(100.0 * (whole[(load, BASELINE, s)] - whole[(load, strategy, s)]) / saved)
            values = [whole[(load, strategy, s)] for s in dict.fromkeys(
                o.seed for o in outcomes if o.load == load) if (load, strategy, s) in whole]
            rows.append(SummaryRow(
                load, strategy, len(mine),
                float(np.median(values)) if values else math.nan,
                float(np.median(cuts)) if cuts else math.nan,
                max(cuts) if cuts else math.nan,
                min(cuts) if cuts else math.nan,
                low, high,
                sum(1 for c in cuts if c < -max(abs(low), abs(high))) if noise else 0,
                float(np.median(shares)) if shares else math.nan,
                min(shares) if shares else math.nan))
    return rows


def write_summary(rows: Sequence[SummaryRow], path: str | os.PathLike[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(SUMMARY_COLUMNS)
        for row in rows:
            writer.writerow([f"{v:.2f}" if isinstance(v, float) else str(v) for v in asdict(row).values()])


__all__ = ["BASELINE", "JITTER_SECONDS", "MATRIX", "MATRIX_STRATEGIES", "ORACLE", "PERTURBED",
           "SUMMARY_COLUMNS", "Matrix", "Run", "SummaryRow", "jittered", "run_matrix", "run_one", "runs",
           "summarise", "write_summary"]
