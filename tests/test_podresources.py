"""exporter/sources/nvml/podresources.py against a real grpcio server speaking the kubelet's v1 proto.

The server is in-process, on a unix socket in a temporary directory, and implements
``v1.PodResourcesLister`` from the vendored proto, so the client's requests, method paths,
deadlines and message-size limit all go through real gRPC. What it answers:

- the H100 node (``gpu-node-1``) of data/dcgm-samples/h100-8gpu-k8s-pod-labels.prom, a
  real GPU Operator node: its 8 GPU UUIDs, and pod
  ``dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5`` container ``main`` on GPU 0, as
  dcgm-exporter (which reads this same API) labelled it. The NUMA nodes are assumed
  (GPUs 0-3 on NUMA 0, 4-7 on NUMA 1, the usual HGX H100 layout).
- a MIG and time-slicing node: the resource names and id formats are the NVIDIA device
  plugin's (``nvidia.com/mig-1g.10gb`` with ``MIG-<uuid>`` ids; ``nvidia.com/gpu.shared``
  with ``GPU-<uuid>::<replica>`` ids, k8s-device-plugin ``internal/rm/devices.go``
  ``NewAnnotatedID``), but these UUIDs are made up: no published kubelet output with MIG
  devices was found.

No real kubelet runs here: the kubelet's side of the exchange is this server's
(tests/helpers/kubelet.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from exporter.sources.nvml.podresources import (
    Assignment,
    Device,
    Limits,
    NodeGpus,
    PodResourcesClient,
    PodResourcesError,
    is_gpu_resource,
    parse_allocatable,
    parse_list,
    physical_id,
)
from exporter.sources.nvml.podresources_v1 import api_pb2 as pb
from tests.helpers import REPO
from tests.helpers.kubelet import Kubelet, start_kubelet
from tests.test_source_isolation import FORBIDDEN, loaded

H100_SAMPLE = REPO / "data" / "dcgm-samples" / "h100-8gpu-k8s-pod-labels.prom"
H100_UUIDS = (  # gpu 0..7 of the sample, in index order
    "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
    "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a",
    "GPU-fbc2c554-4d37-8938-0032-f923bad0f716",
    "GPU-a65a773d-52bb-bcc1-a8ee-f78c3faa2e2d",
    "GPU-82e45d1b-1618-559f-144c-eab51545030b",
    "GPU-39e28159-8c62-ee71-64db-b748edd61e15",
    "GPU-e64d69ca-b4b3-59b2-e78c-94f26c4db365",
    "GPU-04d228d3-3b5a-3534-f5cf-969706647d56",
)
VLLM = ("dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5")


def topology(*numa: int) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa])


def h100_list() -> pb.ListPodResourcesResponse:
    """What the kubelet of gpu-node-1 lists: the vLLM worker on GPU 0, and the pods that hold
    no device (the kubelet lists every pod, with empty device lists), with exclusive CPUs."""
    return pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(name="nvidia-dcgm-exporter-7xk2p", namespace="gpu-operator",
                        containers=[pb.ContainerResources(name="nvidia-dcgm-exporter")]),
        pb.PodResources(name=VLLM[1], namespace=VLLM[0], containers=[
            pb.ContainerResources(
                name="main", cpu_ids=[2, 3, 4, 5],
                devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu",
                                             device_ids=[H100_UUIDS[0]], topology=topology(0))],
                memory=[pb.ContainerMemory(memory_type="memory", size=34359738368,
                                           topology=topology(0))]),
        ]),
    ])


def h100_allocatable() -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(
        devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[uuid],
                                     topology=topology(i // 4)) for i, uuid in enumerate(H100_UUIDS)],
        cpu_ids=list(range(2, 112)),
    )


A100 = "GPU-5d6a5a2c-0f32-3bd9-6f0c-4c1c1e5f7a21"
MIG_1G = ("MIG-0c57c2fb-5b3c-5a6e-9d4e-8f0b7d3f2a11", "MIG-1e9a4b5d-7c2f-5e8a-b3d1-6a4f0c9e2b22")
MIG_3G = "MIG-7f3e2d1c-4b5a-5968-8776-a5b4c3d2e133"
L4 = "GPU-9b8a7c6d-5e4f-3a2b-1c0d-ef9876543210"


def mig_list() -> pb.ListPodResourcesResponse:
    return pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(name="infer-0", namespace="serving", containers=[
            pb.ContainerResources(name="server", devices=[
                pb.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=list(MIG_1G),
                                    topology=topology(0)),
                # another vendor's device and a DRA claim: not the device plugin's GPUs
                pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["fpga-0"]),
            ], dynamic_resources=[pb.DynamicResource(
                claim_name="gpu-claim", claim_namespace="serving",
                claim_resources=[pb.ClaimResource(driver_name="gpu.nvidia.com", pool_name="node-a",
                                                  device_name="gpu-1")])]),
            pb.ContainerResources(name="sidecar"),
        ]),
        pb.PodResources(name="train-0", namespace="research", containers=[
            pb.ContainerResources(name="trainer", devices=[
                pb.ContainerDevices(resource_name="nvidia.com/mig-3g.40gb", device_ids=[MIG_3G])]),
        ]),
        # two pods time-sharing the L4 (4 replicas), one holding two replicas of it
        pb.PodResources(name="notebook-a", namespace="lab", containers=[
            pb.ContainerResources(name="jupyter", devices=[
                pb.ContainerDevices(resource_name="nvidia.com/gpu.shared",
                                    device_ids=[f"{L4}::0", f"{L4}::3"])])]),
        pb.PodResources(name="notebook-b", namespace="lab", containers=[
            pb.ContainerResources(name="jupyter", devices=[
                pb.ContainerDevices(resource_name="nvidia.com/gpu.shared", device_ids=[f"{L4}::1"])])]),
    ])


def mig_allocatable() -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(devices=[
        pb.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=list(MIG_1G),
                            topology=topology(0)),
        pb.ContainerDevices(resource_name="nvidia.com/mig-3g.40gb", device_ids=[MIG_3G],
                            topology=topology(0)),
        pb.ContainerDevices(resource_name="nvidia.com/gpu.shared",
                            device_ids=[f"{L4}::{r}" for r in range(4)], topology=topology(1)),
        pb.ContainerDevices(resource_name="example.com/fpga", device_ids=["fpga-0"]),
    ])


# --- pure parsing ----------------------------------------------------------------------


def test_gpu_resources_are_the_device_plugins() -> None:
    assert [n for n in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                        "nvidia.com/mig-3g.40gb.shared", "nvidia.com/mig-", "nvidia.com/gpus",
                        "amd.com/gpu", "cpu", "gpu.nvidia.com") if is_gpu_resource(n)] == [
        "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-3g.40gb.shared"]


def test_physical_id_strips_the_time_slice_replica() -> None:
    assert [physical_id(d) for d in (f"{L4}::3", L4, MIG_3G, f"{MIG_3G}::0")] == [L4, L4, MIG_3G, MIG_3G]


def test_parse_list_keeps_gpu_devices_only() -> None:
    assert parse_list(mig_list()) == (
        Assignment("serving", "infer-0", "server", "nvidia.com/mig-1g.10gb", MIG_1G, (0,)),
        Assignment("research", "train-0", "trainer", "nvidia.com/mig-3g.40gb", (MIG_3G,), ()),
        Assignment("lab", "notebook-a", "jupyter", "nvidia.com/gpu.shared", (f"{L4}::0", f"{L4}::3"), ()),
        Assignment("lab", "notebook-b", "jupyter", "nvidia.com/gpu.shared", (f"{L4}::1",), ()),
    )


def test_parse_allocatable() -> None:
    assert parse_allocatable(mig_allocatable()) == (
        Device("nvidia.com/mig-1g.10gb", MIG_1G[0], (0,)),
        Device("nvidia.com/mig-1g.10gb", MIG_1G[1], (0,)),
        Device("nvidia.com/mig-3g.40gb", MIG_3G, (0,)),
        *(Device("nvidia.com/gpu.shared", f"{L4}::{r}", (1,)) for r in range(4)),
    )


def test_parse_refuses_too_many_pods_or_devices() -> None:
    with pytest.raises(PodResourcesError) as caught:
        parse_list(mig_list(), Limits(max_pods=3))
    assert str(caught.value) == "List: 4 pods, over the limit of 3"
    with pytest.raises(PodResourcesError) as caught:
        parse_list(mig_list(), Limits(max_devices=5))
    assert str(caught.value) == "List: over 5 device ids"
    assert len(parse_list(mig_list(), Limits(max_devices=6))) == 4  # exactly at the limit
    with pytest.raises(PodResourcesError) as caught:
        parse_allocatable(mig_allocatable(), Limits(max_devices=6))
    assert str(caught.value) == "GetAllocatableResources: over 6 device ids"


def test_node_views() -> None:
    gpus = NodeGpus(parse_list(mig_list()), ())
    assert gpus.by_container() == {
        ("serving", "infer-0", "server"): MIG_1G,
        ("research", "train-0", "trainer"): (MIG_3G,),
        ("lab", "notebook-a", "jupyter"): (f"{L4}::0", f"{L4}::3"),
        ("lab", "notebook-b", "jupyter"): (f"{L4}::1",),
    }


def test_importing_it_loads_nothing_downstream() -> None:
    assert loaded("exporter.sources.nvml.podresources", FORBIDDEN) == []


# --- against a real grpcio server ------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # a unix socket path is at most 107 bytes: pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as directory:
        yield directory


@pytest.fixture
async def serve(socket_dir: str) -> AsyncIterator[Any]:
    servers: list[grpc.aio.Server] = []

    async def start(kubelet: Kubelet) -> str:
        path = os.path.join(socket_dir, "kubelet.sock")
        servers.append(await start_kubelet(kubelet, path))
        return path

    yield start
    for server in servers:
        await server.stop(grace=None)


slow = pytest.mark.slow  # an in-process gRPC server on a unix socket


def dcgm_pod_labels() -> dict[tuple[str, str, str], tuple[str, ...]]:
    """(namespace, pod, container) -> UUIDs, as dcgm-exporter labelled the real H100 node."""
    held: dict[tuple[str, str, str], set[str]] = {}
    for line in H100_SAMPLE.read_text().splitlines():
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("pod"):
            held.setdefault((labels["namespace"], labels["pod"], labels["container"]),
                            set()).add(labels["UUID"])
    return {key: tuple(sorted(uuids)) for key, uuids in held.items()}


@slow
async def test_the_h100_node_agrees_with_dcgm_exporters_pod_labels(serve: Any) -> None:
    kubelet = Kubelet(h100_list(), h100_allocatable())
    client = PodResourcesClient(await serve(kubelet))
    try:
        gpus = await client.read()
    finally:
        await client.close()
    assert gpus == NodeGpus(
        (Assignment(*VLLM, "main", "nvidia.com/gpu", (H100_UUIDS[0],), (0,)),),
        tuple(Device("nvidia.com/gpu", uuid, (i // 4,)) for i, uuid in enumerate(H100_UUIDS)))
    assert gpus.by_container() == dcgm_pod_labels() == {(*VLLM, "main"): (H100_UUIDS[0],)}
    assert kubelet.calls == ["List", "GetAllocatableResources"]


@slow
async def test_mig_and_time_slicing_over_grpc(serve: Any) -> None:
    client = PodResourcesClient(await serve(Kubelet(mig_list(), mig_allocatable())))
    try:
        gpus = await client.read()
        again = await client.read()  # one channel, reused
    finally:
        await client.close()
    assert gpus == again == NodeGpus(parse_list(mig_list()), parse_allocatable(mig_allocatable()))
    assert len(gpus.assignments) == 4 and len(gpus.allocatable) == 7


@slow
async def test_an_old_kubelet_without_get_allocatable(serve: Any) -> None:
    path = await serve(Kubelet(h100_list(), allocatable=None))
    client = PodResourcesClient(path)
    try:
        assert len(await client.list()) == 1
        with pytest.raises(PodResourcesError) as caught:
            await client.read()
    finally:
        await client.close()
    assert str(caught.value) == (f"kubelet PodResources GetAllocatableResources at {path}: "
                                 "UNIMPLEMENTED: Method not implemented!")


@slow
async def test_a_kubelet_that_does_not_answer_meets_the_deadline(serve: Any) -> None:
    stall = asyncio.Event()
    path = await serve(Kubelet(h100_list(), stall=stall))
    client = PodResourcesClient(path, Limits(timeout_seconds=0.2))
    try:
        with pytest.raises(PodResourcesError) as caught:
            await client.list()
    finally:
        stall.set()
        await client.close()
    # gRPC's detail varies by where the deadline struck ("Deadline Exceeded", "Stream removed
    # (Deadline Exceeded)"); the code and the place do not
    message = str(caught.value)
    assert message.startswith(f"kubelet PodResources List at {path}: DEADLINE_EXCEEDED: ")
    assert "Deadline Exceeded" in message


@slow
async def test_an_oversized_answer_is_refused_by_grpc(serve: Any) -> None:
    """The size cap holds before the message is parsed: gRPC refuses it on the wire."""
    big = pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(name=f"pod-{i}", namespace="ns", containers=[pb.ContainerResources(
            name="c", devices=[pb.ContainerDevices(resource_name="nvidia.com/gpu",
                                                   device_ids=[H100_UUIDS[i % 8]])])])
        for i in range(100)])
    assert big.ByteSize() > 4096
    path = await serve(Kubelet(big))
    client = PodResourcesClient(path, Limits(max_message_bytes=4096))
    try:
        with pytest.raises(PodResourcesError) as caught:
            await client.list()
    finally:
        await client.close()
    assert str(caught.value).startswith(f"kubelet PodResources List at {path}: RESOURCE_EXHAUSTED: ")
    assert f"larger than max ({big.ByteSize()} vs. 4096)" in str(caught.value)


async def test_no_socket(socket_dir: str) -> None:
    path = os.path.join(socket_dir, "kubelet.sock")
    client = PodResourcesClient(path)
    with pytest.raises(PodResourcesError) as caught:
        await client.read()
    assert str(caught.value) == (
        f"kubelet PodResources socket {path}: No such file or directory (on a Kubernetes node, "
        "mount /var/lib/kubelet/pod-resources into the container)")
    open(path, "w").close()
    with pytest.raises(PodResourcesError) as caught:
        await client.read()
    assert str(caught.value) == f"kubelet PodResources socket {path}: not a socket"
    await client.close()


@slow
async def test_a_kubelet_gone_after_the_first_read(serve: Any, socket_dir: str) -> None:
    """A socket left behind by a kubelet that died: UNAVAILABLE, one line, no traceback."""
    import socket

    path = os.path.join(socket_dir, "dead.sock")
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(path)  # bound, never listening: what a crashed kubelet leaves
        client = PodResourcesClient(path, Limits(timeout_seconds=2))
        try:
            with pytest.raises(PodResourcesError) as caught:
                await client.list()
        finally:
            await client.close()
    assert str(caught.value).startswith(f"kubelet PodResources List at {path}: UNAVAILABLE: ")
    assert "\n" not in str(caught.value)
