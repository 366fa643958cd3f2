"""No blind green (issue 30): an apiserver that lists no GPU node, after it listed some,
makes the kubernetes source down, with the reason in its status and log."""

from __future__ import annotations

import asyncio
import logging
import time

from exporter.collect import Collector
from tests.helpers.fake_apiserver import NODES, FakeApiserver, key_of, read_objects
from tests.test_kubernetes_source import RECORDED, TOKEN, apiserver, source_for  # noqa: F401


async def test_an_emptied_cluster_is_a_down_source(apiserver, source_for, caplog):  # noqa: F811
    source = source_for(apiserver)
    collector = Collector([source], 10, clock=time.time)
    first = await collector.collect()
    assert len(first.gpus) == 21 and [(s.up, s.error) for s in first.sources] == [(True, "")]
    for node in [o for o in read_objects(RECORDED) if o["kind"] == "Node"]:
        apiserver.delete(NODES, key_of(node))
    reason = "empty fleet: the apiserver lists no node with a GPU, after a read that listed 21 GPUs"
    with caplog.at_level(logging.WARNING):
        for _ in range(100):  # the watch delivers the deletions
            emptied = await collector.collect()
            if not emptied.sources[0].up:
                break
            await asyncio.sleep(0.05)
    [status] = emptied.sources
    assert (status.up, status.error, emptied.gpus) == (False, reason, ())
    assert [(r.source, r.err) for r in caplog.records
            if r.getMessage() == "source returned an empty fleet"] == [("kubernetes", reason)]


async def test_a_cluster_without_gpus_from_the_start_is_left_alone(source_for):  # noqa: F811
    fake = FakeApiserver(token=TOKEN)
    fake.load(o for o in read_objects(RECORDED) if o["kind"] == "Pod")
    await fake.start()
    try:
        snapshot = await Collector([source_for(fake)], 10, clock=time.time).collect()
        assert snapshot.gpus == () and [(s.up, s.error) for s in snapshot.sources] == [(True, "")]
    finally:
        await fake.kill()
