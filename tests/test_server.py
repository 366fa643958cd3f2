"""The aiohttp server in-process: cached bytes, gzip, health, and a loop that survives bad sources."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json

import pytest

from exporter.collect import Collector
from exporter.config import Config
from exporter.snapshot import from_json
from exporter.sources import NoData, SourceReading
from exporter.sources.sim.options import SimSource
from exporter.sources.sim.source import build as sim_source
from exporter.web.server import CONFIG, STATE, make_app, snapshot_bodies, stall_limit

START = 1_760_000_000.0


class BrokenSource:
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    async def read(self) -> SourceReading:
        self.calls += 1
        raise RuntimeError("upstream returned garbage")

    async def close(self) -> None:
        return None


class SlowSource:
    name = "slow"

    async def read(self) -> SourceReading:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        return None


def _app(*extra_sources, interval=0.05):
    sim = sim_source(SimSource(seed=1), lambda: START)
    config = Config(collect_interval=interval, source_timeout=0.5)
    collector = Collector([sim, *extra_sources], config.source_timeout, clock=lambda: START)
    return make_app(config, collector)


async def _wait_ready(client, timeout=10.0):
    for _ in range(int(timeout / 0.05)):
        resp = await client.get("/-/ready")
        if resp.status == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("never ready")


async def test_metrics_plain_and_gzip(aiohttp_client):
    # one collection only: the bodies below are compared with the served snapshot's, and the
    # duration gauge differs from one collection to the next
    client = await aiohttp_client(_app(interval=60))
    await _wait_ready(client)
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert plain.status == 200
    assert plain.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = await plain.read()
    assert text.count(b"\ngpufleet_gpu_utilization_ratio{") == 1088
    raw = await client.get("/metrics", headers={"Accept-Encoding": "gzip, deflate"},
                           auto_decompress=False)
    assert raw.headers["Content-Encoding"] == "gzip"
    body = await raw.read()
    assert gzip.decompress(body) == client.app[STATE].current.text
    assert len(body) < len(text) / 3


async def test_health_and_snapshot_json(aiohttp_client):
    # one collection only, so the JSON and the served snapshot are the same one
    client = await aiohttp_client(_app(interval=60))
    assert (await client.get("/-/healthy")).status == 200
    await _wait_ready(client)
    resp = await client.get("/v1/snapshot")
    assert resp.status == 200
    snapshot = from_json(json.loads(await resp.read()))
    assert snapshot == client.app[STATE].current.snapshot
    assert len(snapshot.gpus) == 1088


async def test_not_ready_before_first_snapshot(aiohttp_client):
    app = _app(SlowSource(), interval=60)
    client = await aiohttp_client(app)
    resp = await client.get("/-/ready")
    assert resp.status == 503
    assert (await client.get("/metrics")).status == 503
    assert (await client.get("/-/healthy")).status == 200


async def test_broken_source_never_stops_serving(aiohttp_client):
    broken = BrokenSource()
    client = await aiohttp_client(_app(broken))
    for _ in range(200):
        if broken.calls >= 3 and client.app[STATE].collections >= 1:
            break
        await asyncio.sleep(0.05)
    assert broken.calls >= 3  # the loop kept collecting after failures
    # a source that never read a GPU: its part of the fleet is unknown, so not ready
    ready = await client.get("/-/ready")
    assert ready.status == 503
    assert await ready.text() == ("gpufleet is not ready: source broken reads no GPU: "
                                  "RuntimeError: upstream returned garbage.\n")
    text = (await (await client.get("/metrics")).read()).decode()
    assert 'gpufleet_source_up{source="broken"} 0.0' in text
    assert 'gpufleet_source_up{source="sim"} 1.0' in text
    assert text.count("\ngpufleet_gpu_utilization_ratio{") == 1088


async def test_timed_out_source_is_down_and_others_served():
    sim = sim_source(SimSource(seed=1), lambda: START)
    collector = Collector([sim, SlowSource()], timeout_seconds=0.2, clock=lambda: START)
    snapshot = await collector.collect()
    status = {s.source: s for s in snapshot.sources}
    assert status["slow"].up is False and "timed out" in status["slow"].error
    assert status["sim"].up is True
    assert len(snapshot.gpus) == 1088


class Breakable:
    """The seed-2 simulated fleet (1,088 GPUs) until ``error`` is set; then each read raises it."""

    def __init__(self, name: str):
        self.name = name
        self.inner = sim_source(SimSource(seed=2), lambda: START)
        self.error: Exception | None = None

    async def read(self):
        if self.error is not None:
            raise self.error
        return await self.inner.read()

    async def close(self):
        return None


async def test_failed_source_serves_last_good_reading_marked_stale():
    flaky = Breakable("flaky")
    collector = Collector([flaky], timeout_seconds=1, clock=lambda: START)
    good = await collector.collect()
    assert not any(g.stale for g in good.gpus)
    flaky.error = ConnectionError("refused")
    stale = await collector.collect()
    assert [g.key for g in stale.gpus] == [g.key for g in good.gpus]
    assert all(g.stale for g in stale.gpus)
    assert stale.sources[0].up is False and stale.sources[0].last_success_time == START
    assert stale.allocations == good.allocations


async def test_no_data_is_not_an_exception():
    class Empty:
        name = "empty"

        async def read(self):
            raise NoData("no GPU on this host")

        async def close(self):
            return None

    snapshot = await Collector([Empty()], timeout_seconds=1).collect()
    assert snapshot.gpus == ()
    assert snapshot.sources[0].up is False and snapshot.sources[0].error.startswith("no data")


async def test_no_data_after_good_readings_serves_nothing_stale():
    """NoData means nothing is there any more: unlike a failure, no last good reading is served."""
    source = Breakable("emptied")
    collector = Collector([source], timeout_seconds=1, clock=lambda: START)
    assert len((await collector.collect()).gpus) == 1088
    source.error = NoData("the targets file lists no target")
    snapshot = await collector.collect()
    assert snapshot.gpus == () and snapshot.allocations == ()
    (status,) = snapshot.sources
    assert status.up is False and status.last_success_time == START


def test_snapshot_json_is_strict_json():
    # RFC 8259 has no NaN: a non-finite number is written as null, never as NaN
    sim = sim_source(SimSource(seed=1), lambda: START)
    snapshot = asyncio.run(Collector([sim], 10, clock=lambda: START).collect())
    gpu = dataclasses.replace(snapshot.gpus[0], temperature_celsius=float("nan"))
    node = dataclasses.replace(snapshot.nodes[0], cpu_cores=float("inf"))
    bad = dataclasses.replace(snapshot, gpus=(gpu, *snapshot.gpus[1:]),
                              nodes=(node, *snapshot.nodes[1:]))
    body, zipped = snapshot_bodies(bad, 5)
    data = json.loads(body, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert (data["gpus"][0]["temperature_celsius"], data["nodes"][0]["cpu_cores"]) == (None, None)
    assert data["gpus"][1]["uuid"] == snapshot.gpus[1].uuid
    assert gzip.decompress(zipped) == body


async def test_snapshot_encoded_once_per_snapshot_and_gzipped(aiohttp_client):
    client = await aiohttp_client(_app(interval=60))
    await _wait_ready(client)
    state = client.app[STATE]
    replies = await asyncio.gather(*(client.get("/v1/snapshot", auto_decompress=False,
                                                headers={"Accept-Encoding": "gzip"})
                                     for _ in range(5)))
    bodies = {await r.read() for r in replies}
    assert [(r.status, r.headers["Content-Encoding"]) for r in replies] == [(200, "gzip")] * 5
    assert len(bodies) == 1
    assert state.snapshot_body is not None and state.snapshot_body[0] is state.current
    job = state.snapshot_body[1]
    plain = await client.get("/v1/snapshot", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers
    assert gzip.decompress(bodies.pop()) == await plain.read()
    assert state.snapshot_body[1] is job  # the same encoding served every request


async def test_ready_turns_503_while_collection_stalls_and_200_once_it_recovers(aiohttp_client):
    # a collection that never ends (here a cycle stuck on a lock, as the advisor's was under
    # an alert flood): /metrics keeps serving the last bytes, so only /-/ready can say
    app = _app(interval=0.1)
    config = app[CONFIG]
    app[CONFIG] = dataclasses.replace(config, web=dataclasses.replace(config.web, stall_intervals=3))
    assert stall_limit(app[CONFIG]) == 0.6  # source_timeout 0.5 + one interval beats 3 x 0.1
    unstuck = asyncio.Event()
    unstuck.set()

    class Stuck:  # the cycle serve runs (web.server.Cycle), stuck until unstuck
        async def run(self, snapshot, blind=()):
            await unstuck.wait()
            return snapshot

        def families(self, frame):
            return []

    app[STATE].cycle = Stuck()
    client = await aiohttp_client(app)
    await _wait_ready(client)
    unstuck.clear()
    stuck_at = asyncio.get_running_loop().time()
    while True:
        resp = await client.get("/-/ready")
        if resp.status == 503:
            break
        assert resp.status == 200
        assert asyncio.get_running_loop().time() - stuck_at < 10, "never turned 503"
        await asyncio.sleep(0.05)
    assert asyncio.get_running_loop().time() - stuck_at >= 0.6 - 0.1  # not before the limit
    body = await resp.text()
    assert body.startswith("gpufleet is not ready: collection stalled: the last one finished ")
    assert "more than 0.6s (web.stall_intervals=3 x collect_interval=0.1s)" in body
    assert (await client.get("/-/healthy")).status == 200  # alive: a restart would not help
    assert (await client.get("/metrics")).status == 200  # the last snapshot still serves
    unstuck.set()
    await _wait_ready(client)
    assert (await client.get("/-/ready")).status == 200


def test_stall_limit_is_n_intervals_unless_a_timed_out_source_takes_longer():
    config = Config(collect_interval=5, source_timeout=10)
    assert config.web.stall_intervals == 3
    assert stall_limit(config) == 15.0
    assert stall_limit(dataclasses.replace(config, source_timeout=60)) == 65.0
