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
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pynvml
from nvml_check import CountingNvml

from exporter.sources.nvml.source import NvmlGpuSource
from tests.helpers.fake_pynvml import FakeGpu, FakeNvml

MAX_GPUS = 64
MAX_COLLECTIONS = 10_000


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8, help=f"fake GPUs (1..{MAX_GPUS})")
    parser.add_argument("--collections", type=int, default=50,
                        help=f"collections measured (1..{MAX_COLLECTIONS})")
    args = parser.parse_args(argv)
    if not 1 <= args.gpus <= MAX_GPUS or not 1 <= args.collections <= MAX_COLLECTIONS:
        parser.error(f"--gpus 1..{MAX_GPUS}, --collections 1..{MAX_COLLECTIONS}")
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
