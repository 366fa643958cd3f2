"""Renderers and ``gpufleet act`` (issue 31): the exact scontrol command, dry-run changing
nothing, the cordon and taint patches guarded by resourceVersion against the fake apiserver
(with a 409 retried), each patched node valid against Kubernetes' Node schema, and the audit
log making a replay idempotent."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import main
from exporter.health.act import Actor, KubernetesApi
from exporter.health.remediation import Drain, Page, Replace, ResetGpu, Resume, encode_event
from exporter.health.render import (
    TAINT_KEY,
    RenderError,
    kubernetes_patch,
    slurm_argv,
    slurm_command_text,
    taint_value,
)
from tests.helpers.fake_apiserver import NODES, FakeApiserver, read_objects

T0 = 1_764_547_200.0
DRAIN = Drain("gpu-node-1", "a", "XID 79 on GPU 3", T0)
RESUME = Resume("gpu-node-1", "a", T0, T0 + 3600)
BIN = Path(sys.executable).parent
KUBERNETES_VERSION = "1.32.0"  # as tests/test_deploy_kubernetes.py
RECORDED = Path(__file__).parent / "data" / "kubernetes"


def test_slurm_commands_are_exact():
    argv = slurm_argv(DRAIN)
    assert argv == ["scontrol", "update", "NodeName=gpu-node-1", "State=DRAIN",
                    "Reason=gpufleet: XID 79 on GPU 3"]
    assert slurm_command_text(argv) == \
        'scontrol update NodeName=gpu-node-1 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"'
    assert slurm_argv(RESUME) == ["scontrol", "update", "NodeName=gpu-node-1", "State=RESUME"]
    assert slurm_argv(ResetGpu("n", "a", 3, "XID 79 on GPU 3", T0)) is None
    assert slurm_argv(Replace("n", "a", 3, 604800.0, T0)) is None
    # nothing a shell would expand reaches the reason; a node name is a node name
    nasty = Drain("n1", "a", 'x"; rm -rf / $(id) `id`', T0)
    assert slurm_argv(nasty)[-1] == "Reason=gpufleet: x_; rm -rf / _(id) _id_"  # type: ignore[index]
    with pytest.raises(RenderError, match="node: 'n1; reboot' is not a node name"):
        slurm_argv(Drain("n1; reboot", "a", "x", T0))


def test_taint_value_is_a_label_value():
    assert taint_value("XID 79 on GPU 3") == "XID-79-on-GPU-3"
    assert taint_value("XID 79 on GPU 3; uncorrectable ECC error on GPU 5") == \
        "XID-79-on-GPU-3-uncorrectable-ECC-error-on-GPU-5"
    long = taint_value("; ".join(f"XID 79 on GPU {n}" for n in range(8)))
    assert len(long) <= 63 and long[-1].isalnum()


def node(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-node-1", "resourceVersion": "7"}, "spec": spec}


def test_kubernetes_patches_keep_other_taints_and_uncordon_only_what_gpufleet_cordoned():
    other = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    patch = kubernetes_patch(DRAIN, node(taints=[other]))
    assert patch == {
        "metadata": {"resourceVersion": "7", "annotations": {
            "gpufleet.io/gpu-unhealthy-reason": "gpufleet: XID 79 on GPU 3",
            "gpufleet.io/cordoned": "true"}},
        "spec": {"unschedulable": True, "taints": [
            other, {"key": TAINT_KEY, "value": "XID-79-on-GPU-3", "effect": "NoSchedule"}]}}
    # an operator cordoned it first: gpufleet taints it but will not uncordon it
    by_hand = kubernetes_patch(DRAIN, node(unschedulable=True))
    assert by_hand is not None and "gpufleet.io/cordoned" not in by_hand["metadata"]["annotations"]
    ours = node(unschedulable=True, taints=[other, {"key": TAINT_KEY, "value": "x", "effect": "NoSchedule"}])
    ours["metadata"]["annotations"] = {"gpufleet.io/cordoned": "true"}
    assert kubernetes_patch(RESUME, ours) == {
        "metadata": {"resourceVersion": "7", "annotations": {
            "gpufleet.io/gpu-unhealthy-reason": None, "gpufleet.io/cordoned": None}},
        "spec": {"taints": [other], "unschedulable": None}}
    assert kubernetes_patch(RESUME, node(unschedulable=True))["spec"] == {"taints": None}  # type: ignore[index]
    with pytest.raises(RenderError, match="the event is for gpu-node-1, the node read is 'other'"):
        kubernetes_patch(DRAIN, {"metadata": {"name": "other", "resourceVersion": "1"}})


@pytest.fixture
def fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """An scontrol that logs its arguments and shows node gpu-node-1 drained by gpufleet."""
    calls = tmp_path / "calls"
    script = tmp_path / "scontrol"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
if [ "$1" = show ]; then echo "NodeName=$4 State=IDLE+DRAIN Reason=gpufleet: XID 79 on GPU 3 [root@now]"; fi
""")
    script.chmod(0o755)
    return script, calls


def events_file(tmp_path: Path, *events: Any) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    return path


def test_slurm_dry_run_prints_the_exact_command_and_runs_nothing(tmp_path, fake_scontrol, capsys):
    script, calls = fake_scontrol
    path = events_file(tmp_path, DRAIN, RESUME, Page("a", ("n1",), "storm", T0))
    audit = tmp_path / "audit.jsonl"
    assert main(["act", "--slurm", "--mode", "dry-run", "--events", str(path), "--scontrol",
                 str(script), "--audit-log", str(audit)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        'scontrol update NodeName=gpu-node-1 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"',
        "scontrol update NodeName=gpu-node-1 State=RESUME"]
    assert "page for pool a: storm (n1)" in err
    assert not calls.exists()
    assert [json.loads(line)["outcome"] for line in audit.read_text().splitlines()] == \
        ["printed", "printed", "advice"]
    assert main(["act", "--slurm", "--events", str(path), "--scontrol", str(script),
                 "--audit-log", str(audit)]) == 0  # observe, the default
    # observe says what it would do, so an operator can check it first, and runs nothing
    assert capsys.readouterr().out.splitlines() == [
        'drain:gpu-node-1:1764547200000: would run: scontrol update NodeName=gpu-node-1 '
        'State=DRAIN Reason="gpufleet: XID 79 on GPU 3"',
        "resume:gpu-node-1:1764550800000: would run: scontrol update NodeName=gpu-node-1 "
        "State=RESUME"]
    assert not calls.exists()


def test_slurm_act_runs_scontrol_once_even_when_replayed(tmp_path, fake_scontrol, capsys):
    script, calls = fake_scontrol
    path = events_file(tmp_path, DRAIN, RESUME)
    audit = tmp_path / "audit.jsonl"
    args = ["act", "--slurm", "--mode", "act", "--events", str(path), "--scontrol", str(script),
            "--audit-log", str(audit)]
    assert main(args) == 0
    assert calls.read_text().splitlines() == [
        "show node -o gpu-node-1", "update NodeName=gpu-node-1 State=DRAIN Reason=gpufleet: XID 79 on GPU 3",
        "show node -o gpu-node-1", "update NodeName=gpu-node-1 State=RESUME"]
    assert main(args) == 0  # a restart replaying the same events
    assert len(calls.read_text().splitlines()) == 4
    assert [json.loads(line)["outcome"] for line in audit.read_text().splitlines()] == \
        ["done", "done", "skipped", "skipped"]


def test_slurm_leaves_a_node_an_operator_drained(tmp_path):
    script = tmp_path / "scontrol"
    calls = tmp_path / "calls"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                      'echo "NodeName=gpu-node-1 State=IDLE+DRAIN Reason=bad fan [ops@now]"\n')
    script.chmod(0o755)
    actor = Actor("slurm", "act", tmp_path / "audit.jsonl", io.StringIO(), scontrol=str(script))
    record = actor.handle(DRAIN)
    assert (record["outcome"], record["detail"]) == \
        ("skipped", "already drained by someone else: their reason kept")
    record = actor.handle(RESUME)
    assert (record["outcome"], record["detail"]) == ("skipped", "not drained by gpufleet: left as it is")
    assert calls.read_text().splitlines() == ["show node -o gpu-node-1"] * 2


def test_a_failing_scontrol_is_one_line_and_exit_1(tmp_path, capsys):
    script = tmp_path / "scontrol"
    script.write_text('#!/bin/sh\n'
                      'if [ "$1" = show ]; then echo "NodeName=gpu-node-1 State=IDLE"; exit 0; fi\n'
                      'echo "slurm_update error: Invalid node name specified" >&2\nexit 1\n')
    script.chmod(0o755)
    assert main(["act", "--slurm", "--mode", "act", "--events", str(events_file(tmp_path, DRAIN)),
                 "--scontrol", str(script), "--audit-log", str(tmp_path / "a.jsonl")]) == 1
    assert capsys.readouterr().err == (
        "gpufleet act: drain:gpu-node-1:1764547200000: scontrol update NodeName=gpu-node-1: exit 1: "
        "slurm_update error: Invalid node name specified\n")


def test_bad_events_and_options_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(encode_event(DRAIN).decode() + '\n{"type": "drain", "node": "n1"}\n')
    assert main(["act", "--slurm", "--events", str(bad), "--audit-log", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err == ("gpufleet: --events " + str(bad) + ": line 2: remediation "
                                       "event: Object missing required field `pool`\n")
    assert main(["act", "--kubernetes", "--mode", "dry-run", "--events", str(bad)]) == 2
    assert "--api-server: needed with --kubernetes --mode dry-run" in capsys.readouterr().err


def validate(obj: dict[str, Any], tmp_path: Path) -> None:
    """The node against Kubernetes 1.32's Node schema, unknown fields refused. Its status is
    left out: gpufleet never writes it, and the recorded one was redacted (no machineID)."""
    path = tmp_path / "node.json"
    path.write_text(json.dumps({k: v for k, v in obj.items() if k != "status"}))
    done = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION,
                           str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"passed for resource node/{obj['metadata']['name']}" in done.stdout + done.stderr


@pytest.fixture
async def apiserver():
    fake = FakeApiserver()
    fake.load([n for n in read_objects(RECORDED) if n["kind"] == "Node"])
    await fake.start()
    yield fake
    await fake.kill()


async def test_kubernetes_cordon_taint_and_resume_against_the_fake_apiserver(apiserver, tmp_path):
    actor = Actor("kubernetes", "act", tmp_path / "audit.jsonl", io.StringIO(),
                  KubernetesApi(apiserver.url))
    before = apiserver.get(NODES, "gpu-node-1")
    record = await asyncio.to_thread(actor.handle, DRAIN)
    assert record["outcome"] == "done" and record["conflicts"] == 0
    assert record["patch"]["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    drained = apiserver.get(NODES, "gpu-node-1")
    assert drained["spec"]["unschedulable"] is True
    assert {"key": TAINT_KEY, "value": "XID-79-on-GPU-3", "effect": "NoSchedule"} in drained["spec"]["taints"]
    assert [t for t in drained["spec"]["taints"] if t["key"] != TAINT_KEY] == before["spec"].get("taints", [])
    assert drained["metadata"]["annotations"]["gpufleet.io/gpu-unhealthy-reason"] == \
        "gpufleet: XID 79 on GPU 3"
    validate(drained, tmp_path)
    record = await asyncio.to_thread(actor.handle, RESUME)
    assert record["outcome"] == "done"
    resumed = apiserver.get(NODES, "gpu-node-1")
    assert "unschedulable" not in resumed["spec"]
    assert resumed["spec"].get("taints", []) == before["spec"].get("taints", [])
    assert resumed["metadata"].get("annotations", {}) == before["metadata"].get("annotations", {})
    validate(resumed, tmp_path)
    assert [r.split("?")[0] for r in apiserver.requests] == [
        "GET /api/v1/nodes/gpu-node-1", "PATCH /api/v1/nodes/gpu-node-1"] * 2


async def test_a_conflict_is_read_again_and_retried_keeping_the_other_writers_change(apiserver, tmp_path):
    apiserver.concurrent_writes = 2  # two other writers get in before gpufleet's patch
    actor = Actor("kubernetes", "act", tmp_path / "audit.jsonl", io.StringIO(),
                  KubernetesApi(apiserver.url))
    record = await asyncio.to_thread(actor.handle, DRAIN)
    assert (record["outcome"], record["conflicts"]) == ("done", 2)
    assert apiserver.requests == ["GET /api/v1/nodes/gpu-node-1", "PATCH /api/v1/nodes/gpu-node-1"] * 3
    node = apiserver.get(NODES, "gpu-node-1")
    assert node["spec"]["unschedulable"] is True and "other-writer" in node["metadata"]["labels"]
    validate(node, tmp_path)
    # a node that never stops changing: gpufleet gives up, one line, after its retries
    apiserver.concurrent_writes = 10
    stubborn = Actor("kubernetes", "act", tmp_path / "audit2.jsonl", io.StringIO(),
                     KubernetesApi(apiserver.url), max_conflict_retries=2)
    record = await asyncio.to_thread(stubborn.handle, Drain("gpu-node-2", "a", "XID 79 on GPU 0", T0))
    assert record["outcome"] == "failed"
    assert record["error"] == "409 Conflict 3 times: the node keeps changing; try again later"


async def test_kubernetes_dry_run_prints_the_patch_and_changes_nothing(apiserver, tmp_path):
    out = io.StringIO()
    actor = Actor("kubernetes", "dry-run", tmp_path / "audit.jsonl", out, KubernetesApi(apiserver.url))
    before = apiserver.get(NODES, "gpu-node-1")
    version = apiserver.version
    record = await asyncio.to_thread(actor.handle, DRAIN)
    assert record["outcome"] == "printed"
    assert json.loads(out.getvalue()) == kubernetes_patch(DRAIN, before)
    assert apiserver.get(NODES, "gpu-node-1") == before and apiserver.version == version
    assert [r.split(" ")[0] for r in apiserver.requests] == ["GET"]


def test_act_is_registered_and_its_help_is_fast():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "exporter", "act", "--help"],
                          capture_output=True, text=True, timeout=60, check=True, env=env)
    assert "--mode {observe,dry-run,act}" in done.stdout
    assert "exporter.health" not in done.stderr  # the work is imported when it runs


async def test_a_missing_node_or_a_bad_name_fails_in_one_line_without_a_request(apiserver, tmp_path):
    actor = Actor("kubernetes", "act", tmp_path / "audit.jsonl", io.StringIO(),
                  KubernetesApi(apiserver.url))
    record = await asyncio.to_thread(actor.handle, Drain("gpu-node-9", "a", "XID 79 on GPU 0", T0))
    assert record["error"] == 'GET /api/v1/nodes/gpu-node-9: HTTP 404: nodes "gpu-node-9" not found'
    apiserver.requests.clear()
    record = await asyncio.to_thread(actor.handle, Drain("../pods", "a", "x", T0))
    assert record["error"] == "node: '../pods' is not a node name (letters, digits, '.', '_', '-')"
    assert apiserver.requests == []


@pytest.mark.slow
async def test_the_fakes_patch_and_conflict_are_what_kubectl_accepts(apiserver, tmp_path):
    """kubectl (client-go) sends gpufleet's drain patch to the fake as to a real apiserver;
    sent again, its stale resourceVersion is refused with the Conflict kubectl reports."""
    from tests.helpers.fake_apiserver import write_kubeconfig

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
    patch = json.dumps(kubernetes_patch(DRAIN, apiserver.get(NODES, "gpu-node-1")))

    def kubectl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args],
                              capture_output=True, text=True, timeout=60, check=False)

    command = ("patch", "node", "gpu-node-1", "--type", "merge", "-p", patch)
    first = await asyncio.to_thread(kubectl, *command)
    assert (first.returncode, first.stdout) == (0, "node/gpu-node-1 patched\n")
    again = await asyncio.to_thread(kubectl, *command)
    assert again.returncode == 1
    assert again.stderr.startswith('Error from server (Conflict): Operation cannot be fulfilled on '
                                   'nodes "gpu-node-1": the object has been modified')
    taints = await asyncio.to_thread(kubectl, "get", "node", "gpu-node-1", "-o", "jsonpath={.spec.taints}")
    assert json.loads(taints.stdout) == [
        {"effect": "NoSchedule", "key": TAINT_KEY, "value": "XID-79-on-GPU-3"}]
