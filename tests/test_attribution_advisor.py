"""The advisor on a shared GPU reads each tenant's own use (exporter/attribution/jobs.py):
a busy tenant beside an idle one no longer makes the idle one look busy, and a tenant's
memory peak is its own processes', not the whole GPU's."""

from __future__ import annotations

from exporter.advisor.engine import memory_peaks
from exporter.attribution.jobs import job_use
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    GpuProcesses,
    Node,
    OwnerUse,
    Placement,
)
from tests.test_advisor_engine import make, report

GIB = 1024**3


def shared_fleet(t: float, processes: bool = True) -> FleetSnapshot:
    """One H200 time-sliced between two notebooks (half each): lab/busy at 85% SM, lab/idle
    with a process holding memory but running nothing; the GPU reads 85% busy."""
    owners = GpuProcesses((OwnerUse("pod", "lab/busy", "main", processes=1,
                                    memory_used_bytes=30 * GIB, sm_utilization_ratio=0.85),
                           OwnerUse("pod", "lab/idle", "main", processes=1,
                                    memory_used_bytes=10 * GIB, sm_utilization_ratio=0.0)))
    node = Node("h1", "H200", 64.0, "pool-h1", "hopper", 8)
    gpu = Gpu("h1", 0, "GPU-h1-0", "H200", "pool-h1", utilization_ratio=0.85,
              memory_used_bytes=40 * GIB, processes=owners if processes else None)
    jobs = tuple(Allocation(f"lab/{name}", (Placement("h1", (0,), 0.5, 1.0),), namespace="lab",
                            pod=name, account="lab") for name in ("busy", "idle"))
    return FleetSnapshot(t, (node,), (gpu,), jobs)


def reclaimed(processes: bool) -> list[str]:
    advisor, clock = make()
    result: list[dict] = []
    for t in (0.0, 3600.0, 7300.0):
        clock[0] = t
        result = advisor.observe(shared_fleet(t, processes), report(30))["reclaim"]
    return [r["job"] for r in result]


def test_the_idle_tenant_of_a_shared_gpu_is_idle_beside_a_busy_one() -> None:
    assert reclaimed(processes=True) == ["lab/idle"]
    assert reclaimed(processes=False) == []  # the GPU's 85% is both tenants' without them


def test_a_tenants_memory_peak_is_its_own_processes() -> None:
    assert memory_peaks(shared_fleet(0.0), {}) == {"lab/busy": 30 * GIB, "lab/idle": 10 * GIB}
    assert memory_peaks(shared_fleet(0.0, processes=False), {}) == {}  # unknown, as before


def test_a_tenant_without_a_process_uses_none_and_the_hosts_is_nobodys() -> None:
    gpu = Gpu("h1", 0, "u", "H200", "", processes=GpuProcesses((
        OwnerUse("host", processes=1, memory_used_bytes=GIB, sm_utilization_ratio=0.5),
        OwnerUse("slurm", "77", step="0", rank="0", processes=1, memory_used_bytes=GIB,
                 sm_utilization_ratio=0.25),
        OwnerUse("slurm", "77", step="0", rank="1", processes=1, memory_used_bytes=2 * GIB,
                 sm_utilization_ratio=0.5))))
    use = job_use([gpu])
    assert use.sm("h1", 0, "77") == 0.75 and use.memory("h1", 0, "77") == 3 * GIB
    assert use.sm("h1", 0, "other") == 0.0 and use.memory("h1", 0, "other") is None
    assert use.sm("h1", 1, "77") is None  # a GPU whose processes were not read
    mig = Gpu("h1", 2, "m", "H200", "", mig=(), processes=GpuProcesses((
        OwnerUse("pod", "a/b", processes=1, memory_used_bytes=GIB),)))
    assert job_use([mig]).sm("h1", 2, "a/b") is None  # no SM samples: not read as idle
