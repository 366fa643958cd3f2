"""Check the NVML source on a machine with real GPUs: every metric, the cost, the failures.

Runs from a fresh checkout with nothing but nvidia-ml-py installed (or from
the repo's venv)::

    pip install nvidia-ml-py && python bench/nvml_check.py          # 30 s
    python bench/nvml_check.py --seconds 10 --interval 0.5

It starts the NVML source exactly as ``gpufleet serve --source nvml`` does,
collects every ``--interval`` seconds for ``--seconds``, then prints for each
GPU every value in base units (and its MIG instances), the cost per collection
(wall time of a whole collection and per-GPU NVML time), and every call that
failed with its error and how often. On a machine without a GPU it says so on
one line and exits 2.

Issue 16: it also prints each GPU's health and performance values (XIDs seen,
ECC, remapped rows, NVLink and PCIe errors, clock-event reasons, clocks, GPM
activity ...), its driver and VBIOS, and the NVML calls a collection makes:
how many per GPU and the time of each kind of call (:class:`CountingNvml`
wraps the module, so the figures are the real library's).

Issue 46: each GPU's processes, read every collection, as the families serve them: per
owner (pod, Slurm job and rank, or the host) the memory, SM use and process count, the
processes whose owner could not be read and why, and at the end what it could not check
on this machine (no process on any GPU, no per-process samples, MIG, another PID
namespace, a process call the driver lacks). Start a CUDA program on a GPU first to check
attribution end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import socket
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.attribution.proc import ProcessOwners
from exporter.snapshot import Gpu
from exporter.sources import SourceStartupError
from exporter.sources.gpu_models import ModelResolver, unknown_model
from exporter.sources.nvml.source import NvmlGpuSource

METRICS = (  # (Gpu field, unit) in the order printed
    ("utilization_ratio", "ratio"),
    ("memory_used_bytes", "B"),
    ("memory_total_bytes", "B"),
    ("temperature_celsius", "°C"),
    ("power_watts", "W"),
    ("power_limit_watts", "W"),
    ("energy_joules", "J"),
    ("nvlink_transmit_bytes", "B"),
    ("nvlink_receive_bytes", "B"),
    ("nvlink_capacity_bytes_per_second", "B/s"),
)


class CountingNvml:
    """The pynvml module (real or fake), counting and timing every ``nvml*`` call made through
    it; constants and error classes pass through untouched."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if not (name.startswith("nvml") and callable(value)) or isinstance(value, type):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                with self._lock:
                    self.calls[name] += 1
                    self.seconds[name] += elapsed
        return timed

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.seconds.clear()


def _resolver() -> ModelResolver:
    try:
        from exporter.sources.gpu_models import catalogue_resolver

        return catalogue_resolver()
    except ImportError:  # no PyYAML: report NVML's product names as they are
        return unknown_model


def _ms(seconds: list[float]) -> str:
    if not seconds:
        return "n/a"
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (f"min {ordered[0] * 1e3:.2f} ms, median {statistics.median(ordered) * 1e3:.2f} ms, "
            f"p95 {p95 * 1e3:.2f} ms, max {ordered[-1] * 1e3:.2f} ms")


async def _collect(source: NvmlGpuSource, seconds: float, interval: float,
                   counting: CountingNvml | None = None) -> dict[str, Any]:
    walls: list[float] = []
    if counting is not None:
        counting.reset()  # start-up calls (enumeration, event sets) are not a collection's
    per_gpu: dict[int, list[float]] = {}
    failures: Counter[tuple[int, str, str]] = Counter()
    stale: Counter[int] = Counter()
    last: tuple[Gpu, ...] = ()
    deadline = time.monotonic() + seconds
    while True:
        started = time.perf_counter()
        snapshot = await source.read()
        walls.append(time.perf_counter() - started)
        last = snapshot.gpus
        for gpu in snapshot.gpus:
            if gpu.stale:
                stale[gpu.index] += 1
        for index, reading in source.last_readings.items():
            per_gpu.setdefault(index, []).append(reading.seconds)
            for error in reading.errors:
                failures[(error.gpu, error.call, error.error)] += 1
        source.last_readings.clear()
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))
    calls = (Counter(counting.calls), Counter(counting.seconds)) if counting is not None else None
    await source.close()
    return {"walls": walls, "per_gpu": per_gpu, "failures": failures, "stale": stale, "last": last,
            "calls": calls}


def run(nvml: Any, seconds: float = 30.0, interval: float = 1.0, call_timeout: float = 2.0,
        out: TextIO = sys.stdout, proc: Path = Path("/proc"),
        kubelet_logs: Path = Path("/var/log")) -> int:
    counting = CountingNvml(nvml)
    owners = ProcessOwners(proc, kubelet_logs / "pods", kubelet_logs / "containers")
    source = NvmlGpuSource(nvml=counting, node=socket.gethostname(), call_timeout=call_timeout,
                           resolve_model=_resolver(), owners=owners, process_interval=0.0)
    try:
        source.start()
    except SourceStartupError as exc:
        print(f"nvml_check: {exc}", file=sys.stderr)
        return 2
    print(f"NVML: driver {source.driver_version}, {len(source.devices)} GPU(s)", file=out)
    for device in source.devices:
        print(f"  gpu {device.index}: {device.product or '?'} ({device.info.model}) "
              f"uuid {device.uuid or '?'} pci {device.pci_bus_id or '?'} "
              f"nvlink links {len(device.nvlink_links)}", file=out)
    print(f"collecting every {interval:g}s for {seconds:g}s ...", file=out, flush=True)
    result = asyncio.run(_collect(source, seconds, interval, counting))

    print("\nlast values (base units; '-' = absent):", file=out)
    for gpu in result["last"]:
        flags = f"up {int(gpu.up)} stale {int(gpu.stale)}"
        print(f"  gpu {gpu.index} {gpu.model} [{flags}]", file=out)
        for name, unit in METRICS:
            value = getattr(gpu, name)
            shown = "-" if value is None else f"{value:.12g} {unit}"
            print(f"    {name:34s} {shown}", file=out)
        for inst in gpu.mig:
            print(f"    mig {inst.instance_id} {inst.profile}: memory used "
                  f"{inst.memory_used_bytes} B of {inst.memory_total_bytes} B", file=out)
        print(f"    {'driver / vbios':34s} {gpu.driver_version or '-'} / {gpu.vbios_version or '-'}",
              file=out)
        _print_issue16(gpu, out)
        _print_processes(gpu, out)

    walls = result["walls"]
    print(f"\ncost per collection ({len(walls)} collections, all GPUs): {_ms(walls)}", file=out)
    for index, costs in sorted(result["per_gpu"].items()):
        print(f"  gpu {index} NVML calls: {_ms(costs)}", file=out)
    for index, count in sorted(result["stale"].items()):
        print(f"  gpu {index}: stale (a call exceeded {call_timeout:g}s) in {count} "
              "collection(s)", file=out)

    if result["calls"] is not None:
        _print_calls(result["calls"], len(walls), len(result["per_gpu"]), out)

    _print_unchecked(result["last"], source, owners, out)

    failures = result["failures"]
    if failures:
        print("\nfailed calls:", file=out)
        for (gpu, call, error), count in sorted(failures.items()):
            print(f"  gpu {gpu} {call}: {error} (in {count} of {len(walls)} collections)",
                  file=out)
    else:
        print("\nfailed calls: none", file=out)
    return 0


def _print_issue16(gpu: Gpu, out: TextIO) -> None:
    """Every health and performance field (issue 16), '-' where absent."""
    for group in (gpu.health, gpu.performance):
        if group is None:
            continue
        for spec in dataclasses.fields(group):
            value = getattr(group, spec.name)
            if spec.name == "xid_counts":
                shown = ", ".join(f"{x.xid}: {x.count}" for x in value) or "none seen"
            elif spec.name == "clock_event_reasons" and value is not None:
                shown = f"0x{value:x}"
            else:
                shown = "-" if value is None else f"{value:.12g}" if isinstance(value, float) \
                    else str(value)
            print(f"    {spec.name:34s} {shown}", file=out)


def _print_processes(gpu: Gpu, out: TextIO) -> None:
    """The GPU's processes per owner, as the owner families serve them."""
    processes = gpu.processes
    if processes is None:
        print(f"    {'processes':34s} - (not read)", file=out)
        return
    if not processes.owners and not processes.unattributed:
        print(f"    {'processes':34s} none running", file=out)
    for owner in processes.owners:
        who = owner.kind + (f" {owner.job}" if owner.job else "") + \
            (f" container {owner.container}" if owner.container else "") + \
            (f" step {owner.step}" if owner.step else "") + \
            (f" rank {owner.rank}" if owner.rank else "")
        memory = "-" if owner.memory_used_bytes is None else f"{owner.memory_used_bytes} B"
        sm = "-" if owner.sm_utilization_ratio is None else f"{owner.sm_utilization_ratio:.3g}"
        print(f"    process owner {who}: {owner.processes} process(es), memory {memory}, "
              f"SM {sm}", file=out)
    for missing in processes.unattributed:
        print(f"    processes unattributed ({missing.reason}): {missing.count}", file=out)
    if processes.cut_total:
        print(f"    processes cut over the cap: {processes.cut_total}", file=out)


def _print_unchecked(gpus: tuple[Gpu, ...], source: NvmlGpuSource, owners: ProcessOwners,
                     out: TextIO) -> None:
    """What this run could not check of the processes' attribution, and why."""
    notes = []
    read = [g for g in gpus if g.processes is not None]
    if not read:
        notes.append("no GPU listed its processes (the process calls failed or are not "
                     "supported): nothing of the attribution was checked")
    elif not any(g.processes.owners or g.processes.unattributed for g in read if g.processes):
        notes.append("no process ran on any GPU: per-process memory, SM samples and their "
                     "owners were not checked (start a CUDA program and run again)")
    if owners.namespace_reason():
        notes.append("this process is not in the host's PID namespace: NVML's PIDs could not "
                     "be resolved (run with the host's PID namespace, hostPID in Kubernetes)")
    for gpu in read:
        if gpu.mig:
            notes.append(f"gpu {gpu.index}: MIG is on: NVML gives no per-process SM samples")
        elif gpu.processes and gpu.processes.owners and all(
                o.sm_utilization_ratio is None for o in gpu.processes.owners):
            notes.append(f"gpu {gpu.index}: the driver gave no per-process SM samples")
    for device in source.devices:
        lacking = sorted(n for n in device.unsupported if "Process" in n)
        if lacking:
            notes.append(f"gpu {device.index}: not supported here: {', '.join(lacking)}")
    kinds = {o.kind for g in read if g.processes for o in g.processes.owners}
    if read and "pod" not in kinds:
        notes.append("no process of a Kubernetes pod: the kubelet's cgroup layouts and names "
                     "were not checked on this machine")
    if read and "slurm" not in kinds:
        notes.append("no process of a Slurm job: Slurm's cgroup layouts were not checked")
    print("\nprocesses: not checked here:" if notes else "\nprocesses: everything checked",
          file=out)
    for note in notes:
        print(f"  {note}", file=out)


def _print_calls(calls: tuple[Counter[str], Counter[str]], collections: int, gpus: int,
                 out: TextIO) -> None:
    counts, seconds = calls
    total = sum(counts.values())
    per = max(1, collections * max(1, gpus))
    print(f"\nNVML calls per collection per GPU: {total / per:.1f} "
          f"({total} calls, {collections} collections, {gpus} GPU(s)); "
          f"NVML time per collection per GPU {sum(seconds.values()) / per * 1e3:.2f} ms", file=out)
    for name, count in sorted(counts.items(), key=lambda item: -seconds[item[0]]):
        print(f"  {name:44s} {count / per:5.1f} per GPU  {seconds[name] / count * 1e6:9.1f} us "
              "per call", file=out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to collect")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between collections")
    parser.add_argument("--timeout", type=float, default=2.0, help="per-GPU NVML call timeout")
    args = parser.parse_args()
    try:
        import pynvml
    except ImportError:
        print("nvml_check: nvidia-ml-py is not installed: pip install nvidia-ml-py",
              file=sys.stderr)
        return 2
    return run(pynvml, args.seconds, args.interval, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
