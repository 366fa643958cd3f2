"""The simulated fleet's job mix: what kinds of job arrive, how big, for how long.

The mix mirrors the reference cluster's (see :mod:`exporter.fleet_sim`):
multi-node training needing more than 80 GB per GPU, single-GPU inference,
time-sliced and MIG slices, and small dev jobs. ``weight`` is each kind's share
of the GPU demand; :func:`relative_rates` turns it into arrival rates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class JobKind:
    name: str
    pools: tuple[str, ...]  # catalogue models it may run on, in preference order
    nodes: tuple[int, ...]  # choices for node count (whole 8-GPU nodes); 0: single node
    gpus: tuple[int, ...]  # GPUs per node when nodes == 0
    share: tuple[float, ...]  # per-GPU share choices (1.0 whole GPU)
    mean_hours: float
    weight: float  # fraction of GPU demand
    memory_gb: tuple[float, float]  # per-GPU memory need range
    utilization: tuple[float, float]
    namespace: str
    priority: int
    qos: str
    mig: bool = False


JOB_KINDS = (
    JobKind("train", ("H200", "B200"), (1, 1, 2, 2, 4), (8,), (1.0,), 10.0, 0.30,
            (82, 135), (0.82, 0.98), "llm-training", 100, "normal"),
    JobKind("infer", ("H100",), (0,), (1, 1, 1, 2), (1.0,), 6.0, 0.40,
            (20, 70), (0.25, 0.8), "serving", 1000, "high"),
    JobKind("slice", ("H100", "A100-80GB"), (0,), (1,), (0.25, 0.5), 3.0, 0.04,
            (5, 18), (0.2, 0.6), "serving", 500, "normal"),
    JobKind("mig", ("A100-80GB",), (0,), (1,), (1 / 7, 2 / 7, 3 / 7), 4.0, 0.02,
            (8, 30), (0.3, 0.7), "notebooks", 10, "low", mig=True),
    JobKind("dev", ("A100-80GB", "H100"), (0,), (1, 1, 2, 4), (1.0,), 2.0, 0.24,
            (8, 38), (0.05, 0.7), "dev", 10, "low"),
)


@dataclass
class SimJob:
    id: str
    kind: JobKind
    placements: list[tuple[int, list[int], float, float]]  # node idx, gpu idxs (global), share, cpus
    start: float
    end: float
    utilization: float
    memory_bytes: float  # per GPU
    nvlink_level: float  # fraction of NVLink capacity used when busy; 0 for 1-GPU jobs
    pinned: bool = False  # scenario jobs never finish


# Scenario jobs' ages come from their own generator per (seed, stream, job number): drawing
# them from the fleet's generator would shift every later job and telemetry value
SCENARIO_AGE_STREAM = 17


def scenario_start(seed: int, number: int, kind: JobKind, now: float) -> float:
    """When a job that a scenario puts in place (``fragmented_pool``, ``idle_allocated``)
    started: some time in the past, drawn as the initial fill draws its jobs' ages
    (uniform up to the kind's mean duration), deterministic per seed and job number.

    A scenario shows a state the fleet reached, so its jobs did not all start at this
    instant: had they, the advisor's ``min_runtime`` (30 min) would defer every move in
    the first half hour of ``make run``.
    """
    rng = np.random.default_rng((seed, SCENARIO_AGE_STREAM, number))
    return now - float(rng.uniform(0, kind.mean_hours * 3600))


def relative_rates() -> list[float]:
    """How often each kind of job arrives, relative to the others: its share of the GPU
    demand over the GPU-hours one job of it holds."""
    rates = []
    for kind in JOB_KINDS:
        node_count = float(np.mean(kind.nodes))
        gpus_per_job = 8 * node_count if node_count else float(np.mean(kind.gpus))
        rates.append(kind.weight / (gpus_per_job * float(np.mean(kind.share)) * kind.mean_hours))
    return rates
