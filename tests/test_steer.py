"""Steering: per-node placement preferences from FGD, as Slurm weights and as a Kubernetes
admission webhook's preferred node affinity (issue 42, Build 2)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from exporter.advisor import admission, steer
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import evaluate
from exporter.analysis.state import build
from exporter.analysis.workload import Shape, from_weighted

# four 8-GPU H100 nodes: one empty, one with 3 GPUs free, one full, one with 6 free;
# and one A100 node, empty. The workload: mostly 1-GPU jobs, some whole-node jobs.
NAMES = ("empty", "three-free", "full", "six-free", "a100-empty")
FREE = ([1.0] * 8, [1.0] * 3 + [0.0] * 5, [0.0] * 8, [1.0] * 6 + [0.0] * 2, [1.0] * 8)
MODELS = ("H100", "H100", "H100", "H100", "A100-80GB")


def _fleet():
    state = build(NAMES, MODELS, ("gpu-h100",) * 4 + ("gpu-a100",), [128.0] * 5,
                  [128.0, 80.0, 0.0, 100.0, 128.0], FREE)
    workload = from_weighted([(Shape(8.0, 1.0, 1), 0.7), (Shape(16.0, 1.0, 2), 0.1),
                              (Shape(64.0, 1.0, 8), 0.2)])
    return state, compile_workload(workload, state.model_names)


def test_the_typical_job_is_steered_to_a_partly_used_node_before_an_empty_one():
    state, cw = _fleet()
    expected = steer.expected_growth(state, cw)
    by_name = dict(zip(NAMES, expected, strict=True))
    # breaking an empty node costs the whole-node jobs that node: more growth than a gap filled
    assert by_name["three-free"] < by_name["empty"]
    assert by_name["six-free"] < by_name["empty"]
    assert by_name["full"] == np.inf
    prefs = {p.node: p for p in steer.preferences(state, cw)}
    assert prefs["three-free"].weight == steer.WEIGHT_BEST
    assert prefs["full"].weight == steer.WEIGHT_WORST
    assert prefs["empty"].weight > prefs["three-free"].weight
    assert all(steer.WEIGHT_BEST <= p.weight <= steer.WEIGHT_WORST for p in prefs.values())


def test_weights_are_levels_of_the_finite_range():
    got = steer.weights(np.array([0.0, 1.0, 0.5, np.inf, 1.0]))
    assert got.tolist() == [1, steer.WEIGHT_WORST, 5, steer.WEIGHT_WORST, steer.WEIGHT_WORST]
    assert steer.weights(np.array([2.0, 2.0])).tolist() == [1, 1]
    assert steer.weights(np.array([np.inf])).tolist() == [steer.WEIGHT_WORST]


def test_a_pod_prefers_the_nodes_its_own_ask_fragments_least_and_its_model():
    state, cw = _fleet()
    one = steer.preferred_nodes(state, cw, 8.0, 1)
    assert one[0] == "three-free" and "full" not in one
    # fgd's own choice is the first named: where the fgd policy places the same task
    from exporter.placement.engine import Placer
    from exporter.placement.task import Task

    assert Placer(state, cw).place(Task(8.0, 1, 1.0), "fgd").node_name == one[0]
    # an 8-GPU ask fits only the empty nodes
    assert set(steer.preferred_nodes(state, cw, 64.0, 8)) == {"empty", "a100-empty"}
    assert steer.preferred_nodes(state, cw, 64.0, 8, models=("A100-80GB",)) == ["a100-empty"]
    assert steer.preferred_nodes(state, cw, 8.0, 1, limit=2) == one[:2]
    assert steer.preferred_nodes(state, cw, 8.0, 9) == []


def test_slurm_commands_change_only_what_changed_within_the_budget_and_never_name_all():
    prefs = (steer.NodePreference("gpu-001", "p", "H100", 0.1, 1),
             steer.NodePreference("gpu-002", "p", "H100", 3.0, 10),
             steer.NodePreference("ALL", "p", "H100", 3.0, 10),
             steer.NodePreference("gpu-003", "p", "H100", 1.0, 4))
    assert steer.slurm_commands(prefs, {"gpu-001": 1, "gpu-002": 1, "gpu-003": 1}) == [
        "scontrol update NodeName=gpu-002 Weight=10", "scontrol update NodeName=gpu-003 Weight=4"]
    assert steer.slurm_commands(prefs, {"gpu-001": 1, "gpu-002": 1, "gpu-003": 1}, budget=1) == [
        "scontrol update NodeName=gpu-002 Weight=10"]
    assert all("ALL" not in c for c in steer.slurm_commands(prefs))


# -- the admission webhook -------------------------------------------------------------------

def _review(pod: dict, uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002", kind: str = "Pod") -> bytes:
    # the shape of a real AdmissionReview request (kubernetes.io docs, "Request")
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": kind},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "team-a", "operation": "CREATE", "object": pod,
                    "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
                    "dryRun": False}}).encode()


def _pod(gpus: int | None, affinity: dict | None = None) -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "8"}} if gpus else {
        "requests": {"cpu": "500m"}}
    spec: dict = {"containers": [{"name": "main", "image": "trainer:1", "resources": resources}]}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train-0", "namespace": "team-a"}, "spec": spec}


def _report():
    state, cw = _fleet()
    return evaluate(state, cw)


def _patch(answer: dict) -> list[dict]:
    return json.loads(base64.b64decode(answer["response"]["patch"]))


def test_a_gpu_pod_gets_a_preferred_affinity_for_the_nodes_it_fragments_least():
    answer = admission.answer(_review(_pod(1)), _report)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    (op,) = _patch(answer)
    assert op["op"] == "add" and op["path"] == "/spec/affinity"
    first, named = op["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert first["weight"] == named["weight"] == admission.PREFERENCE_WEIGHT
    for term in (first, named):
        (field,) = term["preference"]["matchFields"]
        assert field["key"] == "metadata.name" and field["operator"] == "In"
    # fgd's own choice alone in the first term, so it scores both; the best nodes in the second
    assert first["preference"]["matchFields"][0]["values"] == ["three-free"]
    values = named["preference"]["matchFields"][0]["values"]
    assert values[0] == "three-free" and "full" not in values and len(values) == 4


def test_a_pod_without_gpus_gets_no_patch_and_is_allowed():
    answer = admission.answer(_review(_pod(None)), _report)
    assert answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_no_fleet_yet_or_no_room_admits_the_pod_unchanged():
    assert "patch" not in admission.answer(_review(_pod(1)), lambda: None)["response"]
    assert "patch" not in admission.answer(_review(_pod(9)), _report)["response"]
    assert "patch" not in admission.answer(_review(_pod(1), kind="Service"), _report)["response"]


def test_a_pods_own_affinity_is_kept_and_the_term_appended():
    own = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}}]}}
    ops = _patch(admission.answer(_review(_pod(1, own)), _report))
    assert [op["path"] for op in ops] == [
        "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-"] * 2
    assert [op["value"]["preference"]["matchFields"][0]["values"][0] for op in ops] == ["three-free"] * 2
    (op,) = _patch(admission.answer(_review(_pod(1, {"podAntiAffinity": {}})), _report))
    assert op["path"] == "/spec/affinity/nodeAffinity"


@pytest.mark.parametrize("body", [
    b"", b"[]", b"{", b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
    b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
    b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}',
    b"[" * 100_000,
])
def test_a_body_that_is_no_admission_review_is_refused_in_one_line(body):
    with pytest.raises(admission.BadReview) as refused:
        admission.answer(body, _report)
    assert "\n" not in str(refused.value)


def test_a_pod_naming_an_unknown_product_gets_no_patch_and_nothing_is_remembered(caplog):
    """The webhook is open to the apiserver: a pod author's product name must not grow the
    catalogue's memory of unknown names, nor the log, per request."""
    from exporter import gpu_catalogue

    pod = _pod(1)
    for n in range(50):
        pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": f"NoSuchGPU-{n}"}
        assert "patch" not in admission.answer(_review(pod), _report)["response"]
    assert not any("NoSuchGPU" in name for name in gpu_catalogue._warned)
    assert "NoSuchGPU" not in caplog.text
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    (op,) = _patch(admission.answer(_review(pod), _report))
    values = op["value"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "preference"]["matchFields"][0]["values"]
    assert "a100-empty" not in values and values[0] == "three-free"
