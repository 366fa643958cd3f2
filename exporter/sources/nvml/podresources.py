"""The kubelet's PodResources API: which GPU, by UUID, each container on this node holds.

In node mode the Kubernetes source knows that a pod asked for ``nvidia.com/gpu: 2``, but
not which two: the device plugin chose them, and only the kubelet remembers. It serves
the answer on a unix socket, ``/var/lib/kubelet/pod-resources/kubelet.sock``, as the gRPC
service ``v1.PodResourcesLister`` (vendored proto: ``podresources_v1/api.proto``). This is
what dcgm-exporter reads to put ``pod``/``namespace``/``container`` labels on a GPU; here
it gives each pod the GPU UUIDs it holds, so :mod:`exporter.compose` can join the
scheduler's view to telemetry by UUID.

What comes back, for the resources the NVIDIA device plugin advertises:

- ``nvidia.com/gpu``: device ids are GPU UUIDs (``GPU-c4529c8d-...``);
- ``nvidia.com/mig-<profile>`` (MIG strategy ``mixed``): MIG device UUIDs (``MIG-...``);
- time-slicing: a GPU shared by N replicas is advertised as N devices,
  ``GPU-<uuid>::0`` .. ``::N-1`` (k8s-device-plugin ``internal/rm/devices.go``,
  ``NewAnnotatedID``); with ``renameByDefault`` the resource is ``nvidia.com/gpu.shared``.
  :func:`physical_id` strips the replica suffix.

Other resources (CPUs, memory, other vendors' devices, DRA claims, which the Kubernetes
source reads from ``ResourceClaim`` status instead) are left out.

Every answer is bounded before it is used: the message size by gRPC itself
(``max_message_bytes``, 16 MiB by default: a node at the kubelet's 110-pod default with
8 GPUs each is about 20 KB), then the number of pods and device ids. Each call has a
deadline. Whatever goes wrong (no socket, kubelet down, deadline, oversize, a kubelet
too old for ``GetAllocatableResources``) is one :class:`PodResourcesError` with a
one-line message; the caller (the Kubernetes source) marks itself down and serves its
last good view, as the source contract says.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

import grpc

from exporter.errors import one_line
from exporter.sources.nvml.podresources_v1 import api_pb2, api_pb2_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = ".shared"  # time-slicing with renameByDefault: nvidia.com/gpu.shared
REPLICA_SEPARATOR = "::"  # GPU-<uuid>::<replica>, the device plugin's AnnotatedID


class PodResourcesError(Exception):
    """The kubelet's PodResources API could not be read. The message is one line."""


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_seconds: float = 5.0  # per call; dcgm-exporter uses 10 s for the whole List
    max_message_bytes: int = 16 * 1024 * 1024
    max_pods: int = 5_000  # the kubelet's maxPods defaults to 110; 5,000 leaves room for any
    max_devices: int = 100_000  # GPU device ids in one answer: 5,000 pods x 8 GPUs, x2.5


@dataclass(frozen=True, slots=True)
class Assignment:
    """The GPU devices of one resource that one container holds."""

    namespace: str
    pod: str
    container: str
    resource: str  # nvidia.com/gpu, nvidia.com/mig-1g.10gb, nvidia.com/gpu.shared
    device_ids: tuple[str, ...]  # as the device plugin reports them
    numa_nodes: tuple[int, ...] = ()  # the devices' NUMA nodes, when the plugin reports them


@dataclass(frozen=True, slots=True)
class Device:
    """One device the kubelet can hand out (GetAllocatableResources)."""

    resource: str
    device_id: str
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """What the kubelet says about this node's GPUs: who holds which, and what exists."""

    assignments: tuple[Assignment, ...]
    allocatable: tuple[Device, ...]

    def by_container(self) -> dict[tuple[str, str, str], tuple[str, ...]]:
        """(namespace, pod, container) -> its GPU device ids, over all GPU resources."""
        held: dict[tuple[str, str, str], tuple[str, ...]] = {}
        for a in self.assignments:
            key = (a.namespace, a.pod, a.container)
            held[key] = held.get(key, ()) + a.device_ids
        return held


def is_gpu_resource(name: str) -> bool:
    """Whether ``name`` is a resource the NVIDIA device plugin advertises (whole, MIG, shared)."""
    base = name.removesuffix(SHARED_SUFFIX)
    return base == GPU_RESOURCE or (base.startswith(MIG_RESOURCE_PREFIX)
                                    and len(base) > len(MIG_RESOURCE_PREFIX))


def physical_id(device_id: str) -> str:
    """The GPU or MIG UUID of a device id: ``GPU-x::2`` (time-slice replica 2) -> ``GPU-x``."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def _numa(devices: Any) -> tuple[int, ...]:
    if not devices.HasField("topology"):
        return ()
    return tuple(sorted({int(n.ID) for n in devices.topology.nodes}))


class _Budget:
    """Counts pods and device ids against :class:`Limits` while a response is read."""

    def __init__(self, limits: Limits, what: str) -> None:
        self.limits, self.what, self.devices = limits, what, 0

    def pods(self, count: int) -> None:
        if count > self.limits.max_pods:
            raise PodResourcesError(f"{self.what}: {count:,} pods, over the limit of "
                                    f"{self.limits.max_pods:,}")

    def take(self, count: int) -> None:
        self.devices += count
        if self.devices > self.limits.max_devices:
            raise PodResourcesError(f"{self.what}: over {self.limits.max_devices:,} device ids")


def parse_list(response: Any, limits: Limits = Limits()) -> tuple[Assignment, ...]:
    """The GPU assignments in a ``ListPodResourcesResponse``, in the kubelet's order.

    Pure: the tests hand it messages built from the proto."""
    budget = _Budget(limits, "List")
    budget.pods(len(response.pod_resources))
    found: list[Assignment] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                budget.take(len(devices.device_ids))
                found.append(Assignment(pod.namespace, pod.name, container.name,
                                        devices.resource_name, tuple(devices.device_ids),
                                        _numa(devices)))
    return tuple(found)


def parse_allocatable(response: Any, limits: Limits = Limits()) -> tuple[Device, ...]:
    """The GPU devices in an ``AllocatableResourcesResponse``."""
    budget = _Budget(limits, "GetAllocatableResources")
    found: list[Device] = []
    for devices in response.devices:
        if not is_gpu_resource(devices.resource_name):
            continue
        budget.take(len(devices.device_ids))
        numa = _numa(devices)
        found.extend(Device(devices.resource_name, d, numa) for d in devices.device_ids)
    return tuple(found)


class PodResourcesClient:
    """A client of one kubelet's PodResources socket; one channel, reused across reads.

    ``socket_path`` is a parameter (not a global) so tests serve the real proto from a
    grpcio server on a socket in a temporary directory. The channel is bound to the event
    loop of the first call: use one client from one loop, and ``close()`` it there."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, limits: Limits = Limits()) -> None:
        self.socket_path = socket_path
        self.limits = limits
        self._channel: grpc.aio.Channel | None = None

    def _stub(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{os.path.abspath(self.socket_path)}",
                options=[
                    ("grpc.max_receive_message_length", self.limits.max_message_bytes),
                    # the requests are empty messages: nothing larger is ever sent
                    ("grpc.max_send_message_length", 1024),
                    # one answer per call: a retry would hide a kubelet that is down
                    ("grpc.enable_retries", 0),
                    # a channel of its own connection: the global subchannel pool would keep
                    # a failed connection's reconnect backoff (up to 120 s) across channels,
                    # so a restarted kubelet would stay unread for minutes after it is back
                    ("grpc.use_local_subchannel_pool", 1),
                    # a local socket: retrying a connection within a second costs nothing
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
        return api_pb2_grpc.PodResourcesListerStub(self._channel)

    def _check_socket(self) -> None:
        # gRPC reports a missing socket as a generic UNAVAILABLE after its deadline; this
        # says at once what is wrong and where
        try:
            mode = os.stat(self.socket_path).st_mode
        except OSError as exc:
            raise PodResourcesError(
                f"kubelet PodResources socket {self.socket_path}: {exc.strerror} (on a Kubernetes "
                "node, mount /var/lib/kubelet/pod-resources into the container)") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError(f"kubelet PodResources socket {self.socket_path}: not a socket")

    async def _call(self, method: str, request: Any) -> Any:
        self._check_socket()
        call = getattr(self._stub(), method)
        try:
            return await call(request, timeout=self.limits.timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            detail = exc.details() or ""
            raise PodResourcesError(one_line(
                f"kubelet PodResources {method} at {self.socket_path}: {exc.code().name}"
                + (f": {detail}" if detail else ""))) from None

    async def list(self) -> tuple[Assignment, ...]:
        response = await self._call("List", api_pb2.ListPodResourcesRequest())
        return parse_list(response, self.limits)

    async def allocatable(self) -> tuple[Device, ...]:
        response = await self._call("GetAllocatableResources",
                                    api_pb2.AllocatableResourcesRequest())
        return parse_allocatable(response, self.limits)

    async def read(self) -> NodeGpus:
        """Both calls: who holds which GPU, and which GPUs the kubelet can hand out."""
        assignments = await self.list()
        return NodeGpus(assignments, await self.allocatable())

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


__all__ = ["DEFAULT_SOCKET", "Assignment", "Device", "Limits", "NodeGpus", "PodResourcesClient",
           "PodResourcesError", "is_gpu_resource", "parse_allocatable", "parse_list",
           "physical_id"]
