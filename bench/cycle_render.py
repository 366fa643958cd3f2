"""One collection of the default ``serve`` wiring at a simulated scale, in this checkout and in
another (``--before``), alternately, each in its own interpreter: the CPU seconds of a whole
collection (sources, the cycle or the listeners, rendering) and of rendering alone.

    git worktree add /tmp/before baa80dc
    .venv/bin/python bench/cycle_render.py --before /tmp/before --scale 100 --rounds 3

Separate interpreters, so each side imports its own ``exporter``; the order alternates each
round. Prints each side's median beside the other's and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent('''
    import asyncio, dataclasses, json, sys, tempfile, time
    from pathlib import Path
    from exporter.cli.serve import assemble
    from exporter.config import load
    from exporter.exposition import LabelCache
    from exporter.web.server import collect_and_render

    scale, collections = int(sys.argv[1]), int(sys.argv[2])
    config = load(None)
    folder = tempfile.mkdtemp()
    config = dataclasses.replace(
        config, advisor=dataclasses.replace(config.advisor, outbox=str(Path(folder) / "o.sqlite")),
        sources=dataclasses.replace(config.sources, sim=dataclasses.replace(config.sources.sim, scale=scale)))
    collector, state, advisor = assemble(config, ["sim"])

    async def main():
        labels, out = LabelCache(), []
        for _ in range(collections):
            cpu = time.process_time()
            rendered = await collect_and_render(collector, state, labels, 1)
            out.append({"cpu_s": time.process_time() - cpu, "render_s": rendered.render_seconds,
                        "series": rendered.series})
        await collector.close()
        return out

    print(json.dumps(asyncio.run(main())))
''')


def run(checkout: Path, scale: int, collections: int) -> list[dict[str, float]]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(scale), str(collections)], cwd=checkout,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--after", type=Path, default=REPO, help="this checkout, by default")
    parser.add_argument("--scale", type=int, default=100, help="sources.sim.scale (100: 108,800 GPUs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--collections", type=int, default=3, help="per process; the first is dropped")
    args = parser.parse_args()
    sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = [("before", args.before), ("after", args.after)]
        for name, checkout in order if r % 2 == 0 else order[::-1]:
            sides[name] += run(checkout, args.scale, args.collections)[1:]
    series = {name: {s["series"] for s in runs} for name, runs in sides.items()}
    print(f"scale {args.scale}: series {series}")
    for key in ("cpu_s", "render_s"):
        before = statistics.median(s[key] for s in sides["before"])
        after = statistics.median(s[key] for s in sides["after"])
        print(f"  {key:9} before {before:8.3f}  after {after:8.3f}  after/before {after / before:.3f}"
              f"  (n={len(sides['after'])} each; after: "
              f"{', '.join(f'{s[key]:.2f}' for s in sides['after'])}; before: "
              f"{', '.join(f'{s[key]:.2f}' for s in sides['before'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
