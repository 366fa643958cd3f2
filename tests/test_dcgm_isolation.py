"""Hostile dcgm targets (issue 14, defects 3 and 5): one target never breaks the others.

Each target has a deadline covering its fetch and its parse, and caps on bytes, lines and
GPUs; a target over one is down with the reason, the others are served in every
collection, and the source's read ends within the collector's timeout. Targets are
deduplicated by resolved address, and a target's userinfo is used for the request only,
never shown.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
from functools import cache

import pytest
from aiohttp import web

from exporter.collect import Collector
from exporter.config import Duration
from exporter.snapshot import to_json
from exporter.sources.dcgm.options import DcgmSource as DcgmConfig
from exporter.sources.dcgm.source import DcgmExporterSource, target_from
from tests.helpers import data_dir, free_port
from tests.helpers.exported import Exported

# run alone, after the rest (make test): a 3 s source deadline against hostile targets
pytestmark = pytest.mark.alone

L4 = (data_dir() / "dcgm-samples" / "l4-1gpu-default-counters.prom").read_text()
L4_NODE = "i-030791dc5a37cd257"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@cache
def many_lines(count: int) -> bytes:
    """``count`` valid DCGM lines of one GPU: ~45 MB for 1 M, under the old 64 MiB cap."""
    line = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-many",Hostname="flood"} 30\n'
    return (line * count).encode()


@cache
def many_gpus(count: int) -> bytes:
    """A valid body that claims ``count`` GPUs, one line each: distinct UUIDs, indices within
    NVML's 0-63 (an index beyond it is no GPU: the sample is skipped before any cap)."""
    return "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i % 64}",UUID="GPU-{i}",Hostname="claims"}} 30\n'
                   for i in range(count)).encode()


async def serve(aiohttp_server, handler, host: str = "127.0.0.1") -> tuple[str, int]:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    server = await aiohttp_server(app, host=host)
    return f"http://{host}:{server.port}/metrics", server.port


def body_handler(body: bytes):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")
    return handler


def stream_handler(body: bytes):
    """Streams ``body`` chunked, without a Content-Length, until the client hangs up."""
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        try:
            for at in range(0, len(body), 64 * 1024):
                await response.write(body[at:at + 64 * 1024])
        except (ConnectionError, RuntimeError):  # the client stopped reading: as it should
            return response
        await response.write_eof()
        return response
    return handler


async def hang(request: web.Request) -> web.Response:
    await asyncio.sleep(30)
    return web.Response(text=L4)


async def trickle(request: web.Request) -> web.StreamResponse:
    """One byte a second of a real body."""
    response = web.StreamResponse()
    await response.prepare(request)
    for byte in L4.encode()[:60]:
        await response.write(bytes([byte]))
        await asyncio.sleep(1)
    return response


async def garbage(request: web.Request) -> web.Response:
    return web.Response(body=random.Random(7).randbytes(2 * 1024 * 1024))


def config(*targets: str, **kwargs) -> DcgmConfig:
    return DcgmConfig(enabled=True, targets=tuple(targets),
                      timeout=Duration(kwargs.pop("timeout", 3.0)), **kwargs)


def good_served(out: Exported, good: str) -> bool:
    return (out.all("gpufleet_source_up", source="dcgm", target=good) == [
                ({"source": "dcgm", "target": good}, 1.0)]
            and out.all("gpufleet_gpu_up", node=L4_NODE) != []
            and out.value("gpufleet_gpu_stale", node=L4_NODE) == 0)


async def good_beside(aiohttp_server, hostile) -> tuple[str, str, Exported, dict]:
    """One collection of the good L4 target beside one ``hostile`` handler: the good target's
    URL, the hostile one's, what was exported, and each target's status."""
    good, _ = await serve(aiohttp_server, body_handler(L4.encode()))
    bad, _ = await serve(aiohttp_server, hostile)
    # a cap must stop the hostile target, not the deadline: 200,000 lines took over 3 s to
    # reach at load 12; the deadline stays under the collector's timeout
    source = DcgmExporterSource(config(good, bad, timeout=8.0), Clock())
    collector = Collector([source], timeout_seconds=10, clock=source.clock)
    try:
        snapshot = await collector.collect()
    finally:
        await source.close()
    out = Exported.of(snapshot)
    # the read ended within the collector's timeout: the source itself is up
    assert out.value("gpufleet_source_up", source="dcgm", target="") == 1
    return good, bad, out, {s.target: s for s in snapshot.sources}


async def test_a_target_streaming_lines_past_the_line_cap_is_down_and_the_good_one_served(
        aiohttp_server):
    good, flood, out, status = await good_beside(aiohttp_server,
                                                 stream_handler(many_lines(1_000_000)))
    assert not status[flood].up
    assert "200000 lines" in status[flood].error
    assert out.absent("gpufleet_gpu_up", node="flood")
    assert good_served(out, good)


async def test_a_target_claiming_300k_gpus_is_down_and_the_good_one_served(aiohttp_server):
    good, claims, out, status = await good_beside(aiohttp_server, stream_handler(many_gpus(300_000)))
    assert not status[claims].up
    assert "too many GPUs" in status[claims].error
    assert out.absent("gpufleet_gpu_up", node="claims")
    assert good_served(out, good)
    assert len(out.all("gpufleet_gpu_up")) == 1


async def test_nine_hostile_targets_leave_the_good_one_served_in_every_collection(
        aiohttp_server):
    good, _ = await serve(aiohttp_server, body_handler(L4.encode()))
    bad = [
        (await serve(aiohttp_server, hang))[0],
        (await serve(aiohttp_server, hang))[0],
        (await serve(aiohttp_server, trickle))[0],
        (await serve(aiohttp_server, trickle))[0],
        (await serve(aiohttp_server, stream_handler(many_lines(1_000_000))))[0],
        (await serve(aiohttp_server, stream_handler(many_lines(1_000_000))))[0],
        (await serve(aiohttp_server, body_handler(many_lines(1_000_000))))[0],
        (await serve(aiohttp_server, stream_handler(many_gpus(300_000))))[0],
        (await serve(aiohttp_server, garbage))[0],
    ]
    clock = Clock()
    source = DcgmExporterSource(config(*bad[:5], good, *bad[5:], timeout=2.0), clock)
    collector = Collector([source], timeout_seconds=6, clock=clock)
    served = []
    try:
        for _ in range(3):
            out = Exported.of(await collector.collect())
            served.append(good_served(out, good)
                          and out.value("gpufleet_source_up", source="dcgm", target="") == 1
                          and all(out.value("gpufleet_source_up", source="dcgm", target=url) == 0
                                  for url in bad))
            clock.now += 5
    finally:
        await source.close()
    assert served == [True, True, True]


async def test_one_endpoint_listed_by_address_and_by_name_is_one_target(aiohttp_server, caplog):
    requests = []

    async def handler(request: web.Request) -> web.Response:
        requests.append(request.host)
        return web.Response(text=L4)

    by_ip, port = await serve(aiohttp_server, handler)
    by_name = f"http://localhost:{port}/metrics"
    source = DcgmExporterSource(config(by_ip, by_name), Clock())
    collector = Collector([source], timeout_seconds=10, clock=source.clock)
    caplog.set_level(logging.INFO, logger="exporter.sources.dcgm.source")
    try:
        first = Exported.of(await collector.collect())
        second = Exported.of(await collector.collect())
    finally:
        await source.close()
    for out in (first, second):
        assert len(out.all("gpufleet_gpu_up")) == 1
        assert [labels["target"] for labels, _ in out.all("gpufleet_source_up", source="dcgm")
                if "target" in labels] == [by_ip]
    assert len(requests) == 2  # one scrape per collection
    merged = [r for r in caplog.records if "merged" in r.getMessage()]
    assert len(merged) == 1, "merging is logged once, not every collection"
    assert by_name in str(merged[0].__dict__) and by_ip in str(merged[0].__dict__)


async def test_userinfo_is_used_for_the_request_and_shown_nowhere(aiohttp_server, caplog):
    seen = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.Response(text=L4)

    url, port = await serve(aiohttp_server, handler)
    with_secret = f"http://gpufleet:secret@127.0.0.1:{port}/metrics"
    down = f"http://gpufleet:secret@127.0.0.1:{free_port()}/metrics"
    caplog.set_level(logging.DEBUG)
    source = DcgmExporterSource(config(with_secret, down), Clock())
    collector = Collector([source], timeout_seconds=10, clock=source.clock)
    try:
        snapshot = await collector.collect()
    finally:
        await source.close()
    assert seen == ["Basic " + base64.b64encode(b"gpufleet:secret").decode()]
    out = Exported.of(snapshot)
    assert out.value("gpufleet_source_up", source="dcgm", target=url) == 1
    assert out.value("gpufleet_source_up", source="dcgm",
                     target=down.replace("gpufleet:secret@", "")) == 0
    assert out.value("gpufleet_gpu_up", node=L4_NODE) == 1
    assert "secret" not in out.text
    assert "secret" not in json.dumps(to_json(snapshot))
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "dcgm target down" in logged  # the down target was logged, by its clean URL
    assert "secret" not in logged
    assert "secret" not in repr(target_from(with_secret, ""))


def test_a_rejected_target_is_named_without_its_password():
    for text in ("http://gpufleet:secret@host:notaport/metrics", "gpufleet:secret@host:x",
                 "ftp://gpufleet:secret@host/metrics"):
        with pytest.raises(ValueError) as caught:
            target_from(text, "")
        assert "secret" not in str(caught.value)
        assert "host" in str(caught.value)


def test_mig_instances_and_pods_per_gpu_are_capped_only_for_a_scraped_body():
    from exporter.sources.dcgm.fields import OverCap, build_fleet
    from exporter.sources.dcgm.source import BodyParser, Target
    from exporter.sources.gpu_models import catalogue_resolver

    gpu = 'gpu="0",UUID="GPU-m",Hostname="n1"'
    mig = "".join(f'DCGM_FI_DEV_FB_USED{{{gpu},GPU_I_ID="{i}",GPU_I_PROFILE="1g.10gb"}} 1\n'
                  for i in range(8))
    pods = "".join(f'DCGM_FI_DEV_GPU_UTIL{{{gpu},pod="p{i}",namespace="ns"}} 1\n'
                   for i in range(129))
    for body, reason in ((mig, "MIG instances"), (pods, "pods")):
        capped = BodyParser(Target("u", "", "n1"), catalogue_resolver(), max_gpus=64)
        with pytest.raises(OverCap, match=f"too many {reason}"):
            capped.feed(body.encode())
        # one GPU's worth less one passes; a Prometheus server's view (no cap) is not capped
        fits = BodyParser(Target("u", "", "n1"), catalogue_resolver(), max_gpus=64)
        fits.feed("\n".join(body.splitlines()[:-1]).encode())
        assert len(fits.finish()[0].gpus) == 1
        from exporter.sources.dcgm.exposition_parser import parse_text
        assert len(build_fleet(parse_text(body).samples).gpus) == 1


async def test_a_body_over_the_byte_cap_or_with_an_endless_line_is_down(aiohttp_server):
    good, _ = await serve(aiohttp_server, body_handler(L4.encode()))
    announced, _ = await serve(aiohttp_server, body_handler(b"x" * 20_000))
    streamed, _ = await serve(aiohttp_server, stream_handler(L4.encode() * 3))
    endless_line, _ = await serve(aiohttp_server, stream_handler(b"DCGM_" + b"x" * 400_000))
    source = DcgmExporterSource(config(good, announced, streamed, endless_line,
                                       max_body_bytes=10 * 1024), Clock())
    try:
        snapshot = await Collector([source], timeout_seconds=10, clock=source.clock).collect()
    finally:
        await source.close()
    errors = {s.target: s.error for s in snapshot.sources if s.target}
    assert errors[good] == ""
    assert errors[announced] == errors[streamed] == "over a cap: body over 10 KiB"
    source = DcgmExporterSource(config(endless_line), Clock())
    try:
        snapshot = await Collector([source], timeout_seconds=10, clock=source.clock).collect()
    finally:
        await source.close()
    assert snapshot.sources[1].error == "over a cap: a line over 64 KiB"


@pytest.mark.parametrize("body", ["h100", "l4"])
async def test_one_node_reached_by_two_addresses_counts_its_gpus_once(aiohttp_server, body):
    """Issue 32, finding 15: one dcgm-exporter reached by a host name and by an IP the
    resolver does not tie together (here: two ports) was two targets, an 8-GPU node 16."""
    text = (data_dir() / "dcgm-samples" / "h100-8gpu-k8s-pod-labels.prom").read_text() \
        if body == "h100" else L4

    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text)

    first, _ = await serve(aiohttp_server, handler)
    _, port = await serve(aiohttp_server, handler)
    second = f"http://localhost:{port}/metrics"
    source = DcgmExporterSource(config(first, second), Clock())
    collector = Collector([source], timeout_seconds=10, clock=source.clock)
    try:
        out = Exported.of(await collector.collect())
        snapshot = await collector.collect()
    finally:
        await source.close()
    gpus = 8 if body == "h100" else 1
    assert len(out.all("gpufleet_gpu_up")) == gpus
    assert len({g.uuid for g in snapshot.gpus}) == len(snapshot.gpus) == gpus
    assert len(snapshot.nodes) == 1
    assert out.value("gpufleet_source_up", source="dcgm", target=first) == 1
    assert out.value("gpufleet_source_up", source="dcgm", target=second) == 1
    held = [(p.node, i) for a in snapshot.allocations for p in a.placements for i in p.gpus]
    assert len(held) == len(set(held))  # no GPU held twice by the same pod's copies
