"""The kustomize manifests (deploy/kubernetes), rendered and validated by the real tools.

- `kubectl kustomize` renders every overlay (kubectl 1.32; the Makefile installs Debian's
  kubernetes-client where it is missing);
- `kubernetes-validate --strict` checks every core object against Kubernetes 1.32's
  schemas, the version we support;
- the ServiceMonitors and the PrometheusRule against the prometheus-operator v0.93.0 CRDs'
  OpenAPI schemas (tests/data/prometheus-operator, with its origin), made strict as the
  apiserver's strict field validation is;
- the PrometheusRule's groups through `promtool check rules`;
- the dashboards' ConfigMaps equal dashboards/*.json byte for byte;
- the policy checks below (RBAC verbs, security contexts, limits, no inline secret), each
  shown to fail on a manifest that breaks it.

No apiserver runs here (none is packaged for these machines): nothing was applied to a
real cluster.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
import pytest
import yaml

from exporter import config
from exporter.cli.serve import exposition_options
from exporter.sources.kubernetes.source import KubernetesAllocationSource, build
from exporter.sources.nvml import podresources
from exporter.sources.nvml.options import NvmlSource
from exporter.sources.nvml.source import build as build_nvml
from tests.helpers import REPO
from tests.helpers.fake_apiserver import FakeApiserver, read_objects
from tests.helpers.fake_pynvml import FakeGpu, FakeNvml
from tests.helpers.tls import Pki, make_pki

K8S = REPO / "deploy" / "kubernetes"
OVERLAYS = ["node", "cluster", "gpu-operator", "admission"]
KUBERNETES_VERSION = "1.32.0"  # the version we support: kubectl 1.32 renders, 1.32 validates
CRDS = REPO / "tests" / "data" / "prometheus-operator"
KUBECTL = shutil.which("kubectl")
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed (`make test` installs Debian's kubernetes-client)")

Obj = dict[str, Any]


def render(overlay: str) -> str:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(K8S / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


_RENDERED: dict[str, list[Obj]] = {}


def objects(overlay: str) -> list[Obj]:
    """The rendered objects of an overlay (rendered once per test session)."""
    if overlay not in _RENDERED:
        _RENDERED[overlay] = [o for o in yaml.safe_load_all(render(overlay)) if o]
    return copy.deepcopy(_RENDERED[overlay])


def ident(obj: Obj) -> tuple[str, str, str]:
    meta = obj["metadata"]
    # configMapGenerator names end in a content hash; keep the name it was given
    name = re.sub(r"-[a-z0-9]{10}$", "", meta["name"]) if obj["kind"] == "ConfigMap" else meta["name"]
    return obj["kind"], meta.get("namespace", ""), name


def find(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


COMMON = {
    ("Namespace", "", "gpufleet"),
    ("PrometheusRule", "gpufleet", "gpufleet"),
    ("ConfigMap", "gpufleet", "gpufleet-dashboard-fleet"),
    ("ConfigMap", "gpufleet", "gpufleet-dashboard-fragmentation"),
    ("ConfigMap", "gpufleet", "gpufleet-dashboard-node"),
}
CLUSTER = COMMON | {
    ("ServiceAccount", "gpufleet", "gpufleet-cluster"),
    ("ClusterRole", "", "gpufleet-kubernetes-source"),
    ("ClusterRoleBinding", "", "gpufleet-kubernetes-source"),
    ("ConfigMap", "gpufleet", "gpufleet-cluster"),
    ("PersistentVolumeClaim", "gpufleet", "gpufleet-outbox"),
    ("Deployment", "gpufleet", "gpufleet-cluster"),
    ("Service", "gpufleet", "gpufleet-cluster"),
    ("ServiceMonitor", "gpufleet", "gpufleet-cluster"),
    ("NetworkPolicy", "gpufleet", "gpufleet-cluster"),
    ("PodDisruptionBudget", "gpufleet", "gpufleet-cluster"),
}
EXPECTED = {
    "node": COMMON | {
        ("Namespace", "", "gpufleet-node"),
        ("ServiceAccount", "gpufleet-node", "gpufleet-node"),
        ("ConfigMap", "gpufleet-node", "gpufleet-node"),
        ("DaemonSet", "gpufleet-node", "gpufleet-node"),
        ("Service", "gpufleet-node", "gpufleet-nodes"),
        ("ServiceMonitor", "gpufleet-node", "gpufleet-nodes"),
        ("NetworkPolicy", "gpufleet-node", "gpufleet-node"),
    },
    "cluster": CLUSTER,
    "gpu-operator": CLUSTER,
    "admission": CLUSTER | {
        ("MutatingWebhookConfiguration", "", "gpufleet-steering"),
        ("NetworkPolicy", "gpufleet", "gpufleet-admission"),
    },
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders(overlay: str) -> None:
    objs = objects(overlay)
    assert sorted(ident(o) for o in objs) == sorted(EXPECTED[overlay])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kubernetes_validate_strict(overlay: str, tmp_path: Path) -> None:
    """Every core object passes Kubernetes 1.32's schemas with unknown fields refused; the
    two prometheus-operator kinds have no schema there (checked against their CRDs below)."""
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(render(overlay))
    done = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION,
                           str(path)], capture_output=True, text=True, timeout=120, check=False)
    lines = (done.stdout + done.stderr).splitlines()
    core = [o for o in objects(overlay) if "monitoring.coreos.com" not in o["apiVersion"]]
    passed = sorted(f"INFO {path} passed for resource {o['kind'].lower()}/{o['metadata']['name']} "
                    f"against version 1.32" for o in core)
    unknown = sorted(f"WARN {path} Couldn't find schema for kind {kind} with api version "
                     f"monitoring.coreos.com/v1 for kubernetes version 1.32"
                     for kind in ("PrometheusRule", "ServiceMonitor")
                     for _ in find(objects(overlay), kind))
    assert done.returncode == 0
    assert sorted(lines) == sorted(passed + unknown)


def test_kubernetes_validate_can_fail(tmp_path: Path) -> None:
    """--strict rejects a field the schema does not have (a typo the apiserver would drop)."""
    deployment = find(objects("cluster"), "Deployment")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(deployment))
    done = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION,
                           str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert "Additional properties are not allowed ('resource' was unexpected)" in done.stdout + done.stderr


# --- prometheus-operator objects against the CRDs' schemas -----------------------------

def strict(schema: Any) -> Any:
    """The CRD schema with unknown properties refused wherever it lists properties and does
    not preserve unknown fields: the apiserver prunes (or, with strict field validation,
    rejects) such fields, so a misspelt key would silently do nothing."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_validator(plural: str) -> jsonschema.Draft4Validator:
    crd = yaml.safe_load((CRDS / f"monitoring.coreos.com_{plural}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}  # the apiserver checks ObjectMeta
    return jsonschema.Draft4Validator(schema)


def crd_errors(plural: str, obj: Obj) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in crd_validator(plural).iter_errors(obj))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_operator_objects_match_the_crds(overlay: str) -> None:
    objs = objects(overlay)
    for monitor in find(objs, "ServiceMonitor"):
        assert crd_errors("servicemonitors", monitor) == []
    (rule,) = find(objs, "PrometheusRule")
    assert crd_errors("prometheusrules", rule) == []


def test_servicemonitor_schema_check_can_fail() -> None:
    monitor = find(objects("cluster"), "ServiceMonitor")[0]
    monitor["spec"]["endpoints"][0]["scrapeInterval"] = "15s"
    monitor["spec"]["endpoints"][0]["scheme"] = "tcp"
    assert crd_errors("servicemonitors", monitor) == [
        "spec.endpoints.0.scheme: 'tcp' is not one of ['http', 'https', 'HTTP', 'HTTPS']",
        "spec.endpoints.0: Additional properties are not allowed ('scrapeInterval' was unexpected)",
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_servicemonitors_scrape_the_jobs_the_rules_expect(overlay: str) -> None:
    """The job label is the Service's name: gpufleet-nodes and gpufleet-cluster are the
    threshold table's exporter_jobs. The operator's namespace/pod target labels are dropped,
    so gpufleet's own (the workload's) are not renamed exported_*."""
    objs = objects(overlay)
    services = {s["metadata"]["name"]: s for s in find(objs, "Service")}
    for monitor in find(objs, "ServiceMonitor"):
        (service,) = [s for s in services.values()
                      if s["metadata"]["namespace"] == monitor["metadata"]["namespace"]
                      and monitor["spec"]["selector"]["matchLabels"].items()
                      <= s["metadata"]["labels"].items()]
        assert monitor["metadata"]["name"] == service["metadata"]["name"]
        assert "jobLabel" not in monitor["spec"]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
        assert endpoint["honorLabels"] is False
        assert endpoint["relabelings"] == [
            {"action": "labeldrop", "regex": "namespace|pod|container|service|endpoint"}]
    assert sorted(services) == (["gpufleet-nodes"] if overlay == "node" else ["gpufleet-cluster"])


# --- the PrometheusRule: promtool, and the generated copy ------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheusrule_groups_pass_promtool(overlay: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make system-deps` installs Debian's prometheus"
    (rule,) = find(objects(overlay), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=120, check=False)
    count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"Checking {path}\n  SUCCESS: {count} rules found\n\n"


def test_prometheusrule_is_the_generated_one() -> None:
    """The base's rule is `gpufleet rules --format prometheusrule` with the release label; the
    gpu-operator overlay's watches only the gpufleet-cluster job (it runs no node exporters)."""
    plain = yaml.safe_load((REPO / "rules" / "gpufleet-prometheusrule.yaml").read_text())
    (base,) = find(objects("cluster"), "PrometheusRule")
    assert base["spec"] == plain["spec"]
    (operator,) = find(objects("gpu-operator"), "PrometheusRule")
    text = json.dumps(operator["spec"])
    assert "gpufleet-nodes" not in text and 'up{job=~\\"gpufleet-cluster\\"}' in text
    assert [g["name"] for g in operator["spec"]["groups"]] == [g["name"] for g in plain["spec"]["groups"]]


def test_generated_files_are_up_to_date() -> None:
    """`make generate` (deploy/kubernetes/generate.py) was run after the last change to the
    rules or the dashboards."""
    done = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_dashboard_configmaps_are_the_dashboards_byte_for_byte(overlay: str) -> None:
    maps = [m for m in find(objects(overlay), "ConfigMap")
            if "grafana_dashboard" in m["metadata"].get("labels", {})]
    got = {name: text for m in maps for name, text in m["data"].items()}
    want = {p.name: p.read_text() for p in (REPO / "dashboards").glob("gpufleet-*.json")}
    assert sorted(got) == sorted(want) == [
        "gpufleet-fleet.json", "gpufleet-fragmentation.json", "gpufleet-node.json"]
    for name in want:
        assert got[name].encode() == want[name].encode(), name
    assert {m["metadata"]["labels"]["grafana_dashboard"] for m in maps} == {"1"}


# --- policy: RBAC, security contexts, limits, secrets ----------------------------------

READ_VERBS = {"get", "list", "watch"}


def rbac_problems(objs: list[Obj]) -> list[str]:
    out = []
    for role in find(objs, "ClusterRole") + find(objs, "Role"):
        for i, rule in enumerate(role.get("rules", [])):
            where = f"{role['kind']}/{role['metadata']['name']} rules[{i}]"
            if set(rule.get("verbs", [])) - READ_VERBS:
                out.append(f"{where}: verbs {sorted(set(rule['verbs']) - READ_VERBS)}")
            if "*" in rule.get("resources", []) or "*" in rule.get("apiGroups", []):
                out.append(f"{where}: wildcard")
    return out


def api_calls(requests: list[str]) -> set[tuple[str, str, str]]:
    """Each apiserver call as RBAC names it, (apiGroup, resource, verb): a GET on a
    collection is ``list``, with ``watch=1`` ``watch``, on ``<resource>/<name>`` ``get``;
    any other method is its own name, which no read-only role grants."""
    calls = set()
    for line in requests:
        method, _, target = line.partition(" ")
        parts = urlsplit(target)
        segments = parts.path.strip("/").split("/")
        # /api/v1/<resource>[/<name>] or /apis/<group>/<version>/<resource>[/<name>]
        group, rest = ("", segments[2:]) if segments[0] == "api" else (segments[1], segments[3:])
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        if method != "GET":
            verb = method.lower()
        elif len(rest) > 1:
            verb = "get"
        else:
            verb = "watch" if parse_qs(parts.query).get("watch") in (["1"], ["true"]) else "list"
        calls.add((group, rest[0], verb))
    return calls


def grants(role: Obj) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


async def tls_proxy(upstream_port: int, pki: Pki) -> asyncio.Server:
    """TLS in front of the fake apiserver (plain HTTP): in-cluster credentials always speak
    https to KUBERNETES_SERVICE_HOST, checked against the service account's ca.crt."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)


@pytest.mark.parametrize("overlay", ["cluster", "gpu-operator"])
async def test_cluster_role_is_exactly_what_the_kubernetes_source_reads(overlay: str,
                                                                       tmp_path: Path) -> None:
    """The overlay's own config, in-cluster as the pod runs it (service account token and
    CA, KUBERNETES_SERVICE_HOST/PORT), reads the recorded cluster from the fake apiserver
    (tests/helpers/fake_apiserver.py) over TLS; every call it makes, its lists and then its
    watches, must be granted, and nothing else may be: a config that stops reading
    ResourceSlices, or a source that starts reading something new, fails here."""
    objs = objects(overlay)
    options = loaded_config(objs, "gpufleet-cluster", tmp_path).sources.kubernetes
    assert (options.enabled, options.kubeconfig) == (True, "")  # in-cluster
    pki = make_pki(tmp_path / "pki")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("service-account-token")
    shutil.copy(pki.ca, account / "ca.crt")
    fake = FakeApiserver(token="service-account-token")
    fake.load(read_objects(REPO / "tests" / "data" / "kubernetes"))
    await fake.start()
    proxy = await tls_proxy(fake.port, pki)
    port = proxy.sockets[0].getsockname()[1]
    source = build(options, time.time, service_account=account,
                   environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)})
    try:
        reading = await source.read()
        # the recorded cluster, read whole: its GPU nodes and the DRA-claimed GPU by UUID
        assert sorted({g.node for g in reading.gpus}) == [
            "gpu-node-1", "gpu-node-2", "s4124-0073", "t4-node-1"]
        assert "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005" in {g.uuid for g in reading.gpus}
        for _ in range(200):  # the watches open right after the lists; 10 s at most
            if sum("watch=1" in r for r in fake.requests) == 4:
                break
            await asyncio.sleep(0.05)
    finally:
        await source.close()
        proxy.close()
        await proxy.wait_closed()
        await fake.kill()
    (role,) = find(objs, "ClusterRole")
    assert api_calls(fake.requests) == grants(role) == {
        (group, resource, verb) for group, resource in (
            ("", "nodes"), ("", "pods"), ("resource.k8s.io", "resourceclaims"),
            ("resource.k8s.io", "resourceslices"))
        for verb in ("list", "watch")}


def test_api_calls_name_verbs_as_rbac_does() -> None:
    assert api_calls([
        "GET /api/v1/pods?limit=500",
        "GET /api/v1/pods?watch=1&resourceVersion=7&allowWatchBookmarks=true",
        "GET /api/v1/namespaces/ml/pods/trainer-0",
        "GET /apis/resource.k8s.io/v1/namespaces/ml/resourceclaims?limit=500",
        "POST /api/v1/namespaces/ml/pods/trainer-0/eviction",
    ]) == {("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "get"),
           ("resource.k8s.io", "resourceclaims", "list"), ("", "pods", "post")}


def test_rbac_is_the_kubernetes_source_read_only() -> None:
    """Read-only, bound to cluster mode's service account only; node mode has no role."""
    objs = objects("cluster")
    assert rbac_problems(objs) == []
    (binding,) = find(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "gpufleet-kubernetes-source"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpufleet-cluster",
                                    "namespace": "gpufleet"}]
    assert find(objects("node"), "ClusterRole") == find(objects("node"), "Role") == []


def test_rbac_check_can_fail() -> None:
    objs = objects("cluster")
    find(objs, "ClusterRole")[0]["rules"][0]["verbs"].append("delete")
    objs.append({"kind": "Role", "metadata": {"name": "x"},
                 "rules": [{"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}]})
    assert rbac_problems(objs) == [
        "ClusterRole/gpufleet-kubernetes-source rules[0]: verbs ['delete']",
        "Role/x rules[0]: wildcard",
    ]


def pod_specs(objs: list[Obj]) -> list[tuple[str, Obj]]:
    return [(f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
            for o in objs if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")]


def limit_problems(objs: list[Obj]) -> list[str]:
    out = []
    for where, spec in pod_specs(objs):
        for c in spec.get("initContainers", []) + spec["containers"]:
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                missing = {"cpu", "memory"} - set(res.get(kind, {}))
                if missing:
                    out.append(f"{where} {c['name']}: no {kind} {sorted(missing)}")
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_sets_requests_and_limits(overlay: str) -> None:
    assert pod_specs(objects(overlay))
    assert limit_problems(objects(overlay)) == []


def test_limits_check_can_fail() -> None:
    objs = objects("node")
    container = find(objs, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0]
    del container["resources"]["limits"]["memory"]
    assert limit_problems(objs) == ["DaemonSet/gpufleet-node gpufleet: no limits ['memory']"]


# The restricted Pod Security profile, as the container fields that carry it.
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def security_problems(objs: list[Obj]) -> list[str]:
    """Every container: RESTRICTED; non-root everywhere but the node DaemonSet, whose only
    exceptions are uid 0 and the PodResources hostPath (overlays/node/daemonset.yaml)."""
    out = []
    for where, spec in pod_specs(objs):
        node = where == "DaemonSet/gpufleet-node"
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            for key, want in RESTRICTED.items():
                if sc.get(key) != want:
                    out.append(f"{where} {c['name']}: securityContext.{key} is {sc.get(key)!r}")
            if c.get("env") and any("valueFrom" in e and "secretKeyRef" in e["valueFrom"] for e in c["env"]):
                out.append(f"{where} {c['name']}: a Secret in the environment")
            pod_non_root = spec.get("securityContext", {}).get("runAsNonRoot")
            if not node and not (sc.get("runAsNonRoot") or pod_non_root):
                out.append(f"{where} {c['name']}: may run as root")
        if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
            out.append(f"{where}: shares a host namespace")
        host_paths = [v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v]
        if host_paths != (["/var/lib/kubelet/pod-resources"] if node else []):
            out.append(f"{where}: hostPath {host_paths}")
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_contexts(overlay: str) -> None:
    assert security_problems(objects(overlay)) == []


def test_security_check_can_fail() -> None:
    objs = objects("cluster")
    spec = find(objs, "Deployment")[0]["spec"]["template"]["spec"]
    spec["containers"][0]["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    spec["containers"][0]["securityContext"].pop("runAsNonRoot")
    spec["securityContext"].pop("runAsNonRoot")
    spec["volumes"].append({"name": "x", "hostPath": {"path": "/"}})
    assert security_problems(objs) == [
        "Deployment/gpufleet-cluster gpufleet: securityContext.capabilities is {'add': ['SYS_ADMIN']}",
        "Deployment/gpufleet-cluster gpufleet: may run as root",
        "Deployment/gpufleet-cluster: hostPath ['/']",
    ]


def test_pod_security_admission_labels() -> None:
    """The namespaces enforce restricted, except the node DaemonSet's, which enforces
    privileged (hostPath) and warns and audits against restricted."""
    ns = {n["metadata"]["name"]: n["metadata"]["labels"] for n in find(objects("node"), "Namespace")}
    psa = {name: {k.removeprefix("pod-security.kubernetes.io/"): v for k, v in labels.items()
                  if k.startswith("pod-security.kubernetes.io/")} for name, labels in ns.items()}
    assert psa == {
        "gpufleet": {"enforce": "restricted", "enforce-version": "v1.32", "warn": "restricted",
                     "audit": "restricted"},
        "gpufleet-node": {"enforce": "privileged", "warn": "restricted", "warn-version": "v1.32",
                          "audit": "restricted", "audit-version": "v1.32"},
    }


def secret_problems(objs: list[Obj]) -> list[str]:
    out = []
    for o in objs:
        if o["kind"] == "Secret":
            out.append(f"Secret/{o['metadata']['name']}: committed")
        for _, spec in pod_specs([o]):
            for c in spec["containers"]:
                for e in c.get("env", []):
                    if re.search(r"TOKEN|SECRET|PASSWORD|KEY", e["name"]) and "value" in e:
                        out.append(f"{o['metadata']['name']} {c['name']}: {e['name']} inline")
        if o["kind"] == "ConfigMap":
            for name, text in o.get("data", {}).items():
                if re.search(r"^\s*(password|token|secret|bearer_token)\s*:", text, re.M | re.I):
                    out.append(f"ConfigMap/{o['metadata']['name']} {name}: a secret value")
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_value_is_inline(overlay: str) -> None:
    assert secret_problems(objects(overlay)) == []


def test_secret_check_can_fail() -> None:
    objs = objects("cluster")
    objs.append({"kind": "Secret", "metadata": {"name": "gpufleet-advisor"}, "stringData": {"a": "b"}})
    spec = find(objs, "Deployment")[0]["spec"]["template"]["spec"]
    spec["containers"][0]["env"] = [{"name": "GPUFLEET_ADVISOR_TOKEN", "value": "hunter2"}]
    cm = next(m for m in find(objs, "ConfigMap") if m["metadata"]["name"].startswith("gpufleet-cluster"))
    cm["data"]["cluster.yaml"] += "  token: abc\n"
    assert sorted(secret_problems(objs)) == [
        f"ConfigMap/{cm['metadata']['name']} cluster.yaml: a secret value",
        "Secret/gpufleet-advisor: committed",
        "gpufleet-cluster gpufleet: GPUFLEET_ADVISOR_TOKEN inline",
    ]


# --- the workloads: what the issue asks of each ----------------------------------------

def loaded_config(objs: list[Obj], name: str, tmp_path: Path) -> config.Config:
    (cm,) = [m for m in find(objs, "ConfigMap") if m["metadata"]["name"].startswith(name + "-")]
    ((file, text),) = cm["data"].items()
    path = tmp_path / file
    path.write_text(text)
    return config.load(path)


@pytest.mark.parametrize("overlay", ["cluster", "gpu-operator"])
def test_cluster_deployment(overlay: str, tmp_path: Path) -> None:
    objs = objects(overlay)
    (deploy,) = find(objs, "Deployment")
    assert (deploy["spec"]["replicas"], deploy["spec"]["strategy"]) == (1, {"type": "Recreate"})
    spec = deploy["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpufleet-cluster"
    # the Kubernetes source reads in-cluster with the service account's token
    assert spec["automountServiceAccountToken"] is True
    (container,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["secrets"]["secret"]["secretName"] == "gpufleet-advisor"
    assert volumes["outbox"]["persistentVolumeClaim"] == {"claimName": "gpufleet-outbox"}
    assert volumes["config"]["configMap"]["name"].startswith("gpufleet-cluster-")
    cfg = loaded_config(objs, "gpufleet-cluster", tmp_path)
    # the config reads the Secret's files and writes the outbox on the volume
    assert cfg.advisor.token_file == f"{mounts['secrets']}/advisor-token"
    assert [r.secret_file for r in cfg.advisor.receivers] == [f"{mounts['secrets']}/webhook-secret"]
    assert Path(cfg.advisor.outbox).parent == Path(mounts["outbox"])
    assert [i["key"] for i in volumes["secrets"]["secret"]["items"]] == ["advisor-token", "webhook-secret"]
    assert (cfg.sources.prometheus.enabled, cfg.sources.sim.enabled) == (True, False)
    metrics, selector = ("dcgm", 'job="nvidia-dcgm-exporter"') if overlay == "gpu-operator" else (
        "gpufleet", 'job="gpufleet-nodes",cluster="prod"')
    assert (cfg.sources.prometheus.metrics, cfg.sources.prometheus.selector) == (metrics, selector)
    (pdb,) = find(objs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": deploy["spec"]["selector"]}
    assert find(objs, "DaemonSet") == []


def test_node_daemonset(tmp_path: Path) -> None:
    objs = objects("node")
    (ds,) = find(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    # no GPU requested: the exporter must not take one from the workloads
    assert not any("nvidia.com" in k for r in container["resources"].values() for k in r)
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env == {"NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                   "NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                       "readOnly": True}
    # the folder of the socket the PodResources client opens
    assert str(Path(podresources.DEFAULT_SOCKET).parent) == mounts["pod-resources"]["mountPath"]
    cfg = loaded_config(objs, "gpufleet-node", tmp_path)
    assert (cfg.sources.nvml.enabled, cfg.sources.nvml.node, cfg.sources.sim.enabled,
            cfg.advisor.enabled) == (True, "@NODE_NAME@", False, False)
    # the kubelet's PodResources socket, as node.yaml names it, is inside the mount above, and
    # is the option's default and the client's
    assert (cfg.sources.nvml.pod_resources_socket == NvmlSource().pod_resources_socket
            == podresources.DEFAULT_SOCKET)
    assert str(Path(cfg.sources.nvml.pod_resources_socket).parent) == \
        mounts["pod-resources"]["mountPath"]


def test_one_producer_of_the_scheduler_families(tmp_path: Path) -> None:
    """The node and cluster overlays are applied side by side (docs/deploy.md, path 2), so only
    one may serve the scheduler's families (gpufleet_gpu_allocation_info, _allocated_ratio...):
    cluster mode, whose Kubernetes source is an allocation source. The node DaemonSet's nvml
    source, built from node.yaml on the fake pynvml, must then know no jobs: pod_resources off
    (on, it would serve every allocation a second time)."""
    node = loaded_config(objects("node"), "gpufleet-node", tmp_path)
    cluster = loaded_config(objects("cluster"), "gpufleet-cluster", tmp_path)
    assert node.sources.nvml.pod_resources is False
    source = build_nvml(node.sources.nvml, lambda: 0.0,
                        nvml=FakeNvml([FakeGpu("GPU-00000000-0000-0000-0000-000000000000")]))
    try:
        assert exposition_options(node, ["nvml"], [source]).reads_scheduler is False
    finally:
        asyncio.run(source.close())
    assert cluster.sources.kubernetes.enabled is True
    assert KubernetesAllocationSource.role == "allocation"


def test_node_name_substitution_runs() -> None:
    """The container's start command puts the node's name in the config: run its sed here."""
    (ds,) = find(objects("node"), "DaemonSet")
    command = ds["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    script = command[2].replace("/etc/gpufleet/node.yaml", str(K8S / "overlays" / "node" / "node.yaml"))
    script = script.replace("/tmp/node.yaml", "/dev/stdout").replace("exec gpufleet serve", "true")
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"NODE_NAME": "gpu-node-7.example", "PATH": "/usr/bin:/bin"}, check=False)
    assert done.returncode == 0
    assert '    node: "gpu-node-7.example"\n' in done.stdout


def test_network_policies_admit_prometheus() -> None:
    for overlay, port in (("node", "metrics"), ("cluster", "http")):
        (policy,) = find(objects(overlay), "NetworkPolicy")
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        assert rule["from"][0]["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}


def test_the_steering_webhook_can_never_keep_a_pod_out() -> None:
    """issue 42: with gpufleet stopped, the apiserver applies the webhook's failurePolicy:
    Ignore admits the pod unchanged, after at most the timeout. Only pod creation is sent,
    never gpufleet's own namespace (it could not start again) nor kube-system."""
    (config,) = find(objects("admission"), "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] <= 2
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["clientConfig"]["service"] == {"name": "gpufleet-cluster", "namespace": "gpufleet",
                                                "path": "/v1/admission", "port": 9874}
    assert [(r["operations"], r["resources"]) for r in hook["rules"]] == [(["CREATE"], ["pods"])]
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn" and {"gpufleet", "kube-system"} <= set(expr["values"])
    service = next(o for o in find(objects("admission"), "Service")
                   if o["metadata"]["name"] == "gpufleet-cluster")
    assert 9874 in [p["port"] for p in service["spec"]["ports"]]
