"""The slurm source against a real Slurm (Debian's slurmctld, slurmd, munge) on loopback.

One cluster per module: 8 virtual GPU nodes (gpu-001..004 ``h200``, gpu-005..008
``h100``), nine jobs submitted with ``sbatch`` the way data/slurm-samples/
was captured: typed, untyped, ``-c 8``, ``--gpus``, ``--gpus-per-node``, two multi-node
jobs, and one that stays pending. Ground truth comes from Slurm's own tools
(``scontrol show job -d``, ``scontrol show hostnames``, ``sinfo -O GresUsed``), read
with the few regular expressions below rather than with the parser under test.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from exporter.snapshot import JobRequest
from exporter.sources import SourceReading
from exporter.sources.slurm.options import SlurmSource as SlurmConfig
from exporter.sources.slurm.source import SlurmAllocationSource, SlurmCommandError, build
from tests.helpers import http_get, require_binary
from tests.helpers.slurm_cluster import BINARIES, SlurmCluster

pytestmark = pytest.mark.slow  # a real Slurm (slurmctld, slurmd, munge)

JOBS = {
    "typed": ("-p", "gpu-h200", "--gres=gpu:h200:2"),
    "whole-node": ("--gres=gpu:h200:8",),
    "cpus": ("--gres=gpu:h200:4", "-c", "8"),
    "single": ("-p", "gpu-h100", "--gres=gpu:h100:1"),
    "multi-node": ("-p", "gpu-h100", "-N", "2", "--gres=gpu:h100:8"),
    "untyped": ("-p", "gpu-h100", "--gres=gpu:3"),
    "gpus": ("-p", "gpu-h200", "--gpus=h200:3"),
    "per-node": ("-p", "gpu-h100", "--gpus-per-node=h100:2", "-N", "2"),
    "pending": ("-p", "gpu-h200", "-N", "4", "--gres=gpu:h200:8"),
}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> SlurmCluster:
    for binary in BINARIES:
        require_binary(binary)
    if os.geteuid() != 0:
        pytest.fail("the Slurm fixture runs slurmd as root, as in CI; run the tests as root")
    cluster = SlurmCluster(Path(tmp_path_factory.mktemp("slurm")))
    try:
        cluster.start()
        cluster.ids = {name: cluster.sbatch(*args) for name, args in JOBS.items()}
        cluster.wait_states({job: "PENDING" if name == "pending" else "RUNNING"
                             for name, job in cluster.ids.items()})
        yield cluster
    finally:
        cluster.stop()


def source(cluster: SlurmCluster, **options) -> SlurmAllocationSource:
    config = SlurmConfig(enabled=True, slurm_conf=str(cluster.conf), **options)
    return build(config, time.time)


def read(src: SlurmAllocationSource) -> SourceReading:
    return asyncio.run(src.read())


def _indices(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def slurm_truth(cluster: SlurmCluster) -> dict[str, dict[str, tuple[tuple[int, ...], int]]]:
    """job -> node -> (GPU indices, CPUs), as ``scontrol show job -d`` reports them."""
    truth: dict[str, dict[str, tuple[tuple[int, ...], int]]] = {}
    for record in cluster.run("scontrol", "show", "job", "-d").split("\n\n"):
        job = re.search(r"JobId=(\d+)", record)
        if not job or "JobState=RUNNING" not in record:
            continue
        nodes: dict[str, tuple[tuple[int, ...], int]] = {}
        for detail in re.finditer(r"Nodes=(\S+) CPU_IDs=(\S+) .*?GRES=\S*?IDX:([\d,-]+)\)",
                                  record):
            hosts = cluster.run("scontrol", "show", "hostnames", detail.group(1)).split()
            cpus = len(_indices(detail.group(2)))
            for host in hosts:
                nodes[host] = (tuple(_indices(detail.group(3))), cpus)
        truth[job.group(1)] = nodes
    return truth


def held(snapshot: SourceReading) -> dict[str, dict[str, tuple[tuple[int, ...], int]]]:
    return {a.job: {p.node: (p.gpus, int(p.cpus)) for p in a.placements}
            for a in snapshot.allocations}


def test_allocations_equal_what_slurm_reports_gpu_index_by_gpu_index(slurm):
    snapshot = read(source(slurm, format="json"))
    truth = slurm_truth(slurm)
    running = {job for name, job in slurm.ids.items() if name != "pending"}
    assert set(truth) == running  # every submitted job but the pending one runs
    assert held(snapshot) == truth
    multi = held(snapshot)[slurm.ids["multi-node"]]
    assert len(multi) == 2 and all(gpus == tuple(range(8)) for gpus, _ in multi.values())
    ((gpus, cpus),) = held(snapshot)[slurm.ids["cpus"]].values()  # -c 8
    assert len(gpus) == 4 and cpus == 8
    # per node, the union of our placements is what sinfo says is in use
    used = {}
    for line in slurm.run("sinfo", "-N", "-h", "-O", "NodeList:20,GresUsed:60").splitlines():
        node, gres = line.split()
        match = re.search(r"IDX:([\d,-]+)", gres)
        used[node] = sorted(_indices(match.group(1))) if match else []
    ours: dict[str, list[int]] = {node: [] for node in used}
    for placements in held(snapshot).values():
        for node, (gpus, _) in placements.items():
            ours[node] += gpus
    assert {n: sorted(g) for n, g in ours.items()} == used


def test_inventory_is_the_slurm_nodes_with_typed_gpus(slurm):
    snapshot = read(source(slurm, format="json"))
    assert [(n.name, n.model, n.pool, n.cpu_cores, n.gpu_count) for n in snapshot.nodes] == [
        (f"gpu-00{i}", "H200" if i <= 4 else "H100", "gpu-h200" if i <= 4 else "gpu-h100",
         64.0, 8) for i in range(1, 9)]
    assert len(snapshot.gpus) == 64 and all(g.up and not g.stale for g in snapshot.gpus)
    by_job = {a.job: a for a in snapshot.allocations}
    assert by_job[slurm.ids["typed"]].allowed_models == ("H200",)
    assert by_job[slurm.ids["untyped"]].allowed_models == ()
    assert by_job[slurm.ids["typed"]].user == "root"
    assert by_job[slurm.ids["typed"]].start_time is not None


def test_pending_job_is_demand(slurm):
    snapshot = read(source(slurm, format="json"))
    (request,) = snapshot.pending
    assert request == JobRequest(
        job=slurm.ids["pending"], gpu_count=32, cpus=4.0, node_count=4, models=("H200",),
        pool="gpu-h200", priority=0, submit_time=request.submit_time)
    assert request.submit_time is not None  # priority: its QOS's, none here (job_hints)


def test_text_fallback_reads_the_same_cluster_as_json(slurm):
    by_json = read(source(slurm, format="json"))
    by_text = read(source(slurm, format="text"))
    auto = source(slurm)  # auto: JSON works on 22.05, so it stays on JSON
    by_auto = read(auto)
    assert auto._format == "json"
    for other in (by_text, by_auto):
        assert other.nodes == by_json.nodes and other.gpus == by_json.gpus
        assert other.allocations == by_json.allocations and other.pending == by_json.pending


def test_missing_json_support_falls_back_to_text(slurm, tmp_path):
    """A squeue without --json (Slurm before 21.08) makes ``auto`` switch to scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for command in ("squeue", "sinfo"):
        fake = bin_dir / command
        fake.write_text(f"#!/bin/sh\necho \"{command}: unrecognized option '--json'\" >&2\nexit 1\n")
        fake.chmod(0o755)
    (bin_dir / "scontrol").symlink_to(require_binary("scontrol"))
    src = source(slurm, bin_dir=str(bin_dir))
    snapshot = read(src)
    assert src._format == "text"
    assert held(snapshot) == slurm_truth(slurm)
    with pytest.raises(SlurmCommandError, match="unrecognized option"):
        read(source(slurm, bin_dir=str(bin_dir), format="json"))


def _metric(text: str, name: str, **labels: str) -> list[float]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


def _wait_metrics(url: str, predicate, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = http_get(f"{url}/metrics").decode()
        if predicate(text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"condition never met; last /metrics:\n{text[-3000:]}")


def test_served_through_gpufleet_and_survives_slurmctld_being_killed(slurm, exporter_factory):
    config = f"""
collect_interval: 0.5s
source_timeout: 4s
sources:
  sim: {{enabled: false}}
  slurm:
    enabled: true
    slurm_conf: {slurm.conf}
    command_timeout: 1.5s
"""
    exporter = exporter_factory(config=config)
    text = _wait_metrics(exporter.url, lambda t: _metric(t, "gpufleet_source_up", source="slurm")
                         == [1.0])
    truth = slurm_truth(slurm)
    for job, nodes in truth.items():
        for node, (gpus, cpus) in nodes.items():
            for gpu in gpus:
                assert _metric(text, "gpufleet_gpu_allocation_info", job=job, node=node,
                               gpu=str(gpu)) == [1.0], (job, node, gpu)
            assert _metric(text, "gpufleet_allocation_cpu_cores", job=job, node=node) == \
                [float(cpus)]
    assert _metric(text, "gpufleet_pending_gpus", pool="gpu-h200") == [32.0]
    assert _metric(text, "gpufleet_pending_jobs", pool="gpu-h200") == [1.0]
    assert sum(_metric(text, "gpufleet_gpu_stale")) == 0.0
    # the fragmentation analysis runs on Slurm's allocations: 32 GPUs per pool, jobs hold
    # 2+8+4+3 = 17 of gpu-h200 and 1+16+3+4 = 24 of gpu-h100, wherever Slurm put them
    assert _metric(text, "gpufleet_pool_idle_gpus", pool="gpu-h200") == [15.0]
    assert _metric(text, "gpufleet_pool_idle_gpus", pool="gpu-h100") == [8.0]
    assert _metric(text, "gpufleet_cluster_idle_gpus") == [23.0]
    (index,) = _metric(text, "gpufleet_cluster_fragmentation_index")
    assert 0.0 <= index <= 100.0
    assert len(_metric(text, "gpufleet_node_fragmented_gpus")) == 8
    assert _metric(text, "gpufleet_fragmentation_workload_shapes")[0] >= 1

    slurm.kill_controller()  # SIGKILL: no goodbye, as in a crash
    down = _wait_metrics(exporter.url, lambda t: _metric(t, "gpufleet_source_up", source="slurm")
                         == [0.0])
    assert exporter.proc.poll() is None
    stale = _metric(down, "gpufleet_gpu_stale")
    assert len(stale) == 64 and set(stale) == {1.0}  # the last allocation, marked stale
    for job, nodes in truth.items():
        for node, (gpus, _) in nodes.items():
            assert _metric(down, "gpufleet_gpu_allocation_info", job=job, node=node,
                           gpu=str(gpus[0])) == [1.0]
    assert _metric(down, "gpufleet_pending_gpus", pool="gpu-h200") == [32.0]

    slurm.start_controller()
    _wait_metrics(exporter.url, lambda t: _metric(t, "gpufleet_source_up", source="slurm")
                  == [1.0] and sum(_metric(t, "gpufleet_gpu_stale")) == 0.0, timeout=60)
    # what is served again is what Slurm reports now (a SIGKILLed slurmctld may lose jobs it
    # had not saved yet; whatever it recovered is what must be served)
    _wait_metrics(exporter.url, lambda t: served_allocations(t) == {
        j: {n: gpus for n, (gpus, _) in nodes.items()} for j, nodes in slurm_truth(slurm).items()})
    assert exporter.proc.poll() is None


def served_allocations(text: str) -> dict[str, dict[str, tuple[int, ...]]]:
    served: dict[str, dict[str, list[int]]] = {}
    for line in text.splitlines():
        if line.startswith("gpufleet_gpu_allocation_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            served.setdefault(labels["job"], {}).setdefault(labels["node"], []).append(
                int(labels["gpu"]))
    return {j: {n: tuple(sorted(g)) for n, g in nodes.items()} for j, nodes in served.items()}
