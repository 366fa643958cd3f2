"""The advisor on a real Slurm (Debian's slurmctld, slurmd, munge on loopback), not the simulator.

What a job states reaches the planner through Slurm's own ``Comment`` field
(``sbatch --comment``), read by the slurm source in both formats: a job
submitted with ``--gres=gpu:h100:1`` whose comment says it needs 100Gi per GPU
is reported as misplaced, and a job whose comment says it checkpointed 10 min
ago is planned as ``checkpoint_then_migrate`` costing those 10 min of work.

The jobs started seconds ago; the planner is run as if one hour later (its
``now``), with the stated checkpoint 10 min before that, so the 30-min rule
does not make every move a wait. Everything else is the advisor's defaults:
Slurm's own priorities (4294901759 and down under priority/basic) are queue
order, and the source reports each job's QOS priority instead (none here, 0),
so the default ``advisor.high_priority`` (1000) leaves them movable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from exporter.advisor.advise import plan_settings
from exporter.advisor.planner import PlanSettings, plan_compaction
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import IndexSettings, evaluate
from exporter.analysis.state import from_snapshot
from exporter.analysis.workload import Shape, Workload
from exporter.config import AdvisorConfig
from exporter.snapshot import FleetSnapshot
from exporter.sources.slurm.options import SlurmSource as SlurmConfig
from exporter.sources.slurm.source import build
from tests.helpers import require_binary
from tests.helpers.slurm_cluster import BINARIES, SlurmCluster

pytestmark = pytest.mark.slow  # a real Slurm

LATER = time.time() + 3600  # the planner's "now"
SETTINGS = plan_settings(AdvisorConfig())  # the advisor's defaults, as `gpufleet serve` builds them
WORKLOAD = Workload((Shape(8, 1.0, 8), Shape(4, 1.0, 1)), (0.5, 0.5))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    for binary in BINARIES:
        require_binary(binary)
    if os.geteuid() != 0:
        pytest.fail("the Slurm fixture runs slurmd as root, as in CI; run the tests as root")
    cluster = SlurmCluster(Path(tmp_path_factory.mktemp("slurm")))
    try:
        cluster.start()
        cluster.ids = {
            # states it needs 100Gi per GPU, holds an 80 GB H100
            "needs-h200": cluster.sbatch("-p", "gpu-h100", "-w", "gpu-008", "--gres=gpu:h100:1",
                                         "--comment=gpu-memory-required=100Gi"),
            # one stray GPU on gpu-006, checkpointed 10 min before the planner's now
            "stray": cluster.sbatch("-p", "gpu-h100", "-w", "gpu-006", "--gres=gpu:h100:1",
                                    f"--comment=last-checkpoint={LATER - 600:.0f}"),
            # gpu-005 has 2 GPUs free for it
            "fill": cluster.sbatch("-p", "gpu-h100", "-w", "gpu-005", "--gres=gpu:h100:6"),
        }
        cluster.wait_states({job: "RUNNING" for job in cluster.ids.values()})
        yield cluster
    finally:
        cluster.stop()


def snapshot_of(cluster: SlurmCluster, fmt: str) -> FleetSnapshot:
    src = build(SlurmConfig(enabled=True, slurm_conf=str(cluster.conf), format=fmt), time.time)
    reading = asyncio.run(src.read())
    return FleetSnapshot(LATER, reading.nodes, reading.gpus, reading.allocations, reading.pending)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_comment_reaches_the_plan_through_real_slurm(slurm, fmt):
    snapshot = snapshot_of(slurm, fmt)
    by_job = {a.job: a for a in snapshot.allocations}
    needs, stray = by_job[slurm.ids["needs-h200"]], by_job[slurm.ids["stray"]]
    assert needs.gpu_memory_need_bytes == 100 * 2**30 and needs.allowed_models == ("H100",)
    assert stray.last_checkpoint_time == float(round(LATER - 600))

    state = from_snapshot(snapshot)
    report = evaluate(state, compile_workload(WORKLOAD, state.model_names), IndexSettings())
    plan = plan_compaction(snapshot, report, "pool:gpu-h100", LATER, SETTINGS)

    (wrong,) = plan.tier_misplacements
    assert (wrong.job, wrong.node, wrong.model, wrong.memory_need_gb) == \
        (slurm.ids["needs-h200"], "gpu-008", "H100", 107.4)
    assert wrong.reason == "needs 107 GB per GPU, more than H100's 80 GB; fits no model here"

    assert all(a.priority == 0 for a in snapshot.allocations)  # QOS none: not Slurm's 4.29e9
    # a site that calls these jobs high-priority keeps them put
    assert plan_compaction(snapshot, report, "pool:gpu-h100", LATER,
                           PlanSettings(high_priority=0)).migrations == ()
    moves = {m.job: m for m in plan.migrations}
    move = moves[slurm.ids["stray"]]
    assert (move.source.node, move.destination.node, move.action) == \
        ("gpu-006", "gpu-005", "checkpoint_then_migrate")
    assert abs(move.cost_gpu_seconds - 600.0) <= 1.0  # about 10 min on one GPU
    # the same job stating nothing: a move costs at most one 15-min interval, never its runtime
    unstated = dataclasses.replace(snapshot, allocations=tuple(
        dataclasses.replace(a, last_checkpoint_time=None) for a in snapshot.allocations))
    again = plan_compaction(unstated, report, "pool:gpu-h100", LATER, SETTINGS)
    cost = {m.job: m.cost_gpu_seconds for m in again.migrations}[slurm.ids["stray"]]
    assert 0 <= cost < 900


def test_a_stale_stated_checkpoint_fires_its_alert_through_prometheus(
        slurm, exporter_factory, prometheus_factory, tmp_path, capsys):
    """Real Slurm -> a real exporter (slurm source, advisor) -> Prometheus with the rules
    generated from the committed table (every `for` x 0.01: 5m -> 3s): a job whose comment
    says it checkpointed an hour ago fires GpuJobCheckpointStale; the module's other jobs do
    not (one states a checkpoint in the future, so age 0; the rest state none: assumed)."""
    from exporter.cli import main
    from tests.helpers import REPO
    from tests.helpers.alerting import prometheus_config
    from tests.helpers.servers import free_port, http_get

    stated = time.time() - 3600
    stale = slurm.sbatch("-p", "gpu-h200", "-w", "gpu-001", "--gres=gpu:h200:1",
                         f"--comment=last-checkpoint={stated:.0f}")
    slurm.wait_states({stale: "RUNNING"})
    rules = tmp_path / "rules"
    assert main(["rules", "--out", str(rules), "--for-scale", "0.01",
                 "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    capsys.readouterr()
    exporter = exporter_factory(config=f"""
collect_interval: 1s
sources:
  sim: {{enabled: false}}
  slurm: {{enabled: true, slurm_conf: {slurm.conf}}}
advisor: {{outbox: {tmp_path / "outbox.sqlite"}}}
""")
    prom = prometheus_factory(prometheus_config(
        exporter.port, free_port(),  # no Alertmanager: the alert's state is Prometheus' own
        [str(rules / "gpufleet-recording.yaml"), str(rules / "gpufleet-alerts.yaml")]))
    firing = prom.wait_for('ALERTS{alertname="GpuJobCheckpointStale",alertstate="firing"}',
                           lambda result: result, timeout=60)
    # this Slurm has no accounts: the job's account and namespace are empty, so Prometheus
    # stores no such labels and the ticket groups per cluster instead of per account
    assert [r["metric"] for r in firing] == [{
        "__name__": "ALERTS", "alertname": "GpuJobCheckpointStale", "alertstate": "firing",
        "severity": "warning", "page": "false", "exported_job": stale}]
    (alert,) = [a for a in json.loads(http_get(f"{prom.url}/api/v1/alerts"))["data"]["alerts"]
                if a["labels"]["alertname"] == "GpuJobCheckpointStale"]
    assert alert["annotations"]["description"].startswith(
        f"Job {stale} last checkpointed 1h ")
    assert alert["annotations"]["runbook_url"] == "docs/runbooks.md#gpujobcheckpointstale"
    (age,) = prom.query(f'gpufleet_job_checkpoint_age_seconds{{exported_job="{stale}"}}')
    assert age["metric"]["source"] == "stated"
    assert 3600 <= float(age["value"][1]) - (float(age["value"][0]) - time.time()) <= 3600 + 120
    ages = {r["metric"]["exported_job"]: (r["metric"]["source"], float(r["value"][1]))
            for r in prom.query("gpufleet_job_checkpoint_age_seconds")}
    assert ages[slurm.ids["stray"]] == ("stated", 0.0)  # a checkpoint "in the future": age 0
    assert {source for job, (source, _) in ages.items()
            if job not in (stale, slurm.ids["stray"])} == {"assumed"}
