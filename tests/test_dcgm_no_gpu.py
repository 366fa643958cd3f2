"""No blind green (issue 30): a dcgm target that answers with no GPU is down, with the
reason in its target status, the source's status and the log; with no other target, the
source is down (``gpufleet_source_up 0``)."""

from __future__ import annotations

import logging

from exporter.collect import Collector
from exporter.sources.dcgm.source import DcgmExporterSource
from tests.helpers.exported import Exported
from tests.test_dcgm import L4, Clock, config, sample, serve, text_handler

NOT_DCGM = "# TYPE go_goroutines gauge\ngo_goroutines 8\n"  # some other exporter on the port


async def test_a_target_with_no_gpu_is_a_down_source(aiohttp_server, caplog):
    url = await serve(aiohttp_server, text_handler(NOT_DCGM))
    source = DcgmExporterSource(config(url), Clock())
    try:
        with caplog.at_level(logging.WARNING):
            snapshot = await Collector([source], timeout_seconds=10, clock=source.clock).collect()
    finally:
        await source.close()
    target_reason = "no DCGM GPU samples in the body (0 lines skipped)"
    status, *targets = snapshot.sources  # the source's, then one per target
    assert (status.up, status.error) == (False, f"no target served a GPU: {url}: {target_reason}")
    assert [(t.target, t.up, t.error) for t in targets] == [(url, False, target_reason)]
    up = Exported.of(snapshot).all("gpufleet_source_up", source="dcgm")
    assert sorted(up, key=lambda e: len(e[0])) == [({"source": "dcgm"}, 0.0),
                                                   ({"source": "dcgm", "target": url}, 0.0)]
    assert [(r.target, r.err) for r in caplog.records if r.getMessage() == "dcgm target down"] == \
        [(url, target_reason)]


async def test_beside_a_good_target_only_the_empty_one_is_down(aiohttp_server):
    empty = await serve(aiohttp_server, text_handler(NOT_DCGM))
    good = await serve(aiohttp_server, text_handler(sample(L4)))
    source = DcgmExporterSource(config(empty, good), Clock())
    try:
        snapshot = await Collector([source], timeout_seconds=10, clock=source.clock).collect()
    finally:
        await source.close()
    status, *targets = snapshot.sources
    assert (status.up, status.error) == (True, "")
    assert [(t.target, t.up) for t in targets] == [(empty, False), (good, True)]
    assert snapshot.gpus

