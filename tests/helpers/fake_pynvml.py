"""A fake ``pynvml`` for tests on machines without a GPU.

It behaves like nvidia-ml-py at its function boundary:

- the same function names and signatures as ``pynvml`` (a test checks the names);
- pynvml's real error classes, raised the way pynvml raises them
  (``pynvml.NVMLError(code)`` maps to ``NVMLError_GpuIsLost`` etc.), and its
  real constants (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX``, ...);
- pynvml's real ctypes structs (``c_nvmlMemory_t``, ``c_nvmlMemory_v2_t``,
  ``c_nvmlUtilization_t``, ``c_nvmlFieldValue_t`` with ``nvmlReturn`` and
  ``value.ullVal``, ``nvmlPciInfo_t`` with a bytes ``busId``);
- NVML's units: mW, mJ, bytes, per-link KiB counters, percent.

Scenarios: MIG devices behind MIG handles, a GPU lost at run time, functions
that answer NOT_SUPPORTED, per-call failures, a driver without the v2 memory
or the TemperatureV entry points, and calls that wedge until released.

Issue 16: health and performance reads with NVML's structs and units (ECC
counts, retired-page address lists, the remapped-rows 4-tuple, NVLink error
counters per link and their all-link total fields, the clock-event reason
mask, MHz clocks, KB/s PCIe throughput, percent fan and engine utilisation,
GPM samples and ``c_nvmlGpmMetricsGet_t``), an XID injected through an event
set (:meth:`FakeNvml.inject_xid`; ``nvmlEventSetWait_v2`` raises
``NVMLError_Timeout`` when none is queued), and a driver without
``nvmlDeviceGetCurrentClocksEventReasons``.
Processes: a GPU's running compute and graphics processes (:class:`FakeProcess`) come back as
pynvml's own objects: ``nvmlStructToFriendlyObject`` of ``c_nvmlProcessInfo_v2_t`` (the v3
layout is the same struct), ``usedGpuMemory`` None where NVML says NVML_VALUE_NOT_AVAILABLE,
``gpuInstanceId`` 0xFFFFFFFF without MIG; the process-utilisation samples as
``c_nvmlProcessUtilizationSample_t`` (``nvmlDeviceGetProcessUtilization``) and
``c_nvmlProcessUtilizationInfo_v1_t`` (``nvmlDeviceGetProcessesUtilizationInfo``), stamped in
microseconds, ``NVMLError_NotFound`` when no sample is newer than the timestamp asked, and
``NVMLError_NotSupported`` under MIG. Older drivers: ``process_v3=False`` (no ``_v3`` entry
points: FunctionNotFound, as pynvml raises for a missing symbol) and
``processes_utilization_info=False`` (before 550).
It is passed to the NVML source as its ``nvml`` module; nothing is patched.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

GIB = 1024**3


@dataclass
class FakeMig:
    gpu_instance_id: int
    profile: str  # e.g. "1g.10gb"
    memory_total: int  # bytes
    memory_used: int  # bytes


@dataclass
class FakeProcess:
    pid: int
    memory_used: int | None = 0  # bytes; None: NVML_VALUE_NOT_AVAILABLE
    sm_percent: int = 0  # the driver's per-process SM sample
    memory_percent: int = 0
    graphics: bool = False  # listed by ...GraphicsRunningProcesses instead of ...Compute...
    gpu_instance: int | None = None  # the MIG GPU instance it runs in


NOT_AVAILABLE = 0xFFFFFFFF  # what NVML writes in gpuInstanceId without MIG


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:18:00.0"
    utilization: int = 0  # percent
    memory_total: int = 80 * GIB  # bytes
    memory_reserved: int = 512 * 1024**2
    memory_used: int = 0  # bytes, reserved excluded (v2 semantics)
    temperature: int = 30  # Celsius
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    energy_mj: int = 0
    nvlink_tx_kib: list[int] = field(default_factory=list)  # one counter per link
    nvlink_rx_kib: list[int] = field(default_factory=list)
    unsupported_links: set[int] = field(default_factory=set)  # links answering NOT_SUPPORTED
    mig: list[FakeMig] | None = None  # None: MIG disabled
    lost: bool = False
    not_supported: set[str] = field(default_factory=set)  # function names
    failing: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    # issue 16: identity, health and performance, in NVML's units
    vbios: str = "96.00.99.00.01"
    serial: str = "1654923012345"
    utilization_memory: int = 0  # percent (utilization.memory)
    xid_events: bool = True  # False: registering for XID events answers NOT_SUPPORTED
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter) -> n
    retired_pages: dict[int, list[int]] | None = None  # cause -> addresses; None: NOT_SUPPORTED
    retired_pending: bool = False
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure
    nvlink_errors: dict[int, list[int]] = field(default_factory=dict)  # counter -> per link
    nvlink_error_totals: bool = True  # False: a driver without the *_COUNT_TOTAL fields
    pcie_replay: int = 0
    clock_reasons: int = 0  # nvmlClocksEventReason* bits
    clocks_mhz: dict[int, int] = field(default_factory=lambda: {
        real.NVML_CLOCK_SM: 1980, real.NVML_CLOCK_MEM: 2619, real.NVML_CLOCK_GRAPHICS: 1980})
    max_clocks_mhz: dict[int, int] = field(default_factory=lambda: {
        real.NVML_CLOCK_SM: 1980, real.NVML_CLOCK_MEM: 2619, real.NVML_CLOCK_GRAPHICS: 1980})
    memory_temperature: int | None = 41  # Celsius; None: the field answers NOT_SUPPORTED
    fan_percent: int | None = None  # None: passively cooled, NOT_SUPPORTED
    pstate: int = 0
    pcie_generation: int = 5
    pcie_width: int = 16
    pcie_tx_kbs: int = 0  # KB/s
    pcie_rx_kbs: int = 0
    encoder: int = 0  # percent
    decoder: int = 0
    gpm: dict[int, float] | None = None  # NVML_GPM_METRIC_* -> percent; None: no GPM support
    processes: list[FakeProcess] = field(default_factory=list)
    sample_clock_us: int = 1_700_000_000_000_000  # the driver's sample clock, microseconds


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None  # index into FakeGpu.mig for a MIG device handle


def _raise(code: int) -> None:
    raise real.NVMLError(code)  # pynvml maps the code to its NVMLError_* subclass


class _EventSet:
    """What nvmlEventSetCreate hands out: the GPUs registered and the events queued."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # GPU index -> event type mask
        self.queue: collections.deque[tuple[int, int, int]] = collections.deque()
        self.freed = False


class FakeNvml:
    """Stands in for the ``pynvml`` module; unknown attributes come from the real one."""

    def __init__(self, gpus: list[FakeGpu], *, driver_version: str = "550.54.15",
                 library_present: bool = True, memory_v2: bool = True,
                 temperature_v: bool = True, clocks_event_reasons: bool = True,
                 process_v3: bool = True, processes_utilization_info: bool = True) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.library_present = library_present
        self.memory_v2 = memory_v2
        self.temperature_v = temperature_v
        self.initialised = 0
        self.calls: list[str] = []
        # (function name, GPU index) -> event the call waits on: a wedged driver call
        self.wedged: dict[tuple[str, int], threading.Event] = {}
        self._lock = threading.Lock()
        self.clocks_event_reasons = clocks_event_reasons
        self.process_v3 = process_v3
        self.processes_utilization_info = processes_utilization_info
        self.event_sets: list[_EventSet] = []
        self._gpm_samples: dict[int, Any] = {}  # address -> the struct, kept alive
        self._gpm_taken: dict[int, tuple[int, dict[int, float]]] = {}  # address -> GPU, values

    def __getattr__(self, name: str) -> Any:
        # constants, error classes and structs are pynvml's own; functions must be ours
        if name.startswith("nvml") and callable(getattr(real, name, None)) \
                and not name.startswith(("nvmlMemory_", "nvmlTemperature_")):
            raise AttributeError(f"the fake has no {name}; add it")
        return getattr(real, name)

    # --- plumbing ---------------------------------------------------------------------

    def _enter(self, function: str, handle: _Handle | None = None) -> FakeGpu | None:
        with self._lock:
            self.calls.append(function)
        if not self.initialised:
            _raise(real.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        event = self.wedged.get((function, handle.gpu))
        if event is not None:
            event.wait()
        gpu = self.gpus[handle.gpu]
        if gpu.lost:
            _raise(real.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.not_supported:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        if function in gpu.failing:
            _raise(gpu.failing[function])
        return gpu

    # --- library ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if not self.library_present:
            _raise(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            _raise(real.NVML_ERROR_GPU_IS_LOST)
        return _Handle(index)

    # --- identity ---------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._enter("nvmlDeviceGetUUID", handle)
        if handle.mig is not None:
            return f"MIG-{gpu.uuid[4:]}-{handle.mig}"
        return gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        gpu = self._enter("nvmlDeviceGetName", handle)
        if handle.mig is not None:
            return f"{gpu.name} MIG {gpu.mig[handle.mig].profile}"
        return gpu.name

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> real.nvmlPciInfo_t:
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        info = real.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id.encode()
        return info

    # --- telemetry --------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> real.c_nvmlUtilization_t:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        if handle.mig is not None or gpu.mig is not None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)  # NVML has no utilization under MIG
        return real.c_nvmlUtilization_t(gpu=gpu.utilization, memory=gpu.utilization_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig is not None:
            mig = gpu.mig[handle.mig]
            total, reserved, used = mig.memory_total, 0, mig.memory_used
        else:
            total, reserved, used = gpu.memory_total, gpu.memory_reserved, gpu.memory_used
        free = total - reserved - used
        if not version:
            # v1: "used" includes what the driver reserved
            return real.c_nvmlMemory_t(total=total, free=free, used=used + reserved)
        if not self.memory_v2:
            _raise(real.NVML_ERROR_FUNCTION_NOT_FOUND)  # no nvmlDeviceGetMemoryInfo_v2 symbol
        if version != real.nvmlMemory_v2:
            _raise(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return real.c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved,
                                      free=free, used=used)

    def nvmlDeviceGetTemperatureV(self, handle: _Handle, sensor: int,
                                  version: int = real.nvmlTemperature_v1) -> int:
        gpu = self._enter("nvmlDeviceGetTemperatureV", handle)
        if not self.temperature_v:
            _raise(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if sensor != real.NVML_TEMPERATURE_GPU or version != real.nvmlTemperature_v1:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        gpu = self._enter("nvmlDeviceGetTemperature", handle)
        if sensor != real.NVML_TEMPERATURE_GPU:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetFieldValues(self, handle: _Handle, fieldIds: list[Any]) -> Any:
        gpu = self._enter("nvmlDeviceGetFieldValues", handle)
        values = (real.c_nvmlFieldValue_t * len(fieldIds))()
        for value, wanted in zip(values, fieldIds, strict=True):
            field_id, scope = wanted if isinstance(wanted, tuple) else (wanted, 0)
            value.fieldId, value.scopeId = field_id, scope
            value.nvmlReturn = real.NVML_SUCCESS
            links = len(gpu.nvlink_tx_kib)
            if field_id == real.NVML_FI_DEV_NVLINK_LINK_COUNT and links:
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = links
            elif field_id in (real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                              real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) \
                    and scope < links and scope not in gpu.unsupported_links:
                transmit = field_id == real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                counters = gpu.nvlink_tx_kib if transmit else gpu.nvlink_rx_kib
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = counters[scope]
            elif field_id == real.NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature is not None:
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.memory_temperature
            elif field_id in _NVLINK_ERROR_TOTALS and links and gpu.nvlink_error_totals:
                counts = gpu.nvlink_errors.get(_NVLINK_ERROR_TOTALS[field_id], [])
                value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = sum(count for link, count in enumerate(counts[:links])
                                         if link not in gpu.unsupported_links)
            else:
                value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._enter("nvmlDeviceGetNvLinkState", handle)
        if link >= len(gpu.nvlink_tx_kib):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return real.NVML_FEATURE_ENABLED

    # --- MIG --------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._enter("nvmlDeviceGetMigMode", handle)
        mode = real.NVML_DEVICE_MIG_ENABLE if gpu.mig is not None else real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if gpu.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if gpu.mig is None or index >= 7:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig):
            _raise(real.NVML_ERROR_NOT_FOUND)  # an empty slot
        return _Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig is None:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.mig[handle.mig].gpu_instance_id

    # --- issue 16: identity -----------------------------------------------------------

    def nvmlDeviceGetVbiosVersion(self, handle: _Handle) -> str:
        return self._enter("nvmlDeviceGetVbiosVersion", handle).vbios

    def nvmlDeviceGetSerial(self, handle: _Handle) -> str:
        return self._enter("nvmlDeviceGetSerial", handle).serial

    # --- issue 16: XID events ---------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        events = _EventSet()
        with self._lock:
            self.event_sets.append(events)
        return events

    def nvmlDeviceRegisterEvents(self, handle: _Handle, eventTypes: int, eventSet: _EventSet) -> None:
        gpu = self._enter("nvmlDeviceRegisterEvents", handle)
        if not gpu.xid_events:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        eventSet.registered[handle.gpu] = eventSet.registered.get(handle.gpu, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: _EventSet, timeoutms: int) -> real.c_nvmlEventData_t:
        self._enter("nvmlEventSetWait_v2")
        if eventSet.freed:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            if not eventSet.queue:
                _raise(real.NVML_ERROR_TIMEOUT)  # the real call waits timeoutms first
            _gpu, event_type, data = eventSet.queue.popleft()
        return real.c_nvmlEventData_t(eventType=event_type, eventData=data)

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        eventSet.freed = True

    def inject_xid(self, gpu: int, xid: int) -> int:
        """The driver reports an XID on ``gpu``: queued on every set registered for it.
        Returns how many sets received it (0: nobody listens)."""
        delivered = 0
        with self._lock:
            for events in self.event_sets:
                if not events.freed and \
                        events.registered.get(gpu, 0) & real.nvmlEventTypeXidCriticalError:
                    events.queue.append((gpu, real.nvmlEventTypeXidCriticalError, xid))
                    delivered += 1
        return delivered

    # --- issue 16: health -------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int, counterType: int) -> int:
        gpu = self._enter("nvmlDeviceGetTotalEccErrors", handle)
        if errorType not in (real.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                             real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED) \
                or counterType not in (real.NVML_VOLATILE_ECC, real.NVML_AGGREGATE_ECC):
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetRetiredPages(self, device: _Handle, sourceFilter: int) -> list[int]:
        gpu = self._enter("nvmlDeviceGetRetiredPages", device)
        if gpu.retired_pages is None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)  # Ampere and later remap rows instead
        return list(gpu.retired_pages.get(sourceFilter, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetRetiredPagesPendingStatus", device)
        if gpu.retired_pages is None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return real.NVML_FEATURE_ENABLED if gpu.retired_pending else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, device: _Handle) -> tuple[int, int, int, int]:
        gpu = self._enter("nvmlDeviceGetRemappedRows", device)
        if gpu.remapped_rows is None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)  # before Ampere
        return gpu.remapped_rows

    def nvmlDeviceGetNvLinkErrorCounter(self, device: _Handle, link: int, counter: int) -> int:
        gpu = self._enter("nvmlDeviceGetNvLinkErrorCounter", device)
        if link >= len(gpu.nvlink_tx_kib) or counter >= real.NVML_NVLINK_ERROR_COUNT:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        if link in gpu.unsupported_links:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.nvlink_errors.get(counter, [0] * 64)[link]

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetPcieReplayCounter", handle).pcie_replay

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if not self.clocks_event_reasons:
            _raise(real.NVML_ERROR_FUNCTION_NOT_FOUND)  # a driver older than 535
        return gpu.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    # --- issue 16: performance --------------------------------------------------------

    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        gpu = self._enter("nvmlDeviceGetClockInfo", handle)
        if type not in gpu.clocks_mhz:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.clocks_mhz[type]

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, type: int) -> int:
        gpu = self._enter("nvmlDeviceGetMaxClockInfo", handle)
        if type not in gpu.max_clocks_mhz:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_clocks_mhz[type]

    def nvmlDeviceGetFanSpeed(self, handle: _Handle) -> int:
        gpu = self._enter("nvmlDeviceGetFanSpeed", handle)
        if gpu.fan_percent is None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.fan_percent

    def nvmlDeviceGetPerformanceState(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetPerformanceState", handle).pstate

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        return self._enter("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetPcieThroughput(self, device: _Handle, counter: int) -> int:
        gpu = self._enter("nvmlDeviceGetPcieThroughput", device)
        if counter == real.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kbs
        if counter == real.NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kbs
        _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    def nvmlDeviceGetEncoderUtilization(self, handle: _Handle) -> list[int]:
        return [self._enter("nvmlDeviceGetEncoderUtilization", handle).encoder, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, handle: _Handle) -> list[int]:
        return [self._enter("nvmlDeviceGetDecoderUtilization", handle).decoder, 167_000]

    # --- issue 16: GPM ----------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: _Handle) -> real.c_nvmlGpmSupport_t:
        gpu = self._enter("nvmlGpmQueryDeviceSupport", device)
        return real.c_nvmlGpmSupport_t(version=real.NVML_GPM_SUPPORT_VERSION,
                                       isSupportedDevice=int(gpu.gpm is not None))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        struct = real.struct_c_nvmlGpmSample_t()
        sample = real.c_nvmlGpmSample_t(struct)
        with self._lock:
            self._gpm_samples[ctypes.addressof(struct)] = struct
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            address = ctypes.addressof(gpmSample.contents)
            self._gpm_samples.pop(address, None)
            self._gpm_taken.pop(address, None)

    def nvmlGpmSampleGet(self, device: _Handle, gpmSample: Any) -> Any:
        gpu = self._enter("nvmlGpmSampleGet", device)
        if gpu.gpm is None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            self._gpm_taken[ctypes.addressof(gpmSample.contents)] = (device.gpu, dict(gpu.gpm))
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != real.NVML_GPM_METRICS_GET_VERSION:
            _raise(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        with self._lock:
            first = self._gpm_taken.get(ctypes.addressof(metricsGet.sample1.contents))
            second = self._gpm_taken.get(ctypes.addressof(metricsGet.sample2.contents))
        if first is None or second is None or first[0] != second[0] \
                or metricsGet.sample1.contents is metricsGet.sample2.contents:
            _raise(real.NVML_ERROR_INVALID_ARGUMENT)
        values = second[1]  # the activity of the interval ending at the second sample
        for slot in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[slot]
            if metric.metricId in values:
                metric.nvmlReturn = real.NVML_SUCCESS
                metric.value = values[metric.metricId]
            else:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    # --- processes ----------------------------------------------------------------------

    def _running(self, function: str, handle: _Handle, graphics: bool) -> list[Any]:
        gpu = self._enter(function, handle)
        if function.endswith("_v3") and not self.process_v3:
            _raise(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        mig = gpu.mig[handle.mig].gpu_instance_id if handle.mig is not None else None
        found = []
        for process in gpu.processes:
            if process.graphics != graphics or (mig is not None and process.gpu_instance != mig):
                continue
            memory = real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value \
                if process.memory_used is None else process.memory_used
            instance = NOT_AVAILABLE if process.gpu_instance is None else process.gpu_instance
            struct = real.c_nvmlProcessInfo_v2_t(pid=process.pid, usedGpuMemory=memory,
                                                 gpuInstanceId=instance,
                                                 computeInstanceId=0 if gpu.mig else NOT_AVAILABLE)
            obj = real.nvmlStructToFriendlyObject(struct)
            if obj.usedGpuMemory == real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
                obj.usedGpuMemory = None  # as pynvml does
            found.append(obj)
        return found

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: _Handle) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v3", handle, False)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v2", handle, False)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v3", handle, False)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: _Handle) -> list[Any]:
        return self._running("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, True)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        return self._running("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, True)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[Any]:
        return self._running("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, True)

    def _samples(self, function: str, handle: _Handle, timeStamp: int) -> tuple[FakeGpu, int]:
        gpu = self._enter(function, handle)
        if gpu.mig is not None or handle.mig is not None:
            _raise(real.NVML_ERROR_NOT_SUPPORTED)  # no per-process samples under MIG
        with self._lock:
            gpu.sample_clock_us += 1_000_000  # one new sample per process and read
            stamp = gpu.sample_clock_us
        if stamp <= timeStamp or not gpu.processes:
            _raise(real.NVML_ERROR_NOT_FOUND)  # nothing newer than asked: pynvml raises
        return gpu, stamp

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, timeStamp: int) -> list[Any]:
        gpu, stamp = self._samples("nvmlDeviceGetProcessUtilization", handle, timeStamp)
        return [real.c_nvmlProcessUtilizationSample_t(
            pid=p.pid, timeStamp=stamp, smUtil=p.sm_percent, memUtil=p.memory_percent,
            encUtil=0, decUtil=0) for p in gpu.processes]

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: _Handle, timeStamp: int) -> list[Any]:
        if not self.processes_utilization_info:
            self._enter("nvmlDeviceGetProcessesUtilizationInfo", handle)
            _raise(real.NVML_ERROR_FUNCTION_NOT_FOUND)  # a driver before 550
        gpu, stamp = self._samples("nvmlDeviceGetProcessesUtilizationInfo", handle, timeStamp)
        return [real.c_nvmlProcessUtilizationInfo_v1_t(
            timeStamp=stamp, pid=p.pid, smUtil=p.sm_percent, memUtil=p.memory_percent,
            encUtil=0, decUtil=0, jpgUtil=0, ofaUtil=0) for p in gpu.processes]


# NVLink error total fields -> the per-link counter they sum (as NVML sums them)
_NVLINK_ERROR_TOTALS = {
    real.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    real.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_CRC_DATA,
    real.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_REPLAY,
    real.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_RECOVERY,
}

FAKE_FUNCTIONS = sorted(n for n in vars(FakeNvml) if n.startswith("nvml"))


def node_launcher(prelude: str = "", first_arg: int = 2) -> str:
    """A ``python -c`` script for a node-mode process: ``prelude`` (after ``import
    importlib.util, sys``), then pynvml faked by this file, whose path is ``sys.argv[1]``,
    with eight GPUs, then gpufleet's CLI on ``sys.argv[first_arg:]``. The file is loaded by
    its path, not through the tests package: that imports pytest, and pytest numpy where it
    is installed."""
    return f"""
import importlib.util, sys
{prelude}
spec = importlib.util.spec_from_file_location("fake_pynvml", sys.argv[1])
fake = importlib.util.module_from_spec(spec)
sys.modules["fake_pynvml"] = fake
spec.loader.exec_module(fake)
gpus = [fake.FakeGpu(uuid=f"GPU-{{i:08d}}-0000-0000-0000-000000000000",
                     pci_bus_id=f"00000000:{{0x18 + i:02X}}:00.0", utilization=40, memory_used=2**34)
        for i in range(8)]
sys.modules["pynvml"] = fake.FakeNvml(gpus)
from exporter.cli import main
sys.exit(main(sys.argv[{first_arg}:]))
"""
