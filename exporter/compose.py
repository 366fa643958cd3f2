"""Compose an allocation source and a telemetry source into one snapshot.

Fragmentation is a property of allocations (which job holds which GPU), and the
scheduler knows those; telemetry (NVML on each node, dcgm-exporter, Prometheus)
knows how the GPUs behave. In cluster mode both are read and joined here:

- A GPU is matched by UUID where both sides have one, else by (node, GPU index).
  Slurm knows no UUID, so Slurm joins by (node, index): that holds when gres.conf
  lists ``File=/dev/nvidia[0-7]`` in index order, the usual setup.
- A UUID joins only within one node (:func:`exporter.node_names.same_node`: the same name
  without case, or a short name and its FQDN). Telemetry names the node it read, and a
  telemetry GPU carrying the UUID of a GPU the scheduler places on another node would
  otherwise speak for that node (an XID there drains it): it is not joined, both GPUs
  stay, each counted unmatched.
- A matched GPU keeps the scheduler's identity (node, index, pool), so the
  allocations' placements still point at it, and takes everything measured
  (values, UUID, model, MIG, up) from telemetry. It is stale if either side is.
- A GPU seen by one side only is kept, never dropped, and counted in
  :class:`UnmatchedGpus`, exported as ``gpufleet_compose_unmatched_gpus{side}``.
- Nodes, allocations and pending jobs come from the allocation side; telemetry
  adds nodes the scheduler does not know.

Pure functions on immutable snapshots: nothing here reads a source.
"""

from __future__ import annotations

import dataclasses

from exporter.node_names import same_node
from exporter.snapshot import FleetSnapshot, Gpu, UnmatchedGpus

ALLOCATION = "allocation"
TELEMETRY = "telemetry"


def _join(scheduled: Gpu, measured: Gpu) -> Gpu:
    model = measured.model if measured.model not in ("", "unknown") else scheduled.model
    return dataclasses.replace(
        measured,
        node=scheduled.node,
        index=scheduled.index,
        pool=scheduled.pool or measured.pool,
        uuid=measured.uuid or scheduled.uuid,
        model=model,
        stale=measured.stale or scheduled.stale,
    )


def compose(taken_at: float, allocation: FleetSnapshot, telemetry: FleetSnapshot) -> FleetSnapshot:
    """One snapshot from the scheduler's view and the telemetry view of the same fleet."""
    by_uuid: dict[str, list[int]] = {}
    for i, g in enumerate(telemetry.gpus):
        if g.uuid:
            by_uuid.setdefault(g.uuid, []).append(i)
    by_key = {g.key: i for i, g in enumerate(telemetry.gpus)}
    partner: list[int | None] = [None] * len(allocation.gpus)
    matched: set[int] = set()
    # UUIDs first, so a (node, index) guess never takes a GPU a UUID names elsewhere
    for position, gpu in enumerate(allocation.gpus):
        found = by_uuid.get(gpu.uuid, ()) if gpu.uuid else ()
        index = next((i for i in found if i not in matched and (
            telemetry.gpus[i].node == gpu.node or same_node(telemetry.gpus[i].node, gpu.node))),
            None)
        if index is not None:
            partner[position] = index
            matched.add(index)
    for position, gpu in enumerate(allocation.gpus):
        if partner[position] is not None:
            continue
        index = by_key.get(gpu.key)
        # two different UUIDs are two different GPUs, wherever they sit
        if index is None or index in matched or (gpu.uuid and telemetry.gpus[index].uuid):
            continue
        partner[position] = index
        matched.add(index)
    gpus: list[Gpu] = []
    allocation_only = 0
    for gpu, index in zip(allocation.gpus, partner, strict=True):
        if index is None:
            gpus.append(gpu)
            allocation_only += 1
        else:
            gpus.append(_join(gpu, telemetry.gpus[index]))
    telemetry_only = [g for i, g in enumerate(telemetry.gpus) if i not in matched]
    gpus += telemetry_only

    known_nodes = {n.name for n in allocation.nodes}
    nodes = allocation.nodes + tuple(n for n in telemetry.nodes if n.name not in known_nodes)
    return FleetSnapshot(
        taken_at=taken_at,
        nodes=nodes,
        gpus=tuple(gpus),
        allocations=allocation.allocations,
        pending=allocation.pending,
        sources=allocation.sources + telemetry.sources,
        unmatched=(
            UnmatchedGpus(ALLOCATION, allocation_only),
            UnmatchedGpus(TELEMETRY, len(telemetry_only)),
        ),
    )
