"""DCGM field mapping: dcgm-exporter samples → snapshot records, with the units fixed.

Pure and source-agnostic: it works on ``(metric name, labels, value)`` samples,
whether they were scraped from dcgm-exporter's ``/metrics`` (the ``dcgm``
source) or queried from a Prometheus server that scraped it (the Prometheus
source reuses this module). Nothing here does I/O.

dcgm-exporter's ``# TYPE`` lines and unit suffixes are not trusted; what each
field really is (see ``docs/sources.md`` for the sources of these facts):

==========================================  ==========================================
field                                       what it is
==========================================  ==========================================
``DCGM_FI_DEV_FB_USED/FREE/RESERVED``       MiB; total = used + free + reserved,
                                            because ``FB_TOTAL`` is not exported by
                                            default (used excludes reserved)
``DCGM_FI_DEV_GPU_UTIL``                    percent (0-100)
``DCGM_FI_DEV_GPU_TEMP``                    degrees Celsius
``DCGM_FI_DEV_POWER_USAGE``                 W (not mW as NVML)
``DCGM_FI_DEV_ENFORCED_POWER_LIMIT``        W
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``    counter in mJ
``DCGM_FI_PROF_NVLINK_TX/RX_BYTES``         *rates* in B/s, although named bytes
``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL``      declared a counter, behaves as a rate
                                            of uncertain unit: kept raw, as a gauge
``DCGM_FI_DEV_SM_CLOCK``, ``MEM_CLOCK``,    MHz (NVML's unit too): x 10^6 to Hz
``MAX_SM_CLOCK``, ``MAX_MEM_CLOCK``
``DCGM_FI_DEV_MEM_COPY_UTIL``,              percent: NVML's utilization.memory,
``ENC_UTIL``, ``DEC_UTIL``, ``FAN_SPEED``   encoder, decoder, fan (0-100)
``DCGM_FI_PROF_*_ACTIVE``, ``*_OCCUPANCY``  already ratios (0-1), as NVML's GPM
``DCGM_FI_PROF_PCIE_TX/RX_BYTES``           rates in B/s (dcp-metrics-included.csv)
``DCGM_FI_DEV_XID_ERRORS``                  the *last* XID (0: none yet), not a count
``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``        NVML's clock-event bitmask, same bits
                                            (``CLOCK_THROTTLE_REASONS``: its old name)
``DCGM_FI_DEV_MEMORY_TEMP``                 degrees Celsius; 0 where the board has no
                                            HBM sensor (the L4 sample): absent
==========================================  ==========================================

Everything dcgm-exporter's default counters file and ``dcp-metrics-included.csv`` export
lands in the family NVML's reading of the same fact fills (``GPU_FIELDS``); what dcgm
cannot give (XID counts, the last XID's time, the graphics clock) stays absent, and the
fields deliberately dropped are listed with the reason in ``docs/sources.md`` (a test
checks every field of the real samples is one or the other).

Labels vary across versions: ``Hostname`` became ``hostname`` (dcgm-exporter
PR #655), ``UUID`` may be ``uuid``. A MIG GPU instance is identified by
(``UUID``, ``GPU_I_ID``) and named by ``GPU_I_PROFILE``. ``pod``/``namespace``/
``container`` labels (``--kubernetes``) become allocations of that GPU; when
the samples went through a Prometheus server, its own target labels take the
plain names and the workload's become ``exported_pod`` etc., which win.

DCGM reports "no value" with blank sentinels (``DCGM_INT32_BLANK`` 0x7ffffff0,
``DCGM_INT64_BLANK`` 0x7ffffffffffffff0, ``DCGM_FP64_BLANK`` 2**47, and the
next few values for not-found/not-supported/not-permissioned); such samples
are dropped, so the value is absent rather than absurd.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from exporter.snapshot import (
    Allocation,
    Gpu,
    GpuHealth,
    GpuPerformance,
    MigInstance,
    Node,
    Placement,
)
from exporter.sources.gpu_models import ModelResolver, memory_model, unknown_model
from exporter.sources.mig import mig_share

MIB = 1024 * 1024
HZ_PER_MHZ = 1_000_000

# DCGM's blank sentinels (dcgm_structs.h). Each type has BLANK and the next
# 15 values reserved (NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED, ...).
_INT32_BLANK = 0x7FFFFFF0
_FP64_BLANK = 140737488355328.0  # 2**47
# Near 2**63 a float64 is spaced 1024-2048 apart, so INT64_BLANK (2**63 - 16)
# arrives as 9223372036854775808 after Go's %f/%d and our float(): treat
# anything that large as blank; no real GPU reading comes near 9.2e18.
_INT64_NEAR = 9.2e18


def is_blank(value: float) -> bool:
    """True if ``value`` is one of DCGM's "no value" sentinels (or not a number at all)."""
    if math.isnan(value) or math.isinf(value):
        return True
    magnitude = abs(value)
    if magnitude >= _INT64_NEAR:
        return True
    if _FP64_BLANK <= magnitude < _FP64_BLANK + 16:
        return True
    # An int32 field that is blank; an int64 counter (energy in mJ) passes this
    # 16-value window at most once in its life, losing one sample at worst.
    return _INT32_BLANK <= magnitude <= 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class FieldRule:
    """Where one DCGM field goes and the factor that turns it into base units.

    ``kind`` is what the snapshot holds: a float, an int (counters, codes, P-states) or a
    flag (pending/failure states, true when non-zero). ``zero_is_absent``: 0 means "none"
    for this field, not a reading (the last XID before any; a board without an HBM sensor).
    ``upto``: a larger value is DCGM's "unknown" (P-state 32), so absent. A negative int or
    flag (a count, a code, a mask) cannot be a reading either: absent, never a counter that
    goes below zero.
    """

    target: str  # key in _GpuValues.values: a Gpu, GpuHealth or GpuPerformance field name
    scale: float = 1.0
    per: float = 1.0  # divided by after scaling: 41 / 100 is 0.41 where 41 * 0.01 is not
    kind: Literal["float", "int", "flag"] = "float"
    zero_is_absent: bool = False
    upto: float | None = None


# Whole-GPU fields we use, each onto the family NVML's reading of the same fact fills;
# anything else from dcgm-exporter is ignored (not an error) and, when the default counters
# or the samples have it, listed as dropped in docs/sources.md.
GPU_FIELDS: dict[str, FieldRule] = {
    "DCGM_FI_DEV_FB_USED": FieldRule("fb_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": FieldRule("fb_free_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": FieldRule("fb_reserved_bytes", MIB),
    "DCGM_FI_DEV_FB_TOTAL": FieldRule("fb_total_bytes", MIB),
    "DCGM_FI_DEV_GPU_UTIL": FieldRule("utilization_ratio", per=100),
    "DCGM_FI_DEV_GPU_TEMP": FieldRule("temperature_celsius"),
    "DCGM_FI_DEV_POWER_USAGE": FieldRule("power_watts"),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": FieldRule("power_limit_watts"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": FieldRule("power_mgmt_limit_watts"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": FieldRule("energy_joules", per=1000),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": FieldRule("nvlink_transmit_bytes_per_second"),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": FieldRule("nvlink_receive_bytes_per_second"),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": FieldRule("nvlink_bandwidth_raw"),
    # -- performance (GpuPerformance) --
    "DCGM_FI_DEV_SM_CLOCK": FieldRule("sm_clock_hertz", HZ_PER_MHZ),
    "DCGM_FI_DEV_MEM_CLOCK": FieldRule("memory_clock_hertz", HZ_PER_MHZ),
    "DCGM_FI_DEV_MAX_SM_CLOCK": FieldRule("sm_clock_max_hertz", HZ_PER_MHZ),
    "DCGM_FI_DEV_MAX_MEM_CLOCK": FieldRule("memory_clock_max_hertz", HZ_PER_MHZ),
    "DCGM_FI_DEV_MEMORY_TEMP": FieldRule("memory_temperature_celsius", zero_is_absent=True),
    "DCGM_FI_DEV_FAN_SPEED": FieldRule("fan_speed_ratio", per=100),
    "DCGM_FI_DEV_PSTATE": FieldRule("performance_state", kind="int", upto=15),
    "DCGM_FI_DEV_PCIE_LINK_GEN": FieldRule("pcie_link_generation", kind="int"),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": FieldRule("pcie_link_width", kind="int"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": FieldRule("pcie_transmit_bytes_per_second"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": FieldRule("pcie_receive_bytes_per_second"),
    "DCGM_FI_DEV_ENC_UTIL": FieldRule("encoder_utilization_ratio", per=100),
    "DCGM_FI_DEV_DEC_UTIL": FieldRule("decoder_utilization_ratio", per=100),
    "DCGM_FI_DEV_MEM_COPY_UTIL": FieldRule("memory_bandwidth_utilization_ratio", per=100),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": FieldRule("graphics_engine_active_ratio"),
    "DCGM_FI_PROF_SM_ACTIVE": FieldRule("sm_active_ratio"),
    "DCGM_FI_PROF_SM_OCCUPANCY": FieldRule("sm_occupancy_ratio"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": FieldRule("tensor_active_ratio"),
    "DCGM_FI_PROF_DRAM_ACTIVE": FieldRule("dram_active_ratio"),
    # -- health (GpuHealth) --
    "DCGM_FI_DEV_XID_ERRORS": FieldRule("last_xid", kind="int", zero_is_absent=True),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": FieldRule("ecc_single_bit_volatile", kind="int"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": FieldRule("ecc_double_bit_volatile", kind="int"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": FieldRule("ecc_single_bit_aggregate", kind="int"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": FieldRule("ecc_double_bit_aggregate", kind="int"),
    "DCGM_FI_DEV_RETIRED_SBE": FieldRule("retired_pages_single_bit", kind="int"),
    "DCGM_FI_DEV_RETIRED_DBE": FieldRule("retired_pages_double_bit", kind="int"),
    "DCGM_FI_DEV_RETIRED_PENDING": FieldRule("retired_pages_pending", kind="flag"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": FieldRule("remapped_rows_correctable", kind="int"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": FieldRule("remapped_rows_uncorrectable",
                                                         kind="int"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": FieldRule("remapped_rows_pending", kind="flag"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": FieldRule("remapped_rows_failure", kind="flag"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": FieldRule("nvlink_crc_flit_errors",
                                                               kind="int"),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": FieldRule("nvlink_crc_data_errors",
                                                               kind="int"),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": FieldRule("nvlink_replay_errors", kind="int"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": FieldRule("nvlink_recovery_errors",
                                                               kind="int"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": FieldRule("pcie_replay_errors", kind="int"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": FieldRule("clock_event_reasons", kind="int"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": FieldRule("clock_event_reasons", kind="int"),
}

# target -> True for a GpuHealth field, False for a GpuPerformance one (others: Gpu's own)
_IN_HEALTH = {**{f.name: False for f in fields(GpuPerformance)},
              **{f.name: True for f in fields(GpuHealth)}}
_KINDS = {rule.target: rule.kind for rule in GPU_FIELDS.values()}

# Fields a MIG GPU instance series carries that we use (newer dcgm-exporter
# exports framebuffer per GPU instance; profiling fields we ignore).
MIG_FIELDS: dict[str, FieldRule] = {
    "DCGM_FI_DEV_FB_USED": FieldRule("fb_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": FieldRule("fb_free_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": FieldRule("fb_reserved_bytes", MIB),
    "DCGM_FI_DEV_FB_TOTAL": FieldRule("fb_total_bytes", MIB),
}

# Label spellings across dcgm-exporter versions and Prometheus relabelling, first wins.
NODE_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid")
INDEX_LABELS = ("gpu",)
MODEL_LABELS = ("modelName", "modelname")
PCI_LABELS = ("pci_bus_id",)
POD_LABELS = ("exported_pod", "pod")
NAMESPACE_LABELS = ("exported_namespace", "namespace")
CONTAINER_LABELS = ("exported_container", "container")
MIG_ID_LABEL = "GPU_I_ID"
MIG_PROFILE_LABEL = "GPU_I_PROFILE"
# Static fields dcgm-exporter turns into labels (the "label" rows of its counters file).
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
VBIOS_LABEL = "DCGM_FI_DEV_VBIOS_VERSION"
# Every label the mapping reads; docs/sources.md lists the ones it drops (tests/test_dcgm_fields.py).
MAPPED_LABELS = frozenset((*NODE_LABELS, *UUID_LABELS, *INDEX_LABELS, *MODEL_LABELS, *PCI_LABELS,
                           *POD_LABELS, *NAMESPACE_LABELS, MIG_ID_LABEL, MIG_PROFILE_LABEL,
                           DRIVER_LABEL, VBIOS_LABEL))
# Driver and VBIOS versions are short ("580.105.08", "96.00.74.00.01"); a longer value is
# hostile and would become a gpufleet_gpu_info label on every scrape, so it is dropped.
MAX_VERSION_CHARS = 64

# Caps a scraped target is held to (DcgmFleetBuilder(capped=True)); a body beyond one is
# refused whole, not truncated. A MIG GPU holds at most 7 GPU instances (seven 1g profiles
# on A100/H100/H200/B200; MIG instances keep their GPU's UUID, so they do not count as
# GPUs). Pods per GPU: MPS serves at most 48 clients per GPU; time-slicing replicas have no
# hard limit, so 128 is a generous bound that still keeps one body from minting 10^5
# allocation series. The GPU cap itself is the dcgm source's max_gpus option.
MAX_MIG_INSTANCES = 7
MAX_PODS_PER_GPU = 128
# NVML's device index on one node; the advisor's snapshot bounds (MAX_GPUS_PER_NODE in
# exporter/advisor/bounds.py) take no more. -3 or 10^9 is no index: the sample is skipped.
MAX_GPU_INDEX = 63


class OverCap(Exception):
    """A body describes more than a cap allows (GPUs, MIG instances, pods, lines, bytes)."""


def first_label(labels: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return ""


@dataclass
class _MigValues:
    profile: str
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class _GpuValues:
    node: str
    index: int
    uuid: str
    product: str = ""
    pci_bus_id: str = ""
    driver_version: str = ""
    vbios_version: str = ""
    values: dict[str, float] = field(default_factory=dict)
    mig: dict[int, _MigValues] = field(default_factory=dict)
    # (namespace, pod) -> share of this GPU held (MIG slices add up)
    pods: dict[tuple[str, str], float] = field(default_factory=dict)
    _pod_keys: set[tuple[str, str, str]] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class DcgmFleet:
    """The part of the fleet a set of DCGM samples describes."""

    nodes: tuple[Node, ...]
    gpus: tuple[Gpu, ...]
    allocations: tuple[Allocation, ...]
    # uuid -> (transmit, receive) in bytes per second, for sources that keep counters
    nvlink_rates: dict[str, tuple[float | None, float | None]]
    skipped: int  # DCGM samples we could not attribute to a GPU (no UUID, bad gpu index)


class DcgmFleetBuilder:
    """Accumulates samples, then builds nodes, GPUs and allocations.

    ``default_node`` names the node when samples carry no ``Hostname`` (the
    scraped target's host is a good choice); ``pool`` labels every GPU. With
    ``max_gpus``, :meth:`add` raises :class:`OverCap` at the first GPU beyond it, the
    8th MIG instance of a GPU or its 129th pod, so the work stops at the cap.
    """

    def __init__(self, *, default_node: str = "", pool: str = "",
                 resolve_model: ModelResolver = unknown_model,
                 max_gpus: int | None = None) -> None:
        self.default_node = default_node
        self.pool = pool
        self.resolve_model = resolve_model
        # One node's body (the dcgm source) is capped; a Prometheus server's view of the
        # whole fleet is not. With a cap, the MIG and pod caps above apply too.
        self.max_gpus = max_gpus
        self._gpus: dict[str, _GpuValues] = {}
        self.skipped = 0
        self.used = 0

    def add(self, name: str, labels: Mapping[str, str], value: float) -> bool:
        """Take one sample; True if it fed a GPU, False if ignored, blank or unattributable."""
        if not name.startswith("DCGM_"):
            return False
        # Every DCGM sample registers its GPU, so a GPU whose fields we don't use still appears.
        gpu = self._gpu(labels)
        if gpu is None:
            return False
        mig_id_text = labels.get(MIG_ID_LABEL, "")
        rule = (MIG_FIELDS if mig_id_text else GPU_FIELDS).get(name)
        pod = first_label(labels, POD_LABELS)
        mig_id: int | None = None
        if mig_id_text:
            try:
                mig_id = int(mig_id_text)
            except ValueError:
                self.skipped += 1
                return False
            instance = gpu.mig.get(mig_id)
            if instance is None:
                if self.max_gpus is not None and len(gpu.mig) >= MAX_MIG_INSTANCES:
                    raise OverCap(f"too many MIG instances on GPU {gpu.uuid[:40]}: "
                                  f"more than {MAX_MIG_INSTANCES}")
                instance = gpu.mig[mig_id] = _MigValues(labels.get(MIG_PROFILE_LABEL, ""))
        if pod:
            self._add_pod(gpu, labels, pod, mig_id)
        if rule is None or is_blank(value):
            return False
        if (rule.zero_is_absent and value == 0) or (rule.upto is not None and value > rule.upto):
            return False
        if rule.kind != "float" and value < 0:  # a negative count or code is no reading
            return False
        target = gpu.mig[mig_id].values if mig_id is not None else gpu.values
        target[rule.target] = value * rule.scale / rule.per
        self.used += 1
        return True

    def _gpu(self, labels: Mapping[str, str]) -> _GpuValues | None:
        uuid = first_label(labels, UUID_LABELS)
        if not uuid:
            self.skipped += 1
            return None
        gpu = self._gpus.get(uuid)
        if gpu is not None:
            return gpu
        try:
            index = int(first_label(labels, INDEX_LABELS))
        except ValueError:
            self.skipped += 1
            return None
        if not 0 <= index <= MAX_GPU_INDEX:
            self.skipped += 1
            return None
        if self.max_gpus is not None and len(self._gpus) >= self.max_gpus:
            raise OverCap(f"too many GPUs: more than {self.max_gpus}")
        node = first_label(labels, NODE_LABELS) or self.default_node
        gpu = _GpuValues(node, index, uuid, first_label(labels, MODEL_LABELS),
                         first_label(labels, PCI_LABELS),
                         _version(labels.get(DRIVER_LABEL, "")),
                         _version(labels.get(VBIOS_LABEL, "")))
        self._gpus[uuid] = gpu
        return gpu

    def _add_pod(self, gpu: _GpuValues, labels: Mapping[str, str], pod: str,
                 mig_id: int | None) -> None:
        namespace = first_label(labels, NAMESPACE_LABELS)
        # The same pod appears on every field line of its GPU: count each (pod, instance) once.
        key = (namespace, pod, "" if mig_id is None else str(mig_id))
        if key in gpu._pod_keys:
            return
        if self.max_gpus is not None and len(gpu._pod_keys) >= MAX_PODS_PER_GPU:
            raise OverCap(f"too many pods on GPU {gpu.uuid[:40]}: more than {MAX_PODS_PER_GPU}")
        gpu._pod_keys.add(key)
        share = 1.0 if mig_id is None else mig_share(labels.get(MIG_PROFILE_LABEL, ""))
        gpu.pods[(namespace, pod)] = min(1.0, gpu.pods.get((namespace, pod), 0.0) + share)

    def build(self) -> DcgmFleet:
        gpus: list[Gpu] = []
        rates: dict[str, tuple[float | None, float | None]] = {}
        node_gpus: dict[str, list[Gpu]] = {}
        archs: dict[str, str] = {}
        # (namespace, pod) -> node -> [(gpu index, share)]
        held: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = {}
        for values in sorted(self._gpus.values(), key=lambda g: (g.node, g.index)):
            v = values.values
            # no modelName label (dcgm-exporter 2.x): the framebuffer size, where it names one
            info = self.resolve_model(values.product or memory_model(_memory_total(v)))
            health, performance = _sections(v)
            gpu = Gpu(
                node=values.node,
                index=values.index,
                uuid=values.uuid,
                model=info.model,
                pool=self.pool,
                memory_total_bytes=_int(_memory_total(v)),
                memory_used_bytes=_int(v.get("fb_used_bytes")),
                utilization_ratio=v.get("utilization_ratio"),
                temperature_celsius=v.get("temperature_celsius"),
                power_watts=v.get("power_watts"),
                power_limit_watts=v.get("power_limit_watts", v.get("power_mgmt_limit_watts")),
                energy_joules=v.get("energy_joules"),
                nvlink_capacity_bytes_per_second=info.nvlink_bandwidth_bytes_per_second,
                mig=tuple(
                    MigInstance(instance_id, inst.profile,
                                _int(_memory_total(inst.values)),
                                _int(inst.values.get("fb_used_bytes")))
                    for instance_id, inst in sorted(values.mig.items())
                ),
                pci_bus_id=values.pci_bus_id or None,
                dcgm_nvlink_bandwidth_raw=v.get("nvlink_bandwidth_raw"),
                driver_version=values.driver_version or None,
                vbios_version=values.vbios_version or None,
                health=health,
                performance=performance,
            )
            gpus.append(gpu)
            rates[values.uuid] = (v.get("nvlink_transmit_bytes_per_second"),
                                  v.get("nvlink_receive_bytes_per_second"))
            node_gpus.setdefault(values.node, []).append(gpu)
            archs.setdefault(info.model, info.architecture)
            # Several pods on one whole GPU (time-slicing) split it evenly.
            whole = [k for k in values.pods if values.pods[k] >= 1.0]
            for key, share in values.pods.items():
                if share >= 1.0 and len(whole) > 1:
                    share = 1.0 / len(whole)
                held.setdefault(key, {}).setdefault(values.node, []).append((values.index, share))

        nodes = []
        for name, members in node_gpus.items():
            models = [g.model for g in members]
            model = max(set(models), key=models.count)
            # DCGM knows nothing of CPUs: cpu_cores is 0 for nodes seen only through it.
            nodes.append(Node(name, model, 0.0, self.pool, archs.get(model, "unknown"),
                              len(members)))

        allocations = []
        for (namespace, pod), by_node in sorted(held.items()):
            placements = []
            for node, entries in sorted(by_node.items()):
                # One placement per share value, since Placement holds one share for its GPUs.
                by_share: dict[float, list[int]] = {}
                for index, share in entries:
                    by_share.setdefault(round(share, 6), []).append(index)
                for share, indexes in sorted(by_share.items()):
                    placements.append(Placement(node, tuple(sorted(indexes)), share, 0.0))
            allocations.append(Allocation(job=f"{namespace}/{pod}" if namespace else pod,
                                          placements=tuple(placements),
                                          namespace=namespace, pod=pod))
        return DcgmFleet(tuple(nodes), tuple(gpus), tuple(allocations), rates, self.skipped)


def _version(value: str) -> str:
    return value if len(value) <= MAX_VERSION_CHARS and value.isprintable() else ""


def _sections(values: Mapping[str, float]) -> tuple[GpuHealth | None, GpuPerformance | None]:
    """GpuHealth and GpuPerformance from the values each has; None for one with none, so a
    dcgm-exporter exporting none of its fields reads as "not supported". One pass: this runs
    per GPU, 13,520 times in bench/dcgm_parse.py's body."""
    health: dict[str, Any] = {}
    performance: dict[str, Any] = {}
    for name, value in values.items():
        in_health = _IN_HEALTH.get(name)
        if in_health is not None:
            (health if in_health else performance)[name] = _typed(name, value)
    return (GpuHealth(**health) if health else None,
            GpuPerformance(**performance) if performance else None)


def _typed(name: str, value: float) -> float | int | bool:
    kind = _KINDS[name]
    if kind == "int":
        return round(value)
    if kind == "flag":
        return value != 0
    return value


def _memory_total(values: Mapping[str, float]) -> float | None:
    if "fb_total_bytes" in values:
        return values["fb_total_bytes"]
    used, free = values.get("fb_used_bytes"), values.get("fb_free_bytes")
    if used is None or free is None:
        return None
    # Older dcgm-exporter has no FB_RESERVED; its FB_USED then includes reserved.
    return used + free + values.get("fb_reserved_bytes", 0.0)


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def build_fleet(samples: Iterable[tuple[str, Mapping[str, str], float]], *,
                default_node: str = "", pool: str = "",
                resolve_model: ModelResolver = unknown_model) -> DcgmFleet:
    """Map (name, labels, value) samples of one or many GPUs to snapshot records."""
    builder = DcgmFleetBuilder(default_node=default_node, pool=pool, resolve_model=resolve_model)
    for name, labels, value in samples:
        builder.add(name, labels, value)
    return builder.build()


@dataclass
class RateIntegrator:
    """Turns sampled byte rates into byte counters, per GPU.

    DCGM exports NVLink traffic as rates (B/s) while the snapshot, like NVML,
    carries cumulative byte counters, so ``rate()`` works the same on both
    sources. The counter grows by rate x elapsed time between readings and
    starts at 0 when a GPU is first seen (Prometheus treats that as a counter
    reset). It is an estimate: traffic between two samples is assumed flat.
    """

    _last: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def advance(self, uuid: str, now: float, tx_rate: float | None,
                rx_rate: float | None) -> tuple[float | None, float | None]:
        if tx_rate is None and rx_rate is None:
            return None, None
        last = self._last.get(uuid)
        tx_total, rx_total = 0.0, 0.0
        if last is not None:
            then, tx_total, rx_total = last
            elapsed = max(0.0, now - then)
            tx_total += max(0.0, tx_rate or 0.0) * elapsed
            rx_total += max(0.0, rx_rate or 0.0) * elapsed
        self._last[uuid] = (now, tx_total, rx_total)
        return (tx_total if tx_rate is not None else None,
                rx_total if rx_rate is not None else None)

    def forget_except(self, uuids: Iterable[str]) -> None:
        keep = set(uuids)
        for uuid in [u for u in self._last if u not in keep]:
            del self._last[uuid]

    def apply(self, fleet: DcgmFleet, now: float) -> tuple[Gpu, ...]:
        """The fleet's GPUs with NVLink byte counters filled from their rates."""
        out = []
        for gpu in fleet.gpus:
            tx, rx = fleet.nvlink_rates.get(gpu.uuid, (None, None))
            tx_total, rx_total = self.advance(gpu.uuid, now, tx, rx)
            out.append(replace(gpu, nvlink_transmit_bytes=tx_total, nvlink_receive_bytes=rx_total))
        return tuple(out)
