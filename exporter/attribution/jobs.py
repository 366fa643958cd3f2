"""Per job, what its own processes use of each GPU: what the advisor reads on a shared GPU.

A GPU shared by several jobs (time-slicing, MPS, MIG) reports one utilisation and one used
memory for all of them: the busy tenant makes the idle one look busy, and a tenant's memory
peak is everyone's. Where the NVML source read the GPU's processes, a job's share of them
(``Gpu.processes``, its owners whose ``job`` is the allocation's: ``<namespace>/<pod>`` or the
Slurm job id) is its own use. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exporter.snapshot import Gpu


@dataclass(frozen=True, slots=True)
class JobUse:
    memory_used_bytes: int | None  # None: NVML gave no per-process memory
    sm_utilization_ratio: float | None  # None: no per-process samples (MIG, older GPUs)


@dataclass(frozen=True, slots=True)
class GpuJobUse:
    """The jobs' own use of the GPUs whose processes were read."""

    jobs: dict[tuple[str, int, str], JobUse]  # (node, GPU index, job) -> its processes' use
    read: dict[tuple[str, int], bool]  # (node, GPU index) -> whether SM samples were there

    def sm(self, node: str, gpu: int, job: str) -> float | None:
        """The job's SM use of the GPU: its processes' (0 with none running there), or None
        where the GPU's processes or their samples were not read."""
        if not self.read.get((node, gpu)):
            return None
        use = self.jobs.get((node, gpu, job))
        return 0.0 if use is None or use.sm_utilization_ratio is None else use.sm_utilization_ratio

    def memory(self, node: str, gpu: int, job: str) -> int | None:
        """The job's processes' memory on the GPU; None where not read or not given."""
        use = self.jobs.get((node, gpu, job))
        return None if use is None else use.memory_used_bytes


def job_use(gpus: Iterable[Gpu]) -> GpuJobUse:
    jobs: dict[tuple[str, int, str], JobUse] = {}
    read: dict[tuple[str, int], bool] = {}
    for gpu in gpus:
        processes = gpu.processes
        if processes is None or not gpu.up or gpu.stale:
            continue
        sampled = not gpu.mig and all(o.sm_utilization_ratio is not None for o in processes.owners)
        read[gpu.key] = sampled
        for owner in processes.owners:
            if not owner.job:
                continue  # the host's: no allocation's
            key = (gpu.node, gpu.index, owner.job)
            before = jobs.get(key)
            memory, sm = owner.memory_used_bytes, owner.sm_utilization_ratio
            if before is not None:  # containers, steps and ranks of one job add up
                memory = _add(before.memory_used_bytes, memory)
                sm = None if before.sm_utilization_ratio is None or sm is None \
                    else min(1.0, before.sm_utilization_ratio + sm)
            jobs[key] = JobUse(memory, sm)
    return GpuJobUse(jobs, read)


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


__all__ = ["GpuJobUse", "JobUse", "job_use"]
