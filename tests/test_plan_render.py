"""exporter/advisor/kube_render.py and ``gpufleet plan`` (exporter/cli/plan.py).

Each move type is rendered in both formats and compared whole. The objects are checked
by real schemas:

- PodMigrationJobs against the Koordinator CRD's openAPIV3Schema (tests/data/koordinator,
  with its origin), made strict as tests/test_deploy_kubernetes.py makes the
  prometheus-operator CRDs;
- the reservation's pod template (schemaless in the CRD), the Evictions, and the
  Evictions' node-affinity hint (as a pod's affinity) with ``kubernetes-validate
  --strict`` against Kubernetes 1.32.

No apiserver or Koordinator runs here: nothing was applied to a cluster, and
``kubectl apply --dry-run=client`` needs one for discovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import io
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from aiohttp import web

from exporter.advisor.kube_render import RenderError, render_evictions, render_koordinator, to_yaml
from exporter.advisor.plan import CompactionPlan, Endpoint, Migration, Prediction
from exporter.advisor.wire import PlanFormatError, plan_from_json, plan_json
from exporter.cli import main
from tests.helpers import REPO
from tests.test_deploy_kubernetes import KUBERNETES_VERSION, strict

CRD = REPO / "tests" / "data" / "koordinator" / "scheduling.koordinator.sh_podmigrationjobs.yaml"
BIN = Path(sys.executable).parent
T0 = 1764547200.0  # 2025-12-01T00:00:00Z: the plan's snapshot
NOW = T0 + 60  # rendered a minute later: 240 s of the plan's 300 s are left

CHECKPOINT = Migration("train-llama", "research", "train-llama-worker-0", Endpoint("gpu-node-1", (2, 3)),
                       Endpoint("gpu-node-2", (0, 1)), "checkpoint_then_migrate", None, 412.0, 1.0, 16.0,
                       "frees gpu-node-1")
MIGRATE = Migration("vllm", "dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5",
                    Endpoint("gpu-node-1", (0,)), Endpoint("gpu-node-2", (2,)), "migrate", None, 0.0,
                    1.0, 4.5, "")
SHARED = Migration("nb", "lab", "notebook-a", Endpoint("gpu-node-3", (1,)), Endpoint("gpu-node-2", (3,)),
                   "migrate", None, 0.0, 0.25, 0.0, "a quarter GPU")
WAIT = Migration("young", "research", "young-0", Endpoint("gpu-node-1", (4,)), Endpoint("gpu-node-2", (4,)),
                 "wait_until", T0 + 180, 0.0, 1.0, 2.0, "younger than 30 min")


def make_plan(*migrations: Migration) -> CompactionPlan:
    return CompactionPlan(scope="pool:h100", snapshot_time=T0, expires_at=T0 + 300, decision="compact",
                          reasons=("fragmentation index 62 above 40",), before=Prediction(62.0, 12.0),
                          after=Prediction(20.0, 4.0), nodes_freed={"h100": 1}, migrations=migrations)


PLAN = make_plan(CHECKPOINT, MIGRATE, SHARED, WAIT)
PID = PLAN.plan_id


def objects(documents: list[Any]) -> list[dict[str, Any]]:
    return [d.obj for d in documents if d.obj is not None]


def annotations(order: int, m: Migration, **extra: str) -> dict[str, str]:
    return {
        "gpufleet.io/plan-id": PID, "gpufleet.io/order": str(order), "gpufleet.io/job": m.job,
        "gpufleet.io/action": m.action,
        "gpufleet.io/from": f"{m.source.node}:{','.join(map(str, m.source.gpus))}",
        "gpufleet.io/to": f"{m.destination.node}:{','.join(map(str, m.destination.gpus))}",
        "gpufleet.io/gpu-seconds-since-checkpoint": f"{m.cost_gpu_seconds:g}",
        "gpufleet.io/expires-at": "2025-12-01T00:05:00Z",
        **({"gpufleet.io/reason": m.reason} if m.reason else {}), **extra,
    }


AFFINITY_NODE_2 = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-2"]}]}]}}


def pmj(order: int, m: Migration, resources: dict[str, Any], paused: bool = False) -> dict[str, Any]:
    labels = {"gpufleet.io/plan-id": PID}
    return {
        "apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "PodMigrationJob",
        "metadata": {"name": f"gpufleet-{PID}-{order}", "labels": labels,
                     "annotations": annotations(order, m)},
        "spec": {
            "mode": "ReservationFirst", **({"paused": True} if paused else {}), "ttl": "240s",
            "podRef": {"apiVersion": "v1", "kind": "Pod", "namespace": m.namespace, "name": m.pod},
            "reservationOptions": {"template": {"metadata": {"labels": labels}, "spec": {"template": {
                "metadata": {"labels": labels},
                "spec": {"affinity": {"nodeAffinity": AFFINITY_NODE_2},
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                          "effect": "NoSchedule"}],
                         "containers": [{"name": "reserved", "resources": resources}]}}}}},
        },
    }


# --- one test per move type, each format --------------------------------------------------


def test_koordinator_checkpoint_then_migrate_is_paused() -> None:
    (doc,) = render_koordinator(make_plan(CHECKPOINT), NOW)
    plan_id = make_plan(CHECKPOINT).plan_id
    expected = pmj(1, CHECKPOINT, {"requests": {"nvidia.com/gpu": "2", "cpu": "16"},
                                   "limits": {"nvidia.com/gpu": "2"}}, paused=True)
    expected = json.loads(json.dumps(expected).replace(PID, plan_id))
    assert doc.obj == expected
    assert doc.comments == (
        "order 1: checkpoint_then_migrate research/train-llama-worker-0 (train-llama) "
        "gpu-node-1:2,3 -> gpu-node-2:0,1",
        f"paused until the job has checkpointed: unpause with kubectl patch pmj gpufleet-{plan_id}-1 "
        "--type merge -p '{\"spec\":{\"paused\":false}}'")


QUARTER = {"koordinator.sh/gpu-core": "25", "koordinator.sh/gpu-memory-ratio": "25"}


def test_koordinator_migrate_whole_and_shared_gpus() -> None:
    docs = render_koordinator(PLAN, NOW)
    assert objects(docs)[1:] == [
        pmj(2, MIGRATE, {"requests": {"nvidia.com/gpu": "1", "cpu": "4500m"},
                         "limits": {"nvidia.com/gpu": "1"}}),
        # a quarter of a GPU: Koordinator's GPU share, in percent; no CPU stated, none asked
        pmj(3, SHARED, {"requests": dict(QUARTER), "limits": dict(QUARTER)}),
    ]
    assert objects(docs)[0] == pmj(1, CHECKPOINT, {"requests": {"nvidia.com/gpu": "2", "cpu": "16"},
                                                   "limits": {"nvidia.com/gpu": "2"}}, paused=True)


def test_wait_until_renders_no_object() -> None:
    for render in (render_koordinator, render_evictions):
        (doc,) = render(make_plan(WAIT), NOW)
        assert doc.obj is None
        assert doc.comments == (
            "order 1: research/young-0 (young) to gpu-node-2: wait_until 2025-12-01T00:03:00Z.",
            "Not rendered: the job is younger than the planner's minimum age; the next plan carries",
            "this move as a real one.")


def eviction(order: int, m: Migration) -> dict[str, Any]:
    hint = json.dumps(AFFINITY_NODE_2, separators=(",", ":"))
    return {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": m.pod, "namespace": m.namespace,
                         "annotations": annotations(order, m, **{
                             "gpufleet.io/destination-node-affinity": hint})}}


def test_evictions_per_move_type() -> None:
    docs = render_evictions(PLAN, NOW)
    assert objects(docs) == [eviction(1, CHECKPOINT), eviction(2, MIGRATE), eviction(3, SHARED)]
    assert [d.comments for d in docs[:2]] == [
        ("order 1: checkpoint_then_migrate research/train-llama-worker-0 (train-llama) "
         "gpu-node-1:2,3 -> gpu-node-2:0,1",
         "kubectl create --raw /api/v1/namespaces/research/pods/train-llama-worker-0/eviction "
         "-f <this, as JSON>",
         "checkpoint the job first: the eviction stops it at once (after its grace period)"),
        ("order 2: migrate dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5 (vllm) "
         "gpu-node-1:0 -> gpu-node-2:2",
         "kubectl create --raw /api/v1/namespaces/dynamo-workload/pods/"
         "vllm-agg-0-vllmdecodeworker-s65j5/eviction -f <this, as JSON>"),
    ]
    assert docs[3].obj is None  # wait_until


def test_the_stream_parses_back_to_the_objects() -> None:
    for render in (render_koordinator, render_evictions):
        docs = render(PLAN, NOW)
        text = to_yaml(docs, ["header"])
        assert text.startswith("# header\n---\n# order 1: ")
        assert text.count("\n---\n") == 3  # one per object
        assert [o for o in yaml.safe_load_all(text) if o is not None] == objects(docs)
        assert list(yaml.safe_load_all(text)).count(None) == 0  # no empty document


def test_a_line_break_in_a_name_stays_inside_its_comment() -> None:
    # the job name is the sender's text; with a raw line break it would end the comment and
    # put a document of its own choosing into the stream kubectl applies
    evil = dataclasses.replace(MIGRATE, job="vllm\n---\napiVersion: v1\nkind: Secret\n"
                                            "metadata: {name: planted, namespace: default}")
    plan = make_plan(evil)
    for render in (render_koordinator, render_evictions):
        docs = render(plan, NOW)
        text = to_yaml(docs, ["header"])
        assert [o for o in yaml.safe_load_all(text) if o is not None] == objects(docs)
        assert text.count("\n---\n") == 1
        assert "# order 1: migrate dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5 (vllm --- " \
               "apiVersion: v1 kind: Secret " in text


# --- refusals ----------------------------------------------------------------------------


def test_an_expired_plan_is_refused() -> None:
    for render in (render_koordinator, render_evictions):
        with pytest.raises(RenderError) as caught:
            render(PLAN, T0 + 300)
        assert str(caught.value) == f"plan {PID} expired at 2025-12-01T00:05:00Z"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("pod", "Train_0", "pod: not a Kubernetes pod name: 'Train_0'"),
    ("namespace", "a" * 64, f"namespace: not a Kubernetes namespace: '{'a' * 64}'"),
    ("destination", Endpoint("node 2", (0,)), "to.node: not a Kubernetes node name: 'node 2'"),
])
def test_names_kubernetes_would_refuse(field: str, value: Any, message: str) -> None:
    import dataclasses

    bad = make_plan(MIGRATE, dataclasses.replace(MIGRATE, **{field: value}))
    for render in (render_koordinator, render_evictions):
        with pytest.raises(RenderError) as caught:
            render(bad, NOW)
        assert str(caught.value) == f"migrations[order 2].{message}"


def test_plan_from_json_round_trips_and_checks_the_id() -> None:
    data = plan_json(PLAN)
    assert plan_from_json(data) == PLAN
    edited = copy.deepcopy(data)
    edited["migrations"][1]["to"]["node"] = "gpu-node-9"
    with pytest.raises(PlanFormatError) as caught:
        plan_from_json(edited)
    assert str(caught.value).startswith(f"plan_id {PID} does not match the plan's content (plan-")
    shuffled = copy.deepcopy(data)
    shuffled["migrations"].reverse()  # order, not position, decides
    assert plan_from_json(shuffled) == PLAN
    shuffled["migrations"][0]["order"] = 1
    with pytest.raises(PlanFormatError) as caught:
        plan_from_json(shuffled)
    assert str(caught.value) == "migrations: orders must be 1..4, each once"


# --- the real schemas --------------------------------------------------------------------


def pmj_validator() -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # the apiserver checks ObjectMeta
    return jsonschema.Draft4Validator(schema)


def pmj_errors(obj: dict[str, Any]) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in pmj_validator().iter_errors(obj))


def test_podmigrationjobs_match_the_koordinator_crd() -> None:
    jobs = objects(render_koordinator(PLAN, NOW))
    assert len(jobs) == 3
    for job in jobs:
        assert pmj_errors(job) == []


def test_the_crd_check_can_fail() -> None:
    job = objects(render_koordinator(PLAN, NOW))[0]
    job["spec"]["podref"] = job["spec"].pop("podRef")
    job["spec"]["paused"] = "yes"
    assert pmj_errors(job) == [
        "spec.paused: 'yes' is not of type 'boolean'",
        "spec: 'podRef' is a required property",
        "spec: Additional properties are not allowed ('podref' was unexpected)",
    ]


def kubernetes_validate(tmp_path: Path, objs: list[dict[str, Any]]) -> list[str]:
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    done = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION,
                           str(path)], capture_output=True, text=True, timeout=120, check=False)
    return sorted(line.replace(str(path), "FILE") for line in (done.stdout + done.stderr).splitlines())


def pod_templates(plan: CompactionPlan) -> list[dict[str, Any]]:
    """Each reservation's pod template, and each eviction hint as a pod's node affinity, as
    core PodTemplates: the schema Kubernetes checks a pod template against."""
    found = []
    for job in objects(render_koordinator(plan, NOW)):
        template = job["spec"]["reservationOptions"]["template"]["spec"]["template"]
        found.append({"apiVersion": "v1", "kind": "PodTemplate",
                      "metadata": {"name": job["metadata"]["name"]}, "template": template})
    for ev in objects(render_evictions(plan, NOW)):
        hint = json.loads(ev["metadata"]["annotations"]["gpufleet.io/destination-node-affinity"])
        found.append({"apiVersion": "v1", "kind": "PodTemplate",
                      "metadata": {"name": f"hint-{ev['metadata']['name']}"},
                      "template": {"spec": {"affinity": {"nodeAffinity": hint},
                                            "containers": [{"name": "replacement", "image": "x"}]}}})
    return found


def test_evictions_and_pod_templates_pass_kubernetes_validate(tmp_path: Path) -> None:
    evictions = objects(render_evictions(PLAN, NOW))
    templates = pod_templates(PLAN)
    assert kubernetes_validate(tmp_path, evictions + templates) == sorted(
        [f"INFO FILE passed for resource eviction/{e['metadata']['name']} against version 1.32"
         for e in evictions]
        + [f"INFO FILE passed for resource podtemplate/{t['metadata']['name']} against version 1.32"
           for t in templates])
    assert len(evictions) == 3 and len(templates) == 6


def test_kubernetes_validate_can_fail_on_them(tmp_path: Path) -> None:
    ev = objects(render_evictions(PLAN, NOW))[0]
    ev["spec"] = {"nodeName": "gpu-node-2"}  # an Eviction has no place for a destination
    template = pod_templates(PLAN)[0]
    template["template"]["spec"]["affinity"]["nodeAffinity"]["required"] = {}
    lines = kubernetes_validate(tmp_path, [ev, template])
    assert any("Additional properties are not allowed ('spec' was unexpected)" in line for line in lines)
    assert any("Additional properties are not allowed ('required' was unexpected)" in line
               for line in lines)


# --- the command ---------------------------------------------------------------------------


def gpufleet(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``gpufleet plan ARGS`` as ``python -m exporter`` runs it (``SystemExit(main())``), in
    this process: its exit status, stdout and stderr. A process per call cost 0.4-0.6 s of
    CPU, 26 times; the process itself (``python -m exporter plan``, the exit status as the
    shell sees it) is run by test_plan_command_reads_v1_advice."""
    out, err = io.StringIO(), io.StringIO()
    given, sys.stdin = sys.stdin, io.TextIOWrapper(io.BytesIO((stdin or "").encode()))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["plan", *args])
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = given
    return subprocess.CompletedProcess(["gpufleet", "plan", *args], code, out.getvalue(),
                                       err.getvalue())


def saved(tmp_path: Path, data: Any, name: str = "plan.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_plan_command_renders_a_saved_plan(tmp_path: Path) -> None:
    path = saved(tmp_path, plan_json(PLAN))
    done = gpufleet("--from", path, "--format", "koordinator", "--ignore-expiry")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"# gpufleet plan {PID} (pool:h100): 4 moves, "
                                  "fragmented GPUs 12 -> 4\n---\n")
    # reviewed as if at the snapshot: the whole 300 s of the plan's life
    jobs = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert [j["spec"]["ttl"] for j in jobs] == ["300s"] * 3
    assert [pmj_errors(j) for j in jobs] == [[], [], []]
    done = gpufleet("--from", "-", "--format", "json", "--ignore-expiry", stdin=json.dumps(plan_json(PLAN)))
    assert (done.returncode, json.loads(done.stdout)) == (0, plan_json(PLAN))


def test_plan_command_takes_a_saved_advice(tmp_path: Path) -> None:
    advice = {"decision": "compact", "scope": "pool:h100", "reasons": ["x"], "plan": plan_json(PLAN)}
    done = gpufleet("--from", saved(tmp_path, advice), "--format", "eviction", "--ignore-expiry")
    assert done.returncode == 0
    assert [o["kind"] for o in yaml.safe_load_all(done.stdout) if o] == ["Eviction"] * 3
    none = {"decision": "hold", "scope": "pool:h100", "reasons": ["cooldown: 120 s left"], "plan": None}
    done = gpufleet("--from", saved(tmp_path, none, "none.json"), "--format", "koordinator")
    assert (done.returncode, done.stdout, done.stderr) == (
        0, "", "gpufleet: no plan: the advice's decision is 'hold' (cooldown: 120 s left)\n")


def test_plan_command_renders_a_plan_carried_through_the_cooldown(tmp_path: Path) -> None:
    """/v1/advice keeps the last plan until it expires: rendered, and said not to be new."""
    advice = {"decision": "cooldown", "scope": "pool:h100", "reasons": ["x"],
              "plan": plan_json(PLAN), "plan_proposed_at": T0}
    done = gpufleet("--from", saved(tmp_path, advice), "--ignore-expiry")
    assert (done.returncode, json.loads(done.stdout), done.stderr) == (
        0, plan_json(PLAN), "gpufleet: the advice's decision is 'cooldown'; its plan was proposed "
                           "by an earlier evaluation at 2025-12-01T00:00:00Z and is still in force\n")
    advice["plan_proposed_at"] = 1e300  # the sender's number: no date, no traceback
    done = gpufleet("--from", saved(tmp_path, advice, "far.json"), "--ignore-expiry")
    assert (done.returncode, done.stderr) == (
        0, "gpufleet: the advice's decision is 'cooldown'; its plan was proposed by an earlier "
           "evaluation and is still in force\n")
    done = gpufleet("--from", saved(tmp_path, advice, "far.json"))  # expired: still refused
    assert (done.returncode, done.stderr.splitlines()[-1]) == (
        1, f"gpufleet: plan {PID} expired (--ignore-expiry renders it for review)")


def test_plan_command_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    path = saved(tmp_path, plan_json(PLAN))
    done = gpufleet("--from", path, "--format", "koordinator")  # the plan expired in 2025
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"gpufleet: plan {PID} expired at 2025-12-01T00:05:00Z "
               "(--ignore-expiry renders it for review)\n")
    bad = plan_json(PLAN)
    bad["migrations"][0]["gpu_share"] = 2
    done = gpufleet("--from", saved(tmp_path, bad, "bad.json"), "--ignore-expiry")
    assert (done.returncode, done.stderr) == (
        1, f"gpufleet: {tmp_path}/bad.json: not a valid plan: migrations[0].gpu_share: "
           "2 is greater than the maximum of 1\n")
    edited = plan_json(PLAN)
    edited["migrations"][0]["to"]["node"] = "gpu-node-9"
    done = gpufleet("--from", saved(tmp_path, edited, "edited.json"), "--ignore-expiry")
    assert done.returncode == 1
    assert done.stderr.startswith(f"gpufleet: plan_id {PID} does not match the plan's content")
    many = plan_json(PLAN)
    many["migrations"] = many["migrations"] * 251
    done = gpufleet("--from", saved(tmp_path, many, "many.json"))
    assert (done.returncode, done.stderr) == (
        1, f"gpufleet: {tmp_path}/many.json: 1004 migrations, over the limit of 1000\n")
    done = gpufleet("--from", path, "--max-bytes", "100")
    assert (done.returncode, done.stderr.splitlines()) == (
        2, [f"gpufleet: {path}: {Path(path).stat().st_size} bytes, over the 100-byte limit (--max-bytes)"])
    done = gpufleet("--from", str(tmp_path / "missing.json"))
    assert (done.returncode, done.stderr) == (
        2, f"gpufleet: {tmp_path}/missing.json: cannot read: No such file or directory\n")
    error = {"error": "the advisor has no usable token (set GPUFLEET_ADVISOR_TOKEN or "
                      "advisor.token_file, non-blank)"}
    done = gpufleet("--from", saved(tmp_path, error, "error.json"))
    assert (done.returncode, done.stderr) == (
        1, f"gpufleet: {tmp_path}/error.json: an error answer, not a plan: {error['error']}\n")
    done = gpufleet("--from", "https://127.0.0.1:1", "--ca-file", str(tmp_path / "no-ca.pem"))
    assert (done.returncode, done.stderr) == (
        2, f"gpufleet: --ca-file {tmp_path}/no-ca.pem: [Errno 2] No such file or directory\n")
    (tmp_path / "token").write_text("two words\n")
    done = gpufleet("--from", "http://127.0.0.1:1", "--token-file", str(tmp_path / "token"))
    assert (done.returncode, done.stderr) == (
        2, f"gpufleet: --token-file {tmp_path}/token: must hold one token, without spaces\n")
    done = gpufleet("--from", "-", stdin="[1, 2")
    assert (done.returncode, done.stderr) == (
        1, "gpufleet: -: not JSON: Expecting ',' delimiter: line 1 column 6 (char 5)\n")
    assert "Traceback" not in done.stderr


# --- from a running gpufleet's /v1/advice (an aiohttp server speaking its answer) ------------


async def plan_from_url(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "exporter", "plan", *args, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_plan_command_reads_v1_advice(aiohttp_server: Any, tmp_path: Path) -> None:
    seen: list[str | None] = []
    release = asyncio.Event()
    advice = {"decision": "compact", "scope": "pool:h100", "reasons": ["x"], "plan": plan_json(PLAN)}

    async def get_advice(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.json_response({"error": "unauthorized"}, status=401)
        return web.json_response(advice)

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to refuse up front
        await response.prepare(request)
        for _ in range(40):
            await response.write(b" " * 1024)
        await response.write_eof()
        return response

    async def stuck(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response(advice)

    app = web.Application()
    app.router.add_get("/v1/advice", get_advice)
    app.router.add_get("/huge/v1/advice", huge)
    app.router.add_get("/stuck/v1/advice", stuck)
    server = await aiohttp_server(app)
    base = f"http://127.0.0.1:{server.port}"
    token = tmp_path / "token"
    token.write_text("s3cret\n")

    code, out, err = await plan_from_url("--from", base, "--token-file", str(token), "--format",
                                         "eviction", "--ignore-expiry")
    assert (code, err) == (0, "")
    assert [o["metadata"]["name"] for o in yaml.safe_load_all(out) if o] == [
        CHECKPOINT.pod, MIGRATE.pod, SHARED.pod]
    code, out, err = await plan_from_url("--from", f"{base}/v1/advice", "--ignore-expiry")
    assert (code, out, err) == (1, "", f"gpufleet: {base}/v1/advice: HTTP 401: "
                                       '{"error": "unauthorized"}\n')
    assert seen == ["Bearer s3cret", None]
    code, out, err = await plan_from_url("--from", f"{base}/huge/v1/advice", "--max-bytes", "20000")
    assert (code, err) == (1, f"gpufleet: {base}/huge/v1/advice: over the 20000-byte limit (--max-bytes)\n")
    code, out, err = await plan_from_url("--from", f"{base}/stuck/v1/advice", "--timeout", "0.5")
    release.set()
    assert (code, err) == (1, f"gpufleet: {base}/stuck/v1/advice: no complete answer within 0.5 s "
                              "(--timeout)\n")


# --- a real exporter's plan ----------------------------------------------------------------

# the scattered H100 pool makes a plan at 32 nodes (its index 62), not at 4 (30.7)
REAL_FLEET = "medium"
REAL_CONFIG = """
collect_interval: 1s
advisor:
  trigger: 50
  clear_below: 40
  dwell: 0s
  outbox: outbox.sqlite
sources:
  sim:
    seed: 42
    scenarios:
      - {kind: fragmented_pool, pool: gpu-h100}
"""


@pytest.mark.slow
def test_a_real_exporters_plan_renders_valid_objects(exporter_factory: Any, tmp_path: Path) -> None:
    """The simulated fleet's fragmented H100 pool, planned by a real exporter (POST /v1/plan
    on its own /v1/snapshot, whose answer the test keeps whole),
    rendered by the command in every format, each object checked by its schema."""
    from tests.helpers.servers import http_get

    exporter = exporter_factory(config=REAL_CONFIG, env={"GPUFLEET_ADVISOR_TOKEN": "t0ken"},
                                fleet=REAL_FLEET)
    snapshot = http_get(f"{exporter.url}/v1/snapshot")
    request = urllib.request.Request(f"{exporter.url}/v1/plan", data=snapshot, method="POST",
                                     headers={"Authorization": "Bearer t0ken"})
    with urllib.request.urlopen(request, timeout=60) as response:
        advice = json.loads(response.read())
    assert advice["decision"] == "compact"
    path = saved(tmp_path, advice, "advice.json")
    moves = advice["plan"]["migrations"]
    acting = [m for m in moves if m["action"] != "wait_until"]
    assert acting  # the scenario leaves moves to make

    done = gpufleet("--from", path, "--format", "koordinator")
    assert (done.returncode, done.stderr) == (0, "")
    jobs = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert [(j["spec"]["podRef"]["namespace"], j["spec"]["podRef"]["name"], j["spec"].get("paused", False))
            for j in jobs] == [(m["namespace"], m["pod"], m["action"] == "checkpoint_then_migrate")
                               for m in acting]
    assert [pmj_errors(j) for j in jobs] == [[]] * len(acting)

    done = gpufleet("--from", path, "--format", "eviction")
    assert done.returncode == 0
    evictions = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert [e["metadata"]["name"] for e in evictions] == [m["pod"] for m in acting]
    assert kubernetes_validate(tmp_path, evictions) == sorted(
        f"INFO FILE passed for resource eviction/{m['pod']} against version 1.32" for m in acting)

    done = gpufleet("--from", path)
    assert (done.returncode, json.loads(done.stdout)) == (0, advice["plan"])


@pytest.mark.slow
def test_a_real_exporters_advice_keeps_its_plan_through_the_cooldown(exporter_factory: Any) -> None:
    """`gpufleet plan --from URL` against a real exporter, evaluations after the one that made
    the plan (a snapshot a second, cooldown 30 min): the same plan, said not to be new."""
    from tests.helpers.servers import http_get

    exporter = exporter_factory(config=REAL_CONFIG, env={"GPUFLEET_ADVISOR_TOKEN": "t0ken"},
                                fleet=REAL_FLEET)
    advice: dict[str, Any] = {}
    for _ in range(600):  # up to 60 s: the first plan, then an evaluation after it
        advice = json.loads(http_get(f"{exporter.url}/v1/advice"))
        if advice.get("plan") and advice["evaluated_at"] > advice["plan_proposed_at"]:
            break
        time.sleep(0.1)
    assert advice["decision"] == "cooldown", advice["reasons"]
    plan = advice["plan"]
    assert plan["expires_at"] > advice["evaluated_at"]
    done = gpufleet("--from", exporter.url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == plan  # the same plan: no evaluation in cooldown makes one
    assert done.stderr.startswith("gpufleet: the advice's decision is 'cooldown'; its plan was "
                                  "proposed by an earlier evaluation at ")


def test_slurm_format_prints_the_steering_weights_after_the_remediation(tmp_path: Path) -> None:
    """Issue 42: with --weights, the advice's steering as weight updates, after a comment line:
    every node off Slurm's default weight, the highest first; none for the nodes at the default."""
    drain = {"type": "drain", "node": "gpu-003", "pool": "gpu-h200", "reason": "XID 79 on GPU 3",
             "at": 1000.0, "id": "x"}
    steering = {"computed_at": 1200.0, "snapshot_time": 1190.0, "default_weight": 1,
                "levels": [{"weight": 1, "nodes": ["gpu-001", "gpu-002"],
                            "expected_growth": {"min": -0.2, "max": 0.1}},
                           {"weight": 4, "nodes": ["gpu-005", "gpu-004"],
                            "expected_growth": {"min": 0.5, "max": 0.7}},
                           {"weight": 10, "nodes": ["gpu-003"], "expected_growth": {"min": 2, "max": 2}}],
                "gpu_hours_waiting_saved": None}
    advice = {"decision": "none", "reasons": [], "health": {"recent_remediation": [drain]},
              "steering": steering}
    path = saved(tmp_path, advice, "advice.json")
    drain_line = 'scontrol update NodeName=gpu-003 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"\n'
    # without --weights, the remediation alone: a pipe to sh that drains sets no weight
    assert gpufleet("--from", path, "--format", "slurm").stdout == drain_line
    done = gpufleet("--from", path, "--format", "slurm", "--weights")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        'scontrol update NodeName=gpu-003 State=DRAIN Reason="gpufleet: XID 79 on GPU 3"',
        "# steering computed at 1200: 3 of 5 nodes off the default weight 1 (lowest allocated first)",
        "scontrol update NodeName=gpu-003 Weight=10",
        "scontrol update NodeName=gpu-004 Weight=4",
        "scontrol update NodeName=gpu-005 Weight=4"]
    # a name Slurm would read as every node is refused, in one line, and nothing is printed
    steering["levels"][1]["nodes"] = ["ALL"]
    done = gpufleet("--from", saved(tmp_path, advice, "bad.json"), "--format", "slurm", "--weights")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"gpufleet: {tmp_path / 'bad.json'}: steering.levels[1].nodes: 'ALL' is "
                           "reserved by Slurm (it names no single node), not a node name\n")
    done = gpufleet("--from", path, "--format", "json", "--weights")
    assert (done.returncode, done.stderr) == (2, "gpufleet: --weights: only with --format slurm\n")
