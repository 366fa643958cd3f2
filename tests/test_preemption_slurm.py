"""A job requeued by preemption on a real Slurm (Debian's 22.05 slurmctld, slurmd, munge on
loopback) is counted once, in the pool it ran in, with the work it lost since its last
checkpoint: read by the slurm source (squeue --json and scontrol text), counted by the
preemption watch, as ``serve`` runs them.

The cluster is tests/helpers/slurm_cluster.py's with Slurm's partition preemption switched on
(``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``): a ``spot`` partition
(PriorityTier 1) and a ``high`` one (PriorityTier 10) over gpu-008. Ground truth (when Slurm
requeued the job, its restart count) comes from ``scontrol show job`` read with a regular
expression, not with the parser under test.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import time
from pathlib import Path

import pytest

from exporter import metrics
from exporter.preemption.watch import PreemptionWatch, WatchSettings
from exporter.snapshot import FleetSnapshot, Interruption
from exporter.sources.slurm.options import SlurmSource as SlurmConfig
from exporter.sources.slurm.source import build
from tests.helpers import require_binary
from tests.helpers.servers import http_get, wait_until
from tests.helpers.slurm_cluster import BINARIES, SlurmCluster

pytestmark = pytest.mark.slow  # a real Slurm (slurmctld, slurmd, munge)

PREEMPTION = "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n"
PARTITIONS = (
    "PartitionName=spot Nodes=gpu-008 PriorityTier=1 PreemptMode=REQUEUE MaxTime=INFINITE "
    "State=UP\n"
    "PartitionName=high Nodes=gpu-008 PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE "
    "State=UP\n")


class PreemptingCluster(SlurmCluster):
    """The test cluster, with partition-priority preemption that requeues the spot job."""

    def write_config(self) -> None:
        super().write_config()
        text = self.conf.read_text()
        assert "SchedulerType=" in text
        self.conf.write_text(text.replace("SchedulerType=", PREEMPTION + "SchedulerType=", 1)
                             + PARTITIONS)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    for binary in BINARIES:
        require_binary(binary)
    if os.geteuid() != 0:
        pytest.fail("the Slurm fixture runs slurmd as root, as in CI; run the tests as root")
    cluster = PreemptingCluster(Path(tmp_path_factory.mktemp("slurm-preempt")))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def read(cluster: SlurmCluster, form: str) -> FleetSnapshot:
    """One read of the slurm source, as the collector takes it into a snapshot."""
    config = SlurmConfig(enabled=True, slurm_conf=str(cluster.conf), format=form)
    reading = asyncio.run(build(config, time.time).read())
    return FleetSnapshot(time.time(), reading.nodes, reading.gpus, reading.allocations,
                         reading.pending)


def field(cluster: SlurmCluster, job: str, name: str) -> str:
    record = cluster.run("scontrol", "show", "job", job)
    match = re.search(rf"\b{name}=(\S*)", record)
    assert match, f"{name} not in {record!r}"
    return match.group(1)


def local_time(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()  # the controller's zone is this machine's


def sample(watch: PreemptionWatch, name: str, **labels: str) -> float | None:
    for family in watch.families():
        if family.name == name:
            for got, value in family.samples:
                if dict(got) == labels:
                    return value
    return None


def served(url: str, name: str, **labels: str) -> float | None:
    """The value of one sample of ``gpufleet serve``'s /metrics, None while it has none."""
    for line in http_get(f"{url}/metrics").decode().splitlines():
        if line.startswith(name + "{"):
            got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if got == labels:
                return float(line.rsplit(" ", 1)[1])
    return None


def test_a_job_requeued_by_preemption_is_counted_with_its_lost_work(slurm, exporter_factory):
    watches = {form: PreemptionWatch(WatchSettings(checkpoint_interval=900.0))
               for form in ("json", "text")}
    spot = slurm.sbatch("-p", "spot", "--gres=gpu:h100:8")
    slurm.wait_states({spot: "RUNNING"})
    started = local_time(field(slurm, spot, "StartTime"))
    # the job states a checkpoint in its run, as a site's checkpoint hook would
    checkpoint = int(started) + 1
    slurm.run("scontrol", "update", f"JobId={spot}", f"Comment=last-checkpoint={checkpoint}")
    # and gpufleet serve, reading the same Slurm every half second
    exporter = exporter_factory(config=f"""
collect_interval: 0.5s
sources:
  sim: {{enabled: false}}
  slurm: {{enabled: true, slurm_conf: {slurm.conf}}}
""")
    wait_until("the running spot job served", lambda: served(
        exporter.url, metrics.POOL_DELIVERED_GPU_SECONDS_TOTAL.name, pool="gpu-h100"))
    for form, watch in watches.items():
        (alloc,) = [a for a in read(slurm, form).allocations if a.job == spot]
        assert alloc.last_checkpoint_time == checkpoint and alloc.interrupted is None
        assert watch.observe(read(slurm, form)).stops == ()

    high = slurm.sbatch("-p", "high", "--gres=gpu:h100:8")
    slurm.wait_states({high: "RUNNING", spot: "PENDING"})
    assert field(slurm, spot, "Restarts") == "1"
    requeued_at = local_time(field(slurm, spot, "SubmitTime"))  # Slurm's requeue time
    assert requeued_at >= checkpoint

    for form, watch in watches.items():
        snapshot = read(slurm, form)
        (request,) = [r for r in snapshot.pending if r.job == spot]
        assert request.interrupted == Interruption("requeue", requeued_at, 1), form
        view = watch.observe(snapshot)
        (stop,) = view.stops
        assert (stop.job, stop.pool, stop.cause, stop.gpus) == (spot, "gpu-h100", "requeue", 8.0)
        assert stop.lost_seconds == requeued_at - checkpoint, form
        assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100",
                      cause="requeue") == 1
        assert sample(watch, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name, pool="gpu-h100",
                      cause="requeue") == 8 * (requeued_at - checkpoint)
        assert sample(watch, metrics.PREEMPTED_JOBS_WAITING.name, pool="gpu-h100",
                      cause="requeue") == 1
        # the high-priority job is running, not stopped; read again, the stop is not recounted
        assert watch.observe(read(slurm, form)).stops == ()
        assert sample(watch, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100",
                      cause="requeue") == 1

    # served: counted once, with the same lost work, and waiting to resume
    wait_until("the requeue served", lambda: served(
        exporter.url, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100", cause="requeue") == 1)
    assert served(exporter.url, metrics.PREEMPTION_LOST_GPU_SECONDS_TOTAL.name, pool="gpu-h100",
                  cause="requeue") == 8 * (requeued_at - checkpoint)
    job = {"job": spot, "namespace": "", "pool": "gpu-h100", "cause": "requeue"}
    assert served(exporter.url, metrics.JOB_PREEMPTION_LOST_SECONDS.name, **job) == \
        requeued_at - checkpoint
    assert served(exporter.url, metrics.PREEMPTED_JOBS_WAITING.name, pool="gpu-h100",
                  cause="requeue") == 1
    time.sleep(1.5)  # three more collections: still one stop
    assert served(exporter.url, metrics.PREEMPTIONS_TOTAL.name, pool="gpu-h100",
                  cause="requeue") == 1
