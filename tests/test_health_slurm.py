"""Health remediation against a real Slurm (issue 31, Must show): an XID 79 on GPU 3 of
gpu-003 becomes a drain decision; ``gpufleet act --slurm --mode dry-run`` prints the exact
scontrol command and changes nothing; ``--mode act`` drains the node (``scontrol show node``
shows DRAIN with gpufleet's reason); after the fault clears, the clean window and the
minimum drain time pass, the resume decision is acted on and the node is idle again.

The snapshots are built here, not read through a fake pynvml. The third test takes the
events from where the advisor puts them: its service observes the snapshots and queues each
event in the outbox, and the bodies the receiver would get are what ``gpufleet act`` runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.health.remediation import Drain, Remediator, ResetGpu, Resume, encode_event
from exporter.health.verdict import HealthTracker
from tests.helpers import REPO
from tests.helpers.health import T0, gpu, snap, xid_gpu
from tests.helpers.slurm_cluster import H200_NODES, SlurmCluster, running_cluster

pytestmark = pytest.mark.slow  # a real Slurm (slurmctld, slurmd, munge)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with running_cluster(Path(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


def show(slurm: SlurmCluster, node: str) -> str:
    return slurm.run("scontrol", "show", "node", "-o", node)


def act(slurm: SlurmCluster, tmp_path: Path, mode: str, events: list) -> subprocess.CompletedProcess:
    path = tmp_path / f"events-{mode}.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    return subprocess.run([sys.executable, "-m", "exporter", "act", "--slurm", "--mode", mode,
                           "--events", str(path), "--audit-log", str(tmp_path / "audit.jsonl")],
                          env={**slurm.env, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, check=False)


def fleet(at: float, broken: bool = False):
    """gpu-001..004 (the cluster's gpu-h200 pool), 8 GPUs each; XID 79 once on gpu-003 GPU 3."""
    gpus = [xid_gpu(n, i, T0 + 30, pool="gpu-h200") if broken and (n, i) == ("gpu-003", 3)
            else gpu(n, i, "gpu-h200") for n in H200_NODES for i in range(8)]
    return snap(T0 + at, *gpus)


def test_xid_drains_the_node_in_slurm_and_the_clean_window_resumes_it(slurm, tmp_path):
    tracker, remediator = HealthTracker(), Remediator()
    assert remediator.decide(tracker.observe(fleet(0))) == []
    drain, reset = remediator.decide(tracker.observe(fleet(30, broken=True)))
    assert drain == Drain("gpu-003", "gpu-h200", "XID 79 on GPU 3", T0 + 30)
    # no job holds the GPU: reset it (advice for the operator, Slurm has no verb for it)
    assert reset == ResetGpu("gpu-003", "gpu-h200", 3, "XID 79 on GPU 3", T0 + 30)

    dry = act(slurm, tmp_path, "dry-run", [drain, reset])
    assert dry.returncode == 0
    assert dry.stderr == f"gpufleet act: advice, no command: {encode_event(reset).decode()}\n"
    assert dry.stdout == \
        'scontrol update NodeName=gpu-003 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"\n'
    assert "DRAIN" not in show(slurm, "gpu-003") and "Reason=" not in show(slurm, "gpu-003")

    done = act(slurm, tmp_path, "act", [drain])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    shown = show(slurm, "gpu-003")
    assert "State=IDLE+DRAIN " in shown and "Reason=gpufleet: XID 79 on GPU 3 [root@" in shown
    assert slurm.run("sinfo", "-h", "-n", "gpu-003", "-o", "%t").strip() == "drain"
    assert "DRAIN" not in show(slurm, "gpu-004")  # the rest of the pool stays in service

    # the fault clears (the same XID count: no new event); every minute, for two hours
    events = [(at, e) for at in range(60, 7200, 60)
              for e in remediator.decide(tracker.observe(fleet(at, broken=True)))]
    assert events == [(3660, Resume("gpu-003", "gpu-h200", T0 + 30, T0 + 3660))]
    resumed = act(slurm, tmp_path, "act", [e for _, e in events])
    assert (resumed.returncode, resumed.stderr) == (0, "")
    shown = show(slurm, "gpu-003")
    state = shown.split(" State=", 1)[1].split(" ", 1)[0]
    assert "DRAIN" not in state and " Reason=" not in shown, shown
    # right after a resume slurmctld may mark the node NOT_RESPONDING ("idle*") until its
    # next ping of the slurmd; it is back in service, idle, within seconds
    deadline = time.monotonic() + 30
    while slurm.run("sinfo", "-h", "-n", "gpu-003", "-o", "%t").strip() != "idle":
        assert time.monotonic() < deadline, show(slurm, "gpu-003")
        time.sleep(0.5)


def test_the_advisors_outbox_bodies_drain_and_resume_the_node(slurm, tmp_path):
    from exporter.advisor.webhook import Receiver
    from tests.test_health_service import service

    advisor = service(tmp_path / "outbox.sqlite", (Receiver("slurm", "http://127.0.0.1:9/", b"s"),))
    outbox = advisor.deliverer.outbox

    def bodies(path: Path) -> Path:
        """What the receiver would get, one body a line: the outbox's pending rows, then done."""
        pending = outbox.pending()
        path.write_bytes(b"".join(d.body + b"\n" for d in pending))
        for d in pending:
            outbox.delivered(d.delivery_id, T0)
        return path

    def run(mode: str, path: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "exporter", "act", "--slurm", "--mode", mode,
                               "--events", str(path), "--audit-log", str(tmp_path / "audit.jsonl")],
                              env={**slurm.env, "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, timeout=60, check=False)

    def gpu_002(at: float, broken: bool = False):
        gpus = [xid_gpu(n, i, T0 + 30, pool="gpu-h200") if broken and (n, i) == ("gpu-002", 3)
                else gpu(n, i, "gpu-h200") for n in H200_NODES for i in range(8)]
        return snap(T0 + at, *gpus)

    advisor.observe_health(gpu_002(0))
    advisor.observe_health(gpu_002(30, broken=True))
    drained = run("act", bodies(tmp_path / "drain.jsonl"))
    assert drained.returncode == 0, drained.stderr
    shown = show(slurm, "gpu-002")
    assert "+DRAIN " in shown and "Reason=gpufleet: XID 79 on GPU 3 [root@" in shown
    for at in range(60, 4000, 60):
        advisor.observe_health(gpu_002(at, broken=True))  # the same XID count: cleared
    path = bodies(tmp_path / "resume.jsonl")
    assert [json.loads(line)["type"] for line in path.read_text().splitlines()] == ["resume"]
    resumed = run("act", path)
    assert (resumed.returncode, resumed.stderr) == (0, "")
    assert "DRAIN" not in show(slurm, "gpu-002").split(" State=", 1)[1].split(" ", 1)[0]
    outbox.close()


def test_a_node_an_operator_drained_is_left_as_it_is(slurm, tmp_path):
    slurm.run("scontrol", "update", "NodeName=gpu-005", "State=DRAIN", "Reason=bad fan")
    try:
        drain = Drain("gpu-005", "gpu-h100", "XID 79 on GPU 0", T0)
        resume = Resume("gpu-005", "gpu-h100", T0, T0 + 3600)
        done = act(slurm, tmp_path, "act", [drain, resume])
        assert (done.returncode, done.stderr) == (0, "")
        shown = show(slurm, "gpu-005")
        assert "+DRAIN " in shown and " Reason=bad fan [root@" in shown
        audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [(r["type"], r["outcome"], r["detail"]) for r in audit] == [
            ("drain", "skipped", "already drained by someone else: their reason kept"),
            ("resume", "skipped", "not drained by gpufleet: left as it is")]
    finally:
        slurm.run("scontrol", "update", "NodeName=gpu-005", "State=RESUME")
