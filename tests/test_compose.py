"""Composing the scheduler's view with telemetry: joins, one-side-only GPUs, staleness."""

from __future__ import annotations

import dataclasses

from exporter.collect import Collector
from exporter.compose import compose
from exporter.exposition import render_text
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    Node,
    Placement,
    SourceStatus,
    UnmatchedGpus,
    from_json,
    to_json,
)
from exporter.sources import SourceReading


def scheduled() -> FleetSnapshot:
    """What Slurm sees: two nodes of 2 GPUs, no UUIDs, one job on gpu-001/1 and gpu-002/0."""
    return FleetSnapshot(
        0.0,
        nodes=(Node("gpu-001", "H200", 64.0, "gpu-h200", "hopper", 2),
               Node("gpu-002", "H200", 64.0, "gpu-h200", "hopper", 2)),
        gpus=tuple(Gpu(n, i, "", "H200", "gpu-h200") for n in ("gpu-001", "gpu-002")
                   for i in range(2)),
        allocations=(Allocation("42", (Placement("gpu-001", (1,), 1.0, 8.0),
                                       Placement("gpu-002", (0,), 1.0, 8.0))),),
        sources=(SourceStatus("slurm", True, 0.1, 0.0),),
    )


def measured() -> FleetSnapshot:
    """What telemetry sees: gpu-001 both GPUs, gpu-002 only GPU 0, plus a node Slurm lacks."""
    def gpu(node: str, index: int, util: float) -> Gpu:
        return Gpu(node, index, f"GPU-{node}-{index}", "H200", "", utilization_ratio=util,
                   memory_total_bytes=141_000_000_000, power_watts=300.0)

    return FleetSnapshot(
        0.0,
        nodes=(Node("gpu-001", "H200", 0.0, "", "hopper", 2),
               Node("gpu-002", "H200", 0.0, "", "hopper", 2),
               Node("gpu-099", "H200", 0.0, "", "hopper", 1)),
        gpus=(gpu("gpu-001", 0, 0.0), gpu("gpu-001", 1, 0.9), gpu("gpu-002", 0, 0.5),
              gpu("gpu-099", 0, 0.1)),
        sources=(SourceStatus("nvml", True, 0.2, 0.0),),
    )


def test_join_by_node_and_index_keeps_the_scheduler_identity_and_telemetry_values():
    snapshot = compose(5.0, scheduled(), measured())
    by_key = {g.key: g for g in snapshot.gpus}
    joined = by_key[("gpu-001", 1)]
    assert joined.uuid == "GPU-gpu-001-1" and joined.utilization_ratio == 0.9
    assert joined.pool == "gpu-h200" and joined.power_watts == 300.0
    # the allocation still points at a GPU that now has telemetry
    held = snapshot.gpu_allocations()
    assert set(held) == {("gpu-001", 1), ("gpu-002", 0)}
    assert by_key[("gpu-002", 0)].utilization_ratio == 0.5
    assert snapshot.allocations == scheduled().allocations
    assert [s.source for s in snapshot.sources] == ["slurm", "nvml"]
    assert snapshot.taken_at == 5.0


def test_gpus_seen_by_one_side_are_kept_and_counted():
    snapshot = compose(0.0, scheduled(), measured())
    keys = {g.key for g in snapshot.gpus}
    assert ("gpu-002", 1) in keys  # Slurm only: no telemetry, still reported
    assert ("gpu-099", 0) in keys  # telemetry only
    assert len(snapshot.gpus) == 5
    assert snapshot.unmatched == (UnmatchedGpus("allocation", 1), UnmatchedGpus("telemetry", 1))
    assert [n.name for n in snapshot.nodes] == ["gpu-001", "gpu-002", "gpu-099"]
    assert snapshot.nodes[0].cpu_cores == 64.0  # the scheduler's node record wins
    text = render_text(snapshot).decode()
    assert 'gpufleet_compose_unmatched_gpus{side="allocation"} 1.0' in text
    assert 'gpufleet_compose_unmatched_gpus{side="telemetry"} 1.0' in text


def test_uuid_wins_over_node_and_index():
    """Both sides name a UUID: the join follows it even when the node names differ."""
    alloc = scheduled()
    alloc = dataclasses.replace(alloc, gpus=tuple(
        dataclasses.replace(g, uuid=f"GPU-{g.node}-{1 - g.index}") for g in alloc.gpus))
    snapshot = compose(0.0, alloc, measured())
    by_key = {g.key: g for g in snapshot.gpus}
    assert by_key[("gpu-001", 1)].utilization_ratio == 0.0  # telemetry's gpu-001/0
    assert by_key[("gpu-001", 0)].utilization_ratio == 0.9
    assert by_key[("gpu-002", 1)].utilization_ratio == 0.5


def test_stale_on_either_side_makes_the_joined_gpu_stale():
    alloc = scheduled()
    alloc = dataclasses.replace(alloc, gpus=tuple(dataclasses.replace(g, stale=True)
                                                  for g in alloc.gpus))
    snapshot = compose(0.0, alloc, measured())
    assert all(g.stale for g in snapshot.gpus if g.node != "gpu-099")
    assert not [g for g in snapshot.gpus if g.node == "gpu-099" and g.stale]


def test_unmatched_survives_json_round_trip():
    snapshot = compose(0.0, scheduled(), measured())
    assert from_json(to_json(snapshot)) == snapshot


@dataclasses.dataclass
class FixedSource:
    name: str
    reading: FleetSnapshot
    role: str = "full"
    fail: bool = False

    async def read(self) -> SourceReading:
        if self.fail:
            raise RuntimeError("squeue: no answer within 5s")
        return SourceReading.of(dataclasses.replace(self.reading, sources=()))

    async def close(self) -> None:
        return None


async def test_collector_composes_an_allocation_source_with_telemetry():
    slurm = FixedSource("slurm", scheduled(), role="allocation")
    nvml = FixedSource("nvml", measured())
    collector = Collector([slurm, nvml], 5.0, clock=lambda: 100.0)
    snapshot = await collector.collect()
    assert len(snapshot.gpus) == 5 and snapshot.unmatched[0].count == 1
    assert snapshot.allocations == scheduled().allocations

    # Slurm goes down: its last allocation is served, marked stale; telemetry stays fresh
    slurm.fail = True
    down = await collector.collect()
    status = {s.source: s for s in down.sources if not s.target}
    assert not status["slurm"].up and status["nvml"].up
    assert "no answer" in status["slurm"].error
    assert down.allocations == scheduled().allocations
    assert all(g.stale for g in down.gpus if g.node != "gpu-099")

    slurm.fail = False
    back = await collector.collect()
    assert not any(g.stale for g in back.gpus)
    assert all(s.up for s in back.sources)


async def test_without_an_allocation_source_sources_are_merged_as_before():
    a = FixedSource("sim", measured())
    collector = Collector([a], 5.0, clock=lambda: 1.0)
    snapshot = await collector.collect()
    assert snapshot.gpus == measured().gpus and snapshot.unmatched == ()
    text = render_text(snapshot).decode()
    assert "# TYPE gpufleet_compose_unmatched_gpus gauge" in text
    assert "gpufleet_compose_unmatched_gpus{" not in text


async def test_simulated_fleet_as_the_allocation_source_joined_with_telemetry():
    """Issue 9: the allocation side may be the simulated fleet, the telemetry side anything."""
    from exporter.collect import Collector
    from exporter.sources.sim.options import SimSource
    from exporter.sources.sim.source import build as sim_source

    now = 1_760_000_000.0
    scheduler = sim_source(SimSource(seed=1, role="allocation"), lambda: now)
    telemetry = sim_source(SimSource(seed=2), lambda: now)
    telemetry.name = "telemetry"
    snapshot = await Collector([scheduler, telemetry], 10, clock=lambda: now).collect()
    alone = {s.name: await s.read() for s in (scheduler, telemetry)}
    assert len(snapshot.gpus) == 1088  # joined, not concatenated
    assert snapshot.allocations == alone["sim"].allocations  # the scheduler's jobs
    measured = {g.key: g for g in alone["telemetry"].gpus}
    for gpu in snapshot.gpus:  # values and identity from telemetry
        assert gpu.temperature_celsius == measured[gpu.key].temperature_celsius
        assert gpu.uuid == measured[gpu.key].uuid
    assert {u.side: u.count for u in snapshot.unmatched} in ({}, {"allocation": 0, "telemetry": 0})
