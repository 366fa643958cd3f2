"""The kubernetes source on the recorded cluster (tests/data/kubernetes, see its ORIGIN.md).

The apiserver is the fake of tests/helpers/fake_apiserver.py (no real one can run
here); every object it serves was recorded from published output or built in the
shape of a published manifest. What each pod holds is checked exactly: MIG slices
with their profile, time-sliced GPUs at 1/replicas, DRA-claimed GPUs by UUID, the
pending gang, and (with the dcgm source on the real H100 sample of the same
cluster) that the pod allocations agree with dcgm-exporter's own pod labels.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.collect import Collector
from exporter.options import Duration
from exporter.snapshot import Allocation, FleetSnapshot, JobRequest, Placement
from exporter.sources import SourceStartupError
from exporter.sources.dcgm.options import DcgmSource as DcgmConfig
from exporter.sources.dcgm.source import build as build_dcgm
from exporter.sources.kubernetes.options import KubernetesSource as KubernetesConfig
from exporter.sources.kubernetes.source import (
    CLAIMS,
    KubernetesAllocationSource,
    KubernetesError,
    build,
    node_record,
    pod_record,
)
from tests.helpers import REPO, data_dir, free_port, http_get, start_exporter, stop, wait_http, wait_until
from tests.helpers.exported import Exported
from tests.helpers.fake_apiserver import FakeApiserver, read_objects, write_kubeconfig
from tests.helpers.stall import LoopWitness

RECORDED = Path(__file__).parent / "data" / "kubernetes"
TOKEN = "recorded-cluster-token"
GIB = 2**30
MIB = 2**20
# gpu-node-1's GPUs by index, from its ResourceSlice (the same UUIDs as the dcgm sample)
GPU_NODE_1 = ("GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a",
              "GPU-fbc2c554-4d37-8938-0032-f923bad0f716", "GPU-a65a773d-52bb-bcc1-a8ee-f78c3faa2e2d",
              "GPU-82e45d1b-1618-559f-144c-eab51545030b", "GPU-39e28159-8c62-ee71-64db-b748edd61e15",
              "GPU-e64d69ca-b4b3-59b2-e78c-94f26c4db365", "GPU-04d228d3-3b5a-3534-f5cf-969706647d56")
TS = "time-slicing-verification-7cdc7f87c5-"


def ts(text: str) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
async def apiserver():
    fake = FakeApiserver(token=TOKEN)
    fake.load(read_objects(RECORDED))
    await fake.start()
    yield fake
    await fake.kill()


def config(kubeconfig: Path, **options) -> KubernetesConfig:
    return KubernetesConfig(enabled=True, kubeconfig=str(kubeconfig),
                            sync_timeout=Duration(options.pop("sync_timeout", 5.0)), **options)


@pytest.fixture
async def source_for(tmp_path):
    made: list[KubernetesAllocationSource] = []

    def make(fake: FakeApiserver, **options) -> KubernetesAllocationSource:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake.url, TOKEN)
        source = build(config(kubeconfig, **options), time.time)
        made.append(source)
        return source

    yield make
    for source in made:
        await source.close()


@pytest.fixture
def read(source_for):
    async def read_once(fake: FakeApiserver, **options) -> FleetSnapshot:
        reading = await source_for(fake, **options).read()
        return FleetSnapshot(0.0, reading.nodes, reading.gpus, reading.allocations,
                             reading.pending)

    return read_once


def held(snapshot: FleetSnapshot) -> dict[str, tuple[str, tuple[int, ...], float]]:
    """pod -> (node, GPU indices, share of each), for pods holding one kind of share."""
    out = {}
    for alloc in snapshot.allocations:
        (part,) = alloc.placements
        out[alloc.pod] = (part.node, part.gpus, part.gpu_share)
    return out


async def test_nodes_become_gpus_of_their_catalogue_model_with_mig_instances(apiserver, read):
    snapshot = await read(apiserver, resource_slices=True)
    assert [(n.name, n.model, n.pool, n.generation, n.gpu_count, n.cpu_cores)
            for n in snapshot.nodes] == [
        ("gpu-node-1", "H100", "H100", "hopper", 8, 192.0),
        ("gpu-node-2", "H100", "H100", "hopper", 8, 192.0),
        ("s4124-0073", "H100", "H100", "hopper", 1, 128.0),
        ("t4-node-1", "T4", "T4", "turing", 4, 48.0),  # the -SHARED suffix is not the model
    ]  # system-node-2 has no GPU: left out
    gpus = {(g.node, g.index): g for g in snapshot.gpus}
    assert len(gpus) == 21
    assert tuple(gpus[("gpu-node-1", i)].uuid for i in range(8)) == GPU_NODE_1
    assert gpus[("gpu-node-2", 0)].uuid == "GPU-92da0328-2f33-b563-d577-9d2b9f21f280"
    assert gpus[("gpu-node-1", 0)].memory_total_bytes == 81559 * MIB
    # the mixed strategy's profiles on its one H100, largest first as nvidia-smi -L lists them
    mig = gpus[("s4124-0073", 0)].mig
    assert [(m.instance_id, m.profile, m.memory_total_bytes) for m in mig] == [
        (0, "3g.40gb", 40320 * MIB), (1, "2g.20gb", 20096 * MIB),
        (2, "1g.10gb", 9984 * MIB), (3, "1g.10gb", 9984 * MIB)]
    assert all(g.up for g in snapshot.gpus)


async def test_each_pod_holds_its_gpus_mig_slices_time_sliced_shares_and_dra_devices(
        apiserver, read):
    snapshot = await read(apiserver, resource_slices=True)
    assert held(snapshot) == {
        # device plugin, whole GPU: the lowest index the DRA claim left free
        "vllm-agg-0-vllmdecodeworker-s65j5": ("gpu-node-1", (0,), 1.0),
        # DRA: the claim's device gpu-1, which is GPU-bc5610b9 in the node's ResourceSlice
        "isolation-test": ("gpu-node-1", (1,), 1.0),
        # MIG (mixed strategy): a 3g slice is 3/7 of the GPU, a 1g slice 1/7
        "mig-3g-inference": ("s4124-0073", (0,), 3 / 7),
        "mig-1g-notebook-0": ("s4124-0073", (0,), 1 / 7),
        # time-slicing, 4 replicas: each pod holds 1/4, spread over the 4 T4s
        TS + "lkd9d": ("t4-node-1", (0,), 0.25),
        TS + "rrzq7": ("t4-node-1", (1,), 0.25),
        TS + "s8qwk": ("t4-node-1", (2,), 0.25),
        TS + "xhmb7": ("t4-node-1", (3,), 0.25),
        TS + "zsncp": ("t4-node-1", (0,), 0.25),
    }
    shares, _ = snapshot.held()
    assert shares[("t4-node-1", 0)] == 0.5
    assert shares[("s4124-0073", 0)] == pytest.approx(4 / 7)
    by_uuid = {g.uuid: (g.node, g.index) for g in snapshot.gpus if g.uuid}
    assert by_uuid["GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"] == ("gpu-node-1", 1)


async def test_a_pod_carries_its_owner_priority_namespace_start_and_hints(apiserver, read):
    snapshot = await read(apiserver)
    allocations = {a.pod: a for a in snapshot.allocations}
    assert allocations["vllm-agg-0-vllmdecodeworker-s65j5"] == Allocation(
        job="dynamo-workload/vllm-agg-0-vllmdecodeworker",  # its PodClique
        placements=(Placement("gpu-node-1", (0,), 1.0, 0.0),),
        namespace="dynamo-workload", pod="vllm-agg-0-vllmdecodeworker-s65j5", priority=1000,
        qos="inference-high", account="dynamo-workload", start_time=ts("2026-03-10T03:33:42Z"),
        last_checkpoint_time=ts("2026-03-10T03:35:00Z"), gpu_memory_need_bytes=70 * GIB)
    # a Job's label names it; a ReplicaSet less its pod-template-hash is the Deployment, and
    # each of its five pods keeps an allocation key of its own
    assert allocations["mig-3g-inference"].job == "mig-test/mig-3g-inference"
    assert allocations["mig-1g-notebook-0"].job == "mig-test/mig-1g-notebook"
    assert allocations[TS + "lkd9d"].job == f"default/time-slicing-verification/{TS}lkd9d"
    assert len({a.job for a in snapshot.allocations}) == len(snapshot.allocations) == 9


async def test_unscheduled_pods_asking_for_gpus_are_demand_per_job(apiserver, read):
    snapshot = await read(apiserver)
    # the KAI gang: two pods, each with an unallocated claim for one gpu.nvidia.com device
    assert snapshot.pending == (JobRequest(
        job="gang-scheduling-test/gang-test-group", gpu_count=2, node_count=2,
        submit_time=ts("2026-03-10T03:41:05Z")),)


async def test_without_resource_slices_a_dra_device_is_known_by_index_only(apiserver, read):
    snapshot = await read(apiserver)  # resource_slices off: RBAC on nodes, pods, claims only
    assert all(g.uuid == "" for g in snapshot.gpus)
    assert held(snapshot)["isolation-test"] == ("gpu-node-1", (1,), 1.0)
    assert not any("resourceslices" in r for r in apiserver.requests)


async def test_a_cluster_without_the_dra_api_is_read_without_claims(read):
    fake = FakeApiserver(token=TOKEN, served=("/api/v1/nodes", "/api/v1/pods"))
    fake.load(o for o in read_objects(RECORDED) if o["kind"] in ("Node", "Pod"))
    await fake.start()
    try:
        snapshot = await read(fake)
    finally:
        await fake.kill()
    assert "isolation-test" not in held(snapshot)  # its claim cannot be seen
    assert held(snapshot)["vllm-agg-0-vllmdecodeworker-s65j5"] == ("gpu-node-1", (0,), 1.0)
    assert snapshot.pending == ()  # the gang's demand is in its claims


def test_owner_is_the_job_label_then_the_controller_then_the_pod():
    def pod(labels=None, owner=None, name="p-1"):
        meta = {"name": name, "namespace": "ns", "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [owner]
        return {"metadata": meta, "spec": {"nodeName": "n", "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "500m"}}}]},
            "status": {"phase": "Running"}}

    rs = {"kind": "ReplicaSet", "name": "web-7cdc7f87c5", "controller": True}
    assert pod_record(pod({"pod-template-hash": "7cdc7f87c5"}, rs)).owner == "web"
    assert pod_record(pod({}, rs)).owner == "web-7cdc7f87c5"  # no hash label: not stripped
    assert pod_record(pod({"training.kubeflow.org/job-name": "bert", "batch.kubernetes.io/"
                           "job-name": "bert-worker"}, rs)).owner == "bert"
    assert pod_record(pod({"jobset.sigs.k8s.io/jobset-name": "llm"})).owner == "llm"
    not_controller = dict(rs, controller=False)
    assert pod_record(pod({}, not_controller, name="lonely")).owner == "lonely"
    record = pod_record(pod())
    assert (record.whole, record.cpus) == (2, 0.5)


def test_records_survive_hostile_objects():
    assert pod_record({}) is None
    assert pod_record({"metadata": [], "spec": "x", "status": None}) is None
    bad = {"metadata": {"name": "p", "namespace": "n", "annotations": {"gpu-fraction": "nan"}},
           "spec": {"nodeName": "n", "priority": True, "containers": [
               {"resources": {"limits": {"nvidia.com/gpu": "1e9", "nvidia.com/mig-9g.1gb": "1",
                                         "cpu": "-1"}}}, "junk"]},
           "status": {"phase": "Running", "startTime": "yesterday"}}
    assert pod_record(bad) is None  # no count it can trust: asks for nothing
    assert node_record({"metadata": {"name": "n", "labels": {
        "nvidia.com/gpu.product": "x" * 10_000, "nvidia.com/gpu.count": "99999999"}},
        "status": {"capacity": {"nvidia.com/gpu": {"a": 1}}}}) is None
    big = node_record({"metadata": {"name": "n", "labels": {"nvidia.com/gpu.count": "9000"}},
                       "status": {"capacity": {"nvidia.com/gpu": "9000"}}})
    assert big is not None and big.gpus == 64  # a node holds at most 64 GPUs here


async def test_a_forbidden_apiserver_marks_the_source_down_and_the_last_view_is_served_stale(
        apiserver, source_for):
    source = source_for(apiserver, backoff_max=Duration(0.2))
    collector = Collector([source], timeout_seconds=10)
    try:
        good = Exported.of(await collector.collect())
        assert good.value("gpufleet_source_up", source="kubernetes") == 1
        apiserver.forbidden = True  # RBAC revoked, and the watches have to be reopened
        await apiserver.kill()
        await apiserver.start()
        for _ in range(100):  # the aborted watches fail first, then the retries meet the 403
            if all("403" in i.error for i in source._informers.informers):
                break
            await asyncio.sleep(0.05)
        down = Exported.of(await collector.collect())
        error = source._informers.informers[0].error
    finally:
        await collector.close()
    # closed while its watches were failing and retrying: nothing of it is left running
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("informer")] == []
    assert source._session is None
    assert down.value("gpufleet_source_up", source="kubernetes") == 0
    info = down.all("gpufleet_gpu_allocation_info", pod="isolation-test")
    assert [(labels["node"], labels["gpu"]) for labels, _ in info] == [("gpu-node-1", "1")]
    assert down.value("gpufleet_gpu_stale", node="gpu-node-1", gpu="1") == 1
    assert "HTTP 403 Forbidden" in error and "cannot list resource" in error


async def test_an_apiserver_that_never_answers_fails_the_first_read_with_its_reason(tmp_path):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{free_port()}")
    source = build(config(kubeconfig, sync_timeout=0.5), time.time)
    try:
        with pytest.raises(KubernetesError, match=r"no first list within sync_timeout .*"
                                                  r"apiserver unreachable"):
            await source.read()
    finally:
        await source.close()


def test_configuration_errors_name_the_key(tmp_path):
    with pytest.raises(SourceStartupError, match=r"^sources\.kubernetes\.kubeconfig: cannot "
                                                 r"read .*missing"):
        build(config(tmp_path / "missing"), time.time)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443")
    with pytest.raises(SourceStartupError, match=r"^sources\.kubernetes\.context: 'prod' is not "
                                                 r"a context of .* \(it has: recorded\)"):
        build(config(kubeconfig, context="prod"), time.time)
    (tmp_path / "broken").write_text("clusters: [\n")
    with pytest.raises(SourceStartupError, match=r"^sources\.kubernetes\.kubeconfig: "):
        build(config(tmp_path / "broken"), time.time)
    in_cluster = KubernetesConfig(enabled=True)
    with pytest.raises(SourceStartupError, match=r"^sources\.kubernetes\.kubeconfig: empty, and "
                                                 r"this is not a pod"):
        build(in_cluster, time.time, environ={})
    with pytest.raises(SourceStartupError, match=r"no service account token at .*/token"):
        build(in_cluster, time.time, service_account=tmp_path,
              environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})


async def test_pod_allocations_agree_with_dcgm_exporters_pod_labels(apiserver, source_for,
                                                                  aiohttp_server):
    """Cluster mode: the kubernetes source composed with the dcgm source on the real H100
    sample of the same cluster (gpu-node-1). dcgm-exporter says GPU 0 runs the vllm pod."""
    body = (data_dir() / "dcgm-samples" / "h100-8gpu-k8s-pod-labels.prom").read_text()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    dcgm = build_dcgm(DcgmConfig(enabled=True, targets=(f"127.0.0.1:{server.port}",)),
                      time.time)
    alone = Collector([dcgm], timeout_seconds=10)
    measured = await alone.collect()
    kubernetes = source_for(apiserver, resource_slices=True)
    together = Collector([kubernetes, dcgm], timeout_seconds=10)
    try:
        composed = await together.collect()
    finally:
        await together.close()
    # what dcgm-exporter's pod labels say, by UUID
    uuid_of = {(g.node, g.index): g.uuid for g in measured.gpus}
    by_labels = {(a.namespace, a.pod): {uuid_of[(p.node, i)] for p in a.placements for i in p.gpus}
                 for a in measured.allocations}
    assert by_labels == {("dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5"):
                         {"GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"}}
    # what the composed snapshot (the apiserver's allocations on telemetry's GPUs) says
    uuid_after = {(g.node, g.index): g.uuid for g in composed.gpus}
    by_kubernetes = {(a.namespace, a.pod): {uuid_after[(p.node, i)] for p in a.placements
                                            for i in p.gpus}
                     for a in composed.allocations if a.placements[0].node == "gpu-node-1"}
    assert by_kubernetes == {
        **by_labels,
        ("secure-access-test", "isolation-test"): {"GPU-bc5610b9-79c8-fedd-8899-07539c7f868a"},
    }
    # every gpu-node-1 GPU matched by UUID: telemetry's values on the scheduler's GPUs
    gpu0 = next(g for g in composed.gpus if g.uuid == GPU_NODE_1[0])
    assert (gpu0.node, gpu0.index, gpu0.power_watts) == ("gpu-node-1", 0, 113.611)
    assert {u.side: u.count for u in composed.unmatched} == {"allocation": 13, "telemetry": 0}


async def test_not_served_claims_path_is_asked_once(read):
    fake = FakeApiserver(token=TOKEN, served=("/api/v1/nodes", "/api/v1/pods"))
    await fake.start()
    try:
        await read(fake)
        await asyncio.sleep(0.3)
    finally:
        await fake.kill()
    assert sum(CLAIMS in r for r in fake.requests) == 1  # a 404 is not retried


def serve_on_the_recorded_cluster(tmp_path: Path, exporter_options: Any) -> Exported:
    """``gpufleet serve --source kubernetes`` against the fake apiserver in its own process,
    once /metrics shows fragmentation; ``exporter_options(url)`` gives start_exporter's
    keyword arguments (config, env) for the apiserver at ``url``."""
    port = free_port()
    log = tmp_path / "apiserver.log"
    apiserver = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fake_apiserver", "--port", str(port),
         "--token", TOKEN, str(RECORDED)],
        cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc=apiserver)
        exporter = start_exporter(tmp_path, "--source", "kubernetes",
                                  **exporter_options(f"http://127.0.0.1:{port}"))
        try:
            def scraped() -> Exported | None:
                text = http_get(f"{exporter.url}/metrics").decode()
                return Exported(text) if "gpufleet_pool_fragmentation_index{" in text else None

            return wait_until("fragmentation on /metrics", scraped)
        finally:
            stop(exporter.proc)
    finally:
        stop(apiserver)


@pytest.mark.slow
def test_serve_shows_each_pods_gpus_pending_demand_and_fragmentation_per_pool(tmp_path):
    """``gpufleet serve --source kubernetes`` (cluster mode, a kubeconfig) on the recorded
    cluster, the fake apiserver in its own process: what /metrics shows."""
    def config(url: str) -> dict[str, Any]:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url, TOKEN)
        return {"config": f"sources:\n  kubernetes:\n    kubeconfig: {kubeconfig}\n"
                          "    resource_slices: true\n"}

    metrics = serve_on_the_recorded_cluster(tmp_path, config)
    assert metrics.value("gpufleet_source_up", source="kubernetes") == 1

    def gpus_of(pod: str) -> list[tuple[str, str, str]]:
        return sorted((labels["node"], labels["gpu"], labels["uuid"])
                      for labels, _ in metrics.all("gpufleet_gpu_allocation_info", pod=pod))

    def share(job: str) -> float:
        return metrics.value("gpufleet_allocation_gpu_share_ratio", job=job)

    # DRA: the claimed device by UUID
    assert gpus_of("isolation-test") == [
        ("gpu-node-1", "1", "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a")]
    assert gpus_of("vllm-agg-0-vllmdecodeworker-s65j5") == [
        ("gpu-node-1", "0", "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005")]
    # MIG: the slices with their profile, each pod its share of the GPU
    profiles = sorted(labels["profile"] for labels, _ in
                      metrics.all("gpufleet_gpu_mig_instance_info", node="s4124-0073"))
    assert profiles == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert gpus_of("mig-3g-inference") == [("s4124-0073", "0", "")]
    assert share("mig-test/mig-3g-inference") == 3 / 7
    assert share("mig-test/mig-1g-notebook") == 1 / 7
    # time-slicing: each of the five pods holds 1/4 of a T4
    sliced = [labels["job"] for labels, _ in metrics.all("gpufleet_allocation_gpu_share_ratio")
              if labels["node"] == "t4-node-1"]
    assert len(sliced) == 5 and all(share(job) == 0.25 for job in sliced)
    assert metrics.value("gpufleet_gpu_allocated_ratio", node="t4-node-1", gpu="0") == 0.5
    # pending demand, and the fragmentation index per GPU-product pool
    assert metrics.value("gpufleet_pending_gpus", pool="") == 2
    assert metrics.value("gpufleet_pending_jobs", pool="") == 1
    pools = {labels["pool"]: value for labels, value in
             metrics.all("gpufleet_pool_fragmentation_index")}
    assert set(pools) == {"H100", "T4"}
    assert all(0 <= value <= 100 for value in pools.values())
    # what the index is computed from, exactly: H100 17 GPUs less 2 whole and 4/7 of MIG
    # slices held; T4 4 GPUs less five 1/4 replicas
    idle = {labels["pool"]: value for labels, value in metrics.all("gpufleet_pool_idle_gpus")}
    assert idle == {"H100": round(17 - 2 - 4 / 7, 9), "T4": 2.75}


async def test_in_cluster_the_service_account_token_and_ca_reach_an_https_apiserver(tmp_path):
    """In a pod: KUBERNETES_SERVICE_HOST/PORT, and the token and CA kubelet mounts; the
    apiserver serves https with a certificate that CA signed (tests/helpers/tls.py)."""
    import shutil
    import ssl

    from tests.helpers.tls import make_pki

    pki = make_pki(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    fake = FakeApiserver(token=TOKEN, ssl_context=context)
    fake.load(read_objects(RECORDED))
    await fake.start()
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN)
    shutil.copy(pki.ca, account / "ca.crt")
    source = build(KubernetesConfig(enabled=True, sync_timeout=Duration(5)), time.time,
                   service_account=account,
                   environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                            "KUBERNETES_SERVICE_PORT": str(fake.port)})
    try:
        reading = await source.read()
    finally:
        await source.close()
        await fake.kill()
    # the fake answers 401 to a wrong or missing token and the TLS handshake needs the CA:
    # a full reading means both reached it
    assert fake.url.startswith("https://")
    assert len(reading.allocations) == 9 and len(reading.gpus) == 21


# the keys the record functions look for, so generated objects reach their deeper branches
KEYS = ("metadata", "spec", "status", "name", "namespace", "labels", "annotations",
        "ownerReferences", "controller", "kind", "containers", "initContainers", "resources",
        "limits", "requests", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu", "nodeName",
        "priority", "resourceClaims", "resourceClaimName", "phase", "startTime", "capacity",
        "allocatable", "conditions", "type", "devices", "requests", "exactly", "count",
        "deviceClassName", "allocation", "results", "device", "driver", "pool", "attributes",
        "uuid", "string", "int", "gpu-fraction", "nvidia.com/gpu.product",
        "nvidia.com/gpu.count", "nvidia.com/gpu.replicas", "pod-template-hash")
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
    | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=6),
    max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_no_object_makes_a_record_function_raise(obj):
    """Whatever JSON the apiserver (or something in its place) sends, each record function
    returns a record or None: an exception would stop the informer's whole kind."""
    from exporter.sources.kubernetes.source import claim_record, slice_record

    for record in (pod_record, node_record, claim_record, slice_record):
        record(obj if isinstance(obj, dict) else {"metadata": obj, "spec": obj, "status": obj})


def test_a_dra_mig_device_holds_its_profiles_slices_of_its_gpu():
    """A claim for a MIG device of the DRA driver (``gpu-0-mig-...``): with its ResourceSlice,
    the profile's slices (3g: 3/7); without, one slice. Built in the driver's naming
    (gpu-<index>-mig-<...>, attributes type mig, profile, parentUUID): no published
    MIG ResourceSlice was found."""
    from exporter.gpu_catalogue import default_catalogue
    from exporter.sources.kubernetes.source import KubeClaim, slice_record, to_snapshot

    node = node_record(next(o for o in read_objects(RECORDED)
                            if o["metadata"]["name"] == "gpu-node-2"))
    user = pod_record({"metadata": {"name": "mig-user", "namespace": "ns"},
                       "spec": {"nodeName": "gpu-node-2",
                                "resourceClaims": [{"name": "g", "resourceClaimName": "c"}]},
                       "status": {"phase": "Running"}})
    device = "gpu-2-mig-9-4-3"
    claims = {"ns/c": KubeClaim("ns", "c", (("gpu.nvidia.com", "gpu-node-2", device),), 1)}
    piece = slice_record({"spec": {"nodeName": "gpu-node-2", "driver": "gpu.nvidia.com",
                                   "pool": {"name": "gpu-node-2"}, "devices": [
        {"name": device, "attributes": {"type": {"string": "mig"},
                                         "profile": {"string": "3g.40gb"},
                                         "uuid": {"string": "MIG-0f709664-740c-52b0-ae79"}}}]}})
    with_slice, _ = to_snapshot(0, [node], [user], claims, [piece], default_catalogue())
    without, _ = to_snapshot(0, [node], [user], claims, [], default_catalogue())
    assert with_slice.allocations[0].placements == (Placement("gpu-node-2", (2,), 3 / 7, 0.0),)
    assert without.allocations[0].placements == (Placement("gpu-node-2", (2,), 1 / 7, 0.0),)


def test_with_a_pool_label_pending_demand_lands_in_its_products_pool():
    # pools are the pool label's values then, not product names: a waiting pod that asks for
    # H100s by product is demand on the pool the H100 nodes are in
    import copy

    from exporter.gpu_catalogue import default_catalogue
    from exporter.sources.kubernetes.source import to_snapshot

    nodes = []
    for obj in read_objects(RECORDED):
        if obj["kind"] == "Node":
            obj = copy.deepcopy(obj)
            h100 = obj["metadata"]["labels"].get("nvidia.com/gpu.product", "").startswith("NVIDIA-H100")
            obj["metadata"]["labels"]["example.com/pool"] = "train" if h100 else "serve"
            nodes.append(node_record(obj, "example.com/pool"))
    waiting = pod_record({
        "metadata": {"name": "w-0", "namespace": "ml", "creationTimestamp": "2026-03-10T03:41:05Z"},
        "spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                 "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        "status": {"phase": "Pending"}})
    snapshot, _ = to_snapshot(0, [n for n in nodes if n], [waiting], {}, [], default_catalogue())
    assert {n.pool for n in snapshot.nodes} == {"train", "serve"}
    assert [(r.pool, r.gpu_count) for r in snapshot.pending] == [("train", 2)]


def test_a_slice_device_with_a_negative_index_is_no_gpu():
    # index.int is the driver's word; -5 once raised IndexError on every read, holding the
    # whole source down until the slice changed
    from exporter.gpu_catalogue import default_catalogue
    from exporter.sources.kubernetes.source import slice_record, to_snapshot

    node = node_record(next(o for o in read_objects(RECORDED)
                            if o["metadata"]["name"] == "gpu-node-2"))
    piece = slice_record({"spec": {"nodeName": "gpu-node-2", "driver": "gpu.nvidia.com",
                                   "pool": {"name": "gpu-node-2"}, "devices": [
        {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "index": {"int": -5},
                                         "uuid": {"string": "GPU-planted"}}}]}})
    snapshot, _ = to_snapshot(0, [node], [], {}, [piece], default_catalogue())
    without, _ = to_snapshot(0, [node], [], {}, [], default_catalogue())
    assert "GPU-planted" not in {g.uuid for g in snapshot.gpus}
    assert [g.uuid for g in snapshot.gpus] == [g.uuid for g in without.gpus]


async def test_a_kubeconfig_exec_plugin_is_run_again_once_its_token_expires(apiserver,
                                                                           tmp_path):
    """The credential plugins of EKS, GKE and AKS kubeconfigs: ``user.exec`` prints an
    ExecCredential; one whose token has expired is run again before the next request."""
    runs = tmp_path / "runs"
    plugin = tmp_path / "credential"
    plugin.write_text(f"""#!/bin/sh
echo run >> {runs}
echo '{{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
  "status": {{"token": "{TOKEN}", "expirationTimestamp": "2026-01-01T00:00:00Z"}}}}'
""")
    plugin.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: recorded, cluster: {{server: "{apiserver.url}"}}}}]
users: [{{name: eks, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1,
  command: {plugin}, interactiveMode: Never}}}}}}]
contexts: [{{name: recorded, context: {{cluster: recorded, user: eks}}}}]
current-context: recorded
""")
    source = build(config(kubeconfig, backoff_max=Duration(0.2)), time.time)
    try:
        reading = await source.read()
        for _ in range(200):
            if all(i.stats.watches == 1 for i in source._informers.informers):
                break
            await asyncio.sleep(0.05)
        first = len(runs.read_text().splitlines())
        await apiserver.kill()  # every watch is reopened: each request asks for the token
        await apiserver.start()
        for _ in range(200):
            if all(i.healthy and i.stats.watches >= 2 for i in source._informers.informers):
                break
            await asyncio.sleep(0.05)
        watches = [i.stats.watches for i in source._informers.informers]
        await source.read()
    finally:
        await source.close()
    assert len(reading.allocations) == 9 and watches == [2, 2, 2]
    # run for the lists and the first watches, then again for each reopened watch
    assert len(runs.read_text().splitlines()) >= first + 3 > 3


def test_a_change_rebuilds_only_its_nodes_part_and_the_result_is_the_same():
    from exporter.gpu_catalogue import default_catalogue
    from exporter.sources.kubernetes.source import claim_record, slice_record, to_snapshot

    objects = read_objects(RECORDED)
    nodes = [r for r in (node_record(o) for o in objects if o["kind"] == "Node") if r]
    pods = {o["metadata"]["name"]: pod_record(o) for o in objects if o["kind"] == "Pod"}
    pods = {name: r for name, r in pods.items() if r}
    claims = {f"{r.namespace}/{r.name}": r for r in (
        claim_record(o) for o in objects if o["kind"] == "ResourceClaim") if r}
    slices = [r for r in (slice_record(o) for o in objects if o["kind"] == "ResourceSlice") if r]
    catalogue = default_catalogue()
    memo: dict = {}
    first, _ = to_snapshot(1.0, nodes, pods.values(), claims, slices, catalogue, memo)
    before = {name: part for name, (_, part) in memo.items()}
    # one pod on gpu-node-1 is replaced by a newer one of the same request
    import dataclasses
    pods["vllm-agg-0-vllmdecodeworker-s65j5"] = dataclasses.replace(
        pods["vllm-agg-0-vllmdecodeworker-s65j5"], name="vllm-agg-0-vllmdecodeworker-x1x1x")
    second, _ = to_snapshot(2.0, nodes, pods.values(), claims, slices, catalogue, memo)
    rebuilt = sorted(name for name, (_, part) in memo.items() if part is not before[name])
    assert rebuilt == ["gpu-node-1"]
    fresh, _ = to_snapshot(2.0, nodes, pods.values(), claims, slices, catalogue)
    assert second == fresh != first


async def test_a_pod_beyond_its_nodes_gpus_is_counted_once_not_at_every_rebuild(apiserver,
                                                                              source_for):
    def gpu_pod(name: str, gpus: int) -> dict:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns", "uid": name},
                "spec": {"nodeName": "gpu-node-1", "containers": [
                    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
                "status": {"phase": "Running"}}

    apiserver.add(gpu_pod("too-big", 99))  # the node has 8
    source = source_for(apiserver)
    first = (await source.read()).parse_errors
    for i in range(3):  # unrelated changes (a job waiting): each read rebuilds, the stuck pod stays
        waiting = gpu_pod(f"waiting-{i}", 1)
        del waiting["spec"]["nodeName"]
        waiting["status"]["phase"] = "Pending"
        apiserver.add(waiting)
        await until_revision_moves(source)
        assert (await source.read()).parse_errors == first
    assert first > 0


async def until_revision_moves(source) -> None:
    before = tuple(i.revision for i in source._informers.informers)
    for _ in range(400):
        if tuple(i.revision for i in source._informers.informers) != before:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no watch event reached the informers")


async def test_a_cluster_over_max_gpus_is_down_with_the_reason_and_served_stale(apiserver,
                                                                                  source_for):
    """Issue 32, finding 2: 20,000 nodes labelled with 64 GPUs each passed 4 GB while the
    snapshot was built. The GPUs are summed first; over the cap nothing is built."""
    import dataclasses

    source = source_for(apiserver, backoff_max=Duration(0.2))
    collector = Collector([source], timeout_seconds=10)
    try:
        good = await collector.collect()
        gpus = len(good.gpus)
        assert good.sources[0].up and gpus > 1
        source.config = dataclasses.replace(source.config, max_gpus=gpus)
        node = apiserver.get("/api/v1/nodes", "gpu-node-1")
        node["status"]["capacity"]["nvidia.com/gpu"] = "64"  # one node grows past the cap
        node["metadata"]["labels"].pop("nvidia.com/gpu.count", None)
        apiserver.add(node)
        await until_revision_moves(source)
        down = await collector.collect()
    finally:
        await collector.close()
    status = down.sources[0]
    assert not status.up
    assert "over sources.kubernetes.max_gpus" in status.error and f"({gpus})" in status.error
    assert len(down.gpus) == gpus and all(g.stale for g in down.gpus)  # the last good view


async def test_the_snapshot_is_built_off_the_event_loop(apiserver, source_for, monkeypatch):
    """Issue 32, finding 10: 300,000 pods made one scrape take 9.7 s, the build on the loop.
    The build must run off the loop: while it runs, the loop still answers."""
    from exporter.sources.kubernetes import source as kube_source

    witness = LoopWitness()
    monkeypatch.setattr(kube_source, "to_snapshot", witness.wrap(kube_source.to_snapshot))
    source = source_for(apiserver)
    reading = await witness.watch(source.read())
    assert reading.gpus
    assert witness.turned == [True], "the snapshot was built on the event loop, which stood still"


async def test_objects_skipped_as_too_deep_count_as_parse_errors_once(apiserver, source_for):
    """The informers drop an object nested too deep alone (tests/test_kubernetes_watch.py);
    the source counts each in gpufleet_source_parse_errors_total, once."""
    source = source_for(apiserver)
    first = await source.read()
    pods = next(i for i in source._informers.informers if i.name == "pods")
    pods.stats.skipped += 2  # as two objects too deep to decode would
    second = await source.read()
    third = await source.read()
    assert second.parse_errors == first.parse_errors + 2
    assert third.parse_errors == second.parse_errors
