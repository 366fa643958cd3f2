"""``gpufleet plan --format slurm|kubernetes`` (issue 31, Build 2): the remediation in a
/v1/advice answer's ``health``, rendered as the exact scontrol commands, or as the node
merge patches built from the node the (fake) apiserver answers, changing nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exporter.advisor.wire import event_json
from exporter.cli.plan import current
from exporter.health.remediation import Drain, Page, Replace, ResetGpu, Resume, encode_event
from exporter.health.render import kubernetes_patch
from tests.helpers import REPO
from tests.helpers.fake_apiserver import NODES, FakeApiserver, read_objects

T0 = 1_764_547_200.0
RECORDED = Path(__file__).parent / "data" / "kubernetes"
# oldest first: gpu-003 drained, then resumed; gpu-005 drained, a reset advised
HISTORY = [Drain("gpu-003", "h200", "XID 79 on GPU 3", T0),
           Drain("gpu-005", "h100", "uncorrectable ECC error on GPU 1", T0 + 600),
           ResetGpu("gpu-005", "h100", 1, "uncorrectable ECC error on GPU 1", T0 + 600),
           Resume("gpu-003", "h200", T0, T0 + 3700)]


def advice(events: list[Any]) -> dict[str, Any]:
    """The parts of a /v1/advice answer plan reads; the advice lists the newest event first."""
    return {"decision": "none", "scope": "cluster", "reasons": [], "plan": None,
            "health": {"evaluated_at": T0 + 3700, "drained": [],
                       "recent_remediation": [event_json(e) for e in reversed(events)]}}


def plan(tmp_path: Path, data: Any, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "advice.json"
    path.write_text(json.dumps(data))
    return subprocess.run([sys.executable, "-m", "exporter", "plan", "--from", str(path), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_slurm_prints_each_nodes_latest_drain_or_resume_as_its_exact_command(tmp_path):
    done = plan(tmp_path, advice(HISTORY), "--format", "slurm")
    assert (done.returncode, done.stdout) == (0, (
        'scontrol update NodeName=gpu-005 State=DRAIN Reason="gpufleet: uncorrectable ECC error on GPU 1"\n'
        "scontrol update NodeName=gpu-003 State=RESUME\n"))
    assert done.stderr == f"gpufleet plan: advice, no command: {encode_event(HISTORY[2]).decode()}\n"


def test_only_the_latest_action_of_a_node_and_the_advice_since_are_kept():
    again = Drain("gpu-003", "h200", "XID 48 on GPU 0", T0 + 7200)
    old_reset = ResetGpu("gpu-003", "h200", 3, "XID 79 on GPU 3", T0)
    page = Page("h100", ("gpu-005", "gpu-006"), "2 failing nodes, budget 1", T0 + 100)
    replace = Replace("gpu-003", "h200", 3, 604800.0, T0 + 7200)
    events = [HISTORY[0], old_reset, page, *HISTORY[1:], again, replace]
    # gpu-003's drain at T0 and its resume are undone by the new drain: only that one stays,
    # with the replacement advised at the same time; the reset before it is stale
    assert current(events) == [page, HISTORY[1], HISTORY[2], again, replace]
    assert current([]) == []


def test_nothing_to_render_and_bad_input_are_one_line(tmp_path):
    done = plan(tmp_path, advice([]), "--format", "slurm")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "", "gpufleet: no remediation: gpufleet decided no drain, resume or other action lately\n")
    done = plan(tmp_path, {"decision": "none", "plan": None, "health": None}, "--format", "slurm")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "", "gpufleet: no remediation: the advice has no health (the advisor has evaluated no "
               "snapshot yet)\n")
    bad: list[tuple[Any, str]] = [
        ({"plan_id": "plan-abc", "migrations": []},
         "a plan, not /v1/advice's answer: remediation is in the advice's health"),
        ({"health": {"recent_remediation": "drain"}}, "health.recent_remediation: expected a list"),
        ({"health": {"recent_remediation": [event_json(HISTORY[0]), {"type": "drain", "node": 3}]}},
         "health.recent_remediation[1]: "),
        ([1, 2], "expected a JSON object (/v1/advice's answer)"),
    ]
    for data, message in bad:
        done = plan(tmp_path, data, "--format", "slurm")
        assert (done.returncode, done.stdout) == (1, ""), data
        assert done.stderr.startswith("gpufleet: ") and message in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    # a node name no command may carry: that event fails, the others are printed
    evil = Drain("gpu-1; reboot", "h100", "XID 79 on GPU 0", T0 + 900)
    done = plan(tmp_path, advice([HISTORY[0], evil]), "--format", "slurm")
    assert (done.returncode, done.stdout) == (
        1, 'scontrol update NodeName=gpu-003 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"\n')
    assert done.stderr == ("gpufleet: drain:gpu-1; reboot:1764548100000: node: 'gpu-1; reboot' is "
                           "not a node name (letters, digits, '.', '_', '-')\n")


@pytest.mark.parametrize(("args", "message"), [
    (("--format", "kubernetes"), "--api-server: needed with --format kubernetes"),
    (("--format", "kubernetes", "--api-server", "10.0.0.1:6443"), "--api-server: must be an http(s) URL"),
    (("--format", "slurm", "--api-server", "https://10.0.0.1:6443"), "only with --format kubernetes"),
    (("--format", "json", "--api-token-file", "t"), "only with --format kubernetes"),
])
def test_apiserver_options_are_checked_in_one_line(tmp_path, args, message):
    done = plan(tmp_path, advice(HISTORY), *args)
    assert (done.returncode, done.stdout) == (2, "")
    assert message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.fixture
async def apiserver():
    fake = FakeApiserver()
    fake.load([n for n in read_objects(RECORDED) if n["kind"] == "Node"])
    await fake.start()
    yield fake
    await fake.kill()


async def test_kubernetes_prints_the_patch_from_the_node_read_and_changes_nothing(apiserver, tmp_path):
    drain = Drain("gpu-node-1", "a", "XID 79 on GPU 3", T0)
    before = apiserver.get(NODES, "gpu-node-1")
    version = apiserver.version
    done = await asyncio.to_thread(plan, tmp_path, advice([drain]), "--format", "kubernetes",
                                   "--api-server", apiserver.url)
    assert (done.returncode, done.stderr) == (0, "")
    patch = json.loads(done.stdout)
    assert patch == kubernetes_patch(drain, before)
    assert patch["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert patch["spec"]["unschedulable"] is True
    assert {"key": "gpufleet.io/gpu-unhealthy", "value": "XID-79-on-GPU-3",
            "effect": "NoSchedule"} in patch["spec"]["taints"]
    assert apiserver.get(NODES, "gpu-node-1") == before and apiserver.version == version
    assert apiserver.requests == ["GET /api/v1/nodes/gpu-node-1"]
    # a node the apiserver does not have: one line, status 1
    done = await asyncio.to_thread(plan, tmp_path, advice([Drain("gpu-node-9", "a", "XID 79 on GPU 0", T0)]),
                                   "--format", "kubernetes", "--api-server", apiserver.url)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("gpufleet: drain:gpu-node-9:1764547200000: ") and \
        len(done.stderr.splitlines()) == 1, done.stderr
