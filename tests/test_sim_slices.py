"""Slices of one simulated fleet (``first_node``, ``job_prefix``) never collide: the
4-exporter test of the prometheus source serves one slice per exporter."""

from __future__ import annotations

from exporter.fleet_sim.fleet import Simulation
from exporter.sources.sim.options import SimPool, SimSource


def test_slices_have_disjoint_node_and_job_names():
    pool = (SimPool("gpu-h100", "H100", 3, 8, 128),)
    first = Simulation(SimSource(pools=pool, seed=1, job_prefix="a-"), start_time=0.0)
    second = Simulation(SimSource(pools=pool, seed=1, first_node=4, job_prefix="b-"),
                        start_time=0.0)
    one, two = first.snapshot(), second.snapshot()
    assert [n.name for n in one.nodes] == ["gpu-001", "gpu-002", "gpu-003"]
    assert [n.name for n in two.nodes] == ["gpu-004", "gpu-005", "gpu-006"]
    assert not {g.uuid for g in one.gpus} & {g.uuid for g in two.gpus}
    assert one.allocations and all(a.job.startswith("a-") for a in one.allocations)
    assert all(a.job.startswith("b-") and a.pod == f"{a.job}-0" for a in two.allocations)


def test_defaults_keep_the_reference_names():
    snapshot = Simulation(SimSource(), start_time=0.0).snapshot()
    assert snapshot.nodes[0].name == "gpu-001" and snapshot.nodes[-1].name == "gpu-136"
    assert not any(a.job.startswith("-") for a in snapshot.allocations)
