"""Which pod holds which of this node's GPUs: the kubelet's PodResources joined to NVML (issue 18).

On a Kubernetes node the NVIDIA device plugin chooses the GPUs of each pod, and only the
kubelet remembers the choice; it says it on its PodResources socket
(:mod:`exporter.sources.nvml.podresources`). With ``sources.nvml.pod_resources`` on, the nvml
source reads that socket at each collection and serves every pod holding GPUs here as an
:class:`~exporter.snapshot.Allocation` on the exact GPUs, so ``gpufleet_gpu_allocation_info``
and the other scheduler families are served in node mode, as dcgm-exporter's ``pod`` labels
are.

Why an option of the nvml source and not a source of its own
    The kubelet names devices by UUID (``GPU-<uuid>``, ``MIG-<uuid>``, ``GPU-<uuid>::<n>``);
    gpufleet's placements are by (node, GPU index). Only NVML on this node knows which
    index a GPU UUID is, and which GPU and GPU instance a MIG UUID belongs to. A separate
    ``role = "allocation"`` source would have to guess the indices, and
    :mod:`exporter.compose` keeps the allocation side's index on a match (right for Slurm,
    whose indices are its own; wrong for a guess). dcgm-exporter makes the same choice: its
    ``--kubernetes`` is an option of the telemetry exporter, which reads this same API.
    With the option on, the nvml source ``schedules`` (the source contract in
    :mod:`exporter.sources`), so this process serves the scheduler's families.

What maps to what (:func:`join`)
    - ``GPU-<uuid>`` (``nvidia.com/gpu``): the NVML GPU with that UUID, share 1.
    - ``MIG-<uuid>`` (``nvidia.com/mig-<profile>``): the GPU whose MIG device NVML names
      so (``nvmlDeviceGetUUID`` on the MIG handle), share g/7 of its profile ``<g>g.<mem>``;
      a pod's slices of one GPU add up.
    - ``GPU-<uuid>::<n>`` (time-slicing, ``nvidia.com/gpu`` or ``nvidia.com/gpu.shared``):
      replica n of that GPU, share 1/replicas, where replicas is how many ids of that GPU
      ``GetAllocatableResources`` lists (the device plugin advertises each GPU that many
      times). A pod holding two replicas holds 2/replicas.
    - The job is ``<namespace>/<pod>`` and the account the namespace, as the dcgm source
      names dcgm-exporter's pod labels; the pod's containers are one allocation (the pod is
      what Kubernetes schedules and evicts; gpufleet's families have no ``container``
      label). Owners, priorities and memory needs are the apiserver's (the ``kubernetes``
      source, cluster mode), not the kubelet's.
    - A device id NVML does not know (a GPU not seen at start, a MIG UUID NVML did not
      give, a replica of a GPU not in the allocatable list) is left out and counted in
      :attr:`Joined.unknown`, never placed on a guessed GPU; so are the devices of a pod
      whose namespace or name Kubernetes would not accept (empty, over 253 characters,
      unprintable), since they become label values.

Failure
    The kubelet is the nvml source's one target, ``unix://<socket>``. A missing socket, a
    kubelet that is down or slow, or an oversized answer marks that target down with the
    client's one-line reason (``gpufleet_source_up{source="nvml",target="unix://..."} 0``);
    the kubelet's last good answer is joined to the fresh GPUs and served for
    ``pod_resources_stale_for`` (:class:`~exporter.sources.lastgood.LastGood`), then
    dropped. NVML's GPUs stay fresh and the nvml source up: the kubelet's trouble is not
    the GPUs'. Both calls run beside the GPUs' NVML reads, each bounded by
    ``pod_resources_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.errors import one_line
from exporter.snapshot import Allocation, Gpu, Placement
from exporter.sources import Clock, TargetStatus
from exporter.sources.lastgood import LastGood
from exporter.sources.mig import mig_share
from exporter.sources.nvml.podresources import (
    REPLICA_SEPARATOR,
    Limits,
    NodeGpus,
    PodResourcesClient,
    PodResourcesError,
    physical_id,
)

log = logging.getLogger(__name__)

MAX_NAME = 253  # longest name Kubernetes accepts (a DNS subdomain); a longer one is not a pod's


def _name_ok(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME and name.isprintable()


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device NVML reported: its UUID, its GPU, its GPU instance and profile."""

    uuid: str
    gpu_index: int
    instance_id: int
    profile: str  # e.g. "1g.10gb"


@dataclass(frozen=True, slots=True)
class Joined:
    allocations: tuple[Allocation, ...]
    unknown: int  # device ids held by a pod that NVML does not know: left out


def join(node: str, gpus: Iterable[Gpu], migs: Iterable[MigDevice], answer: NodeGpus) -> Joined:
    """The kubelet's assignments as allocations on NVML's GPUs. Pure."""
    by_uuid = {g.uuid: g.index for g in gpus if g.uuid}
    by_mig = {m.uuid: m for m in migs}
    replicas: dict[str, int] = {}
    for device in answer.allocatable:
        if REPLICA_SEPARATOR in device.device_id:
            key = physical_id(device.device_id)
            replicas[key] = replicas.get(key, 0) + 1
    held: dict[tuple[str, str], dict[int, float]] = {}  # (namespace, pod) -> index -> share
    unknown = 0
    for assignment in answer.assignments:
        if not (_name_ok(assignment.namespace) and _name_ok(assignment.pod)):
            unknown += len(assignment.device_ids)
            continue
        shares = held.setdefault((assignment.namespace, assignment.pod), {})
        for device_id in assignment.device_ids:
            uuid = physical_id(device_id)
            if uuid in by_uuid:
                index, share = by_uuid[uuid], 1.0
            elif uuid in by_mig:
                mig = by_mig[uuid]
                index, share = mig.gpu_index, mig_share(mig.profile)
            else:
                unknown += 1
                continue
            if REPLICA_SEPARATOR in device_id:
                if not replicas.get(uuid):  # how many share it is unknown: no guess
                    unknown += 1
                    continue
                share /= replicas[uuid]
            shares[index] = min(1.0, shares.get(index, 0.0) + share)
    allocations = []
    for (namespace, pod), shares in sorted(held.items()):
        if not shares:
            continue
        # one placement per share value: a Placement holds one share for its GPUs
        by_share: dict[float, list[int]] = {}
        for index, share in shares.items():
            by_share.setdefault(round(share, 6), []).append(index)
        placements = tuple(Placement(node, tuple(sorted(indexes)), share, 0.0)
                           for share, indexes in sorted(by_share.items()))
        allocations.append(Allocation(job=f"{namespace}/{pod}", placements=placements,
                                      namespace=namespace, pod=pod, account=namespace))
    return Joined(tuple(allocations), unknown)


class PodGpus:
    """The kubelet side of the nvml source: one client, its last good answer, its status.

    :meth:`fetch` asks the kubelet (start it as a task beside the NVML reads);
    :meth:`join` then places its answer, or the last good one, on the GPUs just read."""

    KEY = "kubelet"

    def __init__(self, client: PodResourcesClient, stale_for: float, clock: Clock) -> None:
        self.client = client
        self.clock = clock
        self.target = f"unix://{client.socket_path}"
        self._last_good: LastGood[str, NodeGpus] = LastGood(lambda answer: answer,
                                                            max_age=stale_for)
        self._last_success: float | None = None
        self._error = ""
        self._duration = 0.0
        self._unknown = 0

    async def fetch(self) -> None:
        """Both calls at once, each bounded by the client's deadline. Never raises (but for a
        cancellation): what went wrong becomes the target's one-line error."""
        started = time.perf_counter()
        try:
            # return_exceptions: one call failing must not leave the other running unawaited
            listed, devices = await asyncio.gather(self.client.list(), self.client.allocatable(),
                                                   return_exceptions=True)
            if isinstance(listed, BaseException):
                raise listed
            if isinstance(devices, BaseException):
                raise devices
            assignments, allocatable = listed, devices
        except Exception as exc:  # whatever the kubelet does, the GPUs' read goes on
            error = str(exc) if isinstance(exc, PodResourcesError) else one_line(
                f"kubelet PodResources at {self.client.socket_path}: {type(exc).__name__}: {exc}")
            if not self._error:
                log.warning("kubelet PodResources unreadable; serving its last answer",
                            extra={"err": error})
            self._error = error
            # a new channel next time: gRPC's own reconnection backs off (up to 120 s), which
            # would keep a restarted kubelet unread for minutes after it is back
            await self.client.close()
        else:
            if self._error:
                log.info("kubelet PodResources answers again", extra={"target": self.target})
            self._error = ""
            now = self.clock()
            self._last_good.remember(self.KEY, NodeGpus(assignments, allocatable), now)
            self._last_success = now
        finally:
            self._duration = time.perf_counter() - started

    def join(self, node: str, gpus: Sequence[Gpu],
             migs: Iterable[MigDevice]) -> tuple[tuple[Allocation, ...], TargetStatus]:
        """The pods' allocations on ``gpus`` and the kubelet's status, after :meth:`fetch`."""
        answer = self._last_good.recall(self.KEY, self.clock())
        joined = join(node, gpus, migs, answer) if answer is not None else Joined((), 0)
        if joined.unknown != self._unknown:
            if joined.unknown:  # once per change, not every collection
                log.warning("the kubelet names GPU devices NVML does not know; left out",
                            extra={"count": joined.unknown})
            self._unknown = joined.unknown
        status = TargetStatus(self.target, up=not self._error, error=self._error,
                              last_success_time=self._last_success,
                              duration_seconds=self._duration)
        return joined.allocations, status

    async def close(self) -> None:
        await self.client.close()


def build(socket_path: str, timeout: float, stale_for: float, clock: Clock) -> PodGpus:
    return PodGpus(PodResourcesClient(socket_path, Limits(timeout_seconds=timeout)), stale_for,
                   clock)
