"""The dcgm source on the real dcgm-exporter samples, served by local aiohttp servers.

Every sample in ``data/dcgm-samples`` is served over HTTP, read
through the source and the collector, rendered, and the exported values are
checked in base units against the numbers in the sample.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.collect import Collector
from exporter.config import Duration
from exporter.sources import SourceStartupError
from exporter.sources.dcgm.exposition_parser import parse_text
from exporter.sources.dcgm.fields import build_fleet, is_blank
from exporter.sources.dcgm.options import DcgmSource as DcgmConfig
from exporter.sources.dcgm.source import DcgmExporterSource, Target, build, parse_body, target_from
from exporter.sources.gpu_models import catalogue_resolver
from tests.helpers import data_dir, free_port
from tests.helpers.exported import Exported

MIB = 1024 * 1024
SAMPLES = data_dir() / "dcgm-samples"
L4 = "l4-1gpu-default-counters.prom"
H100 = "h100-8gpu-k8s-pod-labels.prom"
A100_MIG = "a100-mig-docs.prom"
H100_POD = "vllm-agg-0-vllmdecodeworker-s65j5"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def serve(aiohttp_server, handler) -> str:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}/metrics"


def text_handler(body: str):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")
    return handler


def config(*targets: str, **kwargs) -> DcgmConfig:
    return DcgmConfig(enabled=True, targets=tuple(targets),
                      timeout=Duration(kwargs.pop("timeout", 2.0)), **kwargs)


async def collect(source: DcgmExporterSource, clock: Clock | None = None) -> Exported:
    collector = Collector([source], timeout_seconds=10, clock=clock or source.clock)
    return Exported.of(await collector.collect())


@pytest.fixture
async def read_samples(aiohttp_server):
    """Serve sample bodies, read them once through a dcgm source, return what is exported."""
    sources: list[DcgmExporterSource] = []

    async def read(*bodies: str, clock: Clock | None = None, **kwargs) -> Exported:
        urls = [await serve(aiohttp_server, text_handler(b)) for b in bodies]
        source = DcgmExporterSource(config(*urls, **kwargs), clock or Clock())
        sources.append(source)
        return await collect(source, clock)

    yield read
    for source in sources:
        await source.close()


# --- the three real samples -------------------------------------------------------------

async def test_l4_sample_exports_base_units(read_samples):
    out = await read_samples(sample(L4))
    gpu = {"node": "i-030791dc5a37cd257", "gpu": "0",
           "uuid": "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"}
    assert out.value("gpufleet_gpu_up", **gpu) == 1
    assert out.value("gpufleet_gpu_info", **gpu, model="L4", architecture="ada") == 1
    # FB_FREE 22563 + FB_USED 0 + FB_RESERVED 470 MiB
    assert out.value("gpufleet_gpu_memory_total_bytes", **gpu) == (22563 + 0 + 470) * MIB
    assert out.value("gpufleet_gpu_memory_used_bytes", **gpu) == 0
    assert out.value("gpufleet_gpu_utilization_ratio", **gpu) == 0.0
    assert out.value("gpufleet_gpu_power_watts", **gpu) == 16.365
    assert out.value("gpufleet_gpu_temperature_celsius", **gpu) == 31
    assert out.value("gpufleet_gpu_energy_joules_total", **gpu) == pytest.approx(4742.776)
    # an L4 has no NVLink: no capacity, no traffic, no raw DCGM bandwidth
    assert out.absent("gpufleet_gpu_nvlink_capacity_bytes_per_second")
    assert out.absent("gpufleet_gpu_nvlink_transmit_bytes_total")
    assert out.absent("gpufleet_gpu_allocation_info")
    assert out.value("gpufleet_gpu_allocated_ratio", **gpu) == 0
    assert out.value("gpufleet_source_parse_errors_total", source="dcgm") == 0
    assert out.value("gpufleet_node_info", node="i-030791dc5a37cd257", model="L4", gpus="1") == 1


async def test_h100_sample_attributes_gpu0_to_its_pod(read_samples):
    out = await read_samples(sample(H100))
    assert len(out.all("gpufleet_gpu_up", node="gpu-node-1")) == 8
    allocations = out.all("gpufleet_gpu_allocation_info")
    assert [(labels["gpu"], labels["pod"], labels["namespace"], labels["job"])
            for labels, _ in allocations] == [
        ("0", H100_POD, "dynamo-workload", f"dynamo-workload/{H100_POD}")]
    assert out.value("gpufleet_gpu_allocated_ratio", gpu="0") == 1
    assert [v for _, v in out.all("gpufleet_gpu_allocated_ratio") if v == 0] == [0] * 7
    assert out.value("gpufleet_gpu_power_watts", gpu="0") == 113.611
    assert out.value("gpufleet_gpu_power_watts", gpu="7") == 66.997
    assert out.value("gpufleet_gpu_temperature_celsius", gpu="2") == 26
    assert out.value("gpufleet_gpu_utilization_ratio", gpu="5") == 0.0
    assert out.value("gpufleet_gpu_info", gpu="5", model="H100", pool="",
                     uuid="GPU-39e28159-8c62-ee71-64db-b748edd61e15") == 1
    assert out.value("gpufleet_gpu_nvlink_capacity_bytes_per_second", gpu="3") == 900e9
    # the sample has no framebuffer fields: memory is absent, never 0
    assert out.absent("gpufleet_gpu_memory_total_bytes")
    assert out.absent("gpufleet_gpu_memory_used_bytes")


async def test_a100_mig_sample_yields_its_gpu_instances(read_samples):
    out = await read_samples(sample(A100_MIG))
    uuid = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
    assert out.all("gpufleet_gpu_mig_instance_info") == [
        # no modelName label (dcgm-exporter 2.x): 40,535 MiB of framebuffer is an A100 40GB
        ({"gpu": "0", "model": "A100", "node": "ub20-a100-k8s", "pool": "", "uuid": uuid,
          "gpu_instance": "13", "profile": "1g.5gb"}, 1.0)]
    # the MIG series have no framebuffer fields: instance memory is absent
    assert out.absent("gpufleet_gpu_mig_memory_total_bytes")
    assert out.value("gpufleet_gpu_memory_total_bytes", uuid=uuid) == (35690 + 4845) * MIB
    assert out.value("gpufleet_gpu_memory_used_bytes", uuid=uuid) == 4845 * MIB
    assert out.value("gpufleet_gpu_power_watts", uuid=uuid) == 409.692
    assert out.value("gpufleet_gpu_energy_joules_total", uuid=uuid) == pytest.approx(319159.391)
    assert out.value("gpufleet_gpu_temperature_celsius", uuid=uuid) == 61
    assert out.value("gpufleet_gpu_dcgm_nvlink_bandwidth_raw", uuid=uuid) == 0
    # no DCGM_FI_DEV_GPU_UTIL in the sample: absent, not 0
    assert out.absent("gpufleet_gpu_utilization_ratio")
    # the instance series did not overwrite whole-GPU values: one GPU, not two
    assert len(out.all("gpufleet_gpu_up")) == 1


async def test_mig_instance_memory_and_pod_share():
    labels = {"gpu": "1", "UUID": "GPU-x", "Hostname": "n1", "modelName": "NVIDIA A100-SXM4-80GB"}
    mig = {**labels, "GPU_I_ID": "3", "GPU_I_PROFILE": "3g.40gb",
           "pod": "trainer", "namespace": "ml", "container": "main"}
    fleet = build_fleet([
        ("DCGM_FI_DEV_FB_USED", mig, 1000.0),
        ("DCGM_FI_DEV_FB_FREE", mig, 39000.0),
        ("DCGM_FI_DEV_FB_USED", labels, 2000.0),
        ("DCGM_FI_DEV_FB_FREE", labels, 79000.0),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", mig, 0.5),
    ], resolve_model=catalogue_resolver())
    (gpu,) = fleet.gpus
    assert gpu.model == "A100-80GB"
    assert gpu.memory_used_bytes == 2000 * MIB
    (instance,) = gpu.mig
    assert (instance.instance_id, instance.profile) == (3, "3g.40gb")
    assert (instance.memory_used_bytes, instance.memory_total_bytes) == (1000 * MIB, 40000 * MIB)
    (alloc,) = fleet.allocations
    assert alloc.job == "ml/trainer"
    assert [(p.node, p.gpus, p.gpu_share) for p in alloc.placements] == [("n1", (1,), 0.428571)]


def test_prometheus_relabelled_pod_labels_win():
    # Through Prometheus, pod/namespace name the exporter's own pod; exported_* the workload's.
    labels = {"gpu": "0", "uuid": "GPU-a", "hostname": "n1", "pod": "dcgm-exporter-x",
              "namespace": "gpu-operator", "exported_pod": "job-1", "exported_namespace": "ml"}
    fleet = build_fleet([("DCGM_FI_DEV_GPU_UTIL", labels, 50.0)])
    assert [(a.namespace, a.pod) for a in fleet.allocations] == [("ml", "job-1")]
    assert fleet.gpus[0].utilization_ratio == 0.5
    assert fleet.gpus[0].node == "n1"


def test_time_sliced_gpu_is_shared_between_its_pods():
    base = {"gpu": "0", "UUID": "GPU-a", "Hostname": "n1", "namespace": "serve"}
    fleet = build_fleet([
        ("DCGM_FI_DEV_GPU_UTIL", {**base, "pod": "a"}, 10.0),
        ("DCGM_FI_DEV_GPU_UTIL", {**base, "pod": "b"}, 10.0),
        ("DCGM_FI_DEV_GPU_TEMP", {**base, "pod": "a"}, 40.0),
    ])
    assert sorted((a.pod, a.placements[0].gpu_share) for a in fleet.allocations) == [
        ("a", 0.5), ("b", 0.5)]


# --- label and format variants ----------------------------------------------------------

async def test_lowercase_hostname_and_uuid_labels(read_samples):
    body = sample(L4).replace("Hostname=", "hostname=").replace("UUID=", "uuid=")
    out = await read_samples(body)
    assert out.value("gpufleet_gpu_power_watts", node="i-030791dc5a37cd257",
                     uuid="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c") == 16.365


async def test_random_family_order_gives_the_same_values(read_samples):
    lines = sample(L4).splitlines()
    random.Random(3).shuffle(lines)
    shuffled = await read_samples("\n".join(lines) + "\n")
    ordered = await read_samples(sample(L4))
    assert sorted(shuffled.all("gpufleet_gpu_memory_total_bytes")) == \
        sorted(ordered.all("gpufleet_gpu_memory_total_bytes"))
    assert shuffled.value("gpufleet_gpu_power_watts") == 16.365


def test_blank_sentinels_are_dropped():
    labels = {"gpu": "0", "UUID": "GPU-a", "Hostname": "n1"}
    body = "\n".join([
        f"DCGM_FI_DEV_GPU_UTIL{{{_text(labels)}}} 9223372036854775794",  # INT64_BLANK + 2
        f"DCGM_FI_DEV_POWER_USAGE{{{_text(labels)}}} 140737488355328.000000",  # FP64_BLANK
        f"DCGM_FI_DEV_GPU_TEMP{{{_text(labels)}}} 2147483632",  # INT32_BLANK
        f"DCGM_FI_DEV_FB_USED{{{_text(labels)}}} 100",
    ])
    fleet, errors = parse_body(body.encode(), Target("u", "", "n1"), catalogue_resolver())
    (gpu,) = fleet.gpus
    assert (gpu.utilization_ratio, gpu.power_watts, gpu.temperature_celsius) == (None,) * 3
    assert gpu.memory_used_bytes == 100 * MIB
    assert errors == 0
    assert is_blank(float(0x7FFFFFFFFFFFFFF0)) and not is_blank(700.0)


def test_a_gpu_index_outside_0_to_63_is_no_gpu():
    # one sample per index; only the in-range ones become GPUs (10**9 once became a GPU
    # the advisor's bounds then refused, with the whole snapshot)
    samples = [("DCGM_FI_DEV_GPU_UTIL", {"gpu": index, "UUID": f"GPU-{index}", "Hostname": "n1"}, 5.0)
               for index in ("-3", "0", "63", "64", "1000000000")]
    assert sorted(g.index for g in build_fleet(samples).gpus) == [0, 63]


def _text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


async def test_nvlink_rates_become_byte_counters(read_samples, aiohttp_server):
    labels = '{gpu="0",UUID="GPU-n",Hostname="n1",modelName="NVIDIA H100 80GB HBM3"}'
    body = (f"DCGM_FI_PROF_NVLINK_TX_BYTES{labels} 1000000.000000\n"
            f"DCGM_FI_PROF_NVLINK_RX_BYTES{labels} 250000\n")
    up = {"now": True}

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body) if up["now"] else web.Response(status=500)

    url = await serve(aiohttp_server, handler)
    clock = Clock()
    source = DcgmExporterSource(config(url), clock)
    try:
        first = await collect(source)
        clock.now += 10
        second = await collect(source)
        up["now"] = False
        clock.now += 60
        during = await collect(source)
        up["now"] = True
        clock.now += 5
        after = await collect(source)
    finally:
        await source.close()
    assert first.value("gpufleet_gpu_nvlink_transmit_bytes_total") == 0
    assert second.value("gpufleet_gpu_nvlink_transmit_bytes_total") == 10 * 1_000_000
    assert second.value("gpufleet_gpu_nvlink_receive_bytes_total") == 10 * 250_000
    # during an outage the last counters are served stale; no traffic is invented for
    # the gap: the counters restart from 0 (a counter reset) when the target is back
    assert during.value("gpufleet_gpu_nvlink_transmit_bytes_total") == 10 * 1_000_000
    assert during.value("gpufleet_gpu_stale") == 1
    assert after.value("gpufleet_gpu_nvlink_transmit_bytes_total") == 0


# --- one bad target among three -----------------------------------------------------------

async def _truncating_server() -> tuple[asyncio.Server, str]:
    """Announces a 60,000-byte body, sends 300 bytes of a real sample, and hangs up."""
    body = sample(L4).encode()[:300]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: 60000\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/metrics"


GOOD_TARGET_DEADLINE = 2.0
SLOW_TARGET_SECONDS = 3 * GOOD_TARGET_DEADLINE


async def _bad_target(kind: str, aiohttp_server) -> tuple[str, asyncio.Server | None]:
    if kind == "refused":
        return f"http://127.0.0.1:{free_port()}/metrics", None
    if kind == "truncated":
        server, url = await _truncating_server()
        return url, server

    async def handler(request: web.Request) -> web.Response:
        if kind == "http500":
            return web.Response(status=500, text="internal error\n")
        if kind == "slow":  # a good body, but too late: only the per-target timeout fails it
            await asyncio.sleep(SLOW_TARGET_SECONDS)
            return web.Response(text=sample(A100_MIG))
        return web.Response(body=bytes(random.Random(1).getrandbits(8) for _ in range(4000))
                            + b"\nDCGM_FI_DEV_GPU_TEMP{gpu=\"0\" 12\n}}{{ nonsense 1 2 3\n")
    return await serve(aiohttp_server, handler), None


@pytest.mark.parametrize("kind", ["refused", "http500", "garbage", "truncated", "slow"])
async def test_one_bad_target_of_three_leaves_the_others(kind, aiohttp_server):
    good_h100 = await serve(aiohttp_server, text_handler(sample(H100)))
    good_l4 = await serve(aiohttp_server, text_handler(sample(L4)))
    bad, raw_server = await _bad_target(kind, aiohttp_server)
    # the deadline leaves the good targets room on a loaded CI machine (at 0.5 s all
    # three once timed out there); only the slow target, far beyond it, must miss it
    source = DcgmExporterSource(config(good_h100, bad, good_l4, timeout=GOOD_TARGET_DEADLINE),
                                Clock())
    try:
        out = await collect(source)
    finally:
        await source.close()
        if raw_server is not None:
            raw_server.close()
    assert out.value("gpufleet_source_up", source="dcgm", target=bad) == 0
    assert out.value("gpufleet_source_up", source="dcgm", target=good_h100) == 1
    assert out.value("gpufleet_source_up", source="dcgm", target=good_l4) == 1
    assert out.value("gpufleet_source_up", source="dcgm", target="") == 1  # the source works
    assert len(out.all("gpufleet_gpu_up", node="gpu-node-1")) == 8
    assert out.value("gpufleet_gpu_power_watts", node="i-030791dc5a37cd257") == 16.365
    assert len(out.all("gpufleet_gpu_up")) == 9
    if kind == "garbage":
        assert out.value("gpufleet_source_parse_errors_total", source="dcgm") > 0


async def test_parse_errors_are_a_cumulative_counter(aiohttp_server):
    good = sample(L4) + "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\" 12\nnot a metric line at all\n"
    url = await serve(aiohttp_server, text_handler(good))
    clock = Clock()
    source = DcgmExporterSource(config(url), clock)
    collector = Collector([source], timeout_seconds=10, clock=clock)
    try:
        counts = []
        for _ in range(3):
            out = Exported.of(await collector.collect())
            counts.append(out.value("gpufleet_source_parse_errors_total", source="dcgm"))
            clock.now += 5
    finally:
        await source.close()
    assert counts == [2, 4, 6]
    assert out.value("gpufleet_gpu_power_watts") == 16.365  # the good lines still count


async def test_a_target_that_goes_down_is_served_stale_then_dropped(aiohttp_server):
    state = {"up": True}

    async def handler(request: web.Request) -> web.Response:
        if state["up"]:
            return web.Response(text=sample(L4))
        return web.Response(status=503)

    url = await serve(aiohttp_server, handler)
    clock = Clock()
    source = DcgmExporterSource(config(url, stale_for=Duration(60)), clock)
    # one collector throughout: the last-success time is the collector's memory
    collector = Collector([source], timeout_seconds=10, clock=clock)
    try:
        fresh = Exported.of(await collector.collect())
        state["up"] = False
        clock.now += 30
        stale = Exported.of(await collector.collect())
        clock.now += 60
        gone = Exported.of(await collector.collect())
    finally:
        await source.close()
    assert fresh.value("gpufleet_gpu_stale") == 0
    assert stale.value("gpufleet_gpu_stale") == 1
    assert stale.value("gpufleet_gpu_power_watts") == 16.365
    assert stale.value("gpufleet_source_up", source="dcgm", target=url) == 0
    assert stale.value("gpufleet_last_collect_success_timestamp_seconds", source="dcgm",
                       target="") == clock.now - 90  # the fresh read's, not the down one's
    assert gone.absent("gpufleet_gpu_up")
    assert gone.value("gpufleet_source_up", source="dcgm", target=url) == 0


# --- targets ----------------------------------------------------------------------------

async def test_targets_file_is_reread_when_it_changes(aiohttp_server, tmp_path: Path):
    h100 = await serve(aiohttp_server, text_handler(sample(H100)))
    l4 = await serve(aiohttp_server, text_handler(sample(L4)))
    path = tmp_path / "dcgm-targets.json"
    path.write_text(json.dumps([{"targets": [h100.removeprefix("http://").removesuffix("/metrics")],
                                 "labels": {"pool": "gpu-h100"}}]))
    source = DcgmExporterSource(
        DcgmConfig(enabled=True, targets_file=str(path), pool="default"), Clock())
    try:
        first = await collect(source)
        path.write_text(f"- targets: ['{h100}']\n  labels: {{pool: gpu-h100}}\n"
                        f"- targets: ['{l4}']\n")
        os.utime(path, ns=(1, 1))  # a different mtime, whatever the clock's resolution
        second = await collect(source)
        path.write_text("{not: [valid")  # a broken file keeps the last good list
        third = await collect(source)
    finally:
        await source.close()
    assert {labels["pool"] for labels, _ in first.all("gpufleet_gpu_up")} == {"gpu-h100"}
    assert len(first.all("gpufleet_gpu_up")) == 8
    assert len(second.all("gpufleet_gpu_up")) == 9
    assert second.value("gpufleet_gpu_up", node="i-030791dc5a37cd257", pool="default") == 1
    assert len(third.all("gpufleet_gpu_up")) == 9


async def test_a_targets_file_listing_no_target_is_no_data_and_serves_nothing(aiohttp_server,
                                                                              tmp_path: Path):
    """An empty file_sd is nothing to scrape (NoData), not a failure, and what its old
    targets read is dropped at once rather than served stale for stale_for."""
    l4 = await serve(aiohttp_server, text_handler(sample(L4)))
    path = tmp_path / "dcgm-targets.yaml"
    path.write_text("[]\n")
    source = DcgmExporterSource(DcgmConfig(enabled=True, targets_file=str(path)), Clock())
    collector = Collector([source], timeout_seconds=10, clock=source.clock)
    try:
        empty = await collector.collect()
        path.write_text(f"- targets: ['{l4}']\n")
        os.utime(path, ns=(1, 1))
        one = await collector.collect()
        path.write_text("[]\n")
        os.utime(path, ns=(2, 2))
        emptied = await collector.collect()
    finally:
        await source.close()
    for snapshot in (empty, emptied):
        (status,) = snapshot.sources
        assert not status.up and status.error.startswith("no data: ")
        assert "lists no target" in status.error
        assert snapshot.gpus == ()
    assert len(one.gpus) == 1 and one.sources[0].up
    assert emptied.sources[0].last_success_time == one.sources[0].last_success_time

def test_target_forms():
    assert target_from("gpu-node-1:9400", "p") == Target(
        "http://gpu-node-1:9400/metrics", "p", "gpu-node-1")
    assert target_from("https://n2:9400/custom", "").url == "https://n2:9400/custom"
    for bad in ["", "ftp://x/metrics", "host:notaport"]:
        with pytest.raises(ValueError):
            target_from(bad, "")


def test_build_needs_targets():
    with pytest.raises(SourceStartupError, match="no targets"):
        build(DcgmConfig(enabled=True), Clock())
    with pytest.raises(SourceStartupError, match="host:notaport"):
        build(DcgmConfig(enabled=True, targets=("host:notaport",)), Clock())


# --- fuzzing the parser with mutated real bodies ------------------------------------------

REAL_BODIES = [sample(name) for name in (L4, H100, A100_MIG)]


@st.composite
def mutated_bodies(draw) -> str:
    body = draw(st.sampled_from(REAL_BODIES))
    for _ in range(draw(st.integers(0, 8))):
        if not body:
            break
        at = draw(st.integers(0, len(body) - 1))
        op = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "duplicate"]))
        if op == "delete":
            body = body[:at] + body[at + draw(st.integers(1, 40)):]
        elif op == "insert":
            body = body[:at] + draw(st.text(max_size=20)) + body[at:]
        elif op == "replace":
            body = body[:at] + draw(st.sampled_from(list('{}",=\\\n #e.-+\x00\r'))) + body[at + 1:]
        elif op == "truncate":
            body = body[:at]
        else:
            body = body[:at] + body[at:at + 200] + body[at:]
    return body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_bodies())
def test_parser_never_raises_on_mutated_bodies(body: str):
    parsed = parse_text(body)
    lines = [ln for ln in body.split("\n") if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(parsed.samples) + parsed.errors == len(lines)
    for name, labels, value in parsed.samples:
        assert isinstance(name, str) and isinstance(labels, dict) and isinstance(value, float)
    # nor does mapping what came through
    _fleet, errors = parse_body(body.encode("utf-8", errors="surrogatepass"),
                               Target("u", "", "host"), catalogue_resolver())
    assert errors >= parsed.errors


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_parser_never_raises_on_arbitrary_bytes(raw: bytes):
    _fleet, errors = parse_body(raw, Target("u", "", "host"), catalogue_resolver())
    assert errors >= 0


def test_config_sections_for_the_gpu_sources(tmp_path: Path):
    from exporter.config import ConfigError, load

    path = tmp_path / "gpufleet.yaml"
    path.write_text("sources:\n  dcgm:\n    enabled: true\n    targets: [n1:9400, n2:9400]\n"
                    "    targets_file: /etc/t.json\n    timeout: 500ms\n"
                    "  nvml:\n    call_timeout: 1s\n    pool: gpu-h100\n")
    loaded = load(path)
    assert loaded.sources.dcgm.targets == ("n1:9400", "n2:9400")
    assert loaded.sources.dcgm.timeout == 0.5
    assert loaded.sources.dcgm.stale_for == 300
    assert (loaded.sources.nvml.enabled, loaded.sources.nvml.call_timeout) == (False, 1.0)
    path.write_text("sources:\n  dcgm:\n    timeout: 0s\n")
    with pytest.raises(ConfigError, match=r"sources\.dcgm\.timeout: must be > 0"):
        load(path)
    path.write_text("sources:\n  dcgm:\n    target: [n1:9400]\n")
    with pytest.raises(ConfigError, match=r"sources\.dcgm\.target: unknown key"):
        load(path)
