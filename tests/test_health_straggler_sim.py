"""The ``straggler`` scenario (issue 31, Must show): one GPU of a 16-GPU job of the default
simulated fleet kept at half its peers' pace is flagged at the straggler duration, naming
job, node and GPU, and exported; the default fleet flags none over 2 simulated hours. Both
drive the simulator's clock, no server."""

from __future__ import annotations

import pytest

from exporter.errors import ConfigError
from exporter.fleet_sim.fleet import Simulation
from exporter.health.monitor import HealthMonitor
from exporter.health.stragglers import StragglerSettings, StragglerTracker
from exporter.sources.sim.options import Scenario, SimSource

START = 1_764_547_200.0
DURATION = StragglerSettings().straggler_for_seconds  # 600 s: the straggler's `for`
# train-000055 of seed 42 holds gpu-031 and gpu-032 (16 GPUs) for 43 simulated hours
LAGGING = Scenario(kind="straggler", node="gpu-031", gpu=5)


def test_the_straggler_scenario_is_flagged_at_the_duration_and_exported():
    sim = Simulation(SimSource(seed=42, scenarios=(LAGGING,)), START)
    monitor = HealthMonitor()
    first = None
    for step in range(0, int(DURATION) + 61, 60):
        sim.advance(START + step)
        view = monitor.observe(sim.snapshot())
        if view.stragglers.stragglers and first is None:
            first = step
    assert first == DURATION
    [straggler] = view.stragglers.stragglers
    assert (straggler.job, straggler.node, straggler.gpu, straggler.metric) == \
        ("train-000055", "gpu-031", 5, "sm_active")  # the first metric outside: all are
    assert straggler.value == pytest.approx(straggler.median / 2, rel=0.15)
    [family] = [f for f in monitor.families() if f.name == "gpufleet_job_straggler_gpus"]
    assert [(dict(labels)["job"], value) for labels, value in family.samples] == [("train-000055", 1.0)]


def test_the_default_fleet_raises_no_straggler_over_two_hours():
    # 300 s steps (25 snapshots, ~3 s): a GPU outside its peers for the 600 s duration is
    # outside at 3 successive readings; tests/test_health_sim.py walks the same 2 h at 60 s
    sim = Simulation(SimSource(seed=42), START)
    tracker = StragglerTracker()
    flagged, checked = set(), 0
    for step in range(0, 7201, 300):
        sim.advance(START + step)
        report = tracker.observe(sim.snapshot())
        checked = max(checked, report.jobs_checked)
        flagged |= {(s.job, s.node, s.gpu) for s in report.stragglers}
    assert checked >= 10  # the fleet's multi-GPU jobs were compared
    assert flagged == set()


def test_a_straggler_keeps_a_share_of_its_peers_pace_from_0_to_1():
    with pytest.raises(ConfigError, match=r"sim.scenarios\[0\].value: the share .* not 2"):
        SimSource(scenarios=(Scenario(kind="straggler", node="gpu-031", gpu=5, value=2),)).check("sim")
