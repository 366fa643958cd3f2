"""exporter/attribution: a GPU process's owner from its cgroup, the kubelet's names and its
environment, on a fake /proc holding cgroup files recorded from real nodes
(tests/helpers/fake_proc.py); and the per-owner sums of one GPU's processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.attribution.cgroup import HOST_OWNER, CgroupOwner, owner_of
from exporter.attribution.proc import (
    MAX_ENVIRON_BYTES,
    PID_NAMESPACE,
    PROC_UNREADABLE,
    PROCESS_GONE,
    Owner,
    ProcessOwners,
    Unattributed,
    rank_of,
)
from exporter.attribution.usage import GpuProcess, add_up, merge_lists, sm_ratios
from exporter.snapshot import OwnerUse, UnattributedProcesses
from tests.helpers import fake_proc
from tests.helpers.fake_proc import CONTAINER_PID_NS, FakeProc, container_id, pod_uid

UID = pod_uid(1)
CID = container_id(0xAB)
K8S_LAYOUTS = {
    "systemd-v2": fake_proc.K8S_SYSTEMD_V2, "systemd-v2-guaranteed-crio":
    fake_proc.K8S_SYSTEMD_V2_GUARANTEED_CRIO, "cgroupfs-v2": fake_proc.K8S_CGROUPFS_V2,
    "systemd-v1": fake_proc.K8S_SYSTEMD_V1, "cgroupfs-v1": fake_proc.K8S_CGROUPFS_V1,
    "systemd-v2-cgroupns": fake_proc.K8S_SYSTEMD_V2_CGROUPNS,
}


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def owners_of(proc: FakeProc) -> ProcessOwners:
    return ProcessOwners(proc.proc, proc.pods_dir, proc.containers_dir)


# --- cgroup paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", K8S_LAYOUTS.values(), ids=K8S_LAYOUTS.keys())
def test_both_kubelet_cgroup_drivers_name_the_pod_and_container(layout: str) -> None:
    text = layout.format(uid=UID, uid_=UID.replace("-", "_"), cid=CID)
    assert owner_of(text) == CgroupOwner("pod", pod_uid=UID, container_id=CID)


@pytest.mark.parametrize("layout", [fake_proc.SLURM_V1, fake_proc.SLURM_V2], ids=["v1", "v2"])
def test_slurm_cgroups_name_job_step_and_task(layout: str) -> None:
    assert owner_of(layout.format(job=4242, step=0, task=1)) == CgroupOwner(
        "slurm", job="4242", step="0", task="1")
    assert owner_of(layout.format(job=7, step="batch", task=0)).step == "batch"


def test_a_session_or_a_service_is_the_hosts() -> None:
    assert owner_of(fake_proc.HOST_SESSION) == HOST_OWNER
    assert owner_of(fake_proc.HOST_SERVICE_V1) == HOST_OWNER
    assert owner_of("") == HOST_OWNER
    # a pod-like name outside kubepods is not a pod
    assert owner_of(f"0::/system.slice/pod{UID}/x\n") == HOST_OWNER


def test_rank_from_the_environment() -> None:
    assert rank_of(b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0") == "3"
    assert rank_of(b"SLURM_PROCID=12\0LOCAL_RANK=0\0") == "12"
    assert rank_of(b"LOCAL_RANK=5\0") == "5"
    assert rank_of(b"RANK=abc\0SLURM_PROCID=2\0") == "2"  # not a number: the next one
    assert rank_of(b"RANK=99999999999\0") == ""  # absurd: none
    assert rank_of(b"HOME=/root\0") == ""
    assert rank_of(b"") == ""


# --- /proc ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", K8S_LAYOUTS.values(), ids=K8S_LAYOUTS.keys())
def test_a_pods_process_is_named_from_the_kubelets_log_directories(proc: FakeProc,
                                                                    layout: str) -> None:
    proc.pod_process(101, layout, "research", "train-0", UID, "trainer", CID,
                     {"RANK": "0", "LOCAL_RANK": "0"})
    assert owners_of(proc).owner(101) == Owner("pod", "research/train-0", "trainer", rank="0")


def test_without_the_log_directories_the_pod_is_its_uid(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(101, fake_proc.K8S_CGROUPFS_V2.format(uid=UID, cid=CID))
    owners = ProcessOwners(proc.proc, tmp_path / "none" / "pods", tmp_path / "none" / "containers")
    assert owners.owner(101) == Owner("pod", UID)


@pytest.mark.parametrize("layout", [fake_proc.SLURM_V1, fake_proc.SLURM_V2], ids=["v1", "v2"])
def test_a_slurm_job_with_two_tasks_on_one_node(proc: FakeProc, layout: str) -> None:
    """Must show: its processes are the job's, with rank 0 and 1 (srun's SLURM_PROCID)."""
    for task in (0, 1):
        proc.slurm_process(2000 + task, layout, 4242, "0", task,
                           {"SLURM_JOB_ID": "4242", "SLURM_PROCID": str(task),
                            "SLURM_LOCALID": str(task)})
    owners = owners_of(proc)
    assert [owners.owner(2000), owners.owner(2001)] == [
        Owner("slurm", "4242", step="0", rank="0"), Owner("slurm", "4242", step="0", rank="1")]


def test_an_unreadable_environment_leaves_the_rank_out(proc: FakeProc) -> None:
    proc.process(2000, fake_proc.SLURM_V2.format(job=4242, step=0, task=0),
                 environ_readable=False)
    assert owners_of(proc).owner(2000) == Owner("slurm", "4242", step="0")


def test_what_cannot_be_read_is_a_stated_reason(proc: FakeProc) -> None:
    proc.process(300, fake_proc.HOST_SESSION, readable=False)
    owners = owners_of(proc)
    assert owners.owner(300) == Unattributed(PROC_UNREADABLE)
    assert owners.owner(301) == Unattributed(PROCESS_GONE)  # no /proc/301
    assert owners.owner(0) == Unattributed(PROCESS_GONE)
    assert owners.owner(2 ** 31) == Unattributed(PROCESS_GONE)


def test_another_pid_namespace_reads_nothing(proc: FakeProc) -> None:
    """NVML's PIDs are the host's: in a container's PID namespace they name other processes."""
    proc.pod_process(101, fake_proc.K8S_SYSTEMD_V2, "lab", "a", UID, "c", CID)
    proc.pid_namespace(CONTAINER_PID_NS)
    assert owners_of(proc).owner(101) == Unattributed(PID_NAMESPACE)


def test_an_oversized_environment_is_refused_not_read(proc: FakeProc) -> None:
    proc.process(400, fake_proc.HOST_SESSION)
    (proc.proc / "400" / "environ").write_bytes(b"RANK=1\0" + b"X" * MAX_ENVIRON_BYTES)
    assert owners_of(proc).owner(400) == Owner("host")


def test_an_owner_is_kept_while_its_pid_is_on_a_gpu(proc: FakeProc) -> None:
    proc.process(500, fake_proc.SLURM_V2.format(job=1, step=0, task=0))
    owners = owners_of(proc)
    assert owners.owner(500).job == "1"  # type: ignore[union-attr]
    proc.process(500, fake_proc.SLURM_V2.format(job=2, step=0, task=0))
    owners.forget_except({500})
    assert owners.owner(500).job == "1"  # type: ignore[union-attr]  # cached
    owners.forget_except(set())  # the PID left every GPU: a new process may take it
    assert owners.owner(500).job == "2"  # type: ignore[union-attr]


# --- per-owner sums -----------------------------------------------------------------------------


def test_an_owners_processes_add_up_once_and_reasons_are_counted() -> None:
    table = {1: Owner("pod", "lab/a"), 2: Owner("pod", "lab/a"), 3: Owner("pod", "lab/b"),
             4: Unattributed(PROCESS_GONE), 5: Unattributed(PROCESS_GONE)}
    processes = merge_lists(
        [GpuProcess(1, 10), GpuProcess(2, 20), GpuProcess(3, None), GpuProcess(4, 5)],
        [GpuProcess(1, 12), GpuProcess(5, 1)])  # pid 1 draws too: once, its larger figure
    added = add_up(processes, table.__getitem__, {1: 0.25, 2: 0.5})
    assert added.processes.owners == (
        OwnerUse("pod", "lab/a", processes=2, memory_used_bytes=32, sm_utilization_ratio=0.75),
        OwnerUse("pod", "lab/b", processes=1, memory_used_bytes=None, sm_utilization_ratio=0.0))
    assert added.processes.unattributed == (UnattributedProcesses(PROCESS_GONE, 2),)
    assert added.cut == 0 and added.pids == {1, 2, 3, 4, 5}


def test_over_the_cap_the_smallest_are_cut_and_counted() -> None:
    processes = [GpuProcess(pid, pid * 100) for pid in range(1, 6)]
    added = add_up(processes, lambda pid: Owner("host"), None, cap=3, cut_before=7)
    assert added.processes.owners == (OwnerUse("host", processes=3, memory_used_bytes=1200),)
    assert added.cut == 2 and added.processes.cut_total == 9 and added.pids == {3, 4, 5}


def test_sm_samples_average_per_process_since_the_last_read() -> None:
    samples = [(1, 100, 50.0), (1, 200, 70.0), (2, 50, 90.0), (2, 300, 30.0)]
    assert sm_ratios(samples, since=60) == ({1: 0.6, 2: 0.3}, 300)
    assert sm_ratios([], since=60) == ({}, 60)
