"""One GPU's processes added up per owner: exactly once per (owner, physical GPU). Pure.

NVML lists a GPU's processes on the physical device (and, under MIG, each with its GPU
instance), whatever the device plugin advertised: MPS's 48 logical slots, time-slicing's
replicas, MIG slices and DRA claims are names the kubelet hands out, never separate NVML
devices. A process is counted once per GPU it runs on, in its owner's sum; the owner's
series carry the physical GPU's UUID. Nothing is divided by a slot or replica count.

A process in both the compute and the graphics list (a CUDA process that draws) counts once,
with the larger memory figure. Over ``cap`` processes, the ones using the most memory are
kept; the rest are cut and counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec

from exporter.attribution.proc import REASONS, Attribution, Owner, Unattributed
from exporter.snapshot import GpuProcesses, OwnerUse, UnattributedProcesses

DEFAULT_CAP = 256  # processes per GPU: MPS allows 48 clients (Volta and later), 60 under MIG


class GpuProcess(msgspec.Struct, frozen=True):
    """One process NVML listed on a GPU (a Struct: made 48 times per GPU and read, where a
    frozen dataclass costs several times as much to make)."""

    pid: int
    memory_used_bytes: int | None  # None: NVML_VALUE_NOT_AVAILABLE (WDDM, or not permitted)
    gpu_instance: int | None = None  # MIG GPU instance; None without MIG


@dataclass(frozen=True, slots=True)
class Added:
    processes: GpuProcesses
    cut: int  # processes left out in this read
    pids: frozenset[int]  # the PIDs kept (whose owners the caller keeps cached)


def merge_lists(*lists: Iterable[GpuProcess]) -> list[GpuProcess]:
    """The compute and graphics lists as one, each PID once."""
    by_pid: dict[int, GpuProcess] = {}
    for processes in lists:
        for process in processes:
            seen = by_pid.get(process.pid)
            if seen is None or (process.memory_used_bytes or 0) > (seen.memory_used_bytes or 0):
                by_pid[process.pid] = process
    return list(by_pid.values())


def add_up(processes: Iterable[GpuProcess], owner_of: Callable[[int], Attribution],
           sm_by_pid: Mapping[int, float] | None, cap: int = DEFAULT_CAP,
           cut_before: int = 0) -> Added:
    """Per owner, its processes' memory and SM use; ``sm_by_pid`` None: no samples (absent),
    a PID missing from it: no sample this interval (0). One pass, no call per process but the
    owner's look-up: a busy node reads 48 processes per GPU every processes_interval."""
    listed = list(processes)
    cut = max(0, len(listed) - cap)
    if cut:
        listed.sort(key=_memory_first)
        listed = listed[:cap]
    sums: dict[Owner, list[Any]] = {}  # owner -> [processes, memory, any memory, SM]
    unattributed: dict[str, int] = {}
    sm_get = None if sm_by_pid is None else sm_by_pid.get
    for process in listed:
        found = owner_of(process.pid)
        if type(found) is Unattributed:
            unattributed[found.reason] = unattributed.get(found.reason, 0) + 1
            continue
        entry = sums.get(found)  # type: ignore[arg-type]
        if entry is None:
            entry = sums[found] = [0, 0, False, 0.0]  # type: ignore[index]
        entry[0] += 1
        memory = process.memory_used_bytes
        if memory is not None:
            entry[1] += memory
            entry[2] = True
        if sm_get is not None:
            entry[3] += sm_get(process.pid, 0.0)
    # rounded: the driver's samples are whole percents, and a sum's float noise
    # (0.21000000000000002) would change the series' text every read
    uses = tuple(OwnerUse(o.kind, o.job, o.container, o.step, o.rank, n,
                          memory if any_memory else None,
                          None if sm_get is None else round(min(1.0, sm), 6))
                 for o, (n, memory, any_memory, sm) in sorted(sums.items(), key=_owner_order))
    return Added(GpuProcesses(
        uses, tuple(UnattributedProcesses(r, unattributed[r]) for r in REASONS if r in unattributed),
        cut_before + cut), cut, frozenset(p.pid for p in listed))


def _memory_first(process: GpuProcess) -> tuple[int, int]:
    return (-(process.memory_used_bytes or 0), process.pid)


_FIELDS = attrgetter("kind", "job", "container", "step", "rank")


def _owner_order(item: tuple[Owner, Any]) -> tuple[str, ...]:
    return _FIELDS(item[0])  # type: ignore[no-any-return]


def sm_ratios(samples: Iterable[tuple[int, int, float]], since: int) -> tuple[dict[int, float], int]:
    """Each PID's mean SM use (0-1) over its samples newer than ``since`` (NVML's
    microseconds), from (pid, timestamp, percent); and the newest timestamp seen."""
    sums: dict[int, list[float]] = {}
    newest = since
    for pid, stamp, percent in samples:
        if stamp <= since:
            continue
        newest = max(newest, stamp)
        entry = sums.setdefault(pid, [0.0, 0.0])
        entry[0] += percent
        entry[1] += 1
    return {pid: min(1.0, total / n / 100.0) for pid, (total, n) in sums.items()}, newest


__all__ = ["DEFAULT_CAP", "Added", "GpuProcess", "add_up", "merge_lists", "sm_ratios"]
