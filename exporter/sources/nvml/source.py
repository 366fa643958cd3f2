"""NVML source: the GPUs of this machine, read through libnvidia-ml (``import pynvml``).

gpufleet then replaces dcgm-exporter or nvidia_gpu_exporter as the node's
exporter. NVML is initialised once at start and shut down at close; handles and
static identity (UUID, name, PCI bus id, driver version, NVLink links) are
cached. Each collection reads per GPU, in NVML's units, converted to base units:

=================================  ==============================  ===========================
what                               NVML call                       nvidia-smi equivalent
=================================  ==============================  ===========================
utilization (%, → ratio)           nvmlDeviceGetUtilizationRates   ``utilization.gpu``
memory used/total (bytes)          nvmlDeviceGetMemoryInfo v2      ``memory.used,memory.total``
                                   (used excludes reserved), else
                                   v1
temperature (°C)                   nvmlDeviceGetTemperatureV,      ``temperature.gpu``
                                   else nvmlDeviceGetTemperature
power (mW → W)                     nvmlDeviceGetPowerUsage         ``power.draw``
power limit (mW → W)               nvmlDeviceGetEnforcedPowerLimit ``enforced.power.limit``
energy (mJ → J, counter)           nvmlDeviceGetTotalEnergy…       ``total_energy_consumption``
NVLink data (KiB → B, counters)    nvmlDeviceGetFieldValues with   ``nvlink -gt d``
                                   NVML_FI_DEV_NVLINK_THROUGHPUT_
                                   DATA_TX/RX, one per link
MIG instances (id, profile, mem)   nvmlDeviceGetMigDeviceHandle…   ``mig -lgi``
memory bandwidth (%, → ratio)      nvmlDeviceGetUtilizationRates   ``utilization.memory``
XID events (counter per code)      nvmlEventSetWait_v2 on one      kernel log ``NVRM: Xid``
                                   event set per GPU
ECC (counts)                       nvmlDeviceGetTotalEccErrors     ``ecc.errors.*.total``
retired pages, pending             nvmlDeviceGetRetiredPages,      ``retired_pages.*``
                                   …PendingStatus (pre-Ampere)
remapped rows, pending, failure    nvmlDeviceGetRemappedRows       ``remapped_rows.*``
NVLink errors (summed over links)  field values NVML_FI_DEV_NVLINK ``nvlink -e``
                                   _*_ERROR_COUNT_TOTAL, else
                                   nvmlDeviceGetNvLinkErrorCounter
PCIe replays                       nvmlDeviceGetPcieReplayCounter  ``pcie.replay_counter`` (-q)
clock-event reasons (bitmask)      nvmlDeviceGetCurrentClocksEvent ``clocks_event_reasons.*``
                                   Reasons, else …ThrottleReasons
clocks, max clocks (MHz → Hz)      nvmlDeviceGetClockInfo,         ``clocks.sm``, ``clocks.max.sm``
                                   nvmlDeviceGetMaxClockInfo
memory temperature (°C)            field NVML_FI_DEV_MEMORY_TEMP   ``temperature.memory``
fan (%, → ratio), P-state          nvmlDeviceGetFanSpeed,          ``fan.speed``, ``pstate``
                                   nvmlDeviceGetPerformanceState
PCIe gen, width, KB/s (→ B/s)      nvmlDeviceGetCurrPcieLink…,     ``pcie.link.gen.current``
                                   nvmlDeviceGetPcieThroughput
encoder, decoder (%, → ratio)      nvmlDeviceGetEncoder/Decoder…   ``utilization.encoder``
SM/tensor/DRAM activity (% → 0-1)  GPM: nvmlGpmSampleGet twice,    ``dmon --gpm-metrics``
                                   nvmlGpmMetricsGet (Hopper+)
driver, VBIOS, PCI bus id, serial  read once at start              ``driver_version`` …
=================================  ==============================  ===========================

Issue 16's health and performance reads are optional: ``NotSupported`` (or a
driver without the entry point) leaves the value absent and is remembered, so
an unsupported call is not made again; any other error of such a read is kept
in the GPU's errors (``bench/nvml_check.py`` prints them) but does not set
``up`` to 0, which stays the signal that the GPU's core reads failed. XID
events are drained (at most ``MAX_XID_EVENTS`` a collection, each wait
``XID_WAIT_MS``) in the GPU's own worker thread at each collection, before
anything else, so that the XID that announces a lost GPU (79) is still counted;
the counts live in the source, since the exporter started.

The deprecated NVLink utilization-counter API is not used. On a MIG-enabled
GPU NVML has no utilization (neither for the GPU nor its instances), so it is
absent, never 0.

Isolation: every GPU has its own daemon worker thread, and a collection waits
at most ``call_timeout`` for them. A wedged driver call therefore blocks only
its GPU, whose last good sample is served marked stale (``gpufleet_gpu_stale
1``); the event loop never waits on NVML, and a wedged thread cannot hold up
process exit. ``NVMLError_GpuIsLost`` or any other per-call error sets that
GPU's ``up`` to 0 and leaves the other GPUs alone; ``NVMLError_NotSupported``
just leaves the field absent.

The ``pynvml`` module is a constructor parameter: tests pass a fake that
raises pynvml's real error classes and returns its real structs.

Processes (``sources.nvml.processes``, on by default): each GPU's running compute and
graphics processes (``nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3``, else ``_v2`` on
a driver without the v3 entry points) and the driver's per-process SM samples since the last
read (``nvmlDeviceGetProcessesUtilizationInfo``, else ``nvmlDeviceGetProcessUtilization``;
``NotFound`` is "no sample since", ``NotSupported`` under MIG leaves SM use absent), read in
the GPU's worker like any optional read. Each PID is resolved to its pod, Slurm job or the
host through /proc (:mod:`exporter.attribution`, in the same worker, so a stuck /proc read
holds only that GPU, within ``call_timeout``) and added up per owner on the physical GPU:
``Gpu.processes``.

On a Kubernetes node, ``pod_resources`` adds the kubelet's PodResources API:
each pod holding GPUs becomes an allocation on the GPUs it holds, by UUID, and
the source then ``schedules`` (:mod:`exporter.sources.nvml.pods` says why this
is an option here rather than a source of its own, and how each device id maps).
The kubelet is the source's one target; its failure never touches the GPUs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from exporter.attribution.proc import ProcessOwners
from exporter.attribution.usage import DEFAULT_CAP, GpuProcess, add_up, merge_lists, sm_ratios
from exporter.extras import missing
from exporter.snapshot import (
    Gpu,
    GpuHealth,
    GpuPerformance,
    GpuProcesses,
    MigInstance,
    Node,
    XidCount,
)
from exporter.sources import Clock, SourceReading, SourceStartupError
from exporter.sources.gpu_models import ModelInfo, ModelResolver, unknown_model
from exporter.sources.lastgood import LastGood
from exporter.sources.nvml.options import NvmlSource as NvmlConfig

if TYPE_CHECKING:  # gRPC is imported only where sources.nvml.pod_resources is on
    from exporter.sources.nvml.pods import MigDevice, PodGpus

log = logging.getLogger(__name__)

KIB = 1024
MHZ = 1_000_000
XID_WAIT_MS = 1  # each nvmlEventSetWait_v2: events are queued by the driver, so no need to wait
MAX_XID_EVENTS = 64  # a storm must not hold the GPU's worker; the rest wait for the next read
MAX_XID_CODES = 64  # distinct codes kept per GPU (label cardinality); NVML documents ~150
_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")  # "NVIDIA A100-SXM4-80GB MIG 1g.10gb"


class _Worker:
    """One daemon thread running one GPU's NVML calls, one job at a time.

    Not a ThreadPoolExecutor: its threads are joined at interpreter exit, so a
    call wedged in the driver would hang gpufleet's shutdown forever.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

    def stop(self) -> None:
        self._jobs.put(None)


def _wait_result(future: concurrent.futures.Future[Any], timeout: float) -> Any:
    """Block (outside the event loop) for a worker's result; TimeoutError if it is wedged."""
    return future.result(timeout=timeout)


async def _await_all(futures: list[concurrent.futures.Future[Any]], timeout: float) -> None:
    """Wait until every future is done or ``timeout`` passes, without blocking the loop.

    Not ``asyncio.wrap_future``: a wedged call may finish after the loop has
    closed, and wrap_future would then fail inside the worker thread.
    """
    if not futures:
        return
    loop = asyncio.get_running_loop()
    all_done = loop.create_future()
    remaining = [len(futures)]

    def finished_on_loop() -> None:
        remaining[0] -= 1
        if remaining[0] == 0 and not all_done.done():
            all_done.set_result(None)

    def finished(_: concurrent.futures.Future[Any]) -> None:
        # RuntimeError: the loop has closed, nobody is waiting any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(finished_on_loop)

    for future in futures:
        future.add_done_callback(finished)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(all_done), timeout)


@dataclass(frozen=True, slots=True)
class CallError:
    gpu: int
    call: str
    error: str
    optional: bool = False  # a health or performance read: its failure does not set up to 0


@dataclass(frozen=True, slots=True)
class DeviceReading:
    gpu: Gpu
    errors: tuple[CallError, ...]
    seconds: float  # cost of this GPU's NVML calls
    mig_uuids: tuple[tuple[str, int], ...] = ()  # (MIG device UUID, GPU instance), pods only
    pids: frozenset[int] = frozenset()  # the processes attributed in this read
    processes_read: bool = False  # the processes were read anew (not the last read's)


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    product: str
    pci_bus_id: str | None
    info: ModelInfo
    nvlink_links: tuple[int, ...]
    worker: _Worker
    memory_v2: bool = True  # until the driver says it has no nvmlDeviceGetMemoryInfo_v2
    temperature_v: bool = True  # until it has no nvmlDeviceGetTemperatureV
    pending: concurrent.futures.Future[DeviceReading] | None = None
    startup_error: str = ""
    wedged_logged: bool = False
    vbios_version: str | None = None
    serial: str | None = None
    # issue 16: state kept across collections, touched only by this GPU's worker thread
    unsupported: set[str] = field(default_factory=set)  # optional calls that said NotSupported
    events: Any = None  # the XID event set; None: XID events not supported
    xid_counts: dict[int, int] = field(default_factory=dict)
    last_xid: int | None = None
    last_xid_time: float | None = None
    max_clocks: dict[str, float] = field(default_factory=dict)  # static: read until known
    nvlink_error_totals: bool = True  # until the driver has no *_ERROR_COUNT_TOTAL fields
    gpm_samples: list[Any] | None = None  # [previous, current]; None: no GPM (or not yet)
    gpm_checked: bool = False
    gpm_previous: bool = False  # the previous sample holds a reading
    process_sample_time: int = 0  # the newest process sample read (NVML's microseconds)
    processes_cut: int = 0  # processes over the cap, since start
    processes_read_at: float | None = None  # when they were last read (the source's clock)
    last_processes: tuple[GpuProcesses | None, frozenset[int]] = (None, frozenset())


@dataclass
class NvmlGpuSource:
    """This machine's GPUs. Call :meth:`start` (blocking) before the first :meth:`read`."""

    nvml: ModuleType | Any
    node: str
    pool: str = ""
    call_timeout: float = 2.0
    resolve_model: ModelResolver = unknown_model
    clock: Clock = time.time
    cpu_cores: float = field(default_factory=lambda: float(os.cpu_count() or 0))
    name: str = "nvml"
    driver_version: str = ""
    export_serial: bool = False  # the `serial` label of gpu_info (sources.nvml.export_serial)
    # the kubelet's PodResources (sources.nvml.pod_resources): who holds which GPU; None: off
    pods: PodGpus | None = None
    # who owns each GPU process (sources.nvml.processes); None: processes are not read
    owners: ProcessOwners | None = None
    process_cap: int = DEFAULT_CAP
    process_interval: float = 0.0  # seconds between two reads of a GPU's processes
    devices: list[_Device] = field(default_factory=list)
    last_readings: dict[int, DeviceReading] = field(default_factory=dict)
    # per GPU index: its last good sample, served stale while its calls are wedged
    last_good: LastGood[int, Gpu] = field(default_factory=lambda: LastGood(_stale))
    _started: bool = False

    @property
    def schedules(self) -> bool:
        """With the kubelet's PodResources it knows which pod holds which GPU (the source
        contract): this process then serves the scheduler's families."""
        return self.pods is not None

    # --- start and stop -----------------------------------------------------------------

    def start(self) -> None:
        """nvmlInit and enumeration, bounded by a timeout; SourceStartupError names the fix."""
        worker = _Worker("nvml-init")
        try:
            _wait_result(worker.submit(self._init), max(10.0, 5 * self.call_timeout))
        except concurrent.futures.TimeoutError:
            raise SourceStartupError(
                "NVML did not answer nvmlInit within "
                f"{max(10.0, 5 * self.call_timeout):g}s: the driver looks wedged; check "
                "`nvidia-smi` and the kernel log") from None
        finally:
            worker.stop()

    def _init(self) -> None:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound:
            raise SourceStartupError(
                "NVML library libnvidia-ml.so.1 not found: this machine has no NVIDIA driver. "
                "Install the driver (or run in a container with the NVIDIA runtime), or use "
                "--source dcgm to read dcgm-exporter endpoints instead") from None
        except nvml.NVMLError_DriverNotLoaded:
            raise SourceStartupError(
                "the NVIDIA driver is not loaded (no GPU, or its kernel module failed): "
                "check `nvidia-smi` and `dmesg`") from None
        except nvml.NVMLError_NoPermission:
            raise SourceStartupError(
                "no permission to open the NVIDIA devices: run gpufleet as a user who "
                "can read /dev/nvidia*") from None
        except nvml.NVMLError as exc:
            raise SourceStartupError(f"NVML failed to start: {exc}") from None
        self._started = True
        try:
            count = nvml.nvmlDeviceGetCount()
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            self._shutdown()
            raise SourceStartupError(f"NVML could not list the GPUs: {exc}") from None
        if count == 0:
            self._shutdown()
            raise SourceStartupError("NVML found no GPU on this machine")
        self.devices = [self._identify(index) for index in range(count)]

    def _identify(self, index: int) -> _Device:
        nvml = self.nvml
        worker = _Worker(f"nvml-gpu{index}")
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            product = _text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError as exc:
            # A GPU lost before start keeps its index and reports up 0, never vanishes.
            log.warning("GPU unreadable at start", extra={"gpu": index, "err": str(exc)})
            return _Device(index, None, "", "", None, unknown_model(""), (), worker,
                           startup_error=str(exc))
        try:
            pci: str | None = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError:
            pci = None
        device = _Device(index, handle, uuid, product, pci, self.resolve_model(product),
                         self._nvlink_links(handle), worker)
        device.vbios_version = _optional_text(nvml, nvml.nvmlDeviceGetVbiosVersion, handle)
        if self.export_serial:
            device.serial = _optional_text(nvml, nvml.nvmlDeviceGetSerial, handle)
        device.events = self._xid_event_set(device)
        return device

    def _xid_event_set(self, device: _Device) -> Any:
        """An event set of this GPU alone, registered for critical XIDs; None if unsupported.

        One set per GPU, so that each worker drains only its own GPU's events and a
        wedged GPU cannot hold another's.
        """
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("no XID events for this GPU", extra={"gpu": device.index, "err": str(exc)})
            return None
        try:
            nvml.nvmlDeviceRegisterEvents(device.handle, nvml.nvmlEventTypeXidCriticalError, events)
        except nvml.NVMLError as exc:
            log.info("no XID events for this GPU", extra={"gpu": device.index, "err": str(exc)})
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(events)
            return None
        return events

    def _nvlink_links(self, handle: Any) -> tuple[int, ...]:
        """Link ids of the GPU: the link-count field, else probe each link's state."""
        nvml = self.nvml
        try:
            (value,) = nvml.nvmlDeviceGetFieldValues(handle, [nvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
            if value.nvmlReturn == nvml.NVML_SUCCESS:
                return tuple(range(int(_field_value(nvml, value))))
        except nvml.NVMLError:
            pass
        links = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:
                continue
            links.append(link)
        return tuple(links)

    def _shutdown(self) -> None:
        nvml = self.nvml
        for device in self.devices:  # NVML frees them at shutdown too; this is tidiness
            if device.events is not None:
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlEventSetFree(device.events)
                device.events = None
            for sample in device.gpm_samples or ():
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlGpmSampleFree(sample)
            device.gpm_samples = None
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed", extra={"err": str(exc)})
        self._started = False

    async def close(self) -> None:
        if self.pods is not None:
            await self.pods.close()
        for device in self.devices:
            device.worker.stop()
        if self._started:
            # On its own thread, bounded: a wedged driver must not hang the exit.
            worker = _Worker("nvml-shutdown")
            future = worker.submit(self._shutdown)
            await _await_all([future], self.call_timeout)
            worker.stop()

    # --- collection ---------------------------------------------------------------------

    async def read(self) -> SourceReading:
        submitted = []
        for device in self.devices:
            if device.pending is not None and not device.pending.done():
                continue  # still wedged in a call from an earlier collection
            device.pending = device.worker.submit(self.read_device, device)
            submitted.append(device.pending)
        # the kubelet is asked beside the GPUs, so its deadline adds nothing to theirs
        kubelet = None if self.pods is None else asyncio.ensure_future(self.pods.fetch())
        try:
            await _await_all(submitted, self.call_timeout)
            if kubelet is not None:
                await kubelet
        finally:
            if kubelet is not None and not kubelet.done():  # this read was cancelled
                kubelet.cancel()

        now = self.clock()
        gpus, fresh = [], 0
        fresh_processes = False
        for device in self.devices:
            future = device.pending
            if future is not None and future.done():
                device.pending = None
                try:
                    reading = future.result()
                except Exception as exc:  # a bug or an unforeseen error: this GPU only
                    log.warning("GPU read failed", extra={"gpu": device.index, "err": repr(exc)})
                    gpus.append(dataclasses.replace(self._identity(device), up=False))
                    continue
                self.last_readings[device.index] = reading
                fresh_processes |= reading.processes_read
                self.last_good.remember(device.index, reading.gpu, now)
                if device.wedged_logged:
                    log.info("GPU answers again", extra={"gpu": device.index})
                    device.wedged_logged = False
                gpus.append(reading.gpu)
                fresh += 1
                continue
            if not device.wedged_logged:  # once per wedge, not every collection
                log.warning("GPU read timed out; serving its last good sample as stale",
                            extra={"gpu": device.index, "timeout": self.call_timeout})
                device.wedged_logged = True
            last = self.last_good.recall(device.index, now)
            gpus.append(last or dataclasses.replace(self._identity(device), up=False, stale=True))

        if self.owners is not None and fresh_processes:  # keep the owners of PIDs still listed
            self.owners.forget_except(set().union(*(r.pids for r in self.last_readings.values())))
        models = [g.model for g in gpus]
        model = max(set(models), key=models.count) if models else "unknown"
        architecture = next((d.info.architecture for d in self.devices if d.info.model == model),
                            "unknown")
        node = Node(self.node, model, self.cpu_cores, self.pool, architecture, len(gpus))
        error = "" if fresh else "no GPU answered in time"
        if self.pods is None:
            return SourceReading((node,), tuple(gpus), error=error)
        allocations, kubelet_status = self.pods.join(self.node, gpus, self._mig_devices())
        return SourceReading((node,), tuple(gpus), allocations, targets=(kubelet_status,),
                             error=error)

    def _mig_devices(self) -> list[MigDevice]:
        """The MIG devices of each GPU's last reading (a wedged GPU's: its last good one)."""
        from exporter.sources.nvml.pods import MigDevice

        found = []
        for index, reading in self.last_readings.items():
            profiles = {m.instance_id: m.profile for m in reading.gpu.mig}
            found += [MigDevice(uuid, index, instance, profiles.get(instance, "unknown"))
                      for uuid, instance in reading.mig_uuids]
        return found

    def _identity(self, device: _Device) -> Gpu:
        # The model's NVLink bandwidth only where the GPU has links: an SXM H100 alone in a
        # VM reports none (seen on a real one), and a capacity there would be made up.
        capacity = device.info.nvlink_bandwidth_bytes_per_second if device.nvlink_links else None
        return Gpu(self.node, device.index, device.uuid, device.info.model, self.pool,
                   nvlink_capacity_bytes_per_second=capacity,
                   pci_bus_id=device.pci_bus_id, driver_version=self.driver_version or None,
                   vbios_version=device.vbios_version, serial=device.serial)

    def read_device(self, device: _Device) -> DeviceReading:
        """Every NVML read of one GPU, in base units. Blocking: runs on the GPU's worker."""
        started = time.perf_counter()
        identity = self._identity(device)
        if device.handle is None:
            error = CallError(device.index, "nvmlDeviceGetHandleByIndex", device.startup_error)
            return DeviceReading(dataclasses.replace(identity, up=False), (error,),
                                 time.perf_counter() - started)
        calls = _Calls(self.nvml, device.index, device.unsupported)
        nvml, handle = self.nvml, device.handle
        self._drain_xids(device, calls)  # first: the XID that says the GPU is lost counts too

        mig_mode = calls.run("nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = bool(mig_mode) and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        utilization = memory_bandwidth = None
        if not mig_enabled:
            rates = calls.run("nvmlDeviceGetUtilizationRates",
                              nvml.nvmlDeviceGetUtilizationRates, handle)
            utilization = None if rates is None else rates.gpu / 100.0
            memory_bandwidth = None if rates is None else rates.memory / 100.0
        memory = self._memory(device, calls, handle)
        temperature = self._temperature(device, calls)
        power = calls.run("nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, handle)
        limit = calls.run("nvmlDeviceGetEnforcedPowerLimit",
                          nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        energy = calls.run("nvmlDeviceGetTotalEnergyConsumption",
                           nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        tx, rx = self._nvlink(device, calls)
        mig_uuids: list[tuple[str, int]] | None = [] if self.pods is not None else None
        mig = self._mig_instances(device, calls, mig_uuids) if mig_enabled else ()
        health = self._health(device, calls)
        performance = self._performance(device, calls, memory_bandwidth, mig_enabled)
        read_before = device.processes_read_at
        processes, pids = self._processes(device, calls, mig_enabled)

        if calls.lost:
            # the XIDs seen (79: fallen off the bus) are what on-call needs next to up 0
            gpu = dataclasses.replace(identity, up=False, health=self._xid_health(device))
        else:
            gpu = dataclasses.replace(
                identity,
                memory_total_bytes=None if memory is None else int(memory.total),
                memory_used_bytes=None if memory is None else int(memory.used),
                utilization_ratio=utilization,
                temperature_celsius=None if temperature is None else float(temperature),
                power_watts=None if power is None else power / 1000.0,
                power_limit_watts=None if limit is None else limit / 1000.0,
                energy_joules=None if energy is None else energy / 1000.0,
                nvlink_transmit_bytes=tx,
                nvlink_receive_bytes=rx,
                mig=mig,
                health=health,
                performance=performance,
                processes=processes,
                up=not any(not error.optional for error in calls.errors),
            )
        return DeviceReading(gpu, tuple(calls.errors), time.perf_counter() - started,
                             tuple(mig_uuids or ()), pids, device.processes_read_at != read_before)

    def _memory(self, device: _Device, calls: _Calls, handle: Any) -> Any:
        nvml = self.nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if calls.lost:
            return None
        if device.memory_v2 and version is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_ArgumentVersionMismatch,
                    nvml.NVMLError_NotSupported):
                device.memory_v2 = False  # an older driver: v1 from now on
            except nvml.NVMLError as exc:
                calls.failed("nvmlDeviceGetMemoryInfo_v2", exc)
                return None
        return calls.run("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, handle)

    def _temperature(self, device: _Device, calls: _Calls) -> Any:
        nvml, handle = self.nvml, device.handle
        if calls.lost:
            return None
        if device.temperature_v and hasattr(nvml, "nvmlDeviceGetTemperatureV"):
            try:
                return nvml.nvmlDeviceGetTemperatureV(handle, nvml.NVML_TEMPERATURE_GPU)
            except nvml.NVMLError_FunctionNotFound:
                device.temperature_v = False
            except nvml.NVMLError_NotSupported:
                return None
            except nvml.NVMLError as exc:
                calls.failed("nvmlDeviceGetTemperatureV", exc)
                return None
        return calls.run("nvmlDeviceGetTemperature", nvml.nvmlDeviceGetTemperature, handle,
                         nvml.NVML_TEMPERATURE_GPU)

    def _nvlink(self, device: _Device, calls: _Calls) -> tuple[float | None, float | None]:
        """Cumulative NVLink data bytes over all links, from NVML's per-link KiB counters."""
        if not device.nvlink_links:
            return None, None
        nvml = self.nvml
        links = device.nvlink_links
        fields = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) for link in links]
        fields += [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in links]
        values = calls.run("nvmlDeviceGetFieldValues", nvml.nvmlDeviceGetFieldValues,
                           device.handle, fields)
        if values is None:
            return None, None
        totals: dict[int, float] = {}
        for value in values:
            if value.nvmlReturn == nvml.NVML_SUCCESS:
                totals[value.fieldId] = totals.get(value.fieldId, 0.0) \
                    + _field_value(nvml, value) * KIB
            elif value.nvmlReturn != nvml.NVML_ERROR_NOT_SUPPORTED:
                calls.failed(f"nvmlDeviceGetFieldValues(field {value.fieldId}, "
                             f"link {value.scopeId})", nvml.NVMLError(value.nvmlReturn))
        return (totals.get(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
                totals.get(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX))

    def _mig_instances(self, device: _Device, calls: _Calls,
                       uuids: list[tuple[str, int]] | None = None) -> tuple[MigInstance, ...]:
        """The GPU's MIG instances; with ``uuids``, also each MIG device's UUID (the kubelet
        names MIG devices by it) and its GPU instance."""
        nvml, handle = self.nvml, device.handle
        slots = calls.run("nvmlDeviceGetMaxMigDeviceCount",
                          nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        instances: dict[int, MigInstance] = {}
        for slot in range(slots):
            if calls.lost:
                break
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue  # an empty slot
            except nvml.NVMLError as exc:
                calls.failed("nvmlDeviceGetMigDeviceHandleByIndex", exc)
                continue
            instance_id = calls.run("nvmlDeviceGetGpuInstanceId",
                                    nvml.nvmlDeviceGetGpuInstanceId, mig)
            if uuids is not None and instance_id is not None:
                uuid = calls.optional("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, mig)
                if uuid:
                    uuids.append((_text(uuid), int(instance_id)))
            if instance_id is None or instance_id in instances:
                continue  # several compute instances share one GPU instance
            name = calls.run("nvmlDeviceGetName", nvml.nvmlDeviceGetName, mig)
            memory = calls.run("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, mig)
            instances[instance_id] = MigInstance(
                int(instance_id), mig_profile(_text(name or "")),
                None if memory is None else int(memory.total),
                None if memory is None else int(memory.used))
        return tuple(instances[i] for i in sorted(instances))


    # --- processes and their owners ---------------------------------------------------------

    def _processes(self, device: _Device, calls: _Calls,
                   mig_enabled: bool) -> tuple[GpuProcesses | None, frozenset[int]]:
        """The GPU's processes per owner; None where the driver lists none (NotSupported)."""
        if self.owners is None or calls.lost:
            return None, frozenset()
        now = self.clock()
        if device.processes_read_at is not None and \
                0 <= now - device.processes_read_at < self.process_interval:
            return device.last_processes  # the same object: the render reuses its text
        device.processes_read_at = now
        device.last_processes = self._read_processes(device, calls, mig_enabled)
        return device.last_processes

    def _read_processes(self, device: _Device, calls: _Calls,
                        mig_enabled: bool) -> tuple[GpuProcesses | None, frozenset[int]]:
        lists = [self._running(device, calls, kind) for kind in ("Compute", "Graphics")]
        if all(found is None for found in lists) or calls.lost:
            return None, frozenset()
        made = [[GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                            _instance(p)) for p in found or ()] for found in lists]
        # most GPUs list no graphics process: nothing to merge then
        listed = made[0] if not made[1] else merge_lists(*made)
        sm = None if mig_enabled else self._process_sm(device, calls)
        assert self.owners is not None  # _processes reads none without
        added = add_up(listed, self.owners.owner, sm, self.process_cap, device.processes_cut)
        device.processes_cut = added.processes.cut_total
        return added.processes, added.pids

    def _running(self, device: _Device, calls: _Calls, kind: str) -> list[Any] | None:
        """nvmlDeviceGet<kind>RunningProcesses: the v3 call, else v2 (a driver without v3).
        The versioned names: pynvml's unversioned one raises NVMLLibraryMismatchError there."""
        for version in ("_v3", "_v2"):
            name = f"nvmlDeviceGet{kind}RunningProcesses{version}"
            if name in device.unsupported or not hasattr(self.nvml, name):
                continue
            found = calls.optional(name, getattr(self.nvml, name), device.handle)
            if found is not None or name not in device.unsupported:
                return found
        return None

    def _process_sm(self, device: _Device, calls: _Calls) -> dict[int, float] | None:
        """Each PID's SM use since the last read; {} when the driver has no new sample (every
        process idle), None when it keeps none (unsupported)."""
        nvml = self.nvml
        for name in ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"):
            if name in device.unsupported or not hasattr(nvml, name) or calls.lost:
                continue
            try:
                samples = getattr(nvml, name)(device.handle, device.process_sample_time)
            except nvml.NVMLError_NotFound:
                return {}  # no sample newer than the last read
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
                device.unsupported.add(name)
                continue
            except nvml.NVMLError as exc:
                calls.failed(name, exc, optional=True)
                return None
            ratios, device.process_sample_time = sm_ratios(
                ((int(s.pid), int(s.timeStamp), float(s.smUtil)) for s in samples),
                device.process_sample_time)
            return ratios
        return None

    # --- issue 16: health -----------------------------------------------------------------

    def _drain_xids(self, device: _Device, calls: _Calls) -> None:
        """Count the XID events queued on the GPU's event set since the last read."""
        nvml = self.nvml
        if device.events is None:
            return
        for _ in range(MAX_XID_EVENTS):
            try:
                data = nvml.nvmlEventSetWait_v2(device.events, XID_WAIT_MS)
            except nvml.NVMLError_Timeout:
                return  # nothing (more) queued
            except nvml.NVMLError as exc:
                calls.failed("nvmlEventSetWait_v2", exc, optional=True)
                return
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            xid = int(data.eventData)
            if xid not in device.xid_counts and len(device.xid_counts) >= MAX_XID_CODES:
                log.warning("too many distinct XID codes; not counting this one",
                            extra={"gpu": device.index, "xid": xid})
            else:
                device.xid_counts[xid] = device.xid_counts.get(xid, 0) + 1
            device.last_xid = xid
            device.last_xid_time = self.clock()
            log.warning("XID error", extra={"gpu": device.index, "xid": xid})

    def _xid_health(self, device: _Device) -> GpuHealth | None:
        if device.last_xid is None:
            return None
        return GpuHealth(
            xid_counts=tuple(XidCount(x, n) for x, n in sorted(device.xid_counts.items())),
            last_xid=device.last_xid, last_xid_time=device.last_xid_time)

    def _health(self, device: _Device, calls: _Calls) -> GpuHealth | None:
        """ECC, retired pages, remapped rows, NVLink and PCIe errors, clock-event reasons."""
        if calls.lost:
            return None
        nvml, handle = self.nvml, device.handle
        ecc = {}
        for kind, error_type in (("single_bit", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                                 ("double_bit", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            for counter, counter_type in (("volatile", nvml.NVML_VOLATILE_ECC),
                                          ("aggregate", nvml.NVML_AGGREGATE_ECC)):
                ecc[kind, counter] = calls.optional(
                    f"nvmlDeviceGetTotalEccErrors({kind}, {counter})",
                    nvml.nvmlDeviceGetTotalEccErrors,
                    handle, error_type, counter_type)
        retired = {
            cause: calls.optional(f"nvmlDeviceGetRetiredPages({cause})",
                                  nvml.nvmlDeviceGetRetiredPages, handle, code)
            for cause, code in (
                ("single_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                ("double_bit", nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))}
        retired_pending = calls.optional("nvmlDeviceGetRetiredPagesPendingStatus",
                                         nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        rows = calls.optional("nvmlDeviceGetRemappedRows", nvml.nvmlDeviceGetRemappedRows, handle)
        nvlink = self._nvlink_errors(device, calls)
        replay = calls.optional("nvmlDeviceGetPcieReplayCounter",
                                nvml.nvmlDeviceGetPcieReplayCounter, handle)
        reasons = self._clock_event_reasons(device, calls)
        xids = self._xid_health(device) or GpuHealth()
        return GpuHealth(
            xid_counts=xids.xid_counts, last_xid=xids.last_xid, last_xid_time=xids.last_xid_time,
            ecc_single_bit_volatile=_int(ecc["single_bit", "volatile"]),
            ecc_double_bit_volatile=_int(ecc["double_bit", "volatile"]),
            ecc_single_bit_aggregate=_int(ecc["single_bit", "aggregate"]),
            ecc_double_bit_aggregate=_int(ecc["double_bit", "aggregate"]),
            retired_pages_single_bit=None if retired["single_bit"] is None
            else len(retired["single_bit"]),
            retired_pages_double_bit=None if retired["double_bit"] is None
            else len(retired["double_bit"]),
            retired_pages_pending=None if retired_pending is None
            else retired_pending == nvml.NVML_FEATURE_ENABLED,
            remapped_rows_correctable=None if rows is None else int(rows[0]),
            remapped_rows_uncorrectable=None if rows is None else int(rows[1]),
            remapped_rows_pending=None if rows is None else bool(rows[2]),
            remapped_rows_failure=None if rows is None else bool(rows[3]),
            nvlink_crc_flit_errors=nvlink.get("crc_flit"),
            nvlink_crc_data_errors=nvlink.get("crc_data"),
            nvlink_replay_errors=nvlink.get("replay"),
            nvlink_recovery_errors=nvlink.get("recovery"),
            pcie_replay_errors=_int(replay),
            clock_event_reasons=_int(reasons),
        )

    def _nvlink_errors(self, device: _Device, calls: _Calls) -> dict[str, int]:
        """NVLink error counters summed over the links: the driver's all-link totals in one
        field-values call, else one nvmlDeviceGetNvLinkErrorCounter per link and counter."""
        if not device.nvlink_links or calls.lost:
            return {}
        nvml = self.nvml
        totals = {"crc_flit": nvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                  "crc_data": nvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
                  "replay": nvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
                  "recovery": nvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL}
        found: dict[str, int] = {}
        if device.nvlink_error_totals:
            values = calls.optional("nvmlDeviceGetFieldValues(nvlink errors)",
                                    nvml.nvmlDeviceGetFieldValues, device.handle,
                                    list(totals.values()))
            by_field = {v.fieldId: v for v in values or ()}
            for name, field_id in totals.items():
                value = by_field.get(field_id)
                if value is not None and value.nvmlReturn == nvml.NVML_SUCCESS:
                    found[name] = int(_field_value(nvml, value))
            if found or values is None:
                return found
            device.nvlink_error_totals = False  # every total NotSupported: count per link
        counters = {"crc_flit": nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
                    "crc_data": nvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
                    "replay": nvml.NVML_NVLINK_ERROR_DL_REPLAY,
                    "recovery": nvml.NVML_NVLINK_ERROR_DL_RECOVERY}
        for name, counter in counters.items():
            for link in device.nvlink_links:
                if calls.lost:
                    return {}
                try:
                    count = nvml.nvmlDeviceGetNvLinkErrorCounter(device.handle, link, counter)
                except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                    continue  # this link (inactive, or not this counter): the others still count
                except nvml.NVMLError as exc:
                    calls.failed("nvmlDeviceGetNvLinkErrorCounter", exc, optional=True)
                    continue
                found[name] = found.get(name, 0) + int(count)
        return found

    def _clock_event_reasons(self, device: _Device, calls: _Calls) -> Any:
        """The reason mask: the current name, else the one older drivers and bindings have."""
        nvml = self.nvml
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        if hasattr(nvml, name) and name not in device.unsupported:
            mask = calls.optional(name, getattr(nvml, name), device.handle)
            if mask is not None or name not in device.unsupported:
                return mask
        return calls.optional("nvmlDeviceGetCurrentClocksThrottleReasons",
                              nvml.nvmlDeviceGetCurrentClocksThrottleReasons, device.handle)

    # --- issue 16: performance ------------------------------------------------------------

    def _performance(self, device: _Device, calls: _Calls, memory_bandwidth: float | None,
                     mig_enabled: bool) -> GpuPerformance | None:
        if calls.lost:
            return None
        nvml, handle = self.nvml, device.handle
        domains = (("sm", nvml.NVML_CLOCK_SM), ("memory", nvml.NVML_CLOCK_MEM),
                   ("graphics", nvml.NVML_CLOCK_GRAPHICS))
        clocks = {name: calls.optional(f"nvmlDeviceGetClockInfo({name})",
                                       nvml.nvmlDeviceGetClockInfo, handle, domain)
                  for name, domain in domains}
        for name, domain in domains:  # maximum clocks do not change: read once each
            if name not in device.max_clocks:
                value = calls.optional(f"nvmlDeviceGetMaxClockInfo({name})",
                                       nvml.nvmlDeviceGetMaxClockInfo, handle, domain)
                if value is not None:
                    device.max_clocks[name] = float(value) * MHZ
        fan = calls.optional("nvmlDeviceGetFanSpeed", nvml.nvmlDeviceGetFanSpeed, handle)
        pstate = calls.optional("nvmlDeviceGetPerformanceState",
                                nvml.nvmlDeviceGetPerformanceState, handle)
        generation = calls.optional("nvmlDeviceGetCurrPcieLinkGeneration",
                                    nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle)
        width = calls.optional("nvmlDeviceGetCurrPcieLinkWidth",
                               nvml.nvmlDeviceGetCurrPcieLinkWidth, handle)
        # each of these two samples for 20 ms inside the driver: the GPU's worker pays it
        tx = calls.optional("nvmlDeviceGetPcieThroughput(tx)", nvml.nvmlDeviceGetPcieThroughput,
                            handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = calls.optional("nvmlDeviceGetPcieThroughput(rx)", nvml.nvmlDeviceGetPcieThroughput,
                            handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        encoder = calls.optional("nvmlDeviceGetEncoderUtilization",
                                 nvml.nvmlDeviceGetEncoderUtilization, handle)
        decoder = calls.optional("nvmlDeviceGetDecoderUtilization",
                                 nvml.nvmlDeviceGetDecoderUtilization, handle)
        memory_temperature = self._memory_temperature(device, calls)
        gpm = {} if mig_enabled else self._gpm(device, calls)
        return GpuPerformance(
            sm_clock_hertz=_mhz(clocks["sm"]),
            memory_clock_hertz=_mhz(clocks["memory"]),
            graphics_clock_hertz=_mhz(clocks["graphics"]),
            sm_clock_max_hertz=device.max_clocks.get("sm"),
            memory_clock_max_hertz=device.max_clocks.get("memory"),
            graphics_clock_max_hertz=device.max_clocks.get("graphics"),
            memory_temperature_celsius=memory_temperature,
            fan_speed_ratio=None if fan is None else fan / 100.0,
            # NVML_PSTATE_UNKNOWN (32) is no P-state
            performance_state=pstate if pstate is not None and 0 <= pstate <= 15 else None,
            pcie_link_generation=_int(generation),
            pcie_link_width=_int(width),
            pcie_transmit_bytes_per_second=None if tx is None else float(tx) * KIB,
            pcie_receive_bytes_per_second=None if rx is None else float(rx) * KIB,
            encoder_utilization_ratio=None if encoder is None else encoder[0] / 100.0,
            decoder_utilization_ratio=None if decoder is None else decoder[0] / 100.0,
            memory_bandwidth_utilization_ratio=memory_bandwidth,
            graphics_engine_active_ratio=gpm.get(nvml.NVML_GPM_METRIC_GRAPHICS_UTIL),
            sm_active_ratio=gpm.get(nvml.NVML_GPM_METRIC_SM_UTIL),
            sm_occupancy_ratio=gpm.get(nvml.NVML_GPM_METRIC_SM_OCCUPANCY),
            tensor_active_ratio=gpm.get(nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
            dram_active_ratio=gpm.get(nvml.NVML_GPM_METRIC_DRAM_BW_UTIL),
        )

    def _memory_temperature(self, device: _Device, calls: _Calls) -> float | None:
        nvml = self.nvml
        values = calls.optional("nvmlDeviceGetFieldValues(memory temperature)",
                                nvml.nvmlDeviceGetFieldValues, device.handle,
                                [nvml.NVML_FI_DEV_MEMORY_TEMP])
        if not values:
            return None
        (value,) = values
        if value.nvmlReturn == nvml.NVML_SUCCESS:
            return _field_value(nvml, value)
        if value.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED:
            device.unsupported.add("nvmlDeviceGetFieldValues(memory temperature)")
        else:
            calls.failed("nvmlDeviceGetFieldValues(memory temperature)",
                         nvml.NVMLError(value.nvmlReturn), optional=True)
        return None

    def _gpm(self, device: _Device, calls: _Calls) -> dict[int, float]:
        """GPM activity over the last collection interval: this read's sample against the
        previous one, both kept on the GPU's worker. Empty on the first read and without GPM."""
        nvml = self.nvml
        if not device.gpm_checked:
            device.gpm_checked = True
            query = getattr(nvml, "nvmlGpmQueryDeviceSupport", None)  # nvidia-ml-py >= 12.535
            if query is None:
                return {}
            support = calls.optional("nvmlGpmQueryDeviceSupport", query, device.handle)
            if support is None or not support.isSupportedDevice:
                return {}
            previous = calls.optional("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
            current = calls.optional("nvmlGpmSampleAlloc", nvml.nvmlGpmSampleAlloc)
            if previous is None or current is None:
                return {}
            device.gpm_samples = [previous, current]
        if device.gpm_samples is None or calls.lost:
            return {}
        previous, current = device.gpm_samples
        if calls.optional("nvmlGpmSampleGet", nvml.nvmlGpmSampleGet, device.handle,
                          current) is None:
            device.gpm_previous = False  # a gap: the next pair must not span it
            return {}
        device.gpm_samples = [current, previous]  # this sample is the next read's previous
        if not device.gpm_previous:
            device.gpm_previous = True
            return {}
        wanted = (nvml.NVML_GPM_METRIC_GRAPHICS_UTIL, nvml.NVML_GPM_METRIC_SM_UTIL,
                  nvml.NVML_GPM_METRIC_SM_OCCUPANCY, nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                  nvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1, request.sample2 = previous, current
        for slot, metric in enumerate(wanted):
            request.metrics[slot].metricId = metric
        result = calls.optional("nvmlGpmMetricsGet", nvml.nvmlGpmMetricsGet, request)
        if result is None:
            return {}
        out = {}
        for slot in range(len(wanted)):
            metric = result.metrics[slot]
            if metric.nvmlReturn == nvml.NVML_SUCCESS:
                # percent; clamp: a ratio outside 0-1 is a driver rounding artefact
                out[int(metric.metricId)] = min(1.0, max(0.0, float(metric.value) / 100.0))
        return out


class _Calls:
    """Runs NVML calls for one GPU: NotSupported → absent, GpuIsLost stops the rest.

    :meth:`run` is a core read (its failure sets ``up`` to 0); :meth:`optional` an issue-16
    read, whose NotSupported is remembered in ``unsupported`` so it is not asked again.
    """

    def __init__(self, nvml: Any, gpu: int, unsupported: set[str] | None = None) -> None:
        self.nvml = nvml
        self.gpu = gpu
        self.errors: list[CallError] = []
        self.lost = False
        self.unsupported = set() if unsupported is None else unsupported

    def optional(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.lost or name in self.unsupported:
            return None
        try:
            return fn(*args)
        except (self.nvml.NVMLError_NotSupported, self.nvml.NVMLError_FunctionNotFound):
            self.unsupported.add(name)
            return None
        except self.nvml.NVMLError as exc:
            self.failed(name, exc, optional=True)
            return None

    def run(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.lost:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError_NotSupported:
            return None
        except self.nvml.NVMLError as exc:
            self.failed(name, exc)
            return None

    def failed(self, name: str, exc: BaseException, optional: bool = False) -> None:
        if isinstance(exc, self.nvml.NVMLError_GpuIsLost):
            self.lost = True
            optional = False  # a lost GPU is down whichever read found it
        self.errors.append(CallError(self.gpu, name, f"{type(exc).__name__}: {exc}", optional))


def _instance(process: Any) -> int | None:
    """A listed process's MIG GPU instance; None without MIG (NVML writes 0xFFFFFFFF)."""
    instance = getattr(process, "gpuInstanceId", None)
    return None if instance is None or instance >= 0xFFFFFFFF else int(instance)


def _stale(gpu: Gpu) -> Gpu:
    return dataclasses.replace(gpu, stale=True)


def mig_profile(name: str) -> str:
    """"NVIDIA A100-SXM4-80GB MIG 1g.10gb" → "1g.10gb" (NVML names MIG devices so)."""
    match = _MIG_PROFILE.search(name)
    return match.group(1) if match else "unknown"


def _field_value(nvml: Any, value: Any) -> float:
    kind = value.valueType
    union = value.value
    if kind == nvml.NVML_VALUE_TYPE_DOUBLE:
        return float(union.dVal)
    if kind == nvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(union.uiVal)
    if kind == nvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(union.ulVal)
    if kind == nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(union.sllVal)
    if kind == nvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(union.siVal)
    if kind == nvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return float(union.usVal)
    return float(union.ullVal)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _optional_text(nvml: Any, fn: Callable[..., Any], *args: Any) -> str | None:
    """An identity string read once at start (VBIOS, serial); None where NVML has none."""
    try:
        text = _text(fn(*args)).strip()
    except nvml.NVMLError:
        return None
    return text[:128] or None  # bounded: it becomes a label value


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _mhz(value: Any) -> float | None:
    return None if value is None else float(value) * MHZ


def load_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise SourceStartupError(
            "the nvml source needs nvidia-ml-py: pip install nvidia-ml-py") from None
    return pynvml


def build(config: NvmlConfig, clock: Clock, nvml: Any = None) -> NvmlGpuSource:
    from exporter.sources.gpu_models import catalogue_resolver

    pods = None
    if config.pod_resources:
        try:
            from exporter.sources.nvml import pods as kubelet_pods
        except ImportError as exc:  # grpcio or protobuf: gpufleet[podresources]
            module = "google.protobuf" if "google" in str(exc.name) else "grpc"
            raise SourceStartupError(missing(module, "sources.nvml.pod_resources")) from None

        pods = kubelet_pods.build(config.pod_resources_socket, config.pod_resources_timeout,
                                  config.pod_resources_stale_for, clock)
    source = NvmlGpuSource(
        nvml=nvml if nvml is not None else load_pynvml(),
        node=config.node or socket.gethostname(),
        pool=config.pool,
        call_timeout=config.call_timeout,
        export_serial=config.export_serial,
        resolve_model=catalogue_resolver(),
        clock=clock,
        pods=pods,
        owners=ProcessOwners(Path(config.proc_root), Path(config.kubelet_log_root) / "pods",
                             Path(config.kubelet_log_root) / "containers")
        if config.processes else None,
        process_cap=config.processes_per_gpu,
        process_interval=config.processes_interval,
    )
    source.start()
    return source
