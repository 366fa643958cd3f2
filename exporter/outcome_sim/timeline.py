"""The jobs of one run: when they arrive, what they ask for, how long they run.

- **Rhythm**: the GPU-seconds submitted per hour in the Alibaba spot-GPU trace
  (``hourly_summary.csv``, 184 days with bursts). A run takes a window of
  consecutive hours from it, starting at an hour the seed picks (after the
  first day, whose hour 0 holds the whole backlog the trace began with).
- **Scale**: the load factor is offered GPU-hours over the fleet's GPU-hours.
  Each hour's share of the offered GPU-seconds is its share of the window's
  submitted GPU-seconds, so bursts stay bursts at every load.
- **Shapes**: each job is a pod of the openb trace, drawn at random: its CPU,
  GPUs, GPU share and model constraint.
- **Durations**: log-normal (sigma 1), its mean the hour's mean duration in
  the trace: the hour's GPU-seconds over the GPUs its jobs asked for.
- **Gangs**: openb pods ask for 8 GPUs at most, one node; a share of its 8-GPU
  pods (``gang_share``) become gangs of 2 or 4 such nodes, which start whole or
  not at all.
- **Priorities**: the trace's tables do not say which jobs were high-priority and
  which spot, so a job is high-priority with probability ``high_share``.

Jobs arrive uniformly within their hour. Everything is drawn from one
generator seeded by the seed, so a seed gives the same jobs to every strategy.
docs/simulate.md lists every assumption and what it biases.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exporter.analysis.workload import Shape
from exporter.bounded_file import Wording, read_bounded

HOUR = 3600.0
DAY = 24 * HOUR
ARRIVALS_FILE = Path("alibaba-spot-gpu-v2026") / "hourly_summary.csv"
# the same file, shipped in the package (pyproject's package-data)
PACKAGED_ARRIVALS = Path(__file__).resolve().parent.parent / "traces" / ARRIVALS_FILE.name
DURATION_SIGMA = 1.0  # log-normal spread: most jobs short, a few run for days
MIN_DURATION = 300.0  # no job runs under 5 min
MAX_DURATION = 14 * DAY  # nor longer than two weeks
GANG_SIZES = (2, 4)  # nodes of a gang made of an 8-GPU pod
SKIP_HOURS = 24  # the trace's first day holds the backlog it started with (hour 0: 3,740 jobs)


@dataclass(slots=True, eq=False)
class Job:
    """One job: what it asks for and, once it runs, where it is and how far it got.

    ``work`` is the computing it needs, in seconds on the reference GPU model (the
    H100, throughput 1.0 in the GPU catalogue); it runs at ``speed``, its current
    model's throughput, so a second of its run does ``speed`` seconds of work. ``done``
    is the work it has saved by checkpoints (or finished) before the current run,
    which started computing at ``resumed``. A move or an eviction loses what it
    computed since its last checkpoint (every ``checkpoint`` seconds of its run) and
    restores for a while when it starts again.
    """

    id: int
    submit: float
    work: float
    cpus: float  # per part (node)
    gpus: int  # per part
    share: float  # of each GPU
    parts: int  # nodes; more than one: a gang
    models: tuple[str, ...]  # allowed GPU models, empty: any
    high: bool  # high priority, else spot
    start: float | None = None  # first start
    placements: list = field(default_factory=list)  # engine Placements, one per part
    resumed: float = 0.0  # when the current run began computing (after its restore)
    placed: float = 0.0  # when its current placement began: its last start or move
    done: float = 0.0  # seconds of work saved before the current run
    version: int = 0  # bumped on every (re)start, so a stale finish event is skipped
    migrations: int = 0
    lost_gpu_seconds: float = 0.0
    speed: float = 1.0  # work per second where it runs now: its GPU model's throughput
    restore_due: bool = False  # stopped with a checkpoint to restore: its next start restores it
    requeued: float | None = None  # when an eviction put it back in the queue, while it waits there
    rewaited: float = 0.0  # seconds waited in the queue after evictions, before its restarts
    preemptions: int = 0  # times a high-priority job preempted it
    paused: bool = False  # preempted and queued to resume: ahead of new spot jobs (order_key)
    # what decides where the job fits: jobs with the same key fit the same places
    shape_key: tuple = field(init=False)
    # GPUs held while it runs, shares summed over its parts: kept, as its shape is (read for
    # every job of a node each time the strategies look for moves)
    demand: float = field(init=False)

    def __post_init__(self) -> None:
        self.shape_key = (self.cpus, self.gpus, self.share, self.parts, self.models)
        self.demand = self.gpus * self.share * self.parts

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.parts

    @property
    def whole_node(self) -> bool:
        """8 GPUs or more: a whole node or several (the issue's size class)."""
        return self.total_gpus >= 8

    @property
    def size_class(self) -> str:
        if self.parts > 1:
            return "multi_node"
        if self.gpus >= 8:
            return "node"
        if self.gpus >= 2:
            return "mid"
        return "small"

    def end(self) -> float:
        """When the current run finishes, if nothing disturbs it."""
        return self.resumed + (self.work - self.done) / self.speed

    def waited(self, until: float) -> float:
        """Seconds it waited in the queue by ``until``: before its first start, and again after
        each eviction that requeued it."""
        first = (self.start if self.start is not None and self.start < until else until) - self.submit
        again = self.rewaited + (max(0.0, until - self.requeued) if self.requeued is not None else 0.0)
        return first + again

    def progress(self, now: float, checkpoint: float) -> tuple[float, float]:
        """(seconds of the current run saved by checkpoints, seconds since the last one): run
        time, not work (the work saved is the first times :attr:`speed`)."""
        ran = max(0.0, now - self.resumed)
        saved = math.floor(ran / checkpoint) * checkpoint if checkpoint > 0 else 0.0
        return saved, ran - saved

    def last_checkpoint(self, now: float, checkpoint: float) -> float:
        saved, _ = self.progress(now, checkpoint)
        return self.resumed + saved


@dataclass(frozen=True, slots=True)
class TimelineSettings:
    days: float = 14.0
    warmup_days: float = 1.0  # simulated first, not measured: the fleet fills
    load: float = 1.0  # offered GPU-hours over the fleet's GPU-hours
    high_share: float = 0.3  # share of jobs that are high-priority
    gang_share: float = 0.3  # share of 8-GPU pods that become multi-node gangs

    def __post_init__(self) -> None:
        if self.days <= 0 or self.warmup_days < 0:
            raise ValueError(f"days must be > 0 and warmup_days >= 0, got {self.days}, {self.warmup_days}")
        if not 0 < self.load <= 10:
            raise ValueError(f"load must be in (0, 10], got {self.load}")
        if not (0 <= self.high_share <= 1 and 0 <= self.gang_share <= 1):
            raise ValueError("high_share and gang_share must be in [0, 1]")

    @property
    def hours(self) -> int:
        return math.ceil((self.days + self.warmup_days) * 24)

    @property
    def measured_from(self) -> float:
        return self.warmup_days * DAY

    @property
    def horizon(self) -> float:
        return (self.days + self.warmup_days) * DAY


@dataclass(frozen=True, slots=True)
class HourlyArrivals:
    """The trace's arrival stream: per hour, GPU-seconds submitted and GPUs asked for."""

    gpu_seconds: np.ndarray
    gpu_demand: np.ndarray

    def __post_init__(self) -> None:
        if len(self.gpu_seconds) == 0:
            raise ValueError("the arrival series has no hours")


def arrivals_path() -> Path:
    """The hourly series: $GPUFLEET_DATA's, else the checkout's ``data/``, else the copy
    the package ships (an installed gpufleet has no data/ beside it)."""
    env = os.environ.get("GPUFLEET_DATA")
    if env and (Path(env) / ARRIVALS_FILE).exists():
        return Path(env) / ARRIVALS_FILE
    checkout = Path("data") / ARRIVALS_FILE
    return checkout if checkout.exists() or not PACKAGED_ARRIVALS.is_file() else PACKAGED_ARRIVALS


# the hourly series: 184 days are 115 kB; a FIFO or /dev/zero named by $GPUFLEET_DATA is one
# line (the bounded reader), not a hang
MAX_ARRIVALS_BYTES = 64 * 2**20
_ARRIVALS_FILE = Wording(ValueError, over_limit="{size} bytes, over the {limit}-byte limit",
                         grew_over_limit="over the {limit}-byte limit",
                         cannot_read="cannot read: {reason}")


def read_arrivals(path: str | Path) -> HourlyArrivals:
    """``submit_hour,jobs,gpu_seconds,gpu_demand`` rows, in hour order."""
    path = Path(path)
    seconds, demand = [], []
    text = read_bounded(path, MAX_ARRIVALS_BYTES, _ARRIVALS_FILE).decode("utf-8", "replace")
    with io.StringIO(text, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"gpu_seconds", "gpu_demand"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing column {', '.join(sorted(missing))}")
        for line, row in enumerate(reader, start=2):
            try:
                seconds.append(float(row["gpu_seconds"]))
                demand.append(float(row["gpu_demand"]))
            except ValueError:
                raise ValueError(f"{path}:{line}: gpu_seconds and gpu_demand must be numbers") from None
    return HourlyArrivals(np.array(seconds), np.array(demand))


def window_hours(series: HourlyArrivals, hours: int, rng: np.random.Generator) -> np.ndarray:
    """The series' hours (indices) of ``hours`` consecutive hours from a start the generator
    picks; a series shorter than the window wraps around."""
    usable = len(series.gpu_seconds) - SKIP_HOURS
    base = SKIP_HOURS if usable > 0 else 0
    span = usable if usable > 0 else len(series.gpu_seconds)
    start = int(rng.integers(0, max(1, span - hours))) if span > hours else 0
    return base + (start + np.arange(hours)) % span


def window(series: HourlyArrivals, hours: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(GPU-seconds, mean duration in seconds) for the hours :func:`window_hours` picks."""
    idx = window_hours(series, hours, rng)
    usable = len(series.gpu_seconds) - SKIP_HOURS
    base = SKIP_HOURS if usable > 0 else 0
    seconds = series.gpu_seconds[idx]
    demand = series.gpu_demand[idx]
    overall = float(series.gpu_seconds[base:].sum() / max(series.gpu_demand[base:].sum(), 1e-9))
    mean_duration = np.where(demand > 0, seconds / np.maximum(demand, 1e-9), overall)
    return seconds, np.clip(mean_duration, MIN_DURATION, MAX_DURATION)


def build(shapes: list[Shape], series: HourlyArrivals, capacity_gpus: float, settings: TimelineSettings,
          seed: int) -> list[Job]:
    """Every job of the run, in submit order, the same for every strategy with the same seed."""
    if capacity_gpus <= 0:
        raise ValueError("the fleet has no GPUs")
    gpu_shapes = [s for s in shapes if not s.cpu_only]
    if not gpu_shapes:
        raise ValueError("the job shapes ask for no GPUs, so no load can be offered")
    rng = np.random.default_rng([seed, 28])
    seconds, mean_duration = window(series, settings.hours, rng)
    weights = seconds / seconds.mean() if seconds.mean() > 0 else np.ones(len(seconds))
    target = settings.load * capacity_gpus * HOUR * weights  # offered GPU-seconds per hour
    mu_shift = DURATION_SIGMA**2 / 2
    jobs: list[Job] = []
    offered = owed = 0.0
    for hour in range(settings.hours):
        owed += target[hour]
        arrivals: list[Job] = []
        log_mean = math.log(mean_duration[hour]) - mu_shift
        while offered < owed:
            shape = shapes[int(rng.integers(len(shapes)))]
            duration = float(np.clip(rng.lognormal(log_mean, DURATION_SIGMA), MIN_DURATION, MAX_DURATION))
            gpus = 0 if shape.cpu_only else shape.gpus
            share = 1.0 if shape.cpu_only else shape.gpu_share
            parts = 1
            if gpus >= 8 and rng.random() < settings.gang_share:
                parts = int(rng.choice(GANG_SIZES))
            high = bool(rng.random() < settings.high_share)
            at = (hour + float(rng.random())) * HOUR
            arrivals.append(Job(0, at, duration, shape.cpus, gpus, share, parts, shape.models, high))
            offered += gpus * share * parts * duration
        arrivals.sort(key=lambda j: j.submit)
        jobs.extend(arrivals)
    for number, job in enumerate(jobs):
        job.id = number
    return [j for j in jobs if j.submit < settings.horizon]


__all__ = ["DAY", "HOUR", "HourlyArrivals", "Job", "TimelineSettings", "arrivals_path", "build",
           "read_arrivals", "window", "window_hours"]
