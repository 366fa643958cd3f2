"""Issue 27: this checkout's renderer (the package ``exporter/exposition/``) against another
checkout's, both in one interpreter, on the same simulated snapshots.

On the shared 2-core machine a render's wall time swings 2x from one run to the next, and
separate interpreters (``bench/scrape.py --against``) cannot tell 5% apart. Here the old
renderer's module (``exporter/exposition.py`` of ``--before``, e.g. a detached worktree of
53aa07c) is loaded beside the package under another name; each snapshot is rendered by
both, each with its own ``LabelCache``, their order swapped every snapshot, the gzip bodies
compared equal, and the CPU time (``time.process_time``) of each steady render is kept.

    .venv/bin/python bench/render_ab.py --before /tmp/render-before --scale 100 --snapshots 6
    .venv/bin/python bench/render_ab.py --before /tmp/render-before --scale 100 --no-health
    .venv/bin/python bench/render_ab.py --before /tmp/render-before --scale 100 --profile after

``--profile before|after`` runs cProfile around that side's steady renders instead and
prints the top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def load_before(checkout: Path) -> ModuleType:
    """The old single-file renderer, importing this checkout's catalogue and snapshot."""
    path = checkout / "exporter" / "exposition.py"
    if not path.is_file():
        sys.exit(f"--before: no {path} (a checkout of the renderer before the split, e.g. 53aa07c)")
    spec = importlib.util.spec_from_file_location("exposition_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout with exporter/exposition.py")
    parser.add_argument("--scale", type=int, default=100, help="SimSource scale (100: 108,800 GPUs)")
    parser.add_argument("--snapshots", type=int, default=6, help="steady snapshots rendered by both")
    parser.add_argument("--no-health", action="store_true", help="the simulator without health values")
    parser.add_argument("--profile", choices=("before", "after"),
                        help="profile that side's steady renders (cProfile) instead of timing both")
    args = parser.parse_args()

    from exporter import exposition as after
    from exporter.fleet_sim.fleet import Simulation
    from exporter.sources.sim.options import SimSource

    before = load_before(args.before.resolve())
    sides = {"before": (before, before.LabelCache()), "after": (after, after.LabelCache())}
    start = 1_760_000_000.0
    sim = Simulation(SimSource(scale=args.scale, health=not args.no_health), start_time=start)
    sim.advance(start + 5)
    snapshot = sim.snapshot()
    for module, cache in sides.values():  # the first render: every block made
        module.render(snapshot, cache)
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    profile = cProfile.Profile() if args.profile else None
    series = 0
    for step in range(args.snapshots):
        sim.advance(start + 10 + 5 * step)
        snapshot = sim.snapshot()
        order = ("before", "after") if step % 2 == 0 else ("after", "before")
        bodies = {}
        for side in order:
            module, cache = sides[side]
            profiling = profile is not None and side == args.profile
            if profiling:
                profile.enable()  # type: ignore[union-attr]
            started = time.process_time()
            rendered = module.render(snapshot, cache)
            cpu[side].append(time.process_time() - started)
            if profiling:
                profile.disable()  # type: ignore[union-attr]
            bodies[side] = rendered.gzipped
            series = rendered.series
        if after.gunzip(bodies["before"]) != after.gunzip(bodies["after"]):
            sys.exit(f"snapshot {step}: the two renderers' bodies differ")
        print(f"snapshot {step + 1}/{args.snapshots} ({'/'.join(order)}): "
              f"before {cpu['before'][-1]:.3f} s, after {cpu['after'][-1]:.3f} s CPU", flush=True)
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    b, a = statistics.median(cpu["before"]), statistics.median(cpu["after"])
    print(f"\n{len(snapshot.gpus):,} GPUs, {series:,} series, health {'off' if args.no_health else 'on'}, "
          f"{args.snapshots} snapshots, bodies equal")
    print("| | before | after | after / before |")
    print("|---|---:|---:|---:|")
    print(f"| CPU per steady render, median | {b:.3f} s | {a:.3f} s | {a / b:.2f}x |")
    print(f"| CPU per steady render, min | {min(cpu['before']):.3f} s | {min(cpu['after']):.3f} s | "
          f"{min(cpu['after']) / min(cpu['before']):.2f}x |")
    print(f"| CPU, sum of all | {sum(cpu['before']):.3f} s | {sum(cpu['after']):.3f} s | "
          f"{sum(cpu['after']) / sum(cpu['before']):.2f}x |")
    # each snapshot's pair, rendered back to back: the least exposed to the load changing
    ratios = [a / b for a, b in zip(cpu["after"], cpu["before"], strict=True)]
    print(f"| after / before of each snapshot, median (min-max) | | | {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
