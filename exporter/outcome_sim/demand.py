"""What jobs a run offers: the openb trace's pod shapes, or the GFS trace's own job mix.

``openb`` (:func:`exporter.outcome_sim.timeline.build`): each job is an openb pod.
``gfs``: each job is drawn from the per-job marginals of the Alibaba spot-GPU trace
(the GFS paper's, ``data/alibaba-spot-gpu-v2026/job-marginals/``):

- **size**: workers per job from the trace's exact distribution (1 to 332). A job of
  several workers is a gang of that many parts, each on its own node, all of one
  GPU model. A single worker asks for half a GPU, 1, 2, 4 or 8 GPUs; each worker of
  a gang for 1 or 8 (a whole node), the share of 8 fitted so that jobs of 9 or more
  GPUs are as common as in the trace.
- **model**: one per job, from a joint table of size and model raked
  (:func:`rake`) to the trace's jobs and GPUs asked per model, a model never asked
  for a part its nodes cannot hold or for more parts than it has such nodes.
- **duration**: the trace's duration distribution (its buckets and quantiles,
  interpolated on a log scale), split between the models so that each model's
  share of GPU-seconds is the trace's, and between high-priority and spot so that
  each type's median and p90 are the trace's.
- **CPU**: the trace's median, 8 CPUs per GPU; it never binds on its nodes.

``gfs-hourly``: the same jobs, but each hour's models in the trace's own mix of that hour
(``data/alibaba-spot-gpu-v2026/hourly_concurrency_top_models.csv``, the GPUs each model's
active jobs asked for): a job's model is drawn first, in proportion to its model's GPUs in
the table's hour over the GPU-seconds a job of that model brings, then its size, duration
and priority given the model as ``gfs`` draws them. So each model's share of the GPU-seconds
offered in an hour is its share of the trace's demand in that hour, and the trace's bursts
(H800 from about 0 to 1,400 GPUs within an hour) come in the same hours. The jobs running
at time 0 are each model's demand in the window's first hour. ``gfs`` keeps each model's
share steady, its share over the whole trace.

``gfs-hourly-capped``: as ``gfs-hourly``, but no model is offered more than the load times its
pool's GPUs (in the trace's node list) in any hour; what an hour would offer a pool above that
is not offered, and every model under it gets what ``gfs-hourly`` gives it. The table counts a
job's GPUs from its submit for its duration; a pool of exclusive GPUs cannot run more than it
has, and the trace's A10 pool (2,494 GPUs of one each) is asked for 1.35 times them on average
over 184 days, in 94% of its hours: what the listed GPUs could not have run is waiting counted
inside the durations, or GPUs the node list does not hold. ``gfs-hourly`` replays all of it as
run time on the listed pool, and scales each window's demand to the load, so at ``--load 1.0``
A10 is offered 1.1 to 2.0 times its GPUs, depending on the window.

Arrivals follow the hourly series as ``openb``'s do (:func:`timeline.window`, the
load factor scaling offered GPU-seconds to the fleet). Because a few jobs run for
months, a run starts in the offered load's steady state: the jobs running at time 0
(drawn by length, with what is left of their run) are submitted at 0, inside the
warm-up. docs/simulate.md lists what this assumes and what it biases.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from exporter.analysis.workload import Shape
from exporter.bounded_file import Wording, read_bounded
from exporter.gpu_catalogue import GpuSpec, default_catalogue
from exporter.outcome_sim.timeline import (
    HOUR,
    HourlyArrivals,
    Job,
    TimelineSettings,
    build,
    window,
    window_hours,
)


class JobSource(Protocol):
    """What building a run's jobs reads of a fleet (fleets.SimFleet; a protocol, since the
    fleets module imports this one)."""

    @property
    def name(self) -> str: ...

    @property
    def openb_shapes(self) -> tuple[Shape, ...]: ...

    @property
    def gfs_demand(self) -> GfsDemand: ...

DEMANDS = ("openb", "gfs", "gfs-hourly", "gfs-hourly-capped")
MARGINALS = Path("alibaba-spot-gpu-v2026") / "job-marginals"
NODE_LIST = Path("alibaba-spot-gpu-v2026") / "node_info_df.csv"
HOURLY_MODELS = Path("alibaba-spot-gpu-v2026") / "hourly_concurrency_top_models.csv"
MAX_TABLE_BYTES = 4 * 2**20  # the largest table is 3 kB; the node list 90 kB, the hourly models 260 kB
CPUS_PER_GPU = 8.0  # job_medians.csv: 8 CPUs at the median request of 1 GPU
SHARED_GPU = 0.5  # what a job under one GPU asks of it: the tables do not say
SINGLE_SIZES = {"0": (SHARED_GPU,), "1": (1.0,), "2 to 4": (2.0, 4.0), "5 to 8": (8.0,)}
GANG_GPUS = (1, 8)  # per worker of a gang
MIN_SECONDS = 1.0
MAX_SECONDS = 184 * 86400.0  # the trace's span
DURATION_BINS = 400  # equal-probability bins of the duration distribution, for the raking
_TABLE = Wording(ValueError, over_limit="{size} bytes, over the {limit}-byte limit",
                 grew_over_limit="over the {limit}-byte limit", cannot_read="cannot read: {reason}")


def data_path(relative: Path) -> Path:
    """``relative`` under $GPUFLEET_DATA when it holds it, else under the checkout's ``data/``."""
    env = os.environ.get("GPUFLEET_DATA")
    if env and (Path(env) / relative).exists():
        return Path(env) / relative
    return Path("data") / relative


def read_table(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    text = read_bounded(path, MAX_TABLE_BYTES, _TABLE).decode("utf-8", "replace")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = set(columns) - set(reader.fieldnames or ())
    if missing:
        raise ValueError(f"{path}: missing column {', '.join(sorted(missing))}")
    rows = list(reader)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _number(path: Path, row: dict[str, str], column: str) -> float:
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise ValueError(f"{path}: {column} must be a number, got {row[column]!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{path}: {column} must be a finite number >= 0, got {row[column]!r}")
    return value


# -- the marginals -----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Marginals:
    """The trace's per-job tables, as read."""

    high_share: float  # of jobs
    medians: dict[bool, float]  # seconds, by high priority
    p90s: dict[bool, float]
    knots: tuple[np.ndarray, np.ndarray]  # (seconds, share of jobs at or under): the duration CDF
    totals: dict[str, float]  # job share by total-GPU bucket
    workers: tuple[np.ndarray, np.ndarray]  # (workers, share of jobs)
    models: tuple[str, ...]  # the trace's names
    model_jobs: np.ndarray  # share of jobs per model
    model_gpus: np.ndarray  # GPUs asked per job, per model (shares summed)
    model_gpu_seconds: np.ndarray  # share of GPU-seconds per model
    model_shared: tuple[bool, ...]  # whether its jobs asked for parts of GPUs (a fractional sum)


def _bucket_upper(name: str) -> float:
    """The upper edge in seconds of a ``bucket_duration.csv`` bucket ("1 to 6 hours")."""
    units = {"min": 60.0, "hours": 3600.0, "days": 86400.0}
    words = name.split()
    if words[0] == "over":
        return MAX_SECONDS
    try:
        return float(words[2]) * units[words[3]]
    except (IndexError, KeyError, ValueError):
        raise ValueError(f"bucket_duration.csv: cannot read the bucket {name!r}") from None


def load_marginals(folder: Path | None = None) -> Marginals:
    folder = folder or data_path(MARGINALS)
    path = folder / "job_type_summary.csv"
    types = read_table(path, ("job_type", "jobs", "median_duration", "p90_duration"))
    by_type = {r["job_type"]: r for r in types}
    if set(by_type) != {"HP", "Spot"}:
        raise ValueError(f"{path}: expected the job types HP and Spot")
    jobs = {t: _number(path, r, "jobs") for t, r in by_type.items()}
    high_share = jobs["HP"] / max(sum(jobs.values()), 1.0)
    medians = {t == "HP": _number(path, r, "median_duration") for t, r in by_type.items()}
    p90s = {t == "HP": _number(path, r, "p90_duration") for t, r in by_type.items()}

    path = folder / "bucket_duration.csv"
    points = {MIN_SECONDS: 0.0}
    rows = read_table(path, ("duration_bucket", "jobs_share"))
    for row in sorted(rows, key=lambda r: _bucket_upper(r["duration_bucket"])):
        upper = _bucket_upper(row["duration_bucket"])
        points[upper] = max(points.values()) + _number(path, row, "jobs_share")
    path = folder / "duration_quantiles.csv"
    for row in read_table(path, ("quantile", "duration_seconds")):
        points[_number(path, row, "duration_seconds")] = _number(path, row, "quantile")
    seconds = np.array(sorted(points))
    share = np.maximum.accumulate(np.array([points[s] for s in seconds]))
    share = np.minimum(share / share[-1], 1.0)

    path = folder / "bucket_gpu_demand.csv"
    totals = {r["gpu_demand_bucket"]: _number(path, r, "jobs_share")
              for r in read_table(path, ("gpu_demand_bucket", "jobs_share"))}
    path = folder / "worker_count_distribution.csv"
    counts = {int(_number(path, r, "worker_num")): _number(path, r, "jobs")
              for r in read_table(path, ("worker_num", "jobs"))}
    counts = {w: n for w, n in counts.items() if w >= 1 and n > 0}
    workers = np.array(sorted(counts))
    worker_share = np.array([counts[w] for w in workers]) / sum(counts.values())

    path = folder / "demand_by_model.csv"
    rows = read_table(path, ("gpu_model", "jobs", "gpu_demand", "gpu_seconds"))
    model_jobs = np.array([_number(path, r, "jobs") for r in rows])
    model_gpus = np.array([_number(path, r, "gpu_demand") for r in rows]) / np.maximum(model_jobs, 1.0)
    seconds_by_model = np.array([_number(path, r, "gpu_seconds") for r in rows])
    asked = [_number(path, r, "gpu_demand") for r in rows]
    return Marginals(high_share, medians, p90s, (seconds, share), totals, (workers, worker_share),
                     tuple(r["gpu_model"] for r in rows), model_jobs / model_jobs.sum(), model_gpus,
                     seconds_by_model / seconds_by_model.sum(), tuple(a % 1 > 0 for a in asked))


# -- the node list -------------------------------------------------------------------


def read_gfs_nodes(path: Path | None = None) -> list[tuple[str, str, int, float]]:
    """(trace name, GPU model as the trace names it, GPUs, CPUs) per node of the trace."""
    path = path or data_path(NODE_LIST)
    nodes = []
    for row in read_table(path, ("gpu_model", "gpu_capacity_num", "cpu_num", "node_name")):
        gpus = _number(path, row, "gpu_capacity_num")
        if gpus != int(gpus) or not 1 <= gpus <= 64:
            raise ValueError(f"{path}: gpu_capacity_num must be a whole number of GPUs (1-64), "
                             f"got {row['gpu_capacity_num']!r}")
        nodes.append((row["node_name"], row["gpu_model"], int(gpus), _number(path, row, "cpu_num")))
    return nodes


# -- raking: a joint table from its margins ---------------------------------------------


def _tilt(weights: np.ndarray, values: np.ndarray, mean: float) -> np.ndarray:
    """``weights`` times exp(theta * values), theta chosen so the weighted mean of ``values`` is
    ``mean`` (clamped to what the support allows): the closest table with that mean."""
    live = weights > 0
    if not live.any():
        return weights
    lo, hi = values[live].min(), values[live].max()
    if hi - lo <= 0:
        return weights
    mean = min(max(mean, lo), hi)
    scaled = (values - lo) / (hi - lo)
    logw = np.where(live, np.log(np.where(live, weights, 1.0)), -np.inf)

    def tilted(theta: float) -> np.ndarray:
        log = logw + theta * scaled
        return np.exp(log - log[live].max())

    low, high = -745.0, 745.0
    for _ in range(80):
        theta = (low + high) / 2
        w = tilted(theta)
        if (w * values).sum() / w.sum() < mean:
            low = theta
        else:
            high = theta
    w = tilted((low + high) / 2)
    return w * (weights.sum() / w.sum())


def rake(allowed: np.ndarray, rows: np.ndarray, columns: np.ndarray, values: np.ndarray | None = None,
         row_means: np.ndarray | None = None, rounds: int = 50) -> np.ndarray:
    """A joint table ``P[row, column]`` (zero where not ``allowed``) whose row sums are ``rows``,
    column sums ``columns`` and, when given, each row's mean of ``values`` (per column)
    ``row_means``: iterative proportional fitting, with the row means fitted by exponential
    tilting (the maximum-entropy table under those margins). Margins that cannot all hold
    are met as near as the rounds get."""
    table = allowed.astype(float) * np.outer(rows, columns)
    for _ in range(rounds):
        sums = table.sum(axis=0)
        table *= np.divide(columns, sums, out=np.zeros_like(columns), where=sums > 0)
        for i in range(len(rows)):
            if values is not None and row_means is not None:
                table[i] = _tilt(table[i], values, row_means[i])
            total = table[i].sum()
            if total > 0:
                table[i] *= rows[i] / total
    return table


# -- the draw ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class GfsDemand:
    """The joint tables the jobs are drawn from, built once per fleet."""

    sizes: np.ndarray  # (gpus per part, share of each GPU, parts) per size
    models: tuple[tuple[str, ...], ...]  # a job's allowed models, per trace model
    speeds: np.ndarray  # work per second on each trace model
    joint: np.ndarray  # [model, size]: probability of each, summing to 1
    duration_given_model: np.ndarray  # [model, duration bin], rows summing to 1
    knots: tuple[np.ndarray, np.ndarray]  # log seconds against the CDF
    high_given_cut: tuple[np.ndarray, np.ndarray]  # (cuts in seconds, P(high) in each interval)
    mean_gpu_seconds: float  # per job
    trace_models: tuple[str, ...] = ()  # the trace's names of the models, in the tables' order

    def duration(self, u: np.ndarray) -> np.ndarray:
        log_seconds, cdf = self.knots
        return np.exp(np.interp(u, cdf, log_seconds))


def _size_table(m: Marginals) -> tuple[np.ndarray, np.ndarray]:
    """The sizes a job may have and their probabilities: workers exact; a gang's workers 8 GPUs
    with the probability that makes jobs of 9+ GPUs as common as the trace's, else 1."""
    workers, share = m.workers
    single = float(share[workers == 1].sum())
    gang = share[workers >= 2].sum()
    nine = sum(v for k, v in m.totals.items() if k not in SINGLE_SIZES)
    wide = share[workers >= 9].sum()  # gangs of 1-GPU workers that reach 9 GPUs anyway
    whole = float(np.clip((nine - wide) / (gang - wide), 0.0, 1.0)) if gang > wide else 0.0
    # what the gangs of 1-GPU workers leave of the single-worker buckets
    small = {"0": 0.0, "1": 0.0, "2 to 4": share[(workers >= 2) & (workers <= 4)].sum(),
             "5 to 8": share[(workers >= 5) & (workers <= 8)].sum()}
    rest = {k: max(0.0, m.totals.get(k, 0.0) - (1 - whole) * small[k]) for k in SINGLE_SIZES}
    total = sum(rest.values()) or 1.0
    sizes, p = [], []
    for bucket, gpus_options in SINGLE_SIZES.items():
        for gpus in gpus_options:
            sizes.append((max(gpus, 1.0), min(gpus, 1.0), 1))
            p.append(single * rest[bucket] / total / len(gpus_options))
    for w, s in zip(workers[workers >= 2], share[workers >= 2], strict=True):
        sizes.append((float(GANG_GPUS[0]), 1.0, int(w)))
        p.append(s * (1 - whole))
        sizes.append((float(GANG_GPUS[1]), 1.0, int(w)))
        p.append(s * whole)
    probabilities = np.array(p)
    return np.array(sizes), probabilities / probabilities.sum()


def _high_given_cut(m: Marginals, cdf_at) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """P(high priority | duration interval), the intervals cut at each type's median and p90,
    raked so that both types' medians and p90s are the trace's and together they make its
    duration CDF."""
    h = m.high_share
    cuts = np.array(sorted({m.medians[True], m.p90s[True], m.medians[False], m.p90s[False]}))
    mass = np.diff(np.concatenate([[0.0], cdf_at(cuts), [1.0]]))
    lower = np.concatenate([[0.0], cuts])
    table = np.outer([h, 1 - h], mass)
    bands = []  # (type row, intervals of the band, the type's mass there)
    for row, kind, weight in ((0, True, h), (1, False, 1 - h)):
        for lo, hi, q in ((0.0, m.medians[kind], 0.5), (m.medians[kind], m.p90s[kind], 0.4),
                          (m.p90s[kind], math.inf, 0.1)):
            bands.append((row, (lower >= lo) & (lower < hi), weight * q))
    for _ in range(500):
        for row, inside, target in bands:
            got = table[row, inside].sum()
            if got > 0:
                table[row, inside] *= target / got
        sums = table.sum(axis=0)
        table *= np.divide(mass, sums, out=np.zeros_like(mass), where=sums > 0)
    p_high = np.divide(table[0], table.sum(axis=0), out=np.full(len(mass), h), where=table.sum(axis=0) > 0)
    return cuts, np.clip(p_high, 0.0, 1.0)


def gfs_demand(trace_models: dict[str, str] | None = None, marginals: Marginals | None = None) -> GfsDemand:
    """The tables for a fleet. ``trace_models`` maps the trace's model names to the fleet's;
    a fleet without the trace's models (default, openb) gets the sizes and durations with no
    model constraint."""
    m = marginals or load_marginals()
    sizes, size_p = _size_table(m)
    trace_nodes = read_gfs_nodes()
    mapped = trace_models or {}
    # parts of each size that fit a model's nodes, as the trace's cluster had them
    allowed = np.zeros((len(m.models), len(sizes)), dtype=bool)
    for i, model in enumerate(m.models):
        caps = np.array([g for _, mod, g, _ in trace_nodes if mod == model])
        for j, (gpus, share, parts) in enumerate(sizes):
            enough = int((caps >= gpus).sum()) >= parts if len(caps) else False
            allowed[i, j] = enough and (share >= 1.0 or m.model_shared[i])
    total_gpus = sizes[:, 0] * sizes[:, 1] * sizes[:, 2]
    joint = rake(allowed, m.model_jobs, size_p, total_gpus, m.model_gpus)
    joint /= joint.sum()
    gpus_per_job = (joint * total_gpus).sum(axis=1) / np.maximum(joint.sum(axis=1), 1e-300)

    log_seconds = np.log(m.knots[0])
    cdf = m.knots[1]
    grid = (np.arange(DURATION_BINS * 16) + 0.5) / (DURATION_BINS * 16)
    bin_seconds = np.exp(np.interp(grid, cdf, log_seconds)).reshape(DURATION_BINS, 16).mean(axis=1)
    # per model, the mean duration that gives it the trace's share of GPU-seconds; the
    # durations of all jobs together stay the trace's
    weight = m.model_gpu_seconds / np.maximum(gpus_per_job, 1e-9)
    mean_seconds = bin_seconds.mean()
    scale = mean_seconds / float((weight * 1.0).sum()) if weight.sum() > 0 else 0.0
    per_model = np.where(m.model_jobs > 0, weight * scale / np.maximum(m.model_jobs, 1e-12), mean_seconds)
    durations = rake(np.ones((len(m.models), DURATION_BINS), dtype=bool), m.model_jobs,
                     np.full(DURATION_BINS, 1.0 / DURATION_BINS), bin_seconds, per_model)
    duration_given_model = durations / np.maximum(durations.sum(axis=1, keepdims=True), 1e-300)

    def cdf_at(seconds: np.ndarray) -> np.ndarray:
        return np.interp(np.log(seconds), log_seconds, cdf)

    models = tuple((mapped[name],) if name in mapped else () for name in m.models)
    catalogue = default_catalogue()
    # the trace's durations are run times on the job's own model; work is in reference-model
    # seconds, so a job runs for its drawn duration where it runs
    speeds = np.array([_speed(catalogue.find(mapped[name])) if name in mapped else 1.0
                       for name in m.models])
    seconds_per_job = duration_given_model @ bin_seconds
    mean_gpu_seconds = float((joint * total_gpus[None, :]).sum(axis=1) @ seconds_per_job)
    return GfsDemand(sizes, models, speeds, joint, duration_given_model,
                     (log_seconds, cdf), _high_given_cut(m, cdf_at), mean_gpu_seconds, m.models)


def _speed(spec: GpuSpec | None) -> float:
    """The model's throughput in the catalogue (work per second), 1.0 where it gives none."""
    value = getattr(spec, "throughput", None) if spec is not None else None
    return float(value) if value else 1.0


@dataclass(frozen=True, eq=False)
class Drawn:
    """A batch of jobs as arrays, one entry per job."""

    gpus: np.ndarray
    share: np.ndarray
    parts: np.ndarray
    model: np.ndarray  # index into GfsDemand.models
    seconds: np.ndarray
    high: np.ndarray

    @property
    def gpu_demand(self) -> np.ndarray:
        """GPUs held while it runs, shares summed over its parts."""
        return self.gpus * self.share * self.parts

    @property
    def gpu_seconds(self) -> np.ndarray:
        return self.gpu_demand * self.seconds

    def select(self, which: np.ndarray | slice) -> Drawn:
        return Drawn(*(getattr(self, f)[which] for f in _FIELDS))


_FIELDS = ("gpus", "share", "parts", "model", "seconds", "high")


def draw(demand: GfsDemand, n: int, rng: np.random.Generator, joint: np.ndarray | None = None) -> Drawn:
    """``n`` jobs from ``demand``'s joint table of model and size, or from ``joint`` (the same
    shape, summing to 1): the mix of models an hour of the trace had."""
    joint = demand.joint if joint is None else joint
    cell = rng.choice(joint.size, size=n, p=joint.ravel())
    model, size = np.divmod(cell, joint.shape[1])
    bins = demand.duration_given_model.shape[1]
    cum_bins = np.cumsum(demand.duration_given_model, axis=1)
    b = np.minimum((cum_bins[model] < rng.random(n)[:, None]).sum(axis=1), bins - 1)
    u = (b + rng.random(n)) / bins
    seconds = np.clip(demand.duration(u), MIN_SECONDS, MAX_SECONDS)
    cuts, p_high = demand.high_given_cut
    high = rng.random(n) < p_high[np.searchsorted(cuts, seconds, side="right")]
    s = demand.sizes[size]
    return Drawn(s[:, 0].astype(int), s[:, 1], s[:, 2].astype(int), model, seconds, high)


def _jobs(demand: GfsDemand, drawn: Drawn, submit: np.ndarray, seconds: np.ndarray) -> list[Job]:
    out = []
    for i in range(len(submit)):
        gpus, share, model = int(drawn.gpus[i]), float(drawn.share[i]), int(drawn.model[i])
        out.append(Job(id=0, submit=float(submit[i]), work=float(seconds[i] * demand.speeds[model]),
                       cpus=CPUS_PER_GPU * gpus * share, gpus=gpus, share=share, parts=int(drawn.parts[i]),
                       models=demand.models[model], high=bool(drawn.high[i])))
    return out


def _concat(batches: Sequence[Drawn]) -> Drawn:
    return Drawn(*(np.concatenate([getattr(b, f) for b in batches]) for f in _FIELDS))


def _running(demand: GfsDemand, batch: int, rng: np.random.Generator, target: float,
             joint: np.ndarray | None = None) -> list[Drawn]:
    """Jobs running at time 0, drawn in proportion to their length, until their GPUs (at their
    model's speed) hold ``target``."""
    picked: list[Drawn] = []
    held = 0.0
    while held < target:
        pool = draw(demand, batch, rng, joint)
        pool = pool.select(rng.choice(batch, size=batch, p=pool.seconds / pool.seconds.sum()))
        rate = np.cumsum(pool.gpu_demand * demand.speeds[pool.model])
        pool = pool.select(slice(0, int(np.searchsorted(rate, target - held)) + 1))
        held += float((pool.gpu_demand * demand.speeds[pool.model]).sum())
        picked.append(pool)
    return picked


def gfs_jobs(demand: GfsDemand, series: HourlyArrivals, capacity: float, settings: TimelineSettings,
             seed: int) -> list[Job]:
    """Every job of the run, in submit order, the same for every strategy with the same seed: the
    jobs running at time 0 in the offered load's steady state, then the arrivals. ``capacity``
    is the fleet's work per second (its GPUs at their speeds), what a load of 1.0 offers."""
    if capacity <= 0:
        raise ValueError("the fleet has no GPUs")
    rng = np.random.default_rng([seed, 41])
    seconds, _ = window(series, settings.hours, rng)
    weights = seconds / seconds.mean() if seconds.mean() > 0 else np.ones(len(seconds))
    owed = np.cumsum(settings.load * capacity * HOUR * weights)  # work offered by each hour's end
    batch = max(1024, int(owed[-1] / demand.mean_gpu_seconds * 1.2))
    # arrivals: jobs drawn until their work pays what each hour owes, as timeline.build does
    batches: list[Drawn] = []
    offered = 0.0
    while offered < owed[-1]:
        batches.append(draw(demand, batch, rng))
        offered += float((batches[-1].gpu_seconds * demand.speeds[batches[-1].model]).sum())
    drawn = _concat(batches)
    work = drawn.gpu_seconds * demand.speeds[drawn.model]
    hour = np.searchsorted(owed, np.cumsum(work) - work, side="right")
    arrivals = drawn.select(hour < settings.hours)
    submit = (hour[hour < settings.hours] + rng.random(len(arrivals.seconds))) * HOUR
    order = np.argsort(submit, kind="stable")
    arrivals, submit = arrivals.select(order), submit[order]
    # the steady state at 0: a job is running then with a probability in proportion to its
    # length, for a uniform share of it so far; as many as hold the work the load offers
    running = _concat(_running(demand, batch, rng, settings.load * capacity))
    left = np.maximum(MIN_SECONDS, running.seconds * rng.random(len(running.seconds)))
    jobs = _jobs(demand, running, np.zeros(len(left)), left)
    jobs += _jobs(demand, arrivals, submit, arrivals.seconds)
    for number, job in enumerate(jobs):
        job.id = number
    return [j for j in jobs if j.submit < settings.horizon]


# -- gfs-hourly: each hour's models as the trace had them --------------------------------


def read_hourly_models(models: Sequence[str], path: Path | None = None) -> np.ndarray:
    """``out[hour, model]``: the GPUs asked by each of ``models``' active jobs in each hour of
    the trace (its hour 0 is the arrival series' hour 0)."""
    path = path or data_path(HOURLY_MODELS)
    rows = read_table(path, ("hour", *models))
    # the table's sums leave rounding residue (-3e-12 GPUs); a real negative is refused
    table = np.array([[_number(path, {m: "0" if _tiny(r[m]) else r[m]}, m) for m in models]
                      for r in rows])
    hours = [_number(path, r, "hour") for r in rows]
    if hours != list(range(len(rows))):
        raise ValueError(f"{path}: the hours must be 0, 1, 2, ... in order")
    return table


def _tiny(text: str | None) -> bool:
    try:
        return abs(float(text or "")) < 1e-6
    except ValueError:
        return False


def work_per_job(demand: GfsDemand) -> np.ndarray:
    """GPU-seconds a job of each model brings, on average (its size and duration given it)."""
    total_gpus = demand.sizes[:, 0] * demand.sizes[:, 1] * demand.sizes[:, 2]
    rows = demand.joint.sum(axis=1)
    gpus = (demand.joint * total_gpus).sum(axis=1) / np.maximum(rows, 1e-300)
    bins = demand.duration_given_model.shape[1]
    seconds = demand.duration((np.arange(bins * 16) + 0.5) / (bins * 16)).reshape(bins, 16).mean(axis=1)
    return gpus * np.clip(demand.duration_given_model @ seconds, MIN_SECONDS, MAX_SECONDS)


def hour_joint(demand: GfsDemand, gpus: np.ndarray, per_job: np.ndarray) -> np.ndarray:
    """The joint table of model and size for an hour whose models asked for ``gpus``: each
    model's row as ``demand.joint`` has it, scaled so that its share of the GPU-seconds drawn
    is its share of ``gpus`` (the trace's overall mix where the hour asked for nothing)."""
    rows = demand.joint.sum(axis=1)
    can = (rows > 0) & (per_job > 0)
    weight = np.where(can, np.maximum(gpus, 0.0), 0.0)
    if weight.sum() <= 0:
        return demand.joint
    p_model = weight / np.where(can, per_job, 1.0)
    p_model /= p_model.sum()
    joint = demand.joint / np.maximum(rows, 1e-300)[:, None] * p_model[:, None]
    return joint / joint.sum()


def trace_pools(models: Sequence[str],
                nodes: Sequence[tuple[str, str, int, float]] | None = None) -> np.ndarray:
    """GPUs of each of ``models`` (the trace's names) in the trace's node list."""
    listed = read_gfs_nodes() if nodes is None else nodes
    return np.array([float(sum(gpus for _, model, gpus, _ in listed if model == name)) for name in models])


def offered_gpus(rows: np.ndarray, rate: np.ndarray, speeds: np.ndarray) -> np.ndarray:
    """``out[hour, model]``: the GPUs each model is offered on average in each hour, when the
    hour offers ``rate`` work per second in the mix of ``rows`` (GPUs asked per model)."""
    work = rows @ speeds
    scale = np.divide(rate, work, out=np.zeros(len(rows)), where=work > 0)
    return rows * scale[:, None]


def capped_hours(rows: np.ndarray, rate: np.ndarray, ceiling: np.ndarray,
                 speeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each hour's GPUs offered per model, at most ``ceiling``; the work per second they offer):
    what ``rate`` in the mix of ``rows`` offers, less what it asks of a pool above the ceiling.
    An hour that asks for nothing keeps its rate (the overall mix)."""
    gpus = np.minimum(offered_gpus(rows, rate, speeds), ceiling[None, :])
    asked = rows.sum(axis=1) > 0
    return np.where(asked[:, None], gpus, rows), np.where(asked, gpus @ speeds, rate)


def gfs_hourly_jobs(demand: GfsDemand, series: HourlyArrivals, capacity: float, settings: TimelineSettings,
                    seed: int, hourly: np.ndarray | None = None,
                    pools: np.ndarray | None = None) -> list[Job]:
    """As :func:`gfs_jobs`, each hour's models in the mix of the trace's same hour (``hourly``:
    :func:`read_hourly_models`, the default the checkout's table). With ``pools`` (GPUs per
    trace model), no model is offered more than the load times its pool's GPUs in any hour,
    what the hour asks above that not offered; the other models get what they get without it
    (``gfs-hourly-capped``)."""
    if capacity <= 0:
        raise ValueError("the fleet has no GPUs")
    if not demand.trace_models:
        raise ValueError("gfs-hourly needs the trace's model names in the demand tables")
    table = read_hourly_models(demand.trace_models) if hourly is None else hourly
    rng = np.random.default_rng([seed, 43])
    idx = window_hours(series, settings.hours, rng)
    if int(idx.max()) >= len(table):
        raise ValueError(f"gfs-hourly: the arrival series has hours the per-model table has not "
                         f"({int(idx.max()) + 1} against {len(table)}); use the trace's own series")
    seconds = series.gpu_seconds[idx]
    weights = seconds / seconds.mean() if seconds.mean() > 0 else np.ones(len(seconds))
    rows = table[idx]
    # the jobs running at 0 hold the load's work in the first hour's mix
    start_rows, start_rate = rows[:1], np.array([settings.load * capacity])
    if pools is None:
        owed = np.cumsum(settings.load * capacity * HOUR * weights)
    else:
        ceiling = settings.load * pools
        rows, rate = capped_hours(rows, settings.load * capacity * weights, ceiling, demand.speeds)
        owed = np.cumsum(rate * HOUR)
        start_rows, start_rate = capped_hours(start_rows, start_rate, ceiling, demand.speeds)
    per_job = work_per_job(demand)
    batch = max(256, int(owed[-1] / demand.mean_gpu_seconds / max(settings.hours, 1) * 1.2))
    arrivals: list[Drawn] = []
    submits: list[np.ndarray] = []
    offered = 0.0
    for h in range(settings.hours):
        joint = hour_joint(demand, rows[h], per_job)
        while offered < owed[h]:
            drawn = draw(demand, batch, rng, joint)
            work = drawn.gpu_seconds * demand.speeds[drawn.model]
            start = offered + np.cumsum(work) - work  # where each job's work begins in the stream
            take = start < owed[h]
            arrivals.append(drawn.select(take))
            submits.append((h + rng.random(int(take.sum()))) * HOUR)
            offered += float(work[take].sum())
    drawn_all = _concat(arrivals)
    submit = np.concatenate(submits)
    order = np.argsort(submit, kind="stable")
    drawn_all, submit = drawn_all.select(order), submit[order]
    # the steady state at 0: each model's running jobs hold its share of the first hour's demand
    first = start_rows[0]
    rate_share = first * demand.speeds / max(float((first * demand.speeds).sum()), 1e-300)
    if first.sum() <= 0:
        rate_share = np.full(len(first), 1.0 / len(first))
    picked: list[Drawn] = []
    for m in range(len(first)):
        target = float(start_rate[0]) * float(rate_share[m])
        if target <= 0 or demand.joint[m].sum() <= 0:
            continue
        only = np.zeros_like(demand.joint)
        only[m] = demand.joint[m] / demand.joint[m].sum()
        picked += _running(demand, batch, rng, target, only)
    jobs: list[Job] = []
    if picked:
        running = _concat(picked)
        left = np.maximum(MIN_SECONDS, running.seconds * rng.random(len(running.seconds)))
        jobs = _jobs(demand, running, np.zeros(len(left)), left)
    jobs += _jobs(demand, drawn_all, submit, drawn_all.seconds)
    for number, job in enumerate(jobs):
        job.id = number
    return [j for j in jobs if j.submit < settings.horizon]


def default_demand(fleet_name: str) -> str:
    """The trace's own jobs on the trace's own fleet; openb's shapes elsewhere."""
    return "gfs" if fleet_name == "gfs" else "openb"


def build_jobs(demand_name: str, fleet: JobSource, series: HourlyArrivals, capacity: float,
               settings: TimelineSettings, seed: int) -> list[Job]:
    """The jobs of one run of ``fleet`` under the demand called ``demand_name`` (empty: the
    fleet's default); ``capacity`` is what a load of 1.0 offers per second."""
    demand_name = demand_name or default_demand(fleet.name)
    if demand_name == "openb":
        return build(list(fleet.openb_shapes), series, capacity, settings, seed)
    if demand_name == "gfs":
        return gfs_jobs(fleet.gfs_demand, series, capacity, settings, seed)
    if demand_name == "gfs-hourly":
        return gfs_hourly_jobs(fleet.gfs_demand, series, capacity, settings, seed)
    if demand_name == "gfs-hourly-capped":
        demand = fleet.gfs_demand
        pools = trace_pools(demand.trace_models)
        return gfs_hourly_jobs(demand, series, capacity, settings, seed, pools=pools)
    raise ValueError(f"unknown demand {demand_name!r}; one of {', '.join(DEMANDS)}")


def typical_shapes(demand: GfsDemand, jobs: int = 4000) -> tuple[Shape, ...]:
    """One shape per part of ``jobs`` jobs drawn with a fixed seed: the workload the fleet's
    fragmentation index and the FGD policies score against."""
    drawn = draw(demand, jobs, np.random.default_rng(0))
    shapes = []
    for i in range(jobs):
        gpus, share = int(drawn.gpus[i]), float(drawn.share[i])
        shape = Shape(CPUS_PER_GPU * gpus * share, share, gpus, demand.models[int(drawn.model[i])])
        shapes.extend([shape] * int(drawn.parts[i]))
    return tuple(shapes)


__all__ = ["DEMANDS", "Drawn", "GfsDemand", "JobSource", "Marginals", "build_jobs", "capped_hours",
           "data_path", "default_demand", "draw", "gfs_demand", "gfs_hourly_jobs", "gfs_jobs", "hour_joint",
           "load_marginals", "offered_gpus", "rake", "read_gfs_nodes", "read_hourly_models", "trace_pools",
           "typical_shapes", "work_per_job"]
