"""Per-owner use of shared GPUs through the NVML source: the fake pynvml's processes, a fake
/proc with recorded cgroup paths (tests/helpers/fake_proc.py) and, where the kubelet's
PodResources matter, a real grpcio kubelet on a unix socket (tests/helpers/kubelet.py).

Each test reads through the collector and checks /metrics: each owner exactly once per
physical GPU, whatever slots, replicas, slices or claims the device plugin handed out."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.collect import Collector
from exporter.config import Duration
from exporter.sources.nvml.options import NvmlSource
from exporter.sources.nvml.podresources_v1 import api_pb2 as pb
from exporter.sources.nvml.source import NvmlGpuSource, build
from tests.helpers import fake_proc
from tests.helpers.exported import Exported
from tests.helpers.fake_proc import CONTAINER_PID_NS, FakeProc, container_id, pod_uid
from tests.helpers.fake_pynvml import GIB, FakeGpu, FakeMig, FakeNvml, FakeProcess
from tests.helpers.kubelet import Kubelet, start_kubelet

NODE = "gpu-node-1"
NOW = 1_700_000_000.0
MIB = 1024**2
UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]
OWNER_MEMORY = "gpufleet_gpu_owner_memory_used_bytes"
OWNER_SM = "gpufleet_gpu_owner_sm_utilization_ratio"
OWNER_PROCESSES = "gpufleet_gpu_owner_processes"
UNATTRIBUTED = "gpufleet_gpu_processes_unattributed"
CUT = "gpufleet_gpu_processes_cut_total"


def gpus(count: int = 2, **per_gpu: Any) -> list[FakeGpu]:
    return [FakeGpu(UUIDS[i], **per_gpu.get(str(i), {})) for i in range(count)]


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


@pytest.fixture
def socket_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as directory:
        yield directory


@pytest.fixture
async def sources() -> AsyncIterator[list[NvmlGpuSource]]:
    started: list[NvmlGpuSource] = []
    yield started
    for source in started:
        await source.close()


def make_source(sources: list[NvmlGpuSource], fake: FakeNvml, proc: FakeProc,
                socket: str = "", clock: Any = lambda: NOW, **options: Any) -> NvmlGpuSource:
    where = {"proc_root": str(proc.proc), "kubelet_log_root": str(proc.root / "var" / "log")}
    config = NvmlSource(enabled=True, node=NODE, pod_resources=bool(socket),
                        pod_resources_socket=socket or "/none", pod_resources_timeout=Duration(1),
                        **{**where, **options})
    source = build(config, clock=clock, nvml=fake)
    sources.append(source)
    return source


async def scrape(source: NvmlGpuSource) -> Exported:
    collector = Collector([source], timeout_seconds=10, clock=lambda: NOW)
    return Exported.of(await collector.collect())


def owners(exported: Exported, name: str = OWNER_MEMORY) -> dict[tuple[str, str], list[float]]:
    """(uuid, job) -> the values of its series: one each when nothing is repeated."""
    found: dict[tuple[str, str], list[float]] = {}
    for labels, value in exported.all(name, node=NODE):
        found.setdefault((labels["uuid"], labels["job"]), []).append(value)
    return found


def held(exported: Exported) -> dict[str, set[str]]:
    """uuid -> the jobs gpufleet_gpu_allocation_info says hold it (the PodResources join)."""
    found: dict[str, set[str]] = {}
    for labels, _ in exported.all("gpufleet_gpu_allocation_info", node=NODE):
        found.setdefault(labels["uuid"], set()).add(labels["job"])
    return found


def devices(resource: str, *ids: str) -> pb.ContainerDevices:
    return pb.ContainerDevices(resource_name=resource, device_ids=list(ids))


def pod(namespace: str, name: str, container: str, *held: pb.ContainerDevices) -> Any:
    return pb.PodResources(namespace=namespace, name=name, containers=[
        pb.ContainerResources(name=container, devices=list(held))])


async def with_kubelet(socket_dir: str, listed: Any, allocatable: Any) -> tuple[Any, str]:
    path = os.path.join(socket_dir, "kubelet.sock")
    return await start_kubelet(Kubelet(listed, allocatable), path), path


def pod_processes(proc: FakeProc, layout: str, pods: list[tuple[str, str, list[int]]]) -> None:
    """Each pod (namespace, name, its PIDs) with one container, in ``layout``'s cgroups."""
    for n, (namespace, name, pids) in enumerate(pods):
        for pid in pids:
            proc.pod_process(pid, layout, namespace, name, pod_uid(n), "main", container_id(n))


# --- must show: sharing never repeats a value ------------------------------------------------------


async def test_mps_with_48_slots_each_pod_once_summing_to_the_gpu(
        proc: FakeProc, socket_dir: str, sources: list[NvmlGpuSource]) -> None:
    """Three pods share GPU 0 under MPS: the device plugin advertises 48 logical slots
    (GPU-<uuid>::0..47) and each pod holds 16. Each pod's memory is served once, on the
    physical GPU's UUID, and the three add up to the GPU's used memory within NVML's rounding
    (the driver counts per-process memory in whole MiB; the GPU's figure is exact)."""
    shared = UUIDS[0]
    processes = [FakeProcess(101, 10 * GIB, sm_percent=30), FakeProcess(102, 2 * GIB, sm_percent=5),
                 FakeProcess(201, 20 * GIB, sm_percent=40), FakeProcess(301, 5 * GIB, sm_percent=10)]
    used = sum(p.memory_used or 0 for p in processes) + 300 * 1024  # under a MiB per process
    fake = FakeNvml(gpus(2, **{"0": {"processes": processes, "memory_used": used}}))
    pod_processes(proc, fake_proc.K8S_SYSTEMD_V2, [
        ("llm", "serve-a", [101, 102]), ("llm", "serve-b", [201]), ("lab", "notebook", [301])])
    slots = [f"{shared}::{n}" for n in range(48)]
    listed = pb.ListPodResourcesResponse(pod_resources=[
        pod("llm", "serve-a", "main", devices("nvidia.com/gpu", *slots[0:16])),
        pod("llm", "serve-b", "main", devices("nvidia.com/gpu", *slots[16:32])),
        pod("lab", "notebook", "main", devices("nvidia.com/gpu", *slots[32:48]))])
    allocatable = pb.AllocatableResourcesResponse(devices=[
        devices("nvidia.com/gpu", *slots, UUIDS[1])])
    server, path = await with_kubelet(socket_dir, listed, allocatable)
    try:
        exported = await scrape(make_source(sources, fake, proc, socket=path))
    finally:
        await server.stop(grace=None)
    memory = owners(exported)
    assert memory == {(shared, "llm/serve-a"): [12 * GIB], (shared, "llm/serve-b"): [20 * GIB],
                      (shared, "lab/notebook"): [5 * GIB]}
    gpu_used = exported.value("gpufleet_gpu_memory_used_bytes", uuid=shared)
    assert 0 <= gpu_used - sum(v[0] for v in memory.values()) < 4 * MIB
    # the same jobs the PodResources join says hold the GPU, by the same name
    assert {job for _, job in memory} == held(exported)[shared]
    assert owners(exported, OWNER_SM) == {(shared, "llm/serve-a"): [0.35],
                                          (shared, "llm/serve-b"): [0.4],
                                          (shared, "lab/notebook"): [0.1]}
    assert owners(exported, OWNER_PROCESSES)[shared, "llm/serve-a"] == [2.0]
    assert exported.value(CUT, uuid=shared) == 0.0 and exported.absent(UNATTRIBUTED)


async def test_time_slicing_4_replicas_two_pods_each_once(
        proc: FakeProc, socket_dir: str, sources: list[NvmlGpuSource]) -> None:
    shared = UUIDS[1]
    fake = FakeNvml(gpus(2, **{"1": {"processes": [
        FakeProcess(401, 3 * GIB, sm_percent=20), FakeProcess(402, 1 * GIB, sm_percent=1),
        FakeProcess(501, 7 * GIB, sm_percent=60)]}}))
    pod_processes(proc, fake_proc.K8S_CGROUPFS_V2, [("lab", "nb-a", [401, 402]),
                                                    ("lab", "nb-b", [501])])
    listed = pb.ListPodResourcesResponse(pod_resources=[
        pod("lab", "nb-a", "main", devices("nvidia.com/gpu.shared", f"{shared}::0", f"{shared}::3")),
        pod("lab", "nb-b", "main", devices("nvidia.com/gpu.shared", f"{shared}::1"))])
    allocatable = pb.AllocatableResourcesResponse(devices=[
        devices("nvidia.com/gpu.shared", *(f"{shared}::{r}" for r in range(4))),
        devices("nvidia.com/gpu", UUIDS[0])])
    server, path = await with_kubelet(socket_dir, listed, allocatable)
    try:
        exported = await scrape(make_source(sources, fake, proc, socket=path))
    finally:
        await server.stop(grace=None)
    assert owners(exported) == {(shared, "lab/nb-a"): [4 * GIB], (shared, "lab/nb-b"): [7 * GIB]}
    assert {job for _, job in owners(exported)} == held(exported)[shared]
    assert owners(exported, OWNER_SM) == {(shared, "lab/nb-a"): [0.21], (shared, "lab/nb-b"): [0.6]}


async def test_mig_two_instances_each_owner_once_on_the_physical_gpu(
        proc: FakeProc, sources: list[NvmlGpuSource]) -> None:
    """Two pods, each on its own MIG instance of GPU 0: NVML lists their processes on the
    physical GPU with their GPU instance; each pod once, labelled with the GPU's UUID (not a
    MIG UUID). NVML keeps no per-process samples under MIG: SM use is absent, not 0."""
    migs = [FakeMig(1, "3g.40gb", 40 * GIB, 12 * GIB), FakeMig(5, "1g.10gb", 10 * GIB, 3 * GIB)]
    fake = FakeNvml(gpus(1, **{"0": {"mig": migs, "processes": [
        FakeProcess(601, 12 * GIB, gpu_instance=1), FakeProcess(701, 3 * GIB, gpu_instance=5)]}}))
    pod_processes(proc, fake_proc.K8S_SYSTEMD_V1, [("serving", "infer-1", [601]),
                                                   ("serving", "infer-0", [701])])
    exported = await scrape(make_source(sources, fake, proc))
    assert owners(exported) == {(UUIDS[0], "serving/infer-1"): [12 * GIB],
                                (UUIDS[0], "serving/infer-0"): [3 * GIB]}
    assert exported.absent(OWNER_SM)
    assert exported.value("gpufleet_gpu_up", uuid=UUIDS[0]) == 1.0


async def test_a_dra_claim_is_its_pod_once_on_the_physical_gpu(
        proc: FakeProc, socket_dir: str, sources: list[NvmlGpuSource]) -> None:
    """A pod holding GPU 1 through a DRA ResourceClaim: the kubelet's PodResources lists it
    under dynamic resources, not devices, so the join gives no allocation; its process is still
    its pod's, once, on the GPU NVML found it on (and the claim's other pod, none)."""
    fake = FakeNvml(gpus(2, **{"1": {"processes": [FakeProcess(801, 30 * GIB, sm_percent=90)]}}))
    pod_processes(proc, fake_proc.K8S_SYSTEMD_V2_GUARANTEED_CRIO, [("dra", "trainer", [801])])
    listed = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(
        namespace="dra", name="trainer", containers=[pb.ContainerResources(name="main")])])
    server, path = await with_kubelet(socket_dir, listed, pb.AllocatableResourcesResponse())
    try:
        exported = await scrape(make_source(sources, fake, proc, socket=path))
    finally:
        await server.stop(grace=None)
    assert owners(exported) == {(UUIDS[1], "dra/trainer"): [30 * GIB]}
    assert exported.value(OWNER_SM, uuid=UUIDS[1], job="dra/trainer", container="main") == 0.9
    assert held(exported) == {}


@pytest.mark.parametrize("layout", [fake_proc.SLURM_V1, fake_proc.SLURM_V2], ids=["v1", "v2"])
async def test_a_slurm_job_with_two_tasks_ranks_0_and_1(
        proc: FakeProc, sources: list[NvmlGpuSource], layout: str) -> None:
    fake = FakeNvml(gpus(2, **{"0": {"processes": [FakeProcess(2000, 40 * GIB, sm_percent=70)]},
                               "1": {"processes": [FakeProcess(2001, 41 * GIB, sm_percent=72)]}}))
    for task in (0, 1):
        proc.slurm_process(2000 + task, layout, 4242, "0", task,
                           {"SLURM_JOB_ID": "4242", "SLURM_PROCID": str(task)})
    exported = await scrape(make_source(sources, fake, proc))
    found = sorted((labels["uuid"], labels["owner_kind"], labels["job"], labels["step"],
                    labels["rank"], value) for labels, value in exported.all(OWNER_MEMORY))
    assert found == [(UUIDS[0], "slurm", "4242", "0", "0", 40 * GIB),
                     (UUIDS[1], "slurm", "4242", "0", "1", 41 * GIB)]


# --- must show: what cannot be read is said, and nothing breaks ------------------------------------


async def test_another_pid_namespace_serves_the_gpu_and_says_why(
        proc: FakeProc, sources: list[NvmlGpuSource]) -> None:
    fake = FakeNvml(gpus(1, **{"0": {"memory_used": 9 * GIB, "processes": [
        FakeProcess(101, 4 * GIB), FakeProcess(102, 5 * GIB)]}}))
    pod_processes(proc, fake_proc.K8S_SYSTEMD_V2, [("lab", "a", [101, 102])])
    proc.pid_namespace(CONTAINER_PID_NS)
    exported = await scrape(make_source(sources, fake, proc))
    assert exported.value("gpufleet_gpu_up", uuid=UUIDS[0]) == 1.0
    assert exported.value("gpufleet_gpu_memory_used_bytes", uuid=UUIDS[0]) == 9 * GIB
    assert exported.value(UNATTRIBUTED, uuid=UUIDS[0], reason="pid_namespace") == 2.0
    assert exported.absent(OWNER_MEMORY)


async def test_an_unreadable_proc_serves_the_gpu_and_says_why(
        tmp_path: Path, sources: list[NvmlGpuSource]) -> None:
    """/proc not mounted where configured (every PID gone), and one PID refused."""
    fake = FakeNvml(gpus(1, **{"0": {"processes": [
        FakeProcess(101, 4 * GIB), FakeProcess(102, 5 * GIB), FakeProcess(103, 1 * GIB)]}}))
    proc = FakeProc(tmp_path)
    proc.process(101, fake_proc.HOST_SESSION, readable=False)
    proc.process(103, fake_proc.HOST_SERVICE_V1)
    exported = await scrape(make_source(sources, fake, proc))
    assert exported.value("gpufleet_gpu_up", uuid=UUIDS[0]) == 1.0
    assert exported.value(UNATTRIBUTED, reason="proc_unreadable") == 1.0
    assert exported.value(UNATTRIBUTED, reason="process_gone") == 1.0
    assert exported.value(OWNER_MEMORY, owner_kind="host", job="") == 1 * GIB

    missing = FakeProc(tmp_path / "other")
    source = make_source(sources, FakeNvml(gpus(1, **{"0": {"processes": [
        FakeProcess(101, GIB)]}})), missing, proc_root=str(tmp_path / "no-proc"))
    exported = await scrape(source)
    assert exported.value("gpufleet_gpu_up", uuid=UUIDS[0]) == 1.0
    assert exported.value(UNATTRIBUTED, reason="process_gone") == 1.0


# --- the cap, older drivers, the option ------------------------------------------------------------


async def test_over_the_cap_processes_are_cut_and_counted(
        proc: FakeProc, sources: list[NvmlGpuSource]) -> None:
    fake = FakeNvml(gpus(1, **{"0": {"processes": [
        FakeProcess(1000 + n, (n + 1) * GIB) for n in range(5)]}}))
    for n in range(5):
        proc.process(1000 + n, fake_proc.HOST_SESSION)
    source = make_source(sources, fake, proc, processes_per_gpu=3,
                         processes_interval=Duration(0))
    exported = await scrape(source)
    assert exported.value(OWNER_PROCESSES, owner_kind="host") == 3.0
    assert exported.value(OWNER_MEMORY, owner_kind="host") == (3 + 4 + 5) * GIB
    assert exported.value(CUT, uuid=UUIDS[0]) == 2.0
    assert (await scrape(source)).value(CUT, uuid=UUIDS[0]) == 4.0  # a counter


async def test_an_older_driver_v2_lists_and_the_older_sample_call(
        proc: FakeProc, sources: list[NvmlGpuSource]) -> None:
    """A driver without the v3 process calls nor nvmlDeviceGetProcessesUtilizationInfo:
    the v2 lists and nvmlDeviceGetProcessUtilization, the unsupported calls not asked again."""
    fake = FakeNvml(gpus(1, **{"0": {"processes": [
        FakeProcess(101, 4 * GIB, sm_percent=50), FakeProcess(102, None, sm_percent=20,
                                                              graphics=True)]}}),
                    process_v3=False, processes_utilization_info=False)
    proc.process(101, fake_proc.HOST_SESSION)
    proc.process(102, fake_proc.HOST_SESSION)
    source = make_source(sources, fake, proc, processes_interval=Duration(0))
    exported = await scrape(source)
    assert exported.value(OWNER_MEMORY, owner_kind="host") == 4 * GIB  # 102: not available
    assert exported.value(OWNER_PROCESSES, owner_kind="host") == 2.0
    assert exported.value(OWNER_SM, owner_kind="host") == 0.7
    fake.calls.clear()
    await scrape(source)
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in fake.calls
    assert "nvmlDeviceGetProcessesUtilizationInfo" not in fake.calls
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses_v2") == 1
    assert fake.calls.count("nvmlDeviceGetProcessUtilization") == 1


async def test_no_new_sample_is_idle_not_absent(proc: FakeProc,
                                                sources: list[NvmlGpuSource]) -> None:
    fake = FakeNvml(gpus(1, **{"0": {"processes": [FakeProcess(101, GIB, sm_percent=50)]}}))
    proc.process(101, fake_proc.HOST_SESSION)
    source = make_source(sources, fake, proc, processes_interval=Duration(0))
    assert (await scrape(source)).value(OWNER_SM) == 0.5
    fake.gpus[0].sample_clock_us -= 10_000_000  # the driver took no sample since
    assert (await scrape(source)).value(OWNER_SM) == 0.0


async def test_processes_off_reads_none(proc: FakeProc, sources: list[NvmlGpuSource]) -> None:
    fake = FakeNvml(gpus(1, **{"0": {"processes": [FakeProcess(101, GIB)]}}))
    exported = await scrape(make_source(sources, fake, proc, processes=False))
    assert exported.absent(OWNER_MEMORY) and exported.absent(CUT)
    assert not [c for c in fake.calls if "Process" in c]


async def test_processes_are_read_again_after_their_interval(
        proc: FakeProc, sources: list[NvmlGpuSource]) -> None:
    """Between two reads the last one is served as it was (no NVML process call); after
    ``processes_interval`` the GPU's processes are read again."""
    now = [NOW]
    fake = FakeNvml(gpus(1, **{"0": {"processes": [FakeProcess(101, GIB, sm_percent=50)]}}))
    proc.process(101, fake_proc.HOST_SESSION)
    proc.process(102, fake_proc.HOST_SESSION)
    source = make_source(sources, fake, proc, clock=lambda: now[0],
                         processes_interval=Duration(60))
    assert (await scrape(source)).value(OWNER_MEMORY) == GIB
    fake.gpus[0].processes.append(FakeProcess(102, 2 * GIB))
    fake.calls.clear()
    now[0] += 59
    assert (await scrape(source)).value(OWNER_MEMORY) == GIB
    assert not [c for c in fake.calls if "Process" in c]
    now[0] += 1
    exported = await scrape(source)
    assert exported.value(OWNER_MEMORY) == 3 * GIB
    assert exported.value(OWNER_PROCESSES) == 2.0


def test_nvml_check_prints_owners_and_what_it_could_not_check(proc: FakeProc) -> None:
    """bench/nvml_check.py on the fake: the owners as served, the unattributed, and what a
    real run here would have left unchecked (MIG: no SM samples; no Slurm process)."""
    import io
    import sys

    from tests.helpers import REPO

    sys.path.insert(0, str(REPO / "bench"))
    try:
        import nvml_check
    finally:
        sys.path.remove(str(REPO / "bench"))
    migs = [FakeMig(1, "3g.40gb", 40 * GIB, 12 * GIB)]
    fake = FakeNvml([FakeGpu(UUIDS[0], processes=[FakeProcess(101, 4 * GIB, sm_percent=25),
                                                  FakeProcess(999, GIB)]),
                     FakeGpu(UUIDS[1], mig=migs, processes=[
                         FakeProcess(102, 12 * GIB, gpu_instance=1)])])
    pod_processes(proc, fake_proc.K8S_CGROUPFS_V1, [("lab", "nb", [101, 102])])
    out = io.StringIO()
    code = nvml_check.run(fake, seconds=0.2, interval=0.1, out=out, proc=proc.proc,
                          kubelet_logs=proc.root / "var" / "log")
    text = out.getvalue()
    assert code == 0
    assert f"process owner pod lab/nb container main: 1 process(es), memory {4 * GIB} B, SM 0.25" \
        in text
    assert "processes unattributed (process_gone): 1" in text
    assert "gpu 1: MIG is on: NVML gives no per-process SM samples" in text
    assert "no process of a Slurm job" in text
    assert "no process of a Kubernetes pod" not in text
