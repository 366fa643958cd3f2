"""Which families this process serves: :class:`ExpositionOptions`."""

from __future__ import annotations

from dataclasses import dataclass

from exporter import metrics
from exporter.metrics import FamilySpec, Labels


@dataclass(frozen=True, slots=True)
class ExpositionOptions:
    """What this process serves, so that node mode and cluster mode side by side under one
    Prometheus give one copy of each series (docs/deploy.md, "Node mode and cluster mode").

    Each catalogue family has a producer (:attr:`exporter.metrics.FamilySpec.producer`):

    - ``node``: read from the GPUs and nodes themselves: every per-GPU telemetry family
      (:data:`~exporter.exposition.families.GPU_FAMILIES`), ``gpu_info``, the MIG families,
      ``node_info`` and ``node_cpu_cores``. Served only with ``per_gpu``: a cluster-mode
      process reading them from Prometheus would serve a second copy of what the node
      exporters serve.
    - ``scheduler``: the scheduler's view joined to the GPUs: ``gpu_allocated_ratio``,
      ``gpu_allocation_info``, ``allocation_*``, ``node_cpu_allocated_cores``, ``pending_*``.
      Served only where this process knows the jobs: it reads the scheduler (a source whose
      role is ``allocation``: Slurm, Kubernetes) or is one (the simulator; dcgm-exporter's pod
      labels; NVML with the kubelet's PodResources), whatever ``per_gpu`` says. Plain NVML
      knows no jobs: its zeros beside cluster mode's Slurm view would count every GPU idle.
      Read back from Prometheus they would be a copy.
    - ``fleet``: computed by this process over its whole snapshot, or about itself:
      fragmentation, pools, the advisor, source health, composition, build info. Always.

    ``cluster`` (the config's top-level key) is one more label on every series served,
    merged in sorted place by the label-text functions; empty: no label.
    """

    per_gpu: bool = True
    reads_scheduler: bool = True  # the defaults serve every family (the simulated fleet)
    cluster: str = ""

    def serves(self, spec: FamilySpec) -> bool:
        producer = spec.producer
        if producer == "node":
            return self.per_gpu
        if producer == "scheduler":
            # only where jobs are known: a plain NVML node exporter knows none, and its zeros
            # beside cluster mode's Slurm view would count every GPU as idle
            return self.reads_scheduler
        return True

    def serves_name(self, name: str) -> bool:
        spec = metrics.CATALOGUE.get(name)
        return spec is None or self.serves(spec)

    @property
    def const_labels(self) -> Labels:
        return (("cluster", self.cluster),) if self.cluster else ()


EVERY_FAMILY = ExpositionOptions()  # the defaults: every family served, no cluster label
