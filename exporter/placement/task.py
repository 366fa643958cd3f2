"""What a task asks of a node: the engine's input (:class:`Task`) and what scoring keeps of it (:class:`Ask`).

Both the engine and the policies read these, so they live apart from either:
the engine calls the policies, and neither needs the other's module for a task.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.analysis.state import EPS
from exporter.analysis.workload import Shape
from exporter.snapshot import Allocation
from exporter.snapshot import Placement as SnapshotPlacement


@dataclass(frozen=True, slots=True)
class Task:
    """What one task asks of one node.

    ``gpu_share`` is the share of each of its ``gpus`` GPUs (1.0 whole);
    ``models`` the GPU models it may run on (empty: any);
    ``gpu_memory_need_bytes`` the memory it needs per GPU, when it says
    (the ``tiered`` policy picks models by it; the openb trace gives none);
    ``host_memory_bytes`` the node memory it asks for, which only a
    :class:`~exporter.placement.engine.Placer` told the nodes' memory checks
    (as Kubernetes filters on it).
    """

    cpus: float = 0.0
    gpus: int = 0
    gpu_share: float = 1.0
    models: tuple[str, ...] = ()
    gpu_memory_need_bytes: int | None = None
    host_memory_bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.cpus < 0 or self.gpus < 0:
            raise ValueError(f"a task needs cpus >= 0 and gpus >= 0, got {self.cpus}, {self.gpus}")
        if self.gpus and not 0 < self.gpu_share <= 1 + EPS:
            raise ValueError(f"gpu_share must be in (0, 1], got {self.gpu_share}")

    @property
    def cpu_only(self) -> bool:
        return self.gpus == 0

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for, fractional shares summed."""
        return 0.0 if self.cpu_only else self.gpus * self.gpu_share

    @classmethod
    def from_shape(cls, shape: Shape, gpu_memory_need_bytes: int | None = None,
                   host_memory_bytes: float = 0.0) -> Task:
        if shape.cpu_only:
            return cls(shape.cpus, 0, 1.0, (), None, host_memory_bytes)
        return cls(shape.cpus, shape.gpus, shape.gpu_share, shape.models, gpu_memory_need_bytes,
                   host_memory_bytes)

    @classmethod
    def from_allocation(cls, alloc: Allocation, part: SnapshotPlacement) -> Task:
        """The task one node's part of a running job is: what re-placing it must find room for.

        Its models are the job's own allowed list; the advisor's planner narrows them to
        the job's memory tier.
        """
        gpus = len(part.gpus)
        return cls(part.cpus, gpus, part.gpu_share if gpus else 1.0, alloc.allowed_models,
                   alloc.gpu_memory_need_bytes)


@dataclass(frozen=True, slots=True)
class Ask:
    """A task reduced to what scoring needs; hashable, so per-shape results can be kept."""

    kind: str  # cpu | whole | frac1 (one fractional GPU) | fracn (several fractional GPUs)
    cpus: float
    gpus: int
    share: float

    @classmethod
    def of(cls, task: Task) -> Ask:
        if task.cpu_only:
            return cls("cpu", task.cpus, 0, 0.0)
        if task.gpu_share >= 1.0 - EPS:
            return cls("whole", task.cpus, task.gpus, 1.0)
        return cls("frac1" if task.gpus == 1 else "fracn", task.cpus, task.gpus, task.gpu_share)

    @property
    def demand(self) -> float:
        return self.gpus * self.share


__all__ = ["Ask", "Task"]
