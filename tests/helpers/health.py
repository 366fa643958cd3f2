"""Snapshots for the health tests: GPUs with health counters, nodes in pools."""

from __future__ import annotations

from exporter.snapshot import Allocation, FleetSnapshot, Gpu, GpuHealth, Node, Placement, XidCount

T0 = 1_764_547_200.0


def gpu(node: str = "n1", index: int = 0, pool: str = "p", **health) -> Gpu:
    return Gpu(node, index, f"GPU-{node}-{index}", "h100", pool, health=GpuHealth(**health))


def xid_gpu(node: str, index: int, at: float, code: int = 79, count: int = 1,
            pool: str = "p") -> Gpu:
    """A GPU whose driver reported ``count`` XIDs ``code``, the last at ``at``."""
    return gpu(node, index, pool, xid_counts=(XidCount(code, count),), last_xid=code,
               last_xid_time=at)


def snap(at: float, *gpus: Gpu, allocations: tuple[Allocation, ...] = ()) -> FleetSnapshot:
    pools = {g.node: g.pool for g in gpus}
    return FleetSnapshot(at, tuple(Node(n, "h100", 64, pools[n], "hopper", 8) for n in sorted(pools)),
                         gpus, allocations)


def job(name: str, node: str, *gpus: int) -> Allocation:
    return Allocation(name, (Placement(node, gpus, 1.0, 4.0),))
