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
==========================================  ==========================================

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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from exporter.snapshot import Allocation, Gpu, MigInstance, Node, Placement
from exporter.sources.gpu_models import ModelResolver, unknown_model

MIB = 1024 * 1024

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
    """Where one DCGM field goes and the factor that turns it into base units."""

    target: str  # key in GpuValues
    scale: float


# Whole-GPU fields we use; anything else from dcgm-exporter is ignored (not an error).
GPU_FIELDS: dict[str, FieldRule] = {
    "DCGM_FI_DEV_FB_USED": FieldRule("fb_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": FieldRule("fb_free_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": FieldRule("fb_reserved_bytes", MIB),
    "DCGM_FI_DEV_FB_TOTAL": FieldRule("fb_total_bytes", MIB),
    "DCGM_FI_DEV_GPU_UTIL": FieldRule("utilization_ratio", 0.01),
    "DCGM_FI_DEV_GPU_TEMP": FieldRule("temperature_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": FieldRule("power_watts", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": FieldRule("power_limit_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": FieldRule("power_mgmt_limit_watts", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": FieldRule("energy_joules", 0.001),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": FieldRule("nvlink_transmit_bytes_per_second", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": FieldRule("nvlink_receive_bytes_per_second", 1.0),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": FieldRule("nvlink_bandwidth_raw", 1.0),
}

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

# A100/H100/H200/B200 have 7 compute slices; a "3g.40gb" instance holds 3/7 of
# the GPU. (The A30 has 4; its shares come out low, which we accept over guessing.)
MIG_COMPUTE_SLICES = 7
_SLICES = re.compile(r"^(\d+)g\.")

# Caps a scraped target is held to (DcgmFleetBuilder(capped=True)); a body beyond one is
# refused whole, not truncated. A MIG GPU holds at most 7 GPU instances (seven 1g profiles
# on A100/H100/H200/B200; MIG instances keep their GPU's UUID, so they do not count as
# GPUs). Pods per GPU: MPS serves at most 48 clients per GPU; time-slicing replicas have no
# hard limit, so 128 is a generous bound that still keeps one body from minting 10^5
# allocation series. The GPU cap itself is the dcgm source's max_gpus option.
MAX_MIG_INSTANCES = 7
MAX_PODS_PER_GPU = 128


class OverCap(Exception):
    """A body describes more than a cap allows (GPUs, MIG instances, pods, lines, bytes)."""


def first_label(labels: Mapping[str, str], names: tuple[str, ...]) -> str:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return ""


def mig_share(profile: str) -> float:
    """Share of the whole GPU a MIG profile holds, from its compute slices ("2g.20gb" → 2/7)."""
    match = _SLICES.match(profile)
    if match is None:
        return 1.0 / MIG_COMPUTE_SLICES
    return min(1.0, int(match.group(1)) / MIG_COMPUTE_SLICES)


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
        target = gpu.mig[mig_id].values if mig_id is not None else gpu.values
        target[rule.target] = value * rule.scale
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
        if self.max_gpus is not None and len(self._gpus) >= self.max_gpus:
            raise OverCap(f"too many GPUs: more than {self.max_gpus}")
        node = first_label(labels, NODE_LABELS) or self.default_node
        gpu = _GpuValues(node, index, uuid, first_label(labels, MODEL_LABELS),
                         first_label(labels, PCI_LABELS))
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
            info = self.resolve_model(values.product)
            v = values.values
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
