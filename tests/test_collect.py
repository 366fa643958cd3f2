"""exporter/collect.py: the SourceStatus the collector builds from each read."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from exporter.collect import Collector
from exporter.config import Duration
from exporter.sources import SourceReading, TargetStatus
from exporter.sources.dcgm.options import DcgmSource as DcgmConfig
from exporter.sources.dcgm.source import DcgmExporterSource
from tests.helpers import data_dir
from tests.helpers.exported import Exported

L4 = (data_dir() / "dcgm-samples" / "l4-1gpu-default-counters.prom").read_text()


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Answering:
    """A source that always answers, with ``error`` set while ``down``."""

    name = "fake"

    def __init__(self) -> None:
        self.down = False

    async def read(self) -> SourceReading:
        if self.down:
            return SourceReading(targets=(TargetStatus("t1", up=False, error="refused"),),
                                 error="every target is down")
        return SourceReading(targets=(TargetStatus("t1", up=True),))

    async def close(self) -> None:
        pass


async def test_an_answer_with_error_is_down_and_not_a_success():
    source, clock = Answering(), Clock()
    collector = Collector([source], timeout_seconds=5, clock=clock)
    good = await collector.collect()
    source.down = True
    clock.now += 5
    first_down = await collector.collect()
    clock.now += 5
    second_down = await collector.collect()
    assert good.sources[0].up and good.sources[0].last_success_time == 1_700_000_000.0
    for snapshot in (first_down, second_down):
        status = snapshot.sources[0]
        assert not status.up and status.error == "every target is down"
        assert status.last_success_time == 1_700_000_000.0


async def test_dcgm_with_every_target_down_keeps_its_last_success_time(aiohttp_server):
    """issue 15: gpufleet_last_collect_success_timestamp_seconds{source="dcgm"} kept
    advancing while gpufleet_source_up{source="dcgm"} was 0."""
    state = {"up": True}

    async def handler(request: web.Request) -> web.Response:
        if state["up"]:
            return web.Response(text=L4)
        return web.Response(status=503)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    server = await aiohttp_server(app)
    url = f"http://127.0.0.1:{server.port}/metrics"
    clock = Clock()
    source = DcgmExporterSource(
        DcgmConfig(enabled=True, targets=(url,), timeout=Duration(2.0),
                   stale_for=Duration(60)), clock)
    collector = Collector([source], timeout_seconds=10, clock=clock)
    try:
        await collector.collect()
        state["up"] = False
        seen = []
        for _ in range(2):
            clock.now += 5
            out = Exported.of(await collector.collect())
            assert out.value("gpufleet_source_up", source="dcgm", target="") == 0
            seen.append(out.value("gpufleet_last_collect_success_timestamp_seconds",
                                  source="dcgm", target=""))
    finally:
        await source.close()
    assert seen == [1_700_000_000.0, 1_700_000_000.0]


class Swallowing:
    """A read that ignores cancellation until released: a child that will not die, a
    cleanup that waits on a pipe (issue 32, finding 1)."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.reads = 0

    async def read(self) -> SourceReading:
        self.reads += 1
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                continue  # swallowed
        return SourceReading()

    async def close(self) -> None:
        pass


async def test_a_read_that_swallows_its_cancellation_cannot_hold_the_collection():
    stuck = Swallowing()
    collector = Collector([stuck, Answering()], timeout_seconds=0.2, clock=Clock())
    try:
        started = time.monotonic()
        done, _ = await asyncio.wait((asyncio.ensure_future(collector.collect()),), timeout=3)
        assert done, "the collection waited on the cancelled read"
        first = done.pop().result()
        second = await asyncio.wait_for(collector.collect(), 3)
        assert time.monotonic() - started < 2
        by_name = {s.source: s for s in first.sources}
        assert not by_name["stuck"].up and by_name["stuck"].error == "timed out after 0.2s"
        assert by_name["fake"].up
        # the stuck read still runs: the next round starts no second one, and says so
        assert stuck.reads == 1
        status = next(s for s in second.sources if s.source == "stuck")
        assert not status.up and "has not ended" in status.error
    finally:
        stuck.release.set()
    await asyncio.sleep(0.05)
    third = await collector.collect()
    assert stuck.reads == 2  # ended at last: read afresh
    assert next(s for s in third.sources if s.source == "stuck").up
