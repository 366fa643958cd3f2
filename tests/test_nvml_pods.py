"""exporter/sources/nvml/pods.py: node mode on Kubernetes, the kubelet's PodResources joined to NVML.

The node is the real H100 node of data/dcgm-samples/h100-8gpu-k8s-pod-labels.prom
(``gpu-node-1``, its 8 GPU UUIDs in index order, and the vLLM worker on GPU 0 as
dcgm-exporter labelled it; tests/test_podresources.py). The rest of its workload is made
up, to cover every kind of device id the NVIDIA device plugin hands out: a pod with two
containers on GPUs 1 and 2, two notebooks time-sharing GPU 3 (4 replicas; one holds two),
two pods on MIG instances of GPU 4 (MIG mode on: a 3g.40gb and a 1g.10gb instance, whose
UUIDs are the fake pynvml's), and a pod holding a GPU NVML does not know.

NVML is the fake pynvml (tests/helpers/fake_pynvml.py); the kubelet is a real grpcio server
speaking the kubelet's v1 proto on a unix socket (tests/helpers/kubelet.py). No real kubelet
or GPU is involved.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from exporter.collect import Collector
from exporter.config import Config, ConfigError, Duration
from exporter.config import build as build_config
from exporter.snapshot import Allocation, Gpu, Placement
from exporter.sources.nvml.options import POD_RESOURCES_SOCKET, NvmlSource
from exporter.sources.nvml.podresources import (
    DEFAULT_SOCKET,
    NodeGpus,
    parse_allocatable,
    parse_list,
)
from exporter.sources.nvml.podresources_v1 import api_pb2 as pb
from exporter.sources.nvml.pods import Joined, MigDevice, join
from exporter.sources.nvml.source import NvmlGpuSource, build
from tests.helpers import REPO
from tests.helpers.exported import Exported
from tests.helpers.fake_nvml_exporter import ENV
from tests.helpers.fake_pynvml import GIB, FakeGpu, FakeMig, FakeNvml
from tests.helpers.kubelet import Kubelet, start_kubelet
from tests.helpers.servers import http_get
from tests.test_podresources import H100_UUIDS, VLLM
from tests.test_source_isolation import loaded

NODE = "gpu-node-1"
NOW = 1_700_000_000.0
GPU_NAME = "NVIDIA H100 80GB HBM3"
MIGS = [FakeMig(1, "3g.40gb", 40 * GIB, 12 * GIB), FakeMig(5, "1g.10gb", 10 * GIB, 3 * GIB)]
# the fake names the MIG device in slot s of a GPU "MIG-<the GPU's UUID less GPU->-<s>"
MIG_3G = f"MIG-{H100_UUIDS[4][4:]}-0"
MIG_1G = f"MIG-{H100_UUIDS[4][4:]}-1"
SHARED = H100_UUIDS[3]
GHOST = "GPU-00000000-dead-beef-0000-000000000000"  # a GPU NVML does not have


def fake_gpus() -> list[FakeGpu]:
    return [FakeGpu(uuid, GPU_NAME, pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                    mig=MIGS if i == 4 else None) for i, uuid in enumerate(H100_UUIDS)]


def devices(resource: str, *ids: str) -> pb.ContainerDevices:
    return pb.ContainerDevices(resource_name=resource, device_ids=list(ids))


def pod(namespace: str, name: str, *containers: tuple[str, list[pb.ContainerDevices]]) -> Any:
    return pb.PodResources(namespace=namespace, name=name, containers=[
        pb.ContainerResources(name=c, devices=d) for c, d in containers])


def node_list() -> pb.ListPodResourcesResponse:
    return pb.ListPodResourcesResponse(pod_resources=[
        pod("gpu-operator", "nvidia-dcgm-exporter-7xk2p", ("nvidia-dcgm-exporter", [])),
        pod(*VLLM, ("main", [devices("nvidia.com/gpu", H100_UUIDS[0])])),
        pod("research", "train-0", ("trainer", [devices("nvidia.com/gpu", H100_UUIDS[1])]),
            ("evaluator", [devices("nvidia.com/gpu", H100_UUIDS[2])])),
        pod("lab", "notebook-a", ("jupyter", [devices("nvidia.com/gpu.shared",
                                                      f"{SHARED}::0", f"{SHARED}::3")])),
        pod("lab", "notebook-b", ("jupyter", [devices("nvidia.com/gpu.shared", f"{SHARED}::1")])),
        pod("serving", "infer-0", ("server", [devices("nvidia.com/mig-1g.10gb", MIG_1G)])),
        pod("serving", "infer-1", ("server", [devices("nvidia.com/mig-3g.40gb", MIG_3G)])),
        pod("serving", "ghost", ("server", [devices("nvidia.com/gpu", GHOST)])),
    ])


def node_allocatable() -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(devices=[
        devices("nvidia.com/gpu", *(u for i, u in enumerate(H100_UUIDS) if i not in (3, 4))),
        devices("nvidia.com/gpu.shared", *(f"{SHARED}::{r}" for r in range(4))),
        devices("nvidia.com/mig-1g.10gb", MIG_1G), devices("nvidia.com/mig-3g.40gb", MIG_3G),
    ])


def alloc(namespace: str, name: str, gpus: tuple[int, ...], share: float) -> Allocation:
    return Allocation(f"{namespace}/{name}", (Placement(NODE, gpus, share, 0.0),),
                      namespace=namespace, pod=name, account=namespace)


EXPECTED = (
    alloc(*VLLM, (0,), 1.0),
    alloc("lab", "notebook-a", (3,), 0.5),  # two of GPU 3's four replicas
    alloc("lab", "notebook-b", (3,), 0.25),
    alloc("research", "train-0", (1, 2), 1.0),  # two containers, one pod
    alloc("serving", "infer-0", (4,), 0.142857),  # 1g: 1/7
    alloc("serving", "infer-1", (4,), 0.428571),  # 3g: 3/7
)
# gpu -> (job, share) as gpufleet_gpu_allocation_info and _allocated_ratio serve them
EXPECTED_BY_GPU = {
    "0": [f"{VLLM[0]}/{VLLM[1]}"], "1": ["research/train-0"], "2": ["research/train-0"],
    "3": ["lab/notebook-a", "lab/notebook-b"], "4": ["serving/infer-0", "serving/infer-1"],
}
EXPECTED_RATIO = {"0": 1.0, "1": 1.0, "2": 1.0, "3": 0.75, "4": 0.571428, "5": 0.0, "6": 0.0,
                  "7": 0.0}


def nvml_gpus() -> list[Gpu]:
    return [Gpu(NODE, i, uuid, "H100", "") for i, uuid in enumerate(H100_UUIDS)]


NVML_MIGS = [MigDevice(MIG_3G, 4, 1, "3g.40gb"), MigDevice(MIG_1G, 4, 5, "1g.10gb")]


# --- pure ---------------------------------------------------------------------------------


def test_each_kind_of_device_id_lands_on_its_gpu() -> None:
    answer = NodeGpus(parse_list(node_list()), parse_allocatable(node_allocatable()))
    assert join(NODE, nvml_gpus(), NVML_MIGS, answer) == Joined(EXPECTED, unknown=1)


def test_what_nvml_does_not_know_is_left_out_not_guessed() -> None:
    """No allocatable list: how many replicas share GPU 3 is unknown, so its three replica
    ids are left out; without NVML's MIG UUIDs, so are the MIG devices."""
    answer = NodeGpus(parse_list(node_list()), ())
    assert join(NODE, nvml_gpus(), (), answer) == Joined(
        (EXPECTED[0], EXPECTED[3]), unknown=1 + 3 + 2)


def test_slices_of_one_gpu_held_by_one_pod_add_up() -> None:
    listed = pb.ListPodResourcesResponse(pod_resources=[
        pod("serving", "infer-0", ("a", [devices("nvidia.com/mig-1g.10gb", MIG_1G)]),
            ("b", [devices("nvidia.com/mig-3g.40gb", MIG_3G)])),
        pod("lab", "notebook-a", ("jupyter", [devices("nvidia.com/gpu.shared", *(
            f"{SHARED}::{r}" for r in range(4)))]))])
    answer = NodeGpus(parse_list(listed), parse_allocatable(node_allocatable()))
    assert join(NODE, nvml_gpus(), NVML_MIGS, answer).allocations == (
        alloc("lab", "notebook-a", (3,), 1.0), alloc("serving", "infer-0", (4,), 0.571429))


def test_a_time_sliced_mig_device() -> None:
    """MIG and time-slicing together (the device plugin shares MIG devices too): replica 0 of
    a 1g instance advertised twice is half of 1/7 of its GPU."""
    listed = pb.ListPodResourcesResponse(pod_resources=[
        pod("lab", "tiny", ("c", [devices("nvidia.com/mig-1g.10gb.shared", f"{MIG_1G}::0")]))])
    allocatable = pb.AllocatableResourcesResponse(devices=[
        devices("nvidia.com/mig-1g.10gb.shared", f"{MIG_1G}::0", f"{MIG_1G}::1")])
    answer = NodeGpus(parse_list(listed), parse_allocatable(allocatable))
    assert join(NODE, nvml_gpus(), NVML_MIGS, answer) == Joined(
        (alloc("lab", "tiny", (4,), 0.071429),), unknown=0)


def test_a_pod_name_kubernetes_would_refuse_is_not_served() -> None:
    """Namespace and pod become label values: empty, over 253 characters or unprintable
    (none of which a real kubelet sends) is left out with its devices, counted."""
    listed = pb.ListPodResourcesResponse(pod_resources=[
        pod("lab", "x" * 254, ("c", [devices("nvidia.com/gpu", H100_UUIDS[5])])),
        pod("lab", "bad\nname", ("c", [devices("nvidia.com/gpu", H100_UUIDS[6])])),
        pod("", "no-namespace", ("c", [devices("nvidia.com/gpu", H100_UUIDS[7])])),
        pod("lab", "y" * 253, ("c", [devices("nvidia.com/gpu", H100_UUIDS[1])]))])
    answer = NodeGpus(parse_list(listed), ())
    assert join(NODE, nvml_gpus(), (), answer) == Joined(
        (alloc("lab", "y" * 253, (1,), 1.0),), unknown=3)


def test_the_option_default_is_the_kubelets_socket() -> None:
    assert POD_RESOURCES_SOCKET == DEFAULT_SOCKET == NvmlSource().pod_resources_socket
    assert NvmlSource().pod_resources is False


def test_a_kubelet_deadline_at_or_past_the_source_timeout_is_refused() -> None:
    """The collector would cancel the whole read first, the GPUs' fresh values with it."""
    with pytest.raises(ConfigError) as caught:
        build_config(Config, {"source_timeout": 3, "sources": {"nvml": {
            "enabled": True, "pod_resources": True, "pod_resources_timeout": "3s"}}})
    assert str(caught.value) == ("sources.nvml.pod_resources_timeout: must be below "
                                 "source_timeout (3s >= 3s)")
    assert build_config(Config, {"source_timeout": 3, "sources": {"nvml": {
        "enabled": True, "pod_resources": True}}}).sources.nvml.pod_resources_timeout == 2
    # the kubelet not read: its deadline does not matter
    assert build_config(Config, {"source_timeout": 1, "sources": {"nvml": {
        "enabled": True}}}).sources.nvml.pod_resources_timeout == 2


def test_the_nvml_source_imports_grpc_only_when_the_kubelet_is_read() -> None:
    assert loaded("exporter.sources.nvml.source", ("grpc", "exporter.sources.nvml.pods")) == []


# --- the nvml source on the fake pynvml, with a real grpcio kubelet --------------------------


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # a unix socket path is at most 107 bytes: pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as directory:
        yield directory


@pytest.fixture
async def kubelet(socket_dir: str) -> AsyncIterator[tuple[Kubelet, grpc.aio.Server, str]]:
    path = os.path.join(socket_dir, "kubelet.sock")
    servicer = Kubelet(node_list(), node_allocatable())
    server = await start_kubelet(servicer, path)
    yield servicer, server, path
    await server.stop(grace=None)


def allocations_by_gpu(exported: Exported) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for labels, value in exported.all("gpufleet_gpu_allocation_info", node=NODE):
        assert value == 1.0
        found.setdefault(labels["gpu"], []).append(labels["job"])
    return {gpu: sorted(jobs) for gpu, jobs in sorted(found.items())}


def ratios(exported: Exported) -> dict[str, float]:
    return {labels["gpu"]: round(value, 6) for labels, value in
            exported.all("gpufleet_gpu_allocated_ratio", node=NODE)}


def target_up(exported: Exported, path: str) -> float:
    return exported.value("gpufleet_source_up", source="nvml", target=f"unix://{path}")


@pytest.mark.slow
async def test_pods_on_their_gpus_then_the_kubelet_goes_away(kubelet: Any) -> None:
    servicer, server, path = kubelet
    now = [NOW]
    config = NvmlSource(enabled=True, node=NODE, pod_resources=True, pod_resources_socket=path,
                        pod_resources_timeout=Duration(1), pod_resources_stale_for=Duration(60))
    source: NvmlGpuSource = build(config, clock=lambda: now[0], nvml=FakeNvml(fake_gpus()))
    collector = Collector([source], timeout_seconds=10, clock=lambda: now[0])
    try:
        assert source.schedules is True
        reading = await source.read()
        assert reading.allocations == EXPECTED
        assert [(t.target, t.up, t.error) for t in reading.targets] == [(f"unix://{path}", True, "")]
        assert sorted(servicer.calls) == ["GetAllocatableResources", "List"]

        exported = Exported.of(await collector.collect())
        assert allocations_by_gpu(exported) == EXPECTED_BY_GPU
        assert ratios(exported) == EXPECTED_RATIO
        assert exported.value("gpufleet_gpu_allocation_info", gpu="0", uuid=H100_UUIDS[0],
                              namespace=VLLM[0], pod=VLLM[1]) == 1.0
        assert target_up(exported, path) == 1.0

        # the kubelet goes: socket gone. Its target is down with the reason, the last answer
        # is served, and the GPUs are fresh and the source up
        await server.stop(grace=None)
        assert not os.path.exists(path)  # grpc removes its socket as it stops
        now[0] += 30
        snapshot = await collector.collect()
        exported = Exported.of(snapshot)
        assert target_up(exported, path) == 0.0
        assert [(s.target, s.error) for s in snapshot.sources if s.target] == [(
            f"unix://{path}", f"kubelet PodResources socket {path}: No such file or directory "
            "(on a Kubernetes node, mount /var/lib/kubelet/pod-resources into the container)")]
        assert exported.value("gpufleet_source_up", source="nvml", target="") == 1.0
        assert allocations_by_gpu(exported) == EXPECTED_BY_GPU
        assert [g.stale for g in snapshot.gpus] == [False] * 8
        assert all(g.up for g in snapshot.gpus)

        # past pod_resources_stale_for the pods are no longer served; the GPUs still are
        now[0] += 31
        exported = Exported.of(await collector.collect())
        assert allocations_by_gpu(exported) == {}
        assert set(ratios(exported).values()) == {0.0}
        assert target_up(exported, path) == 0.0

        # a dead kubelet's socket left behind (bound, not listening): gRPC fails to connect
        with socket.socket(socket.AF_UNIX) as dead:
            dead.bind(path)
            now[0] += 5
            snapshot = await collector.collect()
            (error,) = [s.error for s in snapshot.sources if s.target]
            assert error.startswith(f"kubelet PodResources List at {path}: UNAVAILABLE: ")
        os.unlink(path)

        # the kubelet restarts on the same socket: the next read finds it (a new channel,
        # not gRPC's reconnection backoff) and serves its pods again
        servicer.listed = pb.ListPodResourcesResponse(pod_resources=[
            pod(*VLLM, ("main", [devices("nvidia.com/gpu", H100_UUIDS[7])]))])
        restarted = await start_kubelet(servicer, path)
        try:
            now[0] += 5
            exported = Exported.of(await collector.collect())
            assert target_up(exported, path) == 1.0
            assert allocations_by_gpu(exported) == {"7": [f"{VLLM[0]}/{VLLM[1]}"]}
        finally:
            await restarted.stop(grace=None)
    finally:
        await source.close()


def test_without_the_option_nvml_knows_no_jobs() -> None:
    source = build(NvmlSource(enabled=True, node=NODE), clock=lambda: NOW,
                   nvml=FakeNvml(fake_gpus()[:1]))
    try:
        assert source.schedules is False
        assert source.pods is None
    finally:
        asyncio.run(source.close())


# --- python -m exporter serve in node mode -----------------------------------------------------


@pytest.mark.slow
async def test_serve_in_node_mode(kubelet: Any, exporter_factory: Any) -> None:
    """The real exporter (``serve``, NVML source on the fake pynvml) reading the grpcio kubelet:
    each pod's allocation on its GPU by index and UUID, the scheduler's families served; the
    kubelet's socket removed: its target down with the reason, the pods still served (the
    kubelet's last answer), the GPUs fresh and the nvml source up."""
    _, server, path = kubelet
    config = f"""
collect_interval: 1s
sources:
  sim: {{enabled: false}}
  nvml: {{enabled: true, node: {NODE}, pool: gpu-h100, pod_resources: true,
          pod_resources_socket: {path}}}
"""
    spec = {"gpus": [{"uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id,
                      "mig": None if g.mig is None else [vars(m) for m in g.mig]}
                     for g in fake_gpus()]}
    exporter = await asyncio.to_thread(
        exporter_factory, config=config, module="tests.helpers.fake_nvml_exporter",
        env={ENV: json.dumps(spec)})

    async def scrape() -> Exported:
        return Exported((await asyncio.to_thread(http_get, f"{exporter.url}/metrics")).decode())

    exported = await scrape()
    assert allocations_by_gpu(exported) == EXPECTED_BY_GPU
    assert ratios(exported) == EXPECTED_RATIO
    served = sorted((lab["gpu"], lab["uuid"], lab["namespace"], lab["pod"], lab["account"])
                    for lab, _ in exported.all("gpufleet_gpu_allocation_info"))
    assert served[0] == ("0", H100_UUIDS[0], *VLLM, VLLM[0])
    assert served[-1] == ("4", H100_UUIDS[4], "serving", "infer-1", "serving")
    assert target_up(exported, path) == 1.0

    await server.stop(grace=None)
    assert not os.path.exists(path)  # grpc removes its socket as it stops

    async def kubelet_down() -> Exported | None:
        exported = await scrape()
        return exported if target_up(exported, path) == 0.0 else None

    down: Exported | None = None
    for _ in range(100):  # collect_interval is 1 s: at most ~10 s, bounded
        down = await kubelet_down()
        if down is not None:
            break
        await asyncio.sleep(0.1)
    assert down is not None, "the kubelet's target never went down"
    exported = down
    assert exported.value("gpufleet_source_up", source="nvml", target="") == 1.0
    assert allocations_by_gpu(exported) == EXPECTED_BY_GPU  # the last answer, served
    assert {lab["gpu"]: v for lab, v in exported.all("gpufleet_gpu_stale", node=NODE)} == {
        str(i): 0.0 for i in range(8)}
    assert {lab["gpu"]: v for lab, v in exported.all("gpufleet_gpu_up", node=NODE)} == {
        str(i): 1.0 for i in range(8)}
    # the reason, one line, where an operator reads the sources' errors
    snapshot = json.loads(await asyncio.to_thread(http_get, f"{exporter.url}/v1/snapshot"))
    assert [(s["source"], s["up"], s["error"]) for s in snapshot["sources"]] == [
        ("nvml", True, ""),
        ("nvml", False, f"kubelet PodResources socket {path}: No such file or directory (on a "
                        "Kubernetes node, mount /var/lib/kubelet/pod-resources into the container)")]
    assert snapshot["sources"][1]["target"] == f"unix://{path}"



@pytest.mark.slow
def test_the_bench_runs() -> None:
    """bench/kubelet_pods.py, whose figures docs/sources.md quotes, still runs (3 reads)."""
    done = subprocess.run([sys.executable, "bench/kubelet_pods.py", "--reads", "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == [
        "110 pods, 8 GPUs held", "5,000 pods x 20 replica ids (the caps)"]
    assert "8 allocations;" in done.stdout and "5,000 allocations;" in done.stdout
