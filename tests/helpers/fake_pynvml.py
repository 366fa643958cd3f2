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
It is passed to the NVML source as its ``nvml`` module; nothing is patched.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None  # index into FakeGpu.mig for a MIG device handle


def _raise(code: int) -> None:
    raise real.NVMLError(code)  # pynvml maps the code to its NVMLError_* subclass


class FakeNvml:
    """Stands in for the ``pynvml`` module; unknown attributes come from the real one."""

    def __init__(self, gpus: list[FakeGpu], *, driver_version: str = "550.54.15",
                 library_present: bool = True, memory_v2: bool = True,
                 temperature_v: bool = True) -> None:
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
        return real.c_nvmlUtilization_t(gpu=gpu.utilization, memory=0)

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


FAKE_FUNCTIONS = sorted(n for n in vars(FakeNvml) if n.startswith("nvml"))
