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
=================================  ==============================  ===========================

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
from types import ModuleType
from typing import Any

from exporter.snapshot import Gpu, MigInstance, Node
from exporter.sources import Clock, SourceReading, SourceStartupError
from exporter.sources.gpu_models import ModelInfo, ModelResolver, unknown_model
from exporter.sources.lastgood import LastGood
from exporter.sources.nvml_options import NvmlSource as NvmlConfig

log = logging.getLogger(__name__)

KIB = 1024
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


@dataclass(frozen=True, slots=True)
class DeviceReading:
    gpu: Gpu
    errors: tuple[CallError, ...]
    seconds: float  # cost of this GPU's NVML calls


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
    devices: list[_Device] = field(default_factory=list)
    last_readings: dict[int, DeviceReading] = field(default_factory=dict)
    # per GPU index: its last good sample, served stale while its calls are wedged
    last_good: LastGood[int, Gpu] = field(default_factory=lambda: LastGood(_stale))
    _started: bool = False

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
        return _Device(index, handle, uuid, product, pci, self.resolve_model(product),
                       self._nvlink_links(handle), worker)

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
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed", extra={"err": str(exc)})
        self._started = False

    async def close(self) -> None:
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
        await _await_all(submitted, self.call_timeout)

        now = self.clock()
        gpus, fresh = [], 0
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

        models = [g.model for g in gpus]
        model = max(set(models), key=models.count) if models else "unknown"
        architecture = next((d.info.architecture for d in self.devices if d.info.model == model),
                            "unknown")
        node = Node(self.node, model, self.cpu_cores, self.pool, architecture, len(gpus))
        return SourceReading((node,), tuple(gpus), error="" if fresh else "no GPU answered in time")

    def _identity(self, device: _Device) -> Gpu:
        return Gpu(self.node, device.index, device.uuid, device.info.model, self.pool,
                   nvlink_capacity_bytes_per_second=device.info.nvlink_bandwidth_bytes_per_second,
                   pci_bus_id=device.pci_bus_id)

    def read_device(self, device: _Device) -> DeviceReading:
        """Every NVML read of one GPU, in base units. Blocking: runs on the GPU's worker."""
        started = time.perf_counter()
        identity = self._identity(device)
        if device.handle is None:
            error = CallError(device.index, "nvmlDeviceGetHandleByIndex", device.startup_error)
            return DeviceReading(dataclasses.replace(identity, up=False), (error,),
                                 time.perf_counter() - started)
        calls = _Calls(self.nvml, device.index)
        nvml, handle = self.nvml, device.handle

        mig_mode = calls.run("nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = bool(mig_mode) and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        utilization = None
        if not mig_enabled:
            rates = calls.run("nvmlDeviceGetUtilizationRates",
                              nvml.nvmlDeviceGetUtilizationRates, handle)
            utilization = None if rates is None else rates.gpu / 100.0
        memory = self._memory(device, calls, handle)
        temperature = self._temperature(device, calls)
        power = calls.run("nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, handle)
        limit = calls.run("nvmlDeviceGetEnforcedPowerLimit",
                          nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        energy = calls.run("nvmlDeviceGetTotalEnergyConsumption",
                           nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
        tx, rx = self._nvlink(device, calls)
        mig = self._mig_instances(device, calls) if mig_enabled else ()

        if calls.lost:
            gpu = dataclasses.replace(identity, up=False)
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
                up=not calls.errors,
            )
        return DeviceReading(gpu, tuple(calls.errors), time.perf_counter() - started)

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

    def _mig_instances(self, device: _Device, calls: _Calls) -> tuple[MigInstance, ...]:
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
            if instance_id is None or instance_id in instances:
                continue  # several compute instances share one GPU instance
            name = calls.run("nvmlDeviceGetName", nvml.nvmlDeviceGetName, mig)
            memory = calls.run("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, mig)
            instances[instance_id] = MigInstance(
                int(instance_id), mig_profile(_text(name or "")),
                None if memory is None else int(memory.total),
                None if memory is None else int(memory.used))
        return tuple(instances[i] for i in sorted(instances))


class _Calls:
    """Runs NVML calls for one GPU: NotSupported → absent, GpuIsLost stops the rest."""

    def __init__(self, nvml: Any, gpu: int) -> None:
        self.nvml = nvml
        self.gpu = gpu
        self.errors: list[CallError] = []
        self.lost = False

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

    def failed(self, name: str, exc: BaseException) -> None:
        if isinstance(exc, self.nvml.NVMLError_GpuIsLost):
            self.lost = True
        self.errors.append(CallError(self.gpu, name, f"{type(exc).__name__}: {exc}"))


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


def load_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise SourceStartupError(
            "the nvml source needs nvidia-ml-py: pip install nvidia-ml-py") from None
    return pynvml


def build(config: NvmlConfig, clock: Clock, nvml: Any = None) -> NvmlGpuSource:
    from exporter.sources.gpu_models import catalogue_resolver

    source = NvmlGpuSource(
        nvml=nvml if nvml is not None else load_pynvml(),
        node=config.node or socket.gethostname(),
        pool=config.pool,
        call_timeout=config.call_timeout,
        resolve_model=catalogue_resolver(),
        clock=clock,
    )
    source.start()
    return source
