"""NVLink utilisation as the exporter's gauge: each GPU's NVLink byte counters over its last
5 min of collections, over its bandwidth (``gpufleet_gpu_nvlink_utilization_ratio``).

The recording rule it replaces, ``(rate(transmit[5m]) + rate(receive[5m])) / capacity``, made
Prometheus compute two rates and two joins over every GPU's series each interval (0.15-1.5 s
at 10,880 GPUs); the exporter already holds the counters it would read. A rate needs two
readings, which one snapshot does not hold, so :class:`NvlinkWindows` keeps a few per GPU,
30 s apart (ten to a window: its memory does not grow with the collect interval), and the
rate runs from the oldest still inside the window to the newest. A first reading, a counter
that went back (a driver reload, a GPU reset), a GPU replaced at the same place, a lost or
stale GPU, or a clock that went back gives no value until a later reading, never a wrong one.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from exporter import metrics

if TYPE_CHECKING:
    from exporter.metrics import Family, Labels
    from exporter.snapshot import FleetSnapshot, Gpu

WINDOW_SECONDS = 300.0  # the recording rule's [5m]
SLOTS = 10  # readings kept per window: one every WINDOW_SECONDS / SLOTS at most


@dataclass(slots=True)
class GpuWindow:
    """One GPU's readings: (time, transmit bytes, receive bytes), the bytes summed over its
    links. Kept flat in an array of doubles, 24 bytes a reading: cluster mode re-exporting
    108,800 GPUs' telemetry holds a window each (1.0 KB with its key, where a deque of
    reading objects made 1.9 KB)."""

    uuid: str  # a GPU replaced at the same place starts a new window
    kept: array[float]  # the readings kept, oldest first, at least the spacing apart
    # the latest reading, kept or not: what a counter reset is seen against
    at: float
    transmit: float
    receive: float

    def readings(self) -> list[tuple[float, float, float]]:
        kept = self.kept
        return [(kept[i], kept[i + 1], kept[i + 2]) for i in range(0, len(kept), 3)]


@dataclass
class NvlinkWindows:
    """Each GPU's recent NVLink counter readings, by its place (node, index)."""

    seconds: float = WINDOW_SECONDS
    slots: int = SLOTS
    windows: dict[tuple[str, int], GpuWindow] = field(default_factory=dict)

    def observe(self, snapshot: FleetSnapshot, whole: bool = True) -> list[tuple[Labels, float]]:
        """Take ``snapshot``'s readings; the gauge's samples, one per GPU that has a value.

        ``whole``: the snapshot shows the whole fleet, so a GPU it lacks is gone and its window
        is dropped (a blind snapshot's missing GPUs keep theirs)."""
        from exporter.exposition.lines import identity

        now = snapshot.taken_at
        samples: list[tuple[Labels, float]] = []
        for gpu in snapshot.gpus:
            ratio = self.step(gpu, now)
            if ratio is not None:
                samples.append((identity(gpu), ratio))
        if whole:
            present = {gpu.key for gpu in snapshot.gpus}
            for key in [k for k in self.windows if k not in present]:
                del self.windows[key]
        return samples

    def step(self, gpu: Gpu, now: float) -> float | None:
        """One GPU's reading at ``now``: its utilisation over the window, or None."""
        key = gpu.key
        transmit, receive = gpu.nvlink_transmit_bytes, gpu.nvlink_receive_bytes
        if transmit is None or receive is None or not gpu.up:
            self.windows.pop(key, None)  # no counters to continue from
            return None
        if gpu.stale:  # the last good values again: not a reading taken now
            return None
        window = self.windows.get(key)
        if (window is None or window.uuid != gpu.uuid or now < window.at
                or transmit < window.transmit or receive < window.receive):
            self.windows[key] = GpuWindow(gpu.uuid, array("d", (now, transmit, receive)), now,
                                          transmit, receive)
            return None
        kept = window.kept
        drop = 0  # readings out of the window: (now - 5 min, now], as [5m]
        while drop < len(kept) and now - kept[drop] >= self.seconds:
            drop += 3
        if drop:
            del kept[:drop]
        ratio = None
        capacity = gpu.nvlink_capacity_bytes_per_second
        if kept and capacity and now > kept[0]:
            moved = (transmit - kept[1]) + (receive - kept[2])
            ratio = moved / (now - kept[0]) / capacity
        if not kept or now - kept[-3] >= self.seconds / self.slots:
            kept.extend((now, transmit, receive))
        window.at, window.transmit, window.receive = now, transmit, receive
        return ratio


class _Framed(Protocol):
    # the cycle's frame, as far as this stage reads it (as exporter/preemption/stage.py)
    @property
    def snapshot(self) -> FleetSnapshot: ...

    @property
    def blind(self) -> tuple[str, ...]: ...


F = TypeVar("F", bound=_Framed)


@dataclass
class NvlinkStage:
    """The windows as a stage of the cycle: it reads only the snapshot, and runs on a blind
    frame too (each GPU's value needs only its own readings)."""

    windows: NvlinkWindows = field(default_factory=NvlinkWindows)
    name: str = "nvlink"
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def step(self, frame: F) -> F:
        self.samples = self.windows.observe(frame.snapshot, whole=not frame.blind)
        return frame

    def families(self, frame: _Framed) -> list[Family]:
        return [metrics.GPU_NVLINK_UTILIZATION_RATIO.family(self.samples)]


__all__ = ["GpuWindow", "NvlinkStage", "NvlinkWindows"]
