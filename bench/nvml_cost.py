"""The NVML source's cost per collection on the fake pynvml: calls per GPU and time per call.

No GPU needed: the source reads ``tests/helpers/fake_pynvml.py``'s GPUs, each an
H100 with every issue-16 value supported (ECC, remapped rows, 18 NVLink links,
GPM), through :class:`nvml_check.CountingNvml`, which counts and times every
``nvml*`` call. What it measures is gpufleet's own work per call (Python, the
worker threads, building the snapshot) plus the fake's, never the driver's:
``bench/nvml_check.py`` gives the real library's figures on a machine with GPUs.
The fake answers at once where NVML's nvmlDeviceGetPcieThroughput samples for
20 ms, so those two calls cost far more on real hardware.

    python bench/nvml_cost.py                      # 8 GPUs, 50 collections
    python bench/nvml_cost.py --gpus 8 --collections 200

Processes (issue 46), before and after in one run: ``--processes 48`` gives each fake GPU
48 processes (``--owners`` pods among them, each process's cgroup, log directories and
environment in a fake /proc under a temporary directory: tests/helpers/fake_proc.py) and
measures one node-mode cycle, collection then render of /metrics, on three sources over the
same fake NVML: ``processes`` off (today), on and read every cycle, and on and read every
``--processes-interval`` (the option's default), the clock moving ``--collect-interval``
(serve's 5 s) per cycle. The sides alternate, each with its own render cache. Every cycle
the processes' SM samples and memory change, and so do each GPU's utilisation, power, energy
and temperature, as on a busy node. CPU time (``time.process_time``: the workers' threads
included), mean per cycle, is the figure; wall beside it.

    python bench/nvml_cost.py --processes 48 --owners 48 --collections 144
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pynvml
from nvml_check import CountingNvml

from exporter.sources.nvml.options import NvmlSource as NvmlConfig
from exporter.sources.nvml.source import NvmlGpuSource
from tests.helpers.fake_pynvml import FakeGpu, FakeNvml

MAX_GPUS = 64
MAX_COLLECTIONS = 10_000
MAX_PROCESSES = 1_000


def fake_gpu(index: int) -> FakeGpu:
    """An H100 SXM with every issue-16 read supported, as on an HGX board."""
    return FakeGpu(
        uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd", utilization=80, memory_used=60 * 1024**3,
        nvlink_tx_kib=[1000] * 18, nvlink_rx_kib=[2000] * 18,
        nvlink_errors={pynvml.NVML_NVLINK_ERROR_DL_REPLAY: [1] * 18},
        gpm={pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 90.0, pynvml.NVML_GPM_METRIC_SM_UTIL: 60.0,
             pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 40.0,
             pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 50.0},
    )


async def measure(gpus: int, collections: int) -> dict[str, object]:
    fake = FakeNvml([fake_gpu(i) for i in range(gpus)])
    counting = CountingNvml(fake)
    source = NvmlGpuSource(nvml=counting, node="bench")
    source.start()
    try:
        await source.read()  # the first read learns what is unsupported and allocates GPM samples
        counting.reset()
        walls, per_gpu = [], []
        for _ in range(collections):
            started = time.perf_counter()
            await source.read()
            walls.append(time.perf_counter() - started)
            per_gpu += [reading.seconds for reading in source.last_readings.values()]
        calls, seconds = Counter(counting.calls), Counter(counting.seconds)  # not close()'s
    finally:
        await source.close()
    return {"walls": walls, "per_gpu": per_gpu, "calls": calls, "seconds": seconds}


def _fake_proc_tree(root: Path, gpus: int, processes: int, owners: int) -> Any:
    from tests.helpers.fake_proc import K8S_SYSTEMD_V2, FakeProc, container_id, pod_uid

    tree = FakeProc(root)
    for gpu in range(gpus):
        for n in range(processes):
            owner = gpu * owners + n % owners
            tree.pod_process(_pid(gpu, n), K8S_SYSTEMD_V2, "team", f"pod-{owner}",
                             pod_uid(owner), "main", container_id(owner % 256 + owner // 256),
                             {"RANK": str(n), "LOCAL_RANK": str(n), "PATH": "/usr/bin"})
    return tree


def _pid(gpu: int, n: int) -> int:
    return 10_000 + gpu * 1000 + n


async def compare(gpus: int, processes: int, owners: int, collections: int,
                  collect_interval: float, process_interval: float) -> dict[str, Any]:
    """One node-mode cycle (collection, then render) with processes off, on read every
    collection, and on read every ``process_interval`` seconds; the three alternate."""
    import tempfile

    from exporter.attribution.proc import ProcessOwners
    from exporter.exposition import render
    from exporter.exposition.blocks import LabelCache
    from exporter.snapshot import FleetSnapshot
    from tests.helpers.fake_pynvml import FakeProcess

    with tempfile.TemporaryDirectory(prefix="nvml-cost-") as directory:
        tree = _fake_proc_tree(Path(directory), gpus, processes, owners)
        fake = FakeNvml([fake_gpu(i) for i in range(gpus)])
        for gpu, fake_one in enumerate(fake.gpus):
            fake_one.processes = [FakeProcess(_pid(gpu, n), (n + 1) * 256 * 1024**2)
                                  for n in range(processes)]
        now = [0.0]  # the sources' clock: one collect_interval per collection

        def clock() -> float:
            return now[0]

        def owners_of() -> ProcessOwners:
            return ProcessOwners(tree.proc, tree.pods_dir, tree.containers_dir)

        sides = {
            "before": NvmlGpuSource(nvml=fake, node="bench", clock=clock),
            "every": NvmlGpuSource(nvml=fake, node="bench", clock=clock, owners=owners_of()),
            "after": NvmlGpuSource(nvml=fake, node="bench", clock=clock, owners=owners_of(),
                                   process_interval=process_interval),
        }
        caches = {name: LabelCache() for name in sides}
        figures: dict[str, dict[str, list[float]]] = {
            name: {"collect_cpu": [], "render_cpu": [], "collect_wall": [], "render_wall": [],
                   "series": []} for name in sides}
        for source in sides.values():
            source.start()
        try:
            for name, source in sides.items():  # warm: first reads, first render
                reading = await source.read()
                render(FleetSnapshot(0.0, reading.nodes, reading.gpus), caches[name])
            for collection in range(collections):
                now[0] += collect_interval
                for gpu, fake_one in enumerate(fake.gpus):  # new values every collection
                    fake_one.utilization = (collection * 3 + gpu) % 101
                    fake_one.power_mw = 300_000 + collection * 17 + gpu
                    fake_one.energy_mj += 4_500_000
                    fake_one.temperature = 50 + (collection + gpu) % 20
                    for n, process in enumerate(fake_one.processes):
                        process.sm_percent = (collection * 7 + n + gpu) % 100
                        process.memory_used = (n + 1 + collection % 5) * 256 * 1024**2
                order = list(sides)[collection % 3:] + list(sides)[:collection % 3]
                for name in order:
                    cpu, wall = time.process_time(), time.perf_counter()
                    reading = await sides[name].read()
                    cpu_read, wall_read = time.process_time(), time.perf_counter()
                    rendered = render(FleetSnapshot(float(collection), reading.nodes,
                                                    reading.gpus), caches[name])
                    f = figures[name]
                    f["collect_cpu"].append(cpu_read - cpu)
                    f["collect_wall"].append(wall_read - wall)
                    f["render_cpu"].append(time.process_time() - cpu_read)
                    f["render_wall"].append(time.perf_counter() - wall_read)
                    f["series"].append(float(rendered.series))
        finally:
            for source in sides.values():
                await source.close()
    return figures


def print_comparison(figures: dict[str, Any], gpus: int, processes: int, owners: int,
                     collections: int, collect_interval: float, process_interval: float) -> None:
    """Means per cycle (a cycle that reads processes and one that reuses them differ: the
    median would hide the one in twelve that reads), in ms, and each side over before."""
    def mean(name: str, key: str) -> float:
        return statistics.fmean(figures[name][key]) * 1e3

    def cycle(name: str) -> float:
        return mean(name, "collect_cpu") + mean(name, "render_cpu")

    print(f"{gpus} fake GPUs x {processes} processes ({owners} pods per GPU), {collections} "
          f"node-mode cycles each side, one per {collect_interval:g} s, the sides alternating; "
          "mean per cycle, ms")
    every, after = "on, every cycle", f"on, every {process_interval:g} s"
    print(f"{'':28s} {'off (today)':>12s} {every:>16s} {'/today':>7s} {after:>16s} {'/today':>7s}")
    rows = [(label, lambda n, k=key: mean(n, k)) for key, label in (
        ("collect_cpu", "collection CPU"), ("render_cpu", "render CPU"),
        ("collect_wall", "collection wall"), ("render_wall", "render wall"))]
    rows.append(("cycle CPU (collect+render)", cycle))
    for label, value in rows:
        base = value("before")
        print(f"{label:28s} {base:12.2f} {value('every'):16.2f} {value('every') / base:7.3f} "
              f"{value('after'):16.2f} {value('after') / base:7.3f}")
    print(f"{'series rendered (max)':28s} {max(figures['before']['series']):12.0f} "
          f"{max(figures['every']['series']):16.0f} {'':7s} {max(figures['after']['series']):16.0f}")
    print("goal: the cycle within 1.10 of today's (issue 46)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8, help=f"fake GPUs (1..{MAX_GPUS})")
    parser.add_argument("--collections", type=int, default=50,
                        help=f"collections measured (1..{MAX_COLLECTIONS})")
    parser.add_argument("--processes", type=int, default=0,
                        help=f"processes per GPU (0..{MAX_PROCESSES}): compare processes off/on")
    parser.add_argument("--owners", type=int, default=48,
                        help="pods the processes of one GPU belong to (1..--processes)")
    parser.add_argument("--collect-interval", type=float, default=5.0,
                        help="seconds between collections (serve's collect_interval: 5)")
    parser.add_argument("--processes-interval", type=float,
                        default=float(NvmlConfig().processes_interval),
                        help="sources.nvml.processes_interval of the third side (default: the "
                        "option's)")
    args = parser.parse_args(argv)
    if not 1 <= args.gpus <= MAX_GPUS or not 1 <= args.collections <= MAX_COLLECTIONS:
        parser.error(f"--gpus 1..{MAX_GPUS}, --collections 1..{MAX_COLLECTIONS}")
    if not 0 <= args.processes <= MAX_PROCESSES or \
            (args.processes and not 1 <= args.owners <= args.processes):
        parser.error(f"--processes 0..{MAX_PROCESSES}, --owners 1..--processes")
    if args.processes:
        if not (0 < args.collect_interval <= 3600 and 0 <= args.processes_interval <= 3600):
            parser.error("--collect-interval 0..3600 (above 0), --processes-interval 0..3600")
        figures = asyncio.run(compare(args.gpus, args.processes, args.owners, args.collections,
                                      args.collect_interval, args.processes_interval))
        print_comparison(figures, args.gpus, args.processes, args.owners, args.collections,
                         args.collect_interval, args.processes_interval)
        return 0
    result = asyncio.run(measure(args.gpus, args.collections))
    calls, seconds = result["calls"], result["seconds"]
    assert isinstance(calls, dict) and isinstance(seconds, dict)
    per = args.collections * args.gpus
    walls = result["walls"]
    per_gpu = result["per_gpu"]
    assert isinstance(walls, list) and isinstance(per_gpu, list)
    print(f"{args.gpus} fake GPU(s), {args.collections} collections (after a first one)")
    print(f"NVML calls per collection per GPU: {sum(calls.values()) / per:.1f}")
    print(f"time per NVML call (gpufleet + fake): "
          f"{sum(seconds.values()) / sum(calls.values()) * 1e6:.1f} us mean")
    print(f"read_device per GPU: median {statistics.median(per_gpu) * 1e3:.2f} ms; "
          f"collection wall (all GPUs in parallel): median {statistics.median(walls) * 1e3:.2f} ms")
    print("per call kind (per GPU per collection, mean time):")
    for name, count in sorted(calls.items(), key=lambda item: (-item[1], item[0])):
        print(f"  {name:44s} {count / per:5.1f}  {seconds[name] / count * 1e6:7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
