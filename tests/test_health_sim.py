"""Health on the simulated fleet (issue 31, Noise): the default fleet (1,088 GPUs) stays
healthy for 2 simulated hours with no remediation and no straggler; the xid and gpu_lost
scenarios drain exactly their nodes, and the XID's node is resumed after the minimum drain
time."""

from __future__ import annotations

import pytest

from exporter.health.remediation import Drain, Event, Remediator, ResetGpu, Resume
from exporter.health.stragglers import StragglerTracker
from exporter.health.verdict import HealthTracker, Verdict
from exporter.simulation.fleet import Simulation
from exporter.sources.sim.options import Scenario, SimSource

pytestmark = pytest.mark.slow  # 2 simulated hours of the default fleet, twice (~30 s)

START = 1_764_547_200.0


def two_hours(config: SimSource) -> tuple[list[tuple[int, Event]], int, set[Verdict]]:
    sim = Simulation(config, START)
    health, remediator, stragglers = HealthTracker(), Remediator(), StragglerTracker()
    events: list[tuple[int, Event]] = []
    flagged = 0
    verdicts: set[Verdict] = set()
    for step in range(0, 7201, 60):
        sim.advance(START + step)
        snapshot = sim.snapshot()
        fleet = health.observe(snapshot)
        verdicts |= {n.verdict for n in fleet.nodes}
        events += [(step, e) for e in remediator.decide(fleet, snapshot)]
        flagged += len(stragglers.observe(snapshot).stragglers)
    return events, flagged, verdicts


def test_the_default_fleet_stays_healthy_without_remediation_or_stragglers():
    events, flagged, verdicts = two_hours(SimSource(seed=42))
    assert (events, flagged, verdicts) == ([], 0, {Verdict.HEALTHY})


def test_xid_and_lost_gpu_scenarios_drain_their_nodes_only():
    events, flagged, _ = two_hours(SimSource(seed=42, scenarios=(
        Scenario(kind="xid", node="gpu-100", gpu=3, value=79),
        Scenario(kind="gpu_lost", node="gpu-050", gpu=1))))
    assert flagged == 0
    assert [(at, e) for at, e in events if isinstance(e, Drain | Resume)] == [
        (0, Drain("gpu-100", "gpu-a100", "XID 79 on GPU 3", START)),
        (300, Drain("gpu-050", "gpu-h100", "GPU 1 lost", START + 300)),
        (3600, Resume("gpu-100", "gpu-a100", START, START + 3600))]
    assert {(e.node, e.gpu) for _, e in events if isinstance(e, ResetGpu)} == {("gpu-100", 3), ("gpu-050", 1)}
