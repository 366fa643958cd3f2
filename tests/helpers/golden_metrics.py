"""The golden exposition: the default simulated fleet's /metrics at a fixed seed and clock.

As node_exporter's ``end-to-end-test.sh`` and ``e2e-output.txt``: the bytes the
default ``gpufleet serve`` renders after one collection, wired exactly as
``serve`` wires it (sources, analyzer, advisor), with the wall clock fixed at
``CLOCK`` and every duration read as 0. A change to the exposition shows as a
diff of ``tests/golden/metrics.txt`` in review.

    python -m tests.helpers.golden_metrics            # print the exposition
    python -m tests.helpers.golden_metrics --update   # rewrite tests/golden/metrics.txt (make generate)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
from pathlib import Path

from exporter.cli.serve import assemble, enabled_sources
from exporter.config import Config, load
from exporter.exposition import LabelCache
from exporter.web.server import collect_and_render

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "metrics.txt"
CLOCK = 1_760_000_000.0  # 2025-10-09T08:53:20Z


def render_golden() -> bytes:
    """The default config's /metrics after one collection, at ``CLOCK``."""
    config = load(None)
    with tempfile.TemporaryDirectory() as folder:
        # the advisor's outbox is a file: keep it out of the checkout
        advisor = dataclasses.replace(config.advisor, outbox=str(Path(folder) / "outbox.sqlite"))
        config = dataclasses.replace(config, advisor=advisor)
        return asyncio.run(_collect_once(config))


async def _collect_once(config: Config) -> bytes:
    collector, state, advisor = assemble(config, enabled_sources(config), clock=lambda: CLOCK,
                                         timer=lambda: 0.0)
    try:
        rendered = await collect_and_render(collector, state, LabelCache(), config.gzip_level)
    finally:
        await collector.close()
        if advisor is not None:
            advisor.deliverer.store.close()
    return rendered.text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"rewrite {GOLDEN.name}")
    args = parser.parse_args(argv)
    text = render_golden()
    if args.update:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_bytes(text)
        lines = text.count(b"\n")
        print(f"wrote {GOLDEN} ({lines} lines)")
    else:
        sys.stdout.buffer.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
