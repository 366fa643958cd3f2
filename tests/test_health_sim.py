"""Health on the simulated fleet (issue 31, Noise): the default fleet (1,088 GPUs) stays
healthy for 2 simulated hours with no remediation and no straggler; the xid and gpu_lost
scenarios drain exactly their nodes, and the XID's node is resumed after the minimum drain
time; every scenario at once (tests/helpers/noise.py's faults and a straggler) adds no page:
one drain per page-worthy fault, the straggler flagged and nothing else."""

from __future__ import annotations

import pytest

from exporter.fleet_sim.fleet import Simulation
from exporter.health.remediation import Drain, Event, Page, Remediator, ResetGpu, Resume
from exporter.health.stragglers import StragglerTracker
from exporter.health.verdict import HealthTracker, Verdict
from exporter.sources.sim.options import Scenario, SimSource

pytestmark = pytest.mark.slow  # 2 simulated hours of the default fleet, twice (~30 s)

START = 1_764_547_200.0


def two_hours(config: SimSource, stragglers_seen: set | None = None,
              verdicts_seen: dict | None = None, seconds: int = 7200,
              step_seconds: int = 60) -> tuple[list[tuple[int, Event]], int, set[Verdict]]:
    sim = Simulation(config, START)
    health, remediator, stragglers = HealthTracker(), Remediator(), StragglerTracker()
    events: list[tuple[int, Event]] = []
    flagged = 0
    verdicts: set[Verdict] = set()
    for step in range(0, seconds + 1, step_seconds):
        sim.advance(START + step)
        snapshot = sim.snapshot()
        fleet = health.observe(snapshot)
        verdicts |= {n.verdict for n in fleet.nodes}
        if verdicts_seen is not None:
            verdicts_seen.update({n.node: n.verdict for n in fleet.nodes if n.verdict != Verdict.HEALTHY})
        events += [(step, e) for e in remediator.decide(fleet, snapshot)]
        found = stragglers.observe(snapshot).stragglers
        flagged += len(found)
        if stragglers_seen is not None:
            stragglers_seen |= {(s.job, s.node, s.gpu) for s in found}
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


def test_every_scenario_at_once_adds_no_page_and_drains_once_per_page_worthy_fault():
    """Noise: the faults of issue 15's noise run (tests/helpers/noise.py) with the xid and a
    straggler, for 2 simulated hours. Remediation pages for an XID storm only: here none. The
    two faults that page (GPU lost, XID 79) drain their nodes once each; the 90 °C GPU is
    degraded (its page is GpuTemperatureHigh's), the 82 °C one, the idle job and the
    fragmented pool change no verdict, and the straggler is the only job flagged."""
    stragglers: set = set()
    unhealthy: dict = {}
    events, _, _ = two_hours(SimSource(seed=42, scenarios=(
        Scenario(kind="overheat", node="gpu-001", gpu=3, value=90),
        Scenario(kind="gpu_lost", node="gpu-005", gpu=2),
        Scenario(kind="overheat", node="gpu-002", gpu=1, value=82),
        Scenario(kind="idle_allocated", node="gpu-040", gpu=0),
        Scenario(kind="fragmented_pool", pool="gpu-h100"),
        Scenario(kind="xid", node="gpu-098", gpu=4, value=79),
        Scenario(kind="straggler", node="gpu-031", gpu=5))), stragglers, unhealthy, 3600, 120)
    assert [e for _, e in events if isinstance(e, Page)] == []
    assert sorted(e.node for _, e in events if isinstance(e, Drain)) == ["gpu-005", "gpu-098"]
    assert unhealthy == {"gpu-001": Verdict.DEGRADED, "gpu-005": Verdict.FAILING,
                         "gpu-098": Verdict.FAILING}
    assert stragglers == {("train-000055", "gpu-031", 5)}
