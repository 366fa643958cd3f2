"""Health remediation against a real Slurm (issue 31, Must show): an XID 79 on GPU 3 of
gpu-003 becomes a drain decision; ``gpufleet act --slurm --mode dry-run`` prints the exact
scontrol command and changes nothing; ``--mode act`` drains the node (``scontrol show node``
shows DRAIN with gpufleet's reason); after the fault clears, the clean window and the
minimum drain time pass, the resume decision is acted on and the node is idle again.

The first tests build their snapshots; the second takes the events from where the advisor
puts them: its service observes the snapshots and queues each event in the outbox, and the
bodies the receiver would get are what ``gpufleet act`` runs. The last runs the whole path:
fake dcgm-exporter targets read by a real ``gpufleet serve``, whose webhook reaches a real
receiver, whose bodies ``gpufleet act`` runs against the cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.health.remediation import Drain, Remediator, ResetGpu, Resume, encode_event
from exporter.health.verdict import HealthTracker
from tests.helpers import REPO, data_dir, free_port, stop, wait_http, wait_until
from tests.helpers.health import T0, gpu, snap, xid_gpu
from tests.helpers.slurm_cluster import H100_NODES, H200_NODES, SlurmCluster, running_cluster

pytestmark = pytest.mark.slow  # a real Slurm (slurmctld, slurmd, munge)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with running_cluster(Path(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


def show(slurm: SlurmCluster, node: str) -> str:
    return slurm.run("scontrol", "show", "node", "-o", node)


def act_on(slurm: SlurmCluster, tmp_path: Path, mode: str, events: Path) -> subprocess.CompletedProcess:
    """``gpufleet act --slurm`` on an events file, with one audit log per test."""
    return subprocess.run([sys.executable, "-m", "exporter", "act", "--slurm", "--mode", mode,
                           "--events", str(events), "--audit-log", str(tmp_path / "audit.jsonl")],
                          env={**slurm.env, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, check=False)


def act(slurm: SlurmCluster, tmp_path: Path, mode: str, events: list) -> subprocess.CompletedProcess:
    path = tmp_path / f"events-{mode}.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    return act_on(slurm, tmp_path, mode, path)


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
    store = advisor.deliverer.store

    def bodies(path: Path) -> Path:
        """What the receiver would get, one body a line: the outbox's pending rows, then done,
        until none is pending (a node's later event is handed out once the earlier is done)."""
        received = []
        while pending := store.pending():
            received += [d.body + b"\n" for d in pending]
            for d in pending:
                store.delivered(d.delivery_id, T0)
        path.write_bytes(b"".join(received))
        return path

    def gpu_002(at: float, broken: bool = False):
        gpus = [xid_gpu(n, i, T0 + 30, pool="gpu-h200") if broken and (n, i) == ("gpu-002", 3)
                else gpu(n, i, "gpu-h200") for n in H200_NODES for i in range(8)]
        return snap(T0 + at, *gpus)

    advisor.observe_health(gpu_002(0))
    advisor.observe_health(gpu_002(30, broken=True))
    drained = act_on(slurm, tmp_path, "act", bodies(tmp_path / "drain.jsonl"))
    assert drained.returncode == 0, drained.stderr
    shown = show(slurm, "gpu-002")
    assert "+DRAIN " in shown and "Reason=gpufleet: XID 79 on GPU 3 [root@" in shown
    for at in range(60, 4000, 60):
        advisor.observe_health(gpu_002(at, broken=True))  # the same XID count: cleared
    path = bodies(tmp_path / "resume.jsonl")
    assert [json.loads(line)["type"] for line in path.read_text().splitlines()] == ["resume"]
    resumed = act_on(slurm, tmp_path, "act", path)
    assert (resumed.returncode, resumed.stderr) == (0, "")
    assert "DRAIN" not in show(slurm, "gpu-002").split(" State=", 1)[1].split(" ", 1)[0]
    store.close()


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


# -- the whole path: a dcgm-exporter target, a real `gpufleet serve`, its webhook, act --------

DCGM_SAMPLE = data_dir() / "dcgm-samples" / "h100-8gpu-k8s-pod-labels.prom"
X = "gpu-007"  # the node whose GPU 3 throws XID 79; gpu-005..008 are the gpu-h100 partition
MIN_DRAIN = 8.0  # advisor.health.min_drain of the serve below
CLEAN_WINDOW = 2.0  # advisor.health.clean_window


def dcgm_body(node: str, xid_on_gpu: int | None = None) -> str:
    """What ``node``'s dcgm-exporter serves: the H100 sample (8 GPUs, GPU 0 held by a pod)
    with its Hostname, UUIDs and pod made the node's, and the health fields of
    dcgm-exporter's default counters at 0 on every GPU: the last XID (with the
    err_code/err_msg labels dcgm-exporter adds), PCIe replays, remapped rows. GPU
    ``xid_on_gpu`` reports XID 79 as its last XID."""
    text = DCGM_SAMPLE.read_text().replace('Hostname="gpu-node-1"', f'Hostname="{node}"')
    text = re.sub(r'UUID="GPU-([0-9a-f-]+)"', lambda m: f'UUID="GPU-{m[1][:-3]}{node[-3:]}"', text)
    text = text.replace('pod="vllm-agg-0-vllmdecodeworker-s65j5"', f'pod="vllm-{node}"')
    lines = [text.rstrip("\n")]
    for gpu_line in re.findall(r"^DCGM_FI_DEV_GPU_TEMP\{(.*)\} \S+$", text, re.M):
        index = int(re.match(r'gpu="(\d+)"', gpu_line)[1])  # type: ignore[index]
        xid, message = (79, "GPU has fallen off the bus") if index == xid_on_gpu else (0, "No Error")
        lines += [f'DCGM_FI_DEV_XID_ERRORS{{{gpu_line},err_code="{xid}",err_msg="{message}"}} {xid}',
                  *(f"{field}{{{gpu_line}}} 0" for field in (
                      "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                      "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE"))]
    return "\n".join(lines) + "\n"


def plan_slurm(url: str) -> tuple[int, str]:
    """``gpufleet plan --format slurm`` on a running gpufleet: its status and stdout."""
    done = subprocess.run([sys.executable, "-m", "exporter", "plan", "--from", url, "--format", "slurm"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, check=False)
    return done.returncode, done.stdout


def publish(root: Path, node: str, body: str) -> None:
    """Replace what the node's target serves in one rename: a read never sees half a body."""
    (root / node).mkdir(exist_ok=True)
    tmp = root / node / "metrics.tmp"
    tmp.write_text(body)
    os.replace(tmp, root / node / "metrics")


def test_an_xid_on_a_dcgm_target_drains_and_resumes_the_node_through_serve_and_act(
        slurm, tmp_path, exporter_factory):
    from tests.test_advisor_e2e import ENV, Scheduler, metric
    from tests.test_health_service import schema

    targets = tmp_path / "dcgm"
    targets.mkdir()
    for node in H100_NODES:
        publish(targets, node, dcgm_body(node))
    port = free_port()
    dcgm = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(targets)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheduler = Scheduler(free_port()).start()
    try:
        urls = [f"http://127.0.0.1:{port}/{node}/metrics" for node in H100_NODES]
        wait_http(urls[0], proc=dcgm)
        exporter = exporter_factory("--source", "dcgm", env=ENV, config=f"""
collect_interval: 500ms
source_timeout: 3s
sources:
  dcgm:
    targets: [{', '.join(urls)}]
    timeout: 2s
    pool: gpu-h100
advisor:
  outbox: {tmp_path / 'outbox.sqlite'}
  retry_initial: 200ms
  retry_max: 1s
  receivers:
    - {{name: slurm, url: "http://127.0.0.1:{scheduler.port}/gpufleet/plan", timeout: 5s}}
  health:
    clean_window: {CLEAN_WINDOW:g}s
    min_drain: {MIN_DRAIN:g}s
""")
        # every GPU read healthy once, so the XID below is a change the tracker sees
        wait_until("32 healthy GPUs", lambda: metric(exporter.url, "gpufleet_health_gpus",
                                                     pool="gpu-h100", verdict="healthy") == 32)
        assert scheduler.accepted == []
        started = time.time()
        publish(targets, X, dcgm_body(X, xid_on_gpu=3))

        wait_until("the drain and the reset delivered", lambda: len(scheduler.accepted) >= 2)
        assert scheduler.bad_signatures == 0
        assert [h["X-Gpufleet-Event"] for h, _ in scheduler.requests] == ["remediation"] * 2
        drain, reset = sorted(scheduler.accepted, key=lambda b: b["type"])
        at = drain["at"]
        assert started <= at <= time.time()
        assert drain == {"at": at, "event": "remediation", "id": f"drain:{X}:{round(at * 1000)}",
                         "node": X, "pool": "gpu-h100", "reason": "XID 79 on GPU 3",
                         "schema_version": 1, "type": "drain"}
        # GPU 3 holds no pod: a reset is advised too (Slurm has no verb for it)
        assert reset == {"at": at, "event": "remediation", "gpu": 3,
                         "id": f"reset_gpu:{X}/3:{round(at * 1000)}", "node": X,
                         "pool": "gpu-h100", "reason": "XID 79 on GPU 3", "schema_version": 1,
                         "type": "reset_gpu"}
        for body in (drain, reset):
            assert sorted(schema("RemediationEvent").iter_errors(body), key=str) == []
        received = tmp_path / "received.jsonl"  # what a receiver appends, one body a line
        received.write_bytes(b"".join(body + b"\n" for _, body in scheduler.requests))

        command = f'scontrol update NodeName={X} State=DRAIN Reason="gpufleet: XID 79 on GPU 3"\n'
        # gpufleet plan reads the same from serve's /v1/advice
        assert plan_slurm(exporter.url) == (0, command)
        dry = act_on(slurm, tmp_path, "dry-run", received)
        assert (dry.returncode, dry.stdout) == (0, command)
        assert dry.stderr.startswith("gpufleet act: advice, no command: ") and '"reset_gpu"' in dry.stderr
        assert "DRAIN" not in show(slurm, X) and "Reason=" not in show(slurm, X)

        done = act_on(slurm, tmp_path, "act", received)
        assert (done.returncode, done.stdout) == (0, ""), done.stderr
        shown = show(slurm, X)
        assert "State=IDLE+DRAIN " in shown and "Reason=gpufleet: XID 79 on GPU 3 [root@" in shown
        assert all("DRAIN" not in show(slurm, n) for n in ("gpu-006", "gpu-008"))

        # the GPU is reset: its last XID reads 0 again; the clean window and the minimum
        # drain time pass, and a resume is delivered
        publish(targets, X, dcgm_body(X))
        wait_until("the resume delivered", lambda: len(scheduler.accepted) >= 3, timeout=90)
        resume = scheduler.accepted[2]
        assert resume == {"at": resume["at"], "drained_at": at, "event": "remediation",
                          "id": f"resume:{X}:{round(resume['at'] * 1000)}", "node": X,
                          "pool": "gpu-h100", "schema_version": 1, "type": "resume"}
        assert resume["at"] - at >= MIN_DRAIN
        assert "+DRAIN " in show(slurm, X)  # only act changes Slurm
        assert plan_slurm(exporter.url) == (0, f"scontrol update NodeName={X} State=RESUME\n")
        received.write_bytes(b"".join(body + b"\n" for _, body in scheduler.requests))

        # every body received so far, again: the drain the audit log records as done is
        # skipped, the resume is run
        resumed = act_on(slurm, tmp_path, "act", received)
        assert (resumed.returncode, resumed.stdout) == (0, ""), resumed.stderr
        shown = show(slurm, X)
        assert "DRAIN" not in shown.split(" State=", 1)[1].split(" ", 1)[0] and " Reason=" not in shown
        audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert [(r["mode"], r["type"], r["outcome"]) for r in audit] == [
            ("dry-run", "drain", "printed"), ("dry-run", "reset_gpu", "advice"),
            ("act", "drain", "done"), ("act", "reset_gpu", "advice"),
            ("act", "drain", "skipped"), ("act", "reset_gpu", "advice"), ("act", "resume", "done")]
        wait_until(f"{X} idle", lambda: slurm.run("sinfo", "-h", "-n", X, "-o", "%t").strip() == "idle",
                   timeout=30)
        # nothing more was advised: no second drain of the node, no page
        assert [b["type"] for b in scheduler.accepted] == ["drain", "reset_gpu", "resume"]
        assert metric(exporter.url, "gpufleet_remediation_drained_nodes", pool="gpu-h100") == 0
    finally:
        scheduler.close()
        stop(dcgm)
