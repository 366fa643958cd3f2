"""Issue 32, finding 9: caches keyed by GPU identity are pruned to the current snapshot.

Under node-name churn (an autoscaled fleet: every node new after a while) the label-text
cache grew by every identity ever seen, +462 MB/h. Snapshots are built here directly
(a small simulated fleet, renamed each step), no server, so 1,000 of them take well
under a second at the cache's boundary.
"""

from __future__ import annotations

import dataclasses

from exporter.exposition import LabelCache, render, render_text
from exporter.exposition.blocks import chunks_of
from exporter.fleet_sim.fleet import Simulation
from exporter.snapshot import FleetSnapshot
from exporter.sources.sim.options import SimPool, SimSource

START = 1_760_000_000.0


def small_fleet() -> FleetSnapshot:
    sim = Simulation(SimSource(pools=(SimPool("gpu-h100", "H100", 4, 8),), mig_nodes=0),
                     start_time=START)
    sim.advance(START + 600)
    return sim.snapshot()


def churned(snapshot: FleetSnapshot, step: int, nodes: int | None = None) -> FleetSnapshot:
    """``snapshot`` with its first ``nodes`` nodes (all by default) renamed for ``step``: the
    autoscaler replaced them by new machines, with new names and GPU UUIDs."""
    names = [n.name for n in snapshot.nodes][:nodes]
    new = {name: f"{name}-{step}" for name in names}

    def rename(name: str) -> str:
        return new.get(name, name)

    return dataclasses.replace(
        snapshot,
        nodes=tuple(dataclasses.replace(n, name=rename(n.name)) for n in snapshot.nodes),
        gpus=tuple(dataclasses.replace(g, node=rename(g.node), uuid=f"{g.uuid}-{step}")
                   if g.node in new else g for g in snapshot.gpus),
        allocations=tuple(dataclasses.replace(a, placements=tuple(
            dataclasses.replace(p, node=rename(p.node)) for p in a.placements))
            for a in snapshot.allocations))


def test_a_thousand_snapshots_of_churned_identities_keep_the_label_cache_at_the_fleet_size():
    """Each of 1,000 snapshots holds 32 GPUs none of the one before held: the cache holds the
    current 32 texts after every one (before: 32 more each time, 32,000 at the end)."""
    base = small_fleet()
    gpus = len(base.gpus)
    labels = LabelCache()
    largest = 0
    for step in range(1000):
        snapshot = churned(base, step)
        texts = labels.texts(snapshot.gpus)
        chunks_of(snapshot.gpus, texts, labels)
        largest = max(largest, labels.sizes()["label_texts"])
    assert labels.sizes()["label_texts"] == gpus == 32
    assert largest == gpus
    assert labels.sizes()["chunk_texts"] == 1


def test_a_fleet_that_shrinks_forgets_the_gone_gpus_and_a_cluster_label_change_the_old_texts():
    base = small_fleet()
    labels = LabelCache()
    labels.texts(base.gpus)
    labels.texts(base.gpus[:8])  # three nodes gone: no new identity, but the cache shrinks
    assert labels.sizes()["label_texts"] == 8
    labels.texts(base.gpus[:8], (("cluster", "a"),))
    assert labels.sizes()["label_texts"] == 8  # the texts without the cluster label went


def test_churned_renders_keep_every_cache_bounded_and_the_bytes_of_a_fresh_render():
    """Full renders (blocks, parts, joined inputs too) over 40 snapshots, one node in four
    replaced each time: every store stays at its size after the first render, and the body
    equals a render from an empty cache (pruning never changes the bytes)."""
    base = small_fleet()
    labels = LabelCache()
    render(base, labels)
    first = labels.sizes()
    snapshot = base
    for step in range(40):
        snapshot = churned(base, step, nodes=1)
        rendered = render(snapshot, labels)
        assert labels.sizes() == first, step
    assert rendered.text == render_text(snapshot, LabelCache())
