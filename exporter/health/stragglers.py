"""Stragglers: one GPU of a multi-GPU job out of step with its peers (issue 31, Build 4).

Every alert looks at one GPU at a time, so a GPU at half its peers' SM activity (thermal
slowdown, a bad link, a failing HBM stack) slows its whole job unseen: a synchronous job
runs at its slowest GPU's pace. For each job holding at least ``min_job_gpus`` whole GPUs,
each metric (SM activity, utilisation, power, SM clock) is compared with the job's median:
a GPU is outside when its distance from the median exceeds both ``mad_threshold`` times
the robust spread (1.4826 x the median absolute deviation, a standard deviation for normal
data that one outlier cannot inflate) and ``min_relative_deviation`` of the median (so a
job whose GPUs read alike, MAD near 0, does not flag noise). A GPU outside on one metric
for ``straggler_for_seconds`` without a break is a straggler, named by job, node and GPU.

Shared GPUs (a share below 1) are left out: their readings are not one job's. Lost or
stale GPUs are left out too (their verdict says so), and a metric with fewer readings than
``min_job_gpus`` is not compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from exporter.snapshot import FleetSnapshot, Gpu
from exporter.thresholds.health import STRAGGLER_METRICS
from exporter.thresholds.health import StragglerSettings as StragglerSettings  # the table's health.stragglers

MAD_TO_SIGMA = 1.4826  # the MAD of normal data times this is its standard deviation


def _sm_active(g: Gpu) -> float | None:
    return g.performance.sm_active_ratio if g.performance else None


def _sm_clock(g: Gpu) -> float | None:
    return g.performance.sm_clock_hertz if g.performance else None


METRICS: dict[str, Callable[[Gpu], float | None]] = {
    "sm_active": _sm_active,
    "utilization": lambda g: g.utilization_ratio,
    "power": lambda g: g.power_watts,
    "sm_clock": _sm_clock,
}
assert tuple(METRICS) == STRAGGLER_METRICS  # the names the table's health.stragglers.metrics takes


@dataclass(frozen=True, slots=True)
class Straggler:
    job: str
    user: str
    account: str
    node: str
    gpu: int
    metric: str  # the metric that has been outside longest
    value: float
    median: float  # of the job's GPUs
    since: float  # unix seconds it has been outside


@dataclass(frozen=True, slots=True)
class StragglerReport:
    taken_at: float
    stragglers: tuple[Straggler, ...]
    jobs_checked: int  # multi-GPU jobs with at least min_job_gpus whole GPUs


def outliers(values: dict[tuple[str, int], float], settings: StragglerSettings
             ) -> dict[tuple[str, int], float]:
    """The GPUs outside their peers' spread, each with the peers' median."""
    if len(values) < settings.min_job_gpus:
        return {}
    median = statistics.median(values.values())
    if median == 0:
        return {}  # nothing to be relatively far from (an idle job)
    spread = MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values.values())
    limit = max(settings.mad_threshold * spread, settings.min_relative_deviation * abs(median))
    return {key: median for key, value in values.items() if abs(value - median) > limit}


class StragglerTracker:
    """Stragglers over successive snapshots; feed it every snapshot, oldest first."""

    def __init__(self, settings: StragglerSettings | None = None) -> None:
        self.settings = settings or StragglerSettings()
        unknown = set(self.settings.metrics) - set(METRICS)
        if unknown:
            raise ValueError(f"stragglers.metrics: unknown {sorted(unknown)}; known: {list(METRICS)}")
        # (job, node, gpu, metric) -> since when it has been outside
        self._outside: dict[tuple[str, str, int, str], float] = {}

    def observe(self, snapshot: FleetSnapshot) -> StragglerReport:
        now = snapshot.taken_at
        s = self.settings
        gpus = {g.key: g for g in snapshot.gpus if g.up and not g.stale}
        outside: dict[tuple[str, str, int, str], float] = {}
        found: list[Straggler] = []
        checked = 0
        for alloc in snapshot.allocations:
            keys = [(p.node, i) for p in alloc.placements if p.gpu_share >= 1.0 for i in p.gpus]
            if len(keys) < s.min_job_gpus:
                continue
            checked += 1
            worst: dict[tuple[str, int], Straggler] = {}
            for metric in s.metrics:
                read = METRICS[metric]
                values = {k: v for k in keys if k in gpus and (v := read(gpus[k])) is not None}
                for key, median in outliers(values, s).items():
                    mark = (alloc.job, key[0], key[1], metric)
                    since = self._outside.get(mark, now)
                    outside[mark] = since
                    held = worst.get(key)
                    if now - since >= s.straggler_for_seconds and (held is None or since < held.since):
                        worst[key] = Straggler(alloc.job, alloc.user, alloc.account, key[0], key[1],
                                               metric, values[key], median, since)
            found += worst.values()
        self._outside = outside  # a GPU back inside, or a job gone, starts over
        found.sort(key=lambda x: (x.job, x.node, x.gpu))
        return StragglerReport(now, tuple(found), checked)


__all__ = ["METRICS", "Straggler", "StragglerReport", "StragglerSettings", "StragglerTracker",
           "outliers"]
