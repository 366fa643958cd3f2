"""Inline dcgm targets with a pool per group (issue 30, sources.dcgm.target_groups)."""

from __future__ import annotations

from exporter.collect import Collector
from tests.test_dcgm import A100_MIG, L4, Clock, sample, serve, text_handler


async def test_inline_target_groups_give_each_target_its_pool(aiohttp_server, tmp_path):
    """Issue 30: an L4 and an A100 listed inline land in their own pools."""
    from exporter.config import load
    from exporter.sources.dcgm.source import build

    l4 = await serve(aiohttp_server, text_handler(sample(L4)))
    a100 = await serve(aiohttp_server, text_handler(sample(A100_MIG)))
    path = tmp_path / "gpufleet.yaml"
    path.write_text(f"sources:\n  dcgm:\n    enabled: true\n    pool: gpu-other\n    target_groups:\n"
                    f"      - {{pool: gpu-l4, targets: ['{l4}']}}\n"
                    f"      - {{targets: ['{a100}']}}\n")
    source = build(load(path).sources.dcgm, Clock())
    try:
        snapshot = await Collector([source], timeout_seconds=10, clock=source.clock).collect()
    finally:
        await source.close()
    assert sorted((g.model, g.pool) for g in snapshot.gpus) == [("A100", "gpu-other"), ("L4", "gpu-l4")]
    assert sorted((n.model, n.pool) for n in snapshot.nodes) == [("A100", "gpu-other"), ("L4", "gpu-l4")]
