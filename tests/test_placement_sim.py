"""The simulated fleet places its jobs with the placement engine, by the configured policy."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.config import ConfigError, build
from exporter.fleet_sim.fleet import Simulation
from exporter.placement import POLICIES
from exporter.sources.sim.options import SimSource

START = 1_760_000_000.0


def test_config_offers_the_engines_policies():
    assert SimSource().policy == "bestfit"
    assert build(SimSource, {"policy": "fgd"}).policy == "fgd"
    with pytest.raises(ConfigError, match="policy: must be one of fgd, bestfit"):
        build(SimSource, {"policy": "firstfit"}, "sources.sim")


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_the_fleet_consistent(policy):
    sim = Simulation(SimSource(policy=policy, seed=11), START)
    sim.advance(START + 3 * 3600)
    fleet = sim.fleet
    # the engine's copy of the fleet is the fleet
    np.testing.assert_allclose(sim.placer.gpu_free.reshape(-1), fleet.free,
                               atol=1e-8)  # the fleet keeps -1e-9 where the engine keeps 0
    np.testing.assert_allclose(sim.placer.cpu_free, fleet.cpu_free, atol=1e-8)
    assert (fleet.free >= -1e-9).all() and (fleet.cpu_free >= -1e-9).all()
    models = sim.placer.model_names
    for job in sim.jobs.values():
        nodes = {node for node, _, _, _ in job.placements}
        assert len(nodes) == len(job.placements)  # one part per node
        node_models = {models[sim.placer.model[n]] for n in nodes}
        assert len(node_models) == 1, (job.id, node_models)  # never split across models
        on_mig = {bool(fleet.gpu_mig[g]) for _, gpus, _, _ in job.placements for g in gpus}
        assert on_mig == {job.kind.mig}, job.id  # MIG jobs on MIG GPUs only, and only them there
        for node, gpus, _, _ in job.placements:
            assert all(int(fleet.gpu_node[g]) == node for g in gpus)


def test_tiered_sends_training_to_its_memory_tier():
    sim = Simulation(SimSource(policy="tiered", seed=9), START)
    sim.advance(START + 2 * 3600)
    trained = 0
    for job in sim.jobs.values():
        if job.kind.name != "train":
            continue
        trained += 1
        models = {sim.fleet.nodes[n].model for n, _, _, _ in job.placements}
        assert models == ({"B200"} if job.memory_bytes > 120e9 else {"H200"}), job.memory_bytes
    assert trained > 5


def test_the_same_seed_places_the_same_way():
    a = Simulation(SimSource(policy="fgd", seed=3), START)
    b = Simulation(SimSource(policy="fgd", seed=3), START)
    a.advance(START + 3600)
    b.advance(START + 3600)
    assert a.snapshot().allocations == b.snapshot().allocations
