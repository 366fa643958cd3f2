"""Stragglers (issue 31): a GPU at half its peers' SM activity is flagged within the duration,
a uniform job with noise is never flagged over 2 simulated hours."""

from __future__ import annotations

import random

import pytest

from exporter.health.stragglers import StragglerSettings, StragglerTracker, outliers
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, GpuPerformance, Placement

T0 = 1_764_547_200.0
NODES = ("gpu-001", "gpu-002")
JOB = Allocation("train", tuple(Placement(n, tuple(range(8)), 1.0, 32.0) for n in NODES),
                 user="alice", account="ml")


def gpus(rng: random.Random, slow: tuple[str, int] | None = None, factor: float = 0.5) -> list[Gpu]:
    """16 busy GPUs with +-5 % noise on every reading; ``slow`` at ``factor`` of its SM activity."""
    out = []
    for node in NODES:
        for index in range(8):
            noise = lambda: rng.uniform(0.95, 1.05)  # noqa: E731
            sm = 0.8 * noise() * (factor if (node, index) == slow else 1.0)
            out.append(Gpu(node, index, f"GPU-{node}-{index}", "h100", "p",
                           utilization_ratio=min(1.0, 0.97 * noise()), power_watts=600 * noise(),
                           performance=GpuPerformance(sm_active_ratio=sm,
                                                      sm_clock_hertz=1.98e9 * noise())))
    return out


def run(seconds: int, slow: tuple[str, int] | None = None, step: int = 30, seed: int = 7,
        jobs: tuple[Allocation, ...] = (JOB,)) -> list[tuple[int, list]]:
    rng = random.Random(seed)
    tracker = StragglerTracker()
    flagged = []
    for at in range(0, seconds + 1, step):
        report = tracker.observe(FleetSnapshot(T0 + at, gpus=tuple(gpus(rng, slow)), allocations=jobs))
        if report.stragglers:
            flagged.append((at, list(report.stragglers)))
    return flagged


def test_a_gpu_at_half_its_peers_sm_activity_is_flagged_within_the_duration():
    flagged = run(900, slow=("gpu-002", 5))
    first_at, [straggler] = flagged[0]
    assert first_at == 600  # outside from the first snapshot, for the 10 min duration
    assert (straggler.job, straggler.node, straggler.gpu, straggler.metric) == \
        ("train", "gpu-002", 5, "sm_active")
    assert (straggler.user, straggler.account, straggler.since) == ("alice", "ml", T0)
    assert straggler.value == pytest.approx(0.4, rel=0.06)
    assert straggler.median == pytest.approx(0.8, rel=0.05)
    assert [at for at, _ in flagged] == list(range(600, 901, 30))


def test_a_uniform_job_is_never_flagged_over_two_hours():
    for seed in range(5):
        assert run(7200, seed=seed) == []


def test_a_gpu_back_in_step_starts_over_and_small_jobs_are_not_compared():
    rng = random.Random(1)
    tracker = StragglerTracker()
    for at in (0, 300, 590):
        assert not tracker.observe(FleetSnapshot(T0 + at, gpus=tuple(gpus(rng, ("gpu-001", 0))),
                                                 allocations=(JOB,))).stragglers
    tracker.observe(FleetSnapshot(T0 + 595, gpus=tuple(gpus(rng)), allocations=(JOB,)))
    assert not tracker.observe(FleetSnapshot(T0 + 600, gpus=tuple(gpus(rng, ("gpu-001", 0))),
                                             allocations=(JOB,))).stragglers
    small = Allocation("small", (Placement("gpu-001", (0, 1, 2), 1.0, 8.0),))
    shared = Allocation("shared", (Placement("gpu-001", tuple(range(8)), 0.5, 8.0),))
    assert run(1200, slow=("gpu-001", 0), jobs=(small, shared)) == []


def test_outliers_use_the_median_and_mad():
    settings = StragglerSettings()
    values = {("n", i): v for i, v in enumerate([0.80, 0.81, 0.79, 0.80, 0.40])}
    assert outliers(values, settings) == {("n", 4): 0.80}
    # identical peers (MAD 0): only a deviation over 20 % of the median counts
    assert outliers({("n", i): v for i, v in enumerate([0.8, 0.8, 0.8, 0.7])}, settings) == {}
    assert outliers({("n", i): v for i, v in enumerate([0.8, 0.8, 0.8])}, settings) == {}
    with pytest.raises(ValueError, match=r"stragglers.metrics: unknown \['temperature'\]"):
        StragglerTracker(StragglerSettings(metrics=("temperature",)))
