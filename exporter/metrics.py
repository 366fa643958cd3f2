"""The metric catalogue: every family gpufleet exports, as data, one record per family.

Each :class:`FamilySpec` gives a family's name, type, HELP text, unit and label
names, its kind, and for a per-GPU family the snapshot field its samples are read
from (``read``) and the legal values of that field (``bound``). The code that fills
any other family supplies only its samples, through ``spec.family(samples)`` (as
kube-state-metrics' ``FamilyGenerator``: name, help and type are data, only the
value extraction is code). Derived from these records, never written again: the
renderer's per-GPU table (``exporter/exposition/families.py``), the ``prometheus``
source's reverse map (``GPU_VALUES``), the snapshot bounds of ``POST /v1/plan``
(``exporter/advisor/bounds.py``) and ``docs/metrics.md``'s tables (``make
generate-docs``). PromQL written by code takes the name from here too
(:meth:`FamilySpec.selector`). Adding a family is a snapshot field, one entry here,
and the sources that fill it (docs/sources.md, "Adding a family").

A leaf module: it imports nothing from ``exporter``, so any layer may use it,
sources included.

The families are listed in the order ``/metrics`` serves them (a test checks it
against ``tests/golden/metrics.txt``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Labels = tuple[tuple[str, str], ...]
Pairs = Sequence[tuple[tuple[str, ...], float]]  # a GPU's (extra label values, value) of a labelled family

# The identity labels every per-GPU series carries, in the order the docs list them.
IDENTITY: tuple[str, ...] = ("node", "gpu", "uuid", "model", "pool")

# How a family's samples come from a snapshot (``FamilySpec.kind``):
# - "gpu": one series per GPU, the identity labels only; ``read`` names the Gpu field;
# - "gpu_labelled": per GPU with labels beyond identity; ``read`` is a tuple of :class:`Series`
#   (one field each) or a function of the Gpu giving (extra label values, value) pairs;
# - "gpu_joined": per GPU, joined with its node, its holders or its MIG instances
#   (exposition.gpu_snapshot_samples builds them);
# - "allocation": per (job, node) of the allocations;
# - "fleet": computed over the whole snapshot (nodes, pending jobs, sources, build), or by the
#   analyzer, the advisor and the load detector, which hand their samples to ``family()``.
Kind = Literal["gpu", "gpu_labelled", "gpu_joined", "allocation", "fleet"]

# Clock-event (throttle) reasons gpufleet exports (the ``reason`` values of
# gpufleet_gpu_clock_event_active), with NVML's bit in the reason mask
# (nvmlClocksEventReason* / nvmlClocksThrottleReason*; DCGM_FI_DEV_CLOCKS_EVENT_REASONS uses the
# same bits). GpuIdle, application clocks and display clocks are left out: they are settings or
# idleness, not a slowdown anyone pages on. exporter.snapshot re-exports it for the sources.
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("sw_power_cap", 0x04),
    ("hw_slowdown", 0x08),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
)
# the reasons counted as a slowdown (thermal or power brake): GpuClocksThrottled, the dashboards
# and the health verdicts' thermal signal
SLOWDOWN_REASONS = "hw_thermal|sw_thermal|hw_power_brake|hw_slowdown"


@dataclass(frozen=True, slots=True)
class Bound:
    """The legal values of the snapshot field(s) a per-GPU family reads: what ``POST /v1/plan``
    accepts there (exporter/advisor/bounds.py turns it into its check and JSON Schema)."""

    type: Literal["number", "integer", "boolean"]
    low: int | float = 0  # integers stay ints: 2**64 - 1 has no exact float
    high: int | float = 0
    optional: bool = True  # None (absent: the source could not read it) is legal


# Bounds shared by many families. Generous: they stop a posted snapshot from being absurd
# (a negative byte count, a ratio of 1e9), not a source from being slightly off.
FLAG = Bound("boolean", optional=False)  # Gpu.up, Gpu.stale: always known
OPTIONAL_FLAG = Bound("boolean")
BYTES = Bound("integer", 0, 2 ** 60)
RATE = Bound("number", 0, 1e15)  # watts, joules, bytes (counted or per second), hertz
RATIO = Bound("number", 0, 1e3)  # 0-1, with room for a source that reports percent by mistake
CELSIUS = Bound("number", -273.15, 1e4)
COUNT = Bound("integer", 0, 2 ** 64 - 1)  # driver counters (64-bit) and NVML's reason mask
UNIX_TIME = Bound("number", 0, 1e11)  # unix seconds, the year 5138


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a "gpu_labelled" family that reads one snapshot field of each GPU."""

    labels: tuple[str, ...]  # its extra label values, in the order ``spec.labels`` lists them
    path: str  # the field, as FamilySpec.read: "performance.sm_clock_hertz"
    bit: int = 0  # nonzero: the series is 1 while this bit of the field is set, else 0


@dataclass(frozen=True, slots=True)
class FromField:
    """The samples of a "gpu_labelled" family that a function makes of one field's value (a
    tuple of records: XID counts), or none while the field, or its part, is absent or empty."""

    path: str  # as FamilySpec.read
    samples: Callable[[Any], Pairs]


@dataclass(frozen=True, slots=True)
class OrCatalogue:
    """A "gpu" family's value: the GPU's field where it is set and not 0, else the GPU
    catalogue's ``spec`` attribute of its model (the renderer looks it up: this module
    imports nothing from exporter), absent where neither is known."""

    path: str  # as FamilySpec.read
    spec: str  # the attribute of exporter.gpu_catalogue.GpuSpec: "tdp_watts"


# What a per-GPU family reads from each Gpu: a field's path ("utilization_ratio",
# "performance.fan_speed_ratio", "health.last_xid": at most one part, the value absent when the
# part is None), its Series, a FromField, or a function of the whole Gpu.
Read = str | tuple[Series, ...] | FromField | OrCatalogue | Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family ready to render: samples are (labels, value)."""

    name: str  # full sample name, counters end in _total
    type: str  # gauge | counter
    help: str
    samples: Sequence[tuple[Labels, float]]


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """One family of the catalogue: everything about it but the code that fills a snapshot.

    ``family(samples)`` pairs it with a snapshot's values. A per-GPU family ("gpu" or
    "gpu_labelled") also says how its samples are read (``read``) and what its snapshot
    fields may hold (``bound``); the renderer's table, the prometheus source's reverse map,
    the bounds of ``POST /v1/plan`` and docs/metrics.md are all derived from these records.
    """

    name: str  # full sample name, counters end in _total
    type: Literal["gauge", "counter"]  # _info families are gauges that are always 1
    help: str  # the HELP line, exactly
    labels: tuple[str, ...]  # label names, in the order the docs list them (rendering sorts them)
    group: str  # the table of docs/metrics.md that lists it
    unit: str = ""  # the base unit the name ends in (before _total), if any
    doc: str = ""  # more for docs/metrics.md than HELP says: label values, when it is absent
    # Who produces it when node mode and cluster mode run side by side (docs/deploy.md), so
    # that one Prometheus holds one copy: "node" (read from the GPUs and nodes themselves),
    # "scheduler" (the scheduler's allocations and demand), "fleet" (computed by this
    # process: analysis, advisor, its own health). "" is "node" for a family with the GPU
    # identity labels, else "fleet". exposition.ExpositionOptions.serves applies it.
    origin: Literal["", "node", "scheduler", "fleet"] = ""
    kind: Kind = "fleet"
    read: Read = None  # per-GPU kinds: what each GPU gives it (see Read)
    bound: Bound | None = None  # the legal values of the fields ``read`` names

    @property
    def producer(self) -> Literal["node", "scheduler", "fleet"]:
        if self.origin:
            return self.origin
        return "node" if self.labels[:len(IDENTITY)] == IDENTITY else "fleet"

    @property
    def fields(self) -> tuple[str, ...]:
        """The snapshot fields (paths from the Gpu) ``read`` names; none for a function."""
        if isinstance(self.read, str):
            return (self.read,)
        if isinstance(self.read, FromField | OrCatalogue):
            return (self.read.path,)
        if isinstance(self.read, tuple):
            return tuple(dict.fromkeys(series.path for series in self.read))
        return ()

    @property
    def part(self) -> str | None:
        """The part of the Gpu ("health", "performance") every field of the family lies in, or
        None (top-level fields, or a function): a renderer may reuse the family's text for GPUs
        whose part is unchanged without reading a value."""
        parts = {path.partition(".")[0] if "." in path else None for path in self.fields}
        return parts.pop() if len(parts) == 1 else None

    def family(self, samples: Sequence[tuple[Labels, float]]) -> Family:
        return Family(self.name, self.type, self.help, samples)

    def selector(self, *matchers: str, **equal: str) -> str:
        """The PromQL selector of this family: ``selector(pool="a")`` is
        ``gpufleet_..{pool="a"}``; ``matchers`` are written as given (``'pool=~"$pool"'``).
        For the rule and dashboard generators, so that no PromQL spells a name by hand."""
        inner = [*matchers, *(f'{k}="{v}"' for k, v in equal.items())]
        return f"{self.name}{{{','.join(inner)}}}" if inner else self.name


def _gpu(name: str, kind: Literal["gauge", "counter"], help_text: str, unit: str = "",
         extra: tuple[str, ...] = (), doc: str = "",
         origin: Literal["", "node", "scheduler", "fleet"] = "", *, read: Read = None,
         bound: Bound | None = None, group: str = "gpu") -> FamilySpec:
    """A per-GPU family: the identity labels, then ``extra``. With ``read`` its samples are read
    from each GPU ("gpu" without ``extra``, else "gpu_labelled"); without, they are joined
    from several parts of the snapshot ("gpu_joined")."""
    family_kind: Kind = "gpu_joined" if read is None else "gpu_labelled" if extra else "gpu"
    return FamilySpec(name, kind, help_text, (*IDENTITY, *extra), group, unit, doc, origin,
                      family_kind, read, bound)


def _xid_samples(xid_counts: Sequence[Any]) -> Pairs:
    return [((str(x.xid),), float(x.count)) for x in xid_counts]


def _clocks(field: str) -> tuple[Series, ...]:
    """The series of each clock domain: performance.sm_<field> and so on."""
    return tuple(Series((clock,), f"performance.{clock}_{field}") for clock in ("sm", "memory", "graphics"))


# -- per GPU: values read from NVML, DCGM or the simulator ------------------------------------------
GPU_UP = _gpu(
    "gpufleet_gpu_up", "gauge",
    "1 if the GPU answered its last read, 0 if it is lost or every read failed.",
    read="up", bound=FLAG)
GPU_STALE = _gpu(
    "gpufleet_gpu_stale", "gauge",
    "1 if the values served are the last good sample because the source failed.",
    read="stale", bound=FLAG)
GPU_UTILIZATION_RATIO = _gpu(
    "gpufleet_gpu_utilization_ratio", "gauge",
    "Fraction of time a kernel ran on the GPU (0-1).", "ratio",
    read="utilization_ratio", bound=RATIO)
GPU_MEMORY_USED_BYTES = _gpu(
    "gpufleet_gpu_memory_used_bytes", "gauge",
    "GPU framebuffer memory in use, in bytes (reserved memory excluded).", "bytes",
    read="memory_used_bytes", bound=BYTES)
GPU_MEMORY_TOTAL_BYTES = _gpu(
    "gpufleet_gpu_memory_total_bytes", "gauge",
    "GPU framebuffer memory in total, in bytes.", "bytes",
    read="memory_total_bytes", bound=BYTES)
def _memory_used_ratio(gpu: Any) -> float | None:
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    return used / total if used is not None and total else None


GPU_MEMORY_USED_RATIO = _gpu(
    "gpufleet_gpu_memory_used_ratio", "gauge",
    "GPU framebuffer memory in use as a fraction of its total (0-1).", "ratio",
    doc="Memory used over memory total, as this process read them: a gauge, so that alerts "
        "and dashboards compare it without a recording rule dividing 10,880 series by 10,880 "
        "more every interval. Absent where either is unknown or the total is 0.",
    read=_memory_used_ratio, bound=RATIO)
GPU_TEMPERATURE_CELSIUS = _gpu(
    "gpufleet_gpu_temperature_celsius", "gauge",
    "GPU core temperature in degrees Celsius.", "celsius",
    read="temperature_celsius", bound=CELSIUS)
GPU_POWER_WATTS = _gpu(
    "gpufleet_gpu_power_watts", "gauge",
    "GPU power draw in watts.", "watts",
    read="power_watts", bound=RATE)
GPU_POWER_LIMIT_WATTS = _gpu(
    "gpufleet_gpu_power_limit_watts", "gauge",
    "Enforced GPU power limit (cap) in watts.", "watts",
    read="power_limit_watts", bound=RATE)
GPU_POWER_LIMIT_EFFECTIVE_WATTS = _gpu(
    "gpufleet_gpu_power_limit_effective_watts", "gauge",
    "The power limit the GPU is held to: its enforced limit, or its model's catalogue TDP "
    "where it reports none.", "watts",
    doc="What GpuPowerHigh's fractions are of. Absent where the GPU reports no limit and "
        "the catalogue has no TDP for its model.",
    read=OrCatalogue("power_limit_watts", "tdp_watts"), bound=RATE)
GPU_ENERGY_JOULES_TOTAL = _gpu(
    "gpufleet_gpu_energy_joules_total", "counter",
    "Energy the GPU consumed since the driver loaded, in joules.", "joules",
    read="energy_joules", bound=RATE)
GPU_NVLINK_TRANSMIT_BYTES_TOTAL = _gpu(
    "gpufleet_gpu_nvlink_transmit_bytes_total", "counter",
    "Bytes the GPU sent over all its NVLink links.", "bytes",
    read="nvlink_transmit_bytes", bound=RATE)
GPU_NVLINK_RECEIVE_BYTES_TOTAL = _gpu(
    "gpufleet_gpu_nvlink_receive_bytes_total", "counter",
    "Bytes the GPU received over all its NVLink links.", "bytes",
    read="nvlink_receive_bytes", bound=RATE)
GPU_NVLINK_CAPACITY_BYTES_PER_SECOND = _gpu(
    "gpufleet_gpu_nvlink_capacity_bytes_per_second", "gauge",
    "NVLink bandwidth of the GPU, both directions together, from the GPU catalogue.",
    "bytes_per_second", doc="Absent without NVLink.",
    read="nvlink_capacity_bytes_per_second", bound=RATE)
GPU_DCGM_NVLINK_BANDWIDTH_RAW = _gpu(
    "gpufleet_gpu_dcgm_nvlink_bandwidth_raw", "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as reported: a rate of uncertain unit "
    "(see docs/sources.md); dcgm source only.",
    doc="Declared a counter by dcgm-exporter, it behaves as a rate of disputed unit "
        "(KB/s or MiB/s); for comparison only, never summed into the NVLink byte counters.",
    read="dcgm_nvlink_bandwidth_raw", bound=RATE, group="dcgm")

# -- per GPU: performance (issue 16, Build 2): NVML, DCGM or the simulator -------------------------
_ABSENT = "Absent where the GPU or source does not report it."
GPU_CLOCK_HERTZ = _gpu(
    "gpufleet_gpu_clock_hertz", "gauge",
    "Current GPU clock in hertz, by clock domain.", "hertz", extra=("clock",),
    doc="`clock` is `sm`, `memory` or `graphics`; NVML and DCGM report MHz, converted.",
    read=_clocks("clock_hertz"), bound=RATE)
GPU_CLOCK_MAX_HERTZ = _gpu(
    "gpufleet_gpu_clock_max_hertz", "gauge",
    "Maximum GPU clock in hertz, by clock domain.", "hertz", extra=("clock",),
    doc="`clock` as for `gpufleet_gpu_clock_hertz`.",
    read=_clocks("clock_max_hertz"), bound=RATE)
GPU_MEMORY_TEMPERATURE_CELSIUS = _gpu(
    "gpufleet_gpu_memory_temperature_celsius", "gauge",
    "GPU memory (HBM) temperature in degrees Celsius.", "celsius", doc=_ABSENT,
    read="performance.memory_temperature_celsius", bound=CELSIUS)
GPU_FAN_SPEED_RATIO = _gpu(
    "gpufleet_gpu_fan_speed_ratio", "gauge",
    "GPU fan speed as a fraction of its maximum (0-1).", "ratio",
    doc="Absent on passively cooled boards (most data-centre GPUs).",
    read="performance.fan_speed_ratio", bound=RATIO)
GPU_PERFORMANCE_STATE = _gpu(
    "gpufleet_gpu_performance_state", "gauge",
    "GPU performance state (P-state), 0 fastest to 15 slowest.",
    read="performance.performance_state", bound=Bound("integer", 0, 32))
GPU_PCIE_LINK_GENERATION = _gpu(
    "gpufleet_gpu_pcie_link_generation", "gauge",
    "Current PCIe link generation of the GPU.",
    read="performance.pcie_link_generation", bound=Bound("integer", 0, 64))
GPU_PCIE_LINK_WIDTH = _gpu(
    "gpufleet_gpu_pcie_link_width", "gauge",
    "Current PCIe link width of the GPU in lanes.",
    read="performance.pcie_link_width", bound=Bound("integer", 0, 1024))
GPU_PCIE_TRANSMIT_BYTES_PER_SECOND = _gpu(
    "gpufleet_gpu_pcie_transmit_bytes_per_second", "gauge",
    "PCIe transmit throughput of the GPU in bytes per second.", "bytes_per_second",
    doc="NVML samples it over 20 ms and reports KB/s, converted.",
    read="performance.pcie_transmit_bytes_per_second", bound=RATE)
GPU_PCIE_RECEIVE_BYTES_PER_SECOND = _gpu(
    "gpufleet_gpu_pcie_receive_bytes_per_second", "gauge",
    "PCIe receive throughput of the GPU in bytes per second.", "bytes_per_second",
    doc="NVML samples it over 20 ms and reports KB/s, converted.",
    read="performance.pcie_receive_bytes_per_second", bound=RATE)
GPU_ENCODER_UTILIZATION_RATIO = _gpu(
    "gpufleet_gpu_encoder_utilization_ratio", "gauge",
    "Fraction of time the video encoder was busy (0-1).", "ratio",
    read="performance.encoder_utilization_ratio", bound=RATIO)
GPU_DECODER_UTILIZATION_RATIO = _gpu(
    "gpufleet_gpu_decoder_utilization_ratio", "gauge",
    "Fraction of time the video decoder was busy (0-1).", "ratio",
    read="performance.decoder_utilization_ratio", bound=RATIO)
GPU_MEMORY_BANDWIDTH_UTILIZATION_RATIO = _gpu(
    "gpufleet_gpu_memory_bandwidth_utilization_ratio", "gauge",
    "Fraction of time device memory was being read or written (0-1).", "ratio",
    doc="NVML's `utilization.memory`, DCGM_FI_DEV_MEM_COPY_UTIL.",
    read="performance.memory_bandwidth_utilization_ratio", bound=RATIO)
GPU_GRAPHICS_ENGINE_ACTIVE_RATIO = _gpu(
    "gpufleet_gpu_graphics_engine_active_ratio", "gauge",
    "Fraction of time the graphics or compute engine was active (0-1).", "ratio",
    doc="GPM (Hopper and later) from NVML, DCGM_FI_PROF_GR_ENGINE_ACTIVE from dcgm. " + _ABSENT,
    read="performance.graphics_engine_active_ratio", bound=RATIO)
GPU_SM_ACTIVE_RATIO = _gpu(
    "gpufleet_gpu_sm_active_ratio", "gauge",
    "Fraction of SMs busy, averaged over time (0-1).", "ratio",
    doc="GPM SM_UTIL from NVML, DCGM_FI_PROF_SM_ACTIVE from dcgm. A job that spins idle "
        "reads 1 on `gpufleet_gpu_utilization_ratio` but near 0 here. " + _ABSENT,
    read="performance.sm_active_ratio", bound=RATIO)
GPU_SM_OCCUPANCY_RATIO = _gpu(
    "gpufleet_gpu_sm_occupancy_ratio", "gauge",
    "Resident warps over the SMs' maximum, averaged over time (0-1).", "ratio",
    doc="GPM SM_OCCUPANCY from NVML, DCGM_FI_PROF_SM_OCCUPANCY from dcgm. " + _ABSENT,
    read="performance.sm_occupancy_ratio", bound=RATIO)
GPU_TENSOR_ACTIVE_RATIO = _gpu(
    "gpufleet_gpu_tensor_active_ratio", "gauge",
    "Fraction of time any tensor pipe was active (0-1).", "ratio",
    doc="GPM ANY_TENSOR_UTIL from NVML, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE from dcgm. " + _ABSENT,
    read="performance.tensor_active_ratio", bound=RATIO)
GPU_DRAM_ACTIVE_RATIO = _gpu(
    "gpufleet_gpu_dram_active_ratio", "gauge",
    "Device memory bandwidth used over its maximum (0-1).", "ratio",
    doc="GPM DRAM_BW_UTIL from NVML, DCGM_FI_PROF_DRAM_ACTIVE from dcgm. " + _ABSENT,
    read="performance.dram_active_ratio", bound=RATIO)

# -- per GPU: health (issue 16, Build 1) ------------------------------------------------------------
def _health(name: str, kind: Literal["gauge", "counter"], help_text: str,
            extra: tuple[str, ...] = (), doc: str = "", *, read: Read,
            bound: Bound | None = None) -> FamilySpec:
    return _gpu(name, kind, help_text, extra=extra, doc=doc, read=read, bound=bound, group="health")


GPU_XID_ERRORS_TOTAL = _health(
    "gpufleet_gpu_xid_errors_total", "counter",
    "XID error events seen on the GPU since the exporter started, by XID code.", ("xid",),
    doc="From NVML's event set (critical XIDs). A series appears at the first event of a code; "
        "absent from the dcgm source, which relays only the last XID.",
    read=FromField("health.xid_counts", _xid_samples))
GPU_LAST_XID = _health(
    "gpufleet_gpu_last_xid", "gauge",
    "Code of the last XID error seen on the GPU.",
    doc="Absent until an XID is seen.",
    read="health.last_xid", bound=Bound("integer", 0, 2 ** 31))
GPU_LAST_XID_TIMESTAMP_SECONDS = _gpu(
    "gpufleet_gpu_last_xid_timestamp_seconds", "gauge",
    "Unix time the last XID error was seen on the GPU.", "seconds",
    doc="Absent until an XID is seen.", read="health.last_xid_time", bound=UNIX_TIME, group="health")
GPU_ECC_ERRORS_TOTAL = _health(
    "gpufleet_gpu_ecc_errors_total", "counter",
    "ECC memory errors of the GPU, by type and counter.", ("type", "counter"),
    doc="`type` is `single_bit` (corrected) or `double_bit` (uncorrected); `counter` is "
        "`volatile` (since the driver loaded) or `aggregate` (the GPU's life). Absent with ECC off.",
    read=tuple(Series((kind, counter), f"health.ecc_{kind}_{counter}")
               for counter in ("volatile", "aggregate") for kind in ("single_bit", "double_bit")),
    bound=COUNT)
GPU_RETIRED_PAGES_TOTAL = _health(
    "gpufleet_gpu_retired_pages_total", "counter",
    "Framebuffer pages the GPU retired, by cause.", ("cause",),
    doc="`cause` is `single_bit` (repeated corrected errors) or `double_bit`. Pre-Ampere GPUs "
        "only; Ampere and later remap rows instead.",
    read=(Series(("single_bit",), "health.retired_pages_single_bit"),
          Series(("double_bit",), "health.retired_pages_double_bit")), bound=COUNT)
GPU_RETIRED_PAGES_PENDING = _health(
    "gpufleet_gpu_retired_pages_pending", "gauge",
    "1 while a page retirement waits for the next driver reload, else 0.",
    doc="Pre-Ampere GPUs only.",
    read="health.retired_pages_pending", bound=OPTIONAL_FLAG)
GPU_REMAPPED_ROWS_TOTAL = _health(
    "gpufleet_gpu_remapped_rows_total", "counter",
    "Memory rows the GPU remapped, by the error that caused it.", ("cause",),
    doc="`cause` is `correctable` or `uncorrectable`. Ampere and later.",
    read=(Series(("correctable",), "health.remapped_rows_correctable"),
          Series(("uncorrectable",), "health.remapped_rows_uncorrectable")), bound=COUNT)
GPU_REMAPPED_ROWS_PENDING = _health(
    "gpufleet_gpu_remapped_rows_pending", "gauge",
    "1 while a row remap waits for a GPU reset, else 0.",
    doc="Ampere and later. Reset the GPU when it is idle.",
    read="health.remapped_rows_pending", bound=OPTIONAL_FLAG)
GPU_REMAPPED_ROWS_FAILURE = _health(
    "gpufleet_gpu_remapped_rows_failure", "gauge",
    "1 if a row remap failed (no spare rows left), else 0.",
    doc="Ampere and later. The GPU needs service.",
    read="health.remapped_rows_failure", bound=OPTIONAL_FLAG)
GPU_NVLINK_ERRORS_TOTAL = _health(
    "gpufleet_gpu_nvlink_errors_total", "counter",
    "NVLink errors of the GPU, summed over its links, by type.", ("type",),
    doc="`type` is `crc_flit`, `crc_data`, `replay` or `recovery`. Absent without NVLink. "
        "Per-link series would multiply cardinality by up to 18 and are not exported.",
    read=tuple(Series((kind,), f"health.nvlink_{kind}_errors")
               for kind in ("crc_flit", "crc_data", "replay", "recovery")), bound=COUNT)
GPU_PCIE_REPLAY_ERRORS_TOTAL = _health(
    "gpufleet_gpu_pcie_replay_errors_total", "counter",
    "PCIe replays of the GPU (transmissions retried after a link error).",
    read="health.pcie_replay_errors", bound=COUNT)
GPU_CLOCK_EVENT_ACTIVE = _health(
    "gpufleet_gpu_clock_event_active", "gauge",
    "1 while the reason is holding the GPU's clocks down (throttling), else 0.", ("reason",),
    doc="`reason` is `sw_power_cap`, `hw_slowdown`, `hw_thermal`, `sw_thermal`, "
        "`hw_power_brake` or `sync_boost`: one series each whenever the GPU reports its "
        "clock-event reason mask.",
    read=tuple(Series((reason,), "health.clock_event_reasons", bit)
               for reason, bit in CLOCK_EVENT_REASONS), bound=COUNT)

# -- per GPU: processes and their owners (exporter/attribution, NVML source) ----------------------
OWNER_LABELS = ("owner_kind", "job", "container", "step", "rank")


def _owner_samples(field: str) -> Callable[[Any], Pairs]:
    def samples(owners: Sequence[Any]) -> Pairs:
        return [((o.kind, o.job, o.container, o.step, o.rank), float(value))
                for o in owners if (value := getattr(o, field)) is not None]
    return samples


def _unattributed_samples(counts: Sequence[Any]) -> Pairs:
    return [((c.reason,), float(c.count)) for c in counts]


_OWNER_DOC = (
    "One series per (owner, physical GPU): `owner_kind` is `pod`, `slurm` or `host`; `job` is "
    "`<namespace>/<pod>` (as on `gpufleet_gpu_allocation_info`; the pod's UID where the "
    "kubelet's log directories are not mounted) or the Slurm job id, empty for the host; "
    "`container` the pod's container, `step` the Slurm step, `rank` the training rank "
    "(`RANK`, `SLURM_PROCID`, `LOCAL_RANK` of the process) or empty. MPS slots, time-slicing "
    "replicas, MIG slices and DRA claims are never separate series. NVML source only "
    "(docs/attribution.md).")
GPU_OWNER_MEMORY_USED_BYTES = _gpu(
    "gpufleet_gpu_owner_memory_used_bytes", "gauge",
    "GPU memory used by one owner's processes on the GPU, in bytes.", "bytes",
    extra=OWNER_LABELS, doc=_OWNER_DOC + " Absent where NVML gives no per-process memory.",
    read=FromField("processes.owners", _owner_samples("memory_used_bytes")), group="processes")
GPU_OWNER_SM_UTILIZATION_RATIO = _gpu(
    "gpufleet_gpu_owner_sm_utilization_ratio", "gauge",
    "SM use of one owner's processes on the GPU in the driver's latest samples (0-1).", "ratio",
    extra=OWNER_LABELS,
    doc="The driver's per-process samples newer than the previous read, averaged per process "
        "and summed per owner; 0 where the driver took none since (the owner was idle). Read "
        "every `sources.nvml.processes_interval`. Absent under MIG and where the driver keeps "
        "no process samples.",
    read=FromField("processes.owners", _owner_samples("sm_utilization_ratio")),
    group="processes")
GPU_OWNER_PROCESSES = _gpu(
    "gpufleet_gpu_owner_processes", "gauge",
    "Processes of one owner running on the GPU.", extra=OWNER_LABELS,
    read=FromField("processes.owners", _owner_samples("processes")), group="processes")
GPU_PROCESSES_UNATTRIBUTED = _gpu(
    "gpufleet_gpu_processes_unattributed", "gauge",
    "Processes on the GPU whose owner could not be read, by reason.", extra=("reason",),
    doc="`reason` is `pid_namespace` (the exporter is not in the host's PID namespace: run it "
        "with hostPID), `process_gone` (no /proc entry: exited, or another namespace's /proc) "
        "or `proc_unreadable` (its cgroup file refused). Absent while every process has one.",
    read=FromField("processes.unattributed", _unattributed_samples), group="processes")
GPU_PROCESSES_CUT_TOTAL = _gpu(
    "gpufleet_gpu_processes_cut_total", "counter",
    "Processes left out of the owner families over the per-GPU cap, since the exporter started.",
    doc="Each read counts the processes over `sources.nvml.processes_per_gpu` (those using the "
        "least memory).", read="processes.cut_total", bound=COUNT, group="processes")


# -- per GPU: identity, allocation and MIG ---------------------------------------------------------
GPU_INFO = _gpu(
    "gpufleet_gpu_info", "gauge",
    "GPU identity and catalogue data; always 1.",
    extra=("architecture", "driver_version", "vbios_version", "pci_bus_id", "serial"),
    doc="`driver_version`, `vbios_version` and `pci_bus_id` are empty where the source does not "
        "give them; `serial` is there only when the site enables it (NVML option "
        "`sources.nvml.export_serial`).")
GPU_ALLOCATED_RATIO = _gpu(
    "gpufleet_gpu_allocated_ratio", "gauge",
    "Share of the GPU held by jobs (0-1); 1 is a whole GPU allocated.", "ratio",
    origin="scheduler")
GPU_ALLOCATION_INFO = _gpu(
    "gpufleet_gpu_allocation_info", "gauge",
    "The job holding the GPU, one series per job; always 1.",
    extra=("job", "namespace", "pod", "account", "job_gpus", "priority"),
    doc="Scraped without `honor_labels`, `job` arrives as `exported_job`. `account` is the "
        "Slurm account or the Kubernetes namespace the job is charged to (empty when the "
        "scheduler gives none): Alertmanager routes the job's tickets by it.",
    origin="scheduler")
GPU_MIG_INSTANCE_INFO = _gpu(
    "gpufleet_gpu_mig_instance_info", "gauge",
    "A MIG GPU instance and its profile; always 1.", extra=("gpu_instance", "profile"))
GPU_MIG_MEMORY_TOTAL_BYTES = _gpu(
    "gpufleet_gpu_mig_memory_total_bytes", "gauge",
    "Memory of a MIG GPU instance in bytes.", "bytes", extra=("gpu_instance", "profile"))
GPU_MIG_MEMORY_USED_BYTES = _gpu(
    "gpufleet_gpu_mig_memory_used_bytes", "gauge",
    "Memory in use on a MIG GPU instance in bytes.", "bytes", extra=("gpu_instance", "profile"))

# -- per node and pool -----------------------------------------------------------------------------
NODE_INFO = FamilySpec(
    "gpufleet_node_info", "gauge",
    "Node with its pool, GPU model, architecture and GPU count; always 1.",
    ("node", "pool", "model", "architecture", "gpus"), "node", origin="node")
NODE_CPU_CORES = FamilySpec(
    "gpufleet_node_cpu_cores", "gauge", "CPU cores of the node.",
    ("node", "pool", "model"), "node", origin="node")
NODE_GPUS = FamilySpec(
    "gpufleet_node_gpus", "gauge",
    "GPUs of the node by state: up, down or stale (a stale GPU counts as stale only).",
    ("node", "pool", "model", "state"), "node", origin="node",
    doc="A per-node summary of `gpufleet_gpu_up` and `gpufleet_gpu_stale`: one series per node "
        "and state, only the states some GPU is in. Cluster mode's prometheus source reads it "
        "instead of each GPU's up and stale (1 series a node, not 2 a GPU) where every node it "
        "lists has all its GPUs up, and each GPU's series otherwise.")
NODE_GPU_MEMORY_TOTAL_BYTES = FamilySpec(
    "gpufleet_node_gpu_memory_total_bytes", "gauge",
    "Memory in total of each GPU of the node, in bytes, where all its GPUs report the same.",
    ("node", "pool", "model"), "node", "bytes", origin="node",
    doc="A per-node summary of `gpufleet_gpu_memory_total_bytes`: one series per node, only "
        "where every GPU of the node reports a memory total, all the same one, and the GPUs "
        "share one pool and model; absent for a node whose GPUs differ or one of which reports "
        "none. Cluster mode's prometheus source reads it instead of each GPU's memory total "
        "(1 series a node, not 1 a GPU) when it reads memory total for every GPU (its first "
        "read), and each GPU's series for the nodes it does not cover.")
NODE_CPU_ALLOCATED_CORES = FamilySpec(
    "gpufleet_node_cpu_allocated_cores", "gauge", "CPU cores of the node held by jobs.",
    ("node", "pool", "model"), "node", origin="scheduler")
NODE_DRAINED = FamilySpec(
    "gpufleet_node_drained", "gauge",
    "1 for each node the scheduler's own state shows drained or draining (Slurm's DRAIN flag).",
    ("node", "pool"), "node", origin="scheduler",
    doc="Absent for nodes in service and where the source does not read the scheduler's state "
        "(every source but slurm). What confirms a drain gpufleet advised: GpuNodeDrained "
        "tickets a failing node once it is drained, and mutes its GPUs' pages.")
PENDING_JOBS = FamilySpec(
    "gpufleet_pending_jobs", "gauge", "Jobs waiting for GPUs, by the pool they asked for.",
    ("pool",), "node", origin="scheduler")
PENDING_GPUS = FamilySpec(
    "gpufleet_pending_gpus", "gauge", "GPUs asked for by waiting jobs, by pool.",
    ("pool",), "node", origin="scheduler")

# -- sources and collection (self-metrics) ---------------------------------------------------------
SOURCE_UP = FamilySpec(
    "gpufleet_source_up", "gauge",
    "1 if the source (or one target of it) answered its last read.",
    ("source", "target"), "self",
    doc="`target` only on the series of each target of a multi-target source (dcgm, prometheus).")
COLLECT_DURATION_SECONDS = FamilySpec(
    "gpufleet_collect_duration_seconds", "gauge",
    "How long the last read of the source took.", ("source",), "self", "seconds")
LAST_COLLECT_SUCCESS_TIMESTAMP_SECONDS = FamilySpec(
    "gpufleet_last_collect_success_timestamp_seconds", "gauge",
    "Unix time of the source's last successful read.", ("source",), "self", "seconds")
SOURCE_PARSE_ERRORS_TOTAL = FamilySpec(
    "gpufleet_source_parse_errors_total", "counter",
    "Lines or fields the source could not parse and skipped.", ("source",), "self")
SOURCE_SERIES_REFUSED_TOTAL = FamilySpec(
    "gpufleet_source_series_refused_total", "counter",
    "Series refused because the scrape target that sent them does not speak for their node.",
    ("source", "target"), "self",
    doc="Cluster mode's `prometheus` source (`metrics: gpufleet`) only: a node's series count "
        "only from the target serving its identity (docs/sources.md). `target` is that scrape "
        "target as `job/instance` (the job empty where the scrape honours an allocation "
        "series' own `job`). Each refused series counts here and in "
        "`gpufleet_source_parse_errors_total` too. Absent until a target has sent one.")

# -- cluster sources: composition and allocations --------------------------------------------------
COMPOSE_UNMATCHED_GPUS = FamilySpec(
    "gpufleet_compose_unmatched_gpus", "gauge",
    "GPUs only one side of a composed snapshot saw: the scheduler (allocation) "
    "or telemetry.",
    ("side",), "cluster",
    doc="Series only when an allocation source (the scheduler, e.g. Slurm) and a telemetry "
        "source are composed.")
ALLOCATION_CPU_CORES = FamilySpec(
    "gpufleet_allocation_cpu_cores", "gauge",
    "CPU cores the job holds on the node.", ("job", "node"), "cluster", origin="scheduler", kind="allocation")
ALLOCATION_GPU_SHARE_RATIO = FamilySpec(
    "gpufleet_allocation_gpu_share_ratio", "gauge",
    "Share of each of its GPUs on the node the job holds (0-1); 1 is whole GPUs.",
    ("job", "node"), "cluster", "ratio", origin="scheduler", kind="allocation")

# -- the snapshot and the build (self-metrics) -----------------------------------------------------
SNAPSHOT_TIMESTAMP_SECONDS = FamilySpec(
    "gpufleet_snapshot_timestamp_seconds", "gauge",
    "Unix time the served snapshot was taken.", (), "self", "seconds")
BUILD_INFO = FamilySpec(
    "gpufleet_build_info", "gauge", "gpufleet version; always 1.", ("version",), "self")

# -- per GPU, over successive collections (exporter/cycle/nvlink.py) ---------------------------------
# A rate needs two readings, which no one snapshot holds: the cycle's NVLink stage keeps each GPU's
# last 5 min of counter readings and hands its samples to family(), so it is served after the
# snapshot's families, here in the catalogue's order.
GPU_NVLINK_UTILIZATION_RATIO = FamilySpec(
    "gpufleet_gpu_nvlink_utilization_ratio", "gauge",
    "Share of the GPU's NVLink bandwidth in use over the last 5 min of collections, both "
    "directions together (0-1).", IDENTITY, "gpu", "ratio",
    doc="Bytes sent plus received since the oldest collection kept of the last 5 min (kept "
        "30 s apart: 4.5-5 min back once the exporter has run that long), per second, over "
        "gpufleet_gpu_nvlink_capacity_bytes_per_second: what `rate(...[5m])` of the two byte "
        "counters over the capacity computes, without a recording rule over every GPU. Absent "
        "at a GPU's first collection, after a counter reset (until the next collection), while "
        "the GPU is lost or stale, and without NVLink.",
    origin="node", kind="fleet")

# -- fragmentation (the analyzer) ------------------------------------------------------------------
CLUSTER_FRAGMENTATION_INDEX = FamilySpec(
    "gpufleet_cluster_fragmentation_index", "gauge",
    "FGD fragmentation index of the cluster, 0-100: 100 * fragmented / (idle + one "
    "node of slack), plus tier-inversion penalties.",
    (), "fragmentation")
CLUSTER_TIER_INVERSION_PENALTY = FamilySpec(
    "gpufleet_cluster_tier_inversion_penalty", "gauge",
    "Points of the cluster fragmentation index that are tier-inversion penalties, which no "
    "compaction recovers: the index less this is what the advisor and "
    "GpuFleetFragmentationHigh judge.",
    (), "fragmentation")
CLUSTER_FRAGMENTED_GPUS = FamilySpec(
    "gpufleet_cluster_fragmented_gpus", "gauge",
    "Idle GPUs (in GPU shares) the target workload cannot use, weighted by how often "
    "each task shape occurs (FGD).",
    (), "fragmentation")
CLUSTER_IDLE_GPUS = FamilySpec(
    "gpufleet_cluster_idle_gpus", "gauge",
    "Unallocated GPU capacity of the cluster in GPUs (free shares summed).",
    (), "fragmentation")
CLUSTER_FRAGMENTATION_RATIO = FamilySpec(
    "gpufleet_cluster_fragmentation_ratio", "gauge",
    "Fragmented GPUs over idle GPUs (0-1).",
    (), "fragmentation", "ratio")
CLUSTER_FRAGMENTED_GPUS_BY_REASON = FamilySpec(
    "gpufleet_cluster_fragmented_gpus_by_reason", "gauge",
    "Fragmented GPUs by why the workload cannot use them: lacks_gpu, lacks_cpu, "
    "lacks_both, no_access (GPU model), cpu_only.",
    ("reason",), "fragmentation",
    doc="`lacks_gpu`: no node GPU big enough, or too few; a fitting shape's too-small GPUs "
        "count here.")
POOL_FRAGMENTATION_INDEX = FamilySpec(
    "gpufleet_pool_fragmentation_index", "gauge",
    "FGD fragmentation index of the pool, 0-100, plus tier-inversion penalties when "
    "the pool is an idle higher tier.",
    ("pool", "model"), "fragmentation")
POOL_TIER_INVERSION_PENALTY = FamilySpec(
    "gpufleet_pool_tier_inversion_penalty", "gauge",
    "Points of the pool's fragmentation index that are tier-inversion penalties (an idle "
    "higher tier), which no compaction recovers: the index less this is what the advisor "
    "and GpuClusterFragmentationHigh judge.",
    ("pool", "model"), "fragmentation")
POOL_FRAGMENTED_GPUS = FamilySpec(
    "gpufleet_pool_fragmented_gpus", "gauge",
    "Idle GPUs of the pool the target workload cannot use (FGD).",
    ("pool", "model"), "fragmentation")
POOL_IDLE_GPUS = FamilySpec(
    "gpufleet_pool_idle_gpus", "gauge",
    "Unallocated GPU capacity of the pool in GPUs (free shares summed).",
    ("pool", "model"), "fragmentation")
NODE_FRAGMENTED_GPUS = FamilySpec(
    "gpufleet_node_fragmented_gpus", "gauge",
    "Idle GPUs of the node the target workload cannot use (FGD).",
    ("node",), "fragmentation")
TIER_INVERSION = FamilySpec(
    "gpufleet_tier_inversion", "gauge",
    "1 while the higher-tier pool is idle and the lower-tier pool busy, else 0.",
    ("upper", "lower"), "fragmentation",
    doc="`upper` is the higher-tier pool; one series per pair of pools with known, different tiers.")
FRAGMENTATION_WORKLOAD_SHAPES = FamilySpec(
    "gpufleet_fragmentation_workload_shapes", "gauge",
    "Task shapes in the target workload fragmentation is measured against.",
    (), "fragmentation")
FRAGMENTATION_WORKLOAD_COVERAGE_RATIO = FamilySpec(
    "gpufleet_fragmentation_workload_coverage_ratio", "gauge",
    "Share of observed tasks the target workload's shapes cover (0-1).",
    (), "fragmentation", "ratio")
FRAGMENTATION_WORKLOAD_CPU_ONLY_RATIO = FamilySpec(
    "gpufleet_fragmentation_workload_cpu_only_ratio", "gauge",
    "Weight of CPU-only shapes in the target workload (0-1).",
    (), "fragmentation", "ratio")
FRAGMENTATION_WORKLOAD_INFO = FamilySpec(
    "gpufleet_fragmentation_workload_info", "gauge",
    "Where the target workload comes from and whether CPU-only tasks count; always 1.",
    ("source", "cpu_only"), "fragmentation",
    doc="`source` is `window`, `trace` or `shapes`; `cpu_only` is `included` or `excluded`.")

# -- pool load: change points and scaling hints (issue 20, exporter/pool_load/tracker.py) ------------------
POOL_LOAD_CHANGE_TOTAL = FamilySpec(
    "gpufleet_pool_load_change_total", "counter",
    "Load regime changes the CUSUM detector found in the pool's demand ratio, by direction.",
    ("pool", "direction"), "load",
    doc="`direction` is `up` or `down`. Demand ratio = (allocated + pending GPUs) / GPUs, "
        "one sample per snapshot (docs/load.md).")
POOL_LOAD_LAST_CHANGE_TIMESTAMP_SECONDS = FamilySpec(
    "gpufleet_pool_load_last_change_timestamp_seconds", "gauge",
    "Unix time of the snapshot at which the last load change of the pool was detected.",
    ("pool",), "load", "seconds", doc="Absent until a change is detected.")
POOL_RECOMMENDED_NODES = FamilySpec(
    "gpufleet_pool_recommended_nodes", "gauge",
    "Nodes the scaling hint recommends for the pool (the threshold table's scaling rule).",
    ("pool",), "load",
    doc="Up above the `up` demand ratio, down below `down`, after `hysteresis` samples and the "
        "cooldown, within `min_nodes`-`max_nodes` (rules/thresholds.yaml `scaling:`).")
POOL_SCALING_REASON = FamilySpec(
    "gpufleet_pool_scaling_reason", "gauge",
    "1 for the reason of the pool's current scaling hint, 0 for the others.",
    ("pool", "reason"), "load",
    doc="`reason`: `hold`, `up`, `down`, `min_nodes` or `max_nodes` (a bound stopped the rule).")

# -- the rebalancing advisor -----------------------------------------------------------------------
ADVISOR_COMPACTION_RECOMMENDED = FamilySpec(
    "gpufleet_advisor_compaction_recommended", "gauge",
    "1 while compaction is recommended for the scope (cluster or pool:<name>).",
    ("scope",), "advisor",
    doc="Recommended: the index stayed above the trigger for the dwell time and has not yet "
        "dropped below the clear bound.")
ADVISOR_PLAN_MIGRATIONS = FamilySpec(
    "gpufleet_advisor_plan_migrations", "gauge",
    "Migrations in the last proposed plan.", (), "advisor")
ADVISOR_PLAN_FRAGMENTED_GPUS_RECOVERED = FamilySpec(
    "gpufleet_advisor_plan_fragmented_gpus_recovered", "gauge",
    "Fragmented GPUs the last proposed plan recovers (predicted).", (), "advisor")
ADVISOR_PLAN_NODES_FREED = FamilySpec(
    "gpufleet_advisor_plan_nodes_freed", "gauge",
    "Whole nodes the last proposed plan frees, by pool.", ("pool",), "advisor",
    doc="A whole node has 8 GPUs or more, every one free.")
ADVISOR_DECISION_INFO = FamilySpec(
    "gpufleet_advisor_decision_info", "gauge",
    "The advisor's current decision (none, cooldown, hold, compact); always 1.",
    ("decision",), "advisor")
ADVISOR_WEBHOOK_DELIVERIES_TOTAL = FamilySpec(
    "gpufleet_advisor_webhook_deliveries_total", "counter",
    "Webhook delivery attempts by receiver and result (delivered, retry, rejected, "
    "expired).",
    ("receiver", "result"), "advisor")
ADVISOR_EVALUATIONS_TOTAL = FamilySpec(
    "gpufleet_advisor_evaluations_total", "counter",
    "Advisor evaluations by what triggered them (snapshot, alertmanager).",
    ("trigger",), "advisor")
ADVISOR_ALERTMANAGER_NOTIFICATIONS_TOTAL = FamilySpec(
    "gpufleet_advisor_alertmanager_notifications_total", "counter",
    "Alertmanager webhook notifications received at /v1/alerts, by result "
    "(accepted, duplicate, invalid, unauthorized).",
    ("result",), "advisor")
ADVISOR_OUTBOX_PENDING = FamilySpec(
    "gpufleet_advisor_outbox_pending", "gauge",
    "Plan deliveries waiting in the durable outbox.", (), "advisor")
ADVISOR_OUTBOX_ERRORS_TOTAL = FamilySpec(
    "gpufleet_advisor_outbox_errors_total", "counter",
    "Failed outbox operations by operation (insert, update, select, prune); a plan whose "
    "insert failed is kept in memory and retried.",
    ("operation",), "advisor")
JOB_CHECKPOINT_AGE_SECONDS = FamilySpec(
    "gpufleet_job_checkpoint_age_seconds", "gauge",
    "Seconds since the job last checkpointed: the time it states, or the last whole "
    "advisor.checkpoint_interval since it started.",
    ("job", "namespace", "account", "source"), "advisor", "seconds",
    doc="`source` is `stated` (a Slurm comment's `last-checkpoint=` or the pod annotation "
        "`gpufleet.io/last-checkpoint`) or `assumed` (`advisor.assume_checkpointing`); absent for "
        "a job that states none when the site assumes no checkpointing. What a move of the job "
        "costs, per GPU (docs/advisor.md).")
JOB_NVLINK_GENERATIONS = FamilySpec(
    "gpufleet_job_nvlink_generations", "gauge",
    "NVLink generations the GPUs of a multi-node job span.", ("job", "namespace"), "advisor",
    doc="Multi-node jobs only. Above 1 the job spans generations that do not interconnect "
        "(Blackwell's NVLink 5 and Hopper's NVLink 4).")
POOL_IDLE_ALLOCATED_GPUS = FamilySpec(
    "gpufleet_pool_idle_allocated_gpus", "gauge",
    "GPUs held by jobs below the GpuJobUtilizationLow critical level for its duration, "
    "by pool: the advisor's reclaim candidates.", ("pool",), "advisor")
POOL_IDLE_ALLOCATED_GPU_SECONDS = FamilySpec(
    "gpufleet_pool_idle_allocated_gpu_seconds", "gauge",
    "GPU-seconds the reclaim candidates of a pool have held idle so far (a lower bound: "
    "counted from the exporter's first snapshot that saw them idle).", ("pool",), "advisor",
    "seconds")
JOB_GPU_MEMORY_PEAK_BYTES = FamilySpec(
    "gpufleet_job_gpu_memory_peak_bytes", "gauge",
    "Peak GPU memory a job used per GPU over its life, as this exporter measured it.",
    ("job", "namespace", "account"), "advisor", "bytes",
    doc="From whole, non-MIG GPUs the job holds alone (a shared GPU's memory is several "
        "jobs'); absent without memory telemetry. Counted from the exporter's first snapshot "
        "of the job, forgotten when the job ends: a lower bound, which only raises a declared "
        "need, never replaces one (docs/advisor.md).")
POOL_RIGHT_SIZING_GPUS = FamilySpec(
    "gpufleet_pool_right_sizing_gpus", "gauge",
    "GPUs held in a pool under pressure by jobs whose declared and measured memory need "
    "fits a lower tier: the advisor's right-sizing list, by pool.", ("pool",), "advisor")
POOL_RIGHT_SIZING_GPU_SECONDS = FamilySpec(
    "gpufleet_pool_right_sizing_gpu_seconds", "gauge",
    "GPU-seconds the right-sizing candidates of a pool have held their GPUs so far "
    "(since each job started).", ("pool",), "advisor", "seconds")

# -- health verdicts, remediation and stragglers (issue 31; exporter/health/) ------------------------
# Few series at any scale: per-pool counts, and per node or GPU only the degraded and failing ones.
HEALTH_NODES = FamilySpec(
    "gpufleet_health_nodes", "gauge",
    "Nodes by health verdict (healthy, unknown, degraded, failing), by pool.",
    ("pool", "verdict"), "remediation",
    doc="Every verdict of every pool, 0 included. A node's verdict is its worst GPU's; unknown: "
        "stale readings or no health counters read (docs/health.md).")
HEALTH_GPUS = FamilySpec(
    "gpufleet_health_gpus", "gauge",
    "GPUs by health verdict (healthy, unknown, degraded, failing), by pool.",
    ("pool", "verdict"), "remediation",
    doc="Every verdict of every pool, 0 included: healthy is the count of working GPUs.")
NODE_HEALTH_VERDICT = FamilySpec(
    "gpufleet_node_health_verdict", "gauge",
    "1 for each node whose health verdict is degraded or failing.",
    ("node", "pool", "verdict"), "remediation",
    doc="Absent for healthy and unknown nodes (their counts are gpufleet_health_nodes), so the "
        "family stays small on a large fleet.")
GPU_HEALTH_VERDICT = FamilySpec(
    "gpufleet_gpu_health_verdict", "gauge",
    "1 for each GPU whose health verdict is degraded or failing, with the signal behind it.",
    ("node", "gpu", "pool", "verdict", "signal"), "remediation",
    doc="`signal`: xid, ecc, remap_failure, gpu_lost, nvlink, pcie, thermal, remap_pending (the "
        "first reason of the verdict). Absent for healthy and unknown GPUs.")
HEALTH_FAULTS_TOTAL = FamilySpec(
    "gpufleet_health_faults_total", "counter",
    "GPUs that turned failing, by pool and cause (the signal: xid, ecc, remap_failure, gpu_lost).",
    ("pool", "cause"), "remediation",
    doc="Interruptions by cause, counted since the exporter started. Every pool and cause has a "
        "series from the first collection, 0 until its first fault, so increase() counts that "
        "fault (a series born at 1 would not be).")
NODE_FAULTS = FamilySpec(
    "gpufleet_node_faults", "gauge",
    "Times the node turned failing within the replacement window (7 days by default).",
    ("node", "pool"), "remediation",
    doc="Nodes with a fault in the window only. At `replace_after_faults` (3) the advisor advises "
        "a replacement: the repeat offenders.")
REMEDIATION_EVENTS_TOTAL = FamilySpec(
    "gpufleet_remediation_events_total", "counter",
    "Remediation events advised, by action (drain, reset_gpu, resume, replace, page).",
    ("action",), "remediation",
    doc="Each event is queued for the advisor's receivers; page: a pool with more failing nodes "
        "than the drain budget, drained not at all. Every action has a series from the first "
        "collection, 0 until its first event.")
REMEDIATION_DRAINED_NODES = FamilySpec(
    "gpufleet_remediation_drained_nodes", "gauge",
    "Nodes gpufleet advised draining and has not yet resumed, by pool.", ("pool",), "remediation")
REMEDIATION_BUDGET_BLOCKED_NODES = FamilySpec(
    "gpufleet_remediation_budget_blocked_nodes", "gauge",
    "Failing nodes not drained because the drain budget would be exceeded, by pool.",
    ("pool",), "remediation",
    doc="Above 0 the pool has paged (an XID storm, a driver bug, a power event?).")
REMEDIATION_FAULT_TO_DRAIN_SECONDS_TOTAL = FamilySpec(
    "gpufleet_remediation_fault_to_drain_seconds_total", "counter",
    "Seconds from a node turning failing to gpufleet advising its drain, summed over the "
    "drains, by pool.", ("pool",), "remediation", "seconds",
    doc="Divided by the drains (gpufleet_remediation_events_total{action=\"drain\"}): the mean "
        "time to drain; above 0 only when a budget held a drain back.")
REMEDIATION_DRAIN_TO_RESUME_SECONDS_TOTAL = FamilySpec(
    "gpufleet_remediation_drain_to_resume_seconds_total", "counter",
    "Seconds nodes stayed drained by gpufleet before it advised their resume, summed over the "
    "resumes, by pool.", ("pool",), "remediation", "seconds",
    doc="Divided by the resumes: the mean time a drained node is out of service.")
JOB_STRAGGLER_GPUS = FamilySpec(
    "gpufleet_job_straggler_gpus", "gauge",
    "GPUs of a multi-GPU job out of step with its peers (median and MAD) for the straggler "
    "duration.", ("job", "namespace", "account"), "remediation",
    doc="Jobs with a straggler only; which GPU, node and metric is in /v1/advice's health.")
# -- preemption as the scheduler runs it (exporter/preemption/) ---------------------------------------
# From the scheduler's view (origin scheduler: served where jobs are known). Counters per pool and
# cause: every cause of every pool from its first snapshot, 0 until its first
# stop, so increase() counts that one too. Per job only the jobs stopped and not yet resumed.
PREEMPTIONS_TOTAL = FamilySpec(
    "gpufleet_preemptions_total", "counter",
    "Jobs the scheduler stopped (preempted, requeued, suspended, evicted), by pool and cause.",
    ("pool", "cause"), "preemption",
    doc="`cause`: `requeue` (a Slurm job pending again with its restart count grown: "
        "PreemptMode=REQUEUE, or an operator's or a failed node's requeue, which Slurm does not "
        "tell apart), `suspend` (Slurm), `preemption`, `eviction`, `kubelet`, `taint`, `gc` (the "
        "reason of a pod's DisruptionTarget condition: PreemptionByScheduler, "
        "EvictionByEvictionAPI, TerminationByKubelet, DeletionByTaintManager, DeletionByPodGC), "
        "`other`. `pool`: the pool of the nodes the job ran on. Each stop counted once, since "
        "the exporter started.",
    origin="scheduler")
PREEMPTION_LOST_GPU_SECONDS_TOTAL = FamilySpec(
    "gpufleet_preemption_lost_gpu_seconds_total", "counter",
    "GPU-seconds of work the stopped jobs lost (from each job's last checkpoint to its stop, "
    "times its GPUs), by pool and cause.", ("pool", "cause"), "preemption", "seconds",
    doc="The checkpoint the job states, or its last whole advisor.checkpoint_interval "
        "(`advisor.assume_checkpointing`). Divided by "
        "gpufleet_pool_delivered_gpu_seconds_total over a window: the preemption overhead "
        "(GpuPoolPreemptionOverheadHigh).",
    origin="scheduler")
POOL_DELIVERED_GPU_SECONDS_TOTAL = FamilySpec(
    "gpufleet_pool_delivered_gpu_seconds_total", "counter",
    "GPU-seconds the pool's running jobs held between snapshots (suspended and stopping "
    "jobs left out).", ("pool",), "preemption", "seconds",
    doc="A gap between two snapshots counts at most 5 min: what ran while the exporter or its "
        "source was away is not known.",
    origin="scheduler")
PREEMPTED_JOBS_WAITING = FamilySpec(
    "gpufleet_preempted_jobs_waiting", "gauge",
    "Stopped jobs waiting to resume (requeued and pending, or suspended), by pool and cause.",
    ("pool", "cause"), "preemption",
    doc="Every pool and cause of gpufleet_preemptions_total, 0 where no job waits.",
    origin="scheduler")
JOB_PREEMPTED_WAIT_SECONDS = FamilySpec(
    "gpufleet_job_preempted_wait_seconds", "gauge",
    "Seconds a stopped job has waited to resume since the scheduler stopped it.",
    ("job", "namespace", "pool", "cause"), "preemption", "seconds",
    doc="Only jobs waiting now (requeued and pending, or suspended); gone when the job resumes "
        "or ends.",
    origin="scheduler")
JOB_PREEMPTION_LOST_SECONDS = FamilySpec(
    "gpufleet_job_preemption_lost_seconds", "gauge",
    "Seconds of work per GPU the waiting job's last stop lost (since its last checkpoint).",
    ("job", "namespace", "pool", "cause"), "preemption", "seconds",
    doc="Absent where neither a checkpoint nor the run's start is known (a job requeued "
        "before the exporter first saw it running, that states no checkpoint).",
    origin="scheduler")
# -- the process's own logging (issue 32, Build 3) ---------------------------------------------------
LOG_LINES_DROPPED_TOTAL = FamilySpec(
    "gpufleet_log_lines_dropped_total", "counter",
    "Log lines not written, by reason: queue_full (stderr slower than the logging, the "
    "bounded queue full) or rate_limited (a source's same line within its interval).",
    ("reason",), "self",
    doc="Both stay 0 in a quiet process; `rate_limited` grows while an upstream fails the "
        "same way over and over (its line is logged once per 10 s with the count).")
# -- the threshold table's reloads (issue 29, exporter/thresholds/reloading.py) -------------------------
CONFIG_LAST_RELOAD_SUCCESSFUL = FamilySpec(
    "gpufleet_config_last_reload_successful", "gauge",
    "1 if the last reload of the threshold table succeeded, 0 if it failed and the last good "
    "table stays in force.", (), "self",
    doc="Prometheus' own convention (`prometheus_config_last_reload_successful`). The table is "
        "`--thresholds FILE` or `thresholds_file`, read again on SIGHUP and when it changes; "
        "always 1 with the table installed with gpufleet.")
CONFIG_LAST_RELOAD_SUCCESS_TIMESTAMP_SECONDS = FamilySpec(
    "gpufleet_config_last_reload_success_timestamp_seconds", "gauge",
    "Unix time of the last successful load of the threshold table (the start, or a reload).",
    (), "self", "seconds")

# The table, keyed by name, in definition order (the order above): every FamilySpec of this
# module, so a family declared above cannot be left out of it.
CATALOGUE: dict[str, FamilySpec] = {
    value.name: value for value in list(globals().values()) if isinstance(value, FamilySpec)
}

__all__ = ["CATALOGUE", "CLOCK_EVENT_REASONS", "IDENTITY", "SLOWDOWN_REASONS", "Bound", "Family",
           "FamilySpec", "FromField", "Labels", "OrCatalogue", "Pairs", "Series"]
