"""The fleet snapshot: one immutable picture of every node, GPU and allocation.

Sources produce it, analysis reads it, exposition renders it. Nothing mutates a
snapshot after it is built: each collection builds a new one and the server
swaps one reference, so a scrape never sees half of an update.

Telemetry fields are ``None`` when a source could not read them (a MIG GPU has
no utilization, a lost GPU has nothing). Absent is exported as a missing
series, never as zero or NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The clock-event reasons gpufleet exports with their bits in NVML's mask, for the sources that
# decode a mask: the catalogue's (the ``reason`` values of gpufleet_gpu_clock_event_active).
from exporter.metrics import CLOCK_EVENT_REASONS as CLOCK_EVENT_REASONS
from exporter.validate import Builder


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    model: str  # catalogue name of its GPUs
    cpu_cores: float
    pool: str  # Slurm partition or Kubernetes node pool
    generation: str  # architecture generation, e.g. "hopper"
    gpu_count: int
    # the scheduler's own state: drained or draining (Slurm's DRAIN flag); None: the source
    # does not say. What confirms a drain gpufleet only advised (/v1/advice's health)
    drained: bool | None = None


@dataclass(frozen=True, slots=True)
class MigInstance:
    instance_id: int
    profile: str  # e.g. "1g.10gb"
    memory_total_bytes: int | None
    memory_used_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class XidCount:
    """How many times one XID was seen on a GPU since the exporter (or simulation) started."""

    xid: int
    count: int


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """Error and slowdown counters of one GPU (issue 16, Build 1). ``None``: not supported.

    Counts are as the driver keeps them (ECC, retired pages, remapped rows, NVLink and PCIe
    counters survive an exporter restart) except XIDs, which are events the exporter saw.
    """

    xid_counts: tuple[XidCount, ...] = ()  # sorted by xid; empty: none seen (or no event set)
    last_xid: int | None = None
    last_xid_time: float | None = None  # unix seconds the last XID was seen
    ecc_single_bit_volatile: int | None = None  # corrected, since the driver loaded
    ecc_double_bit_volatile: int | None = None  # uncorrected, since the driver loaded
    ecc_single_bit_aggregate: int | None = None  # corrected, over the GPU's life
    ecc_double_bit_aggregate: int | None = None  # uncorrected, over the GPU's life
    retired_pages_single_bit: int | None = None  # pre-Ampere page retirement
    retired_pages_double_bit: int | None = None
    retired_pages_pending: bool | None = None  # a retirement waits for the next driver load
    remapped_rows_correctable: int | None = None  # Ampere and later row remapping
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None  # a remap waits for a GPU reset
    remapped_rows_failure: bool | None = None  # a remap failed: the GPU needs service
    nvlink_crc_flit_errors: int | None = None  # each summed over the GPU's links
    nvlink_crc_data_errors: int | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    pcie_replay_errors: int | None = None
    clock_event_reasons: int | None = None  # NVML's reason bitmask (see CLOCK_EVENT_REASONS)


@dataclass(frozen=True, slots=True)
class GpuPerformance:
    """Clocks, link state and engine activity of one GPU (issue 16, Build 2). ``None``: not supported."""

    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    graphics_clock_hertz: float | None = None
    sm_clock_max_hertz: float | None = None
    memory_clock_max_hertz: float | None = None
    graphics_clock_max_hertz: float | None = None
    memory_temperature_celsius: float | None = None  # HBM
    fan_speed_ratio: float | None = None  # 0-1; absent on passively cooled boards
    performance_state: int | None = None  # P-state 0 (fastest) - 15
    pcie_link_generation: int | None = None  # current, not maximum
    pcie_link_width: int | None = None  # lanes, current
    pcie_transmit_bytes_per_second: float | None = None
    pcie_receive_bytes_per_second: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    memory_bandwidth_utilization_ratio: float | None = None  # NVML utilization.memory
    # GPM (Hopper and later) or DCGM_FI_PROF_*: what the GPU really did, 0-1
    graphics_engine_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class OwnerUse:
    """What one owner's processes use of one physical GPU (exporter.attribution.usage)."""

    kind: str  # "pod", "slurm" or "host"
    job: str = ""  # "<namespace>/<pod>" (else the pod's UID) or the Slurm job id
    container: str = ""
    step: str = ""  # the Slurm step
    rank: str = ""  # the training rank from the process environment, "" when unknown
    processes: int = 0
    memory_used_bytes: int | None = None  # None: NVML gives no per-process memory here
    sm_utilization_ratio: float | None = None  # None: no process samples (MIG, old GPUs)


@dataclass(frozen=True, slots=True)
class UnattributedProcesses:
    reason: str  # exporter.attribution.proc.REASONS
    count: int


@dataclass(frozen=True, slots=True)
class GpuProcesses:
    """The processes on a GPU, added up per owner, exactly once per (owner, physical GPU)."""

    owners: tuple[OwnerUse, ...] = ()
    unattributed: tuple[UnattributedProcesses, ...] = ()
    cut_total: int = 0  # processes left out over the per-GPU cap since the exporter started


@dataclass(frozen=True, slots=True)
class Gpu:
    node: str
    index: int
    uuid: str
    model: str
    pool: str
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    nvlink_transmit_bytes: float | None = None
    nvlink_receive_bytes: float | None = None
    nvlink_capacity_bytes_per_second: float | None = None
    up: bool = True  # False: the GPU is lost or every read of it failed
    stale: bool = False  # True: values are the last good sample, not a fresh one
    mig: tuple[MigInstance, ...] = ()
    pci_bus_id: str | None = None
    # DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as dcgm-exporter reports it (a rate of uncertain unit)
    dcgm_nvlink_bandwidth_raw: float | None = None
    driver_version: str | None = None
    vbios_version: str | None = None
    serial: str | None = None  # only when the site exports it (nvml option, off by default)
    health: GpuHealth | None = None  # None: the source reads no health counters
    performance: GpuPerformance | None = None  # None: the source reads no performance values
    processes: GpuProcesses | None = None  # None: the source reads no processes

    @property
    def key(self) -> tuple[str, int]:
        return (self.node, self.index)


@dataclass(frozen=True, slots=True)
class Placement:
    """The part of a job that sits on one node: which GPUs, what share of each, how many CPUs."""

    node: str
    gpus: tuple[int, ...]
    gpu_share: float  # fraction of each of those GPUs held, 1.0 = whole GPU
    cpus: float


@dataclass(frozen=True, slots=True)
class Interruption:
    """The scheduler stopped a job that has not finished: preempted, requeued, suspended or
    evicted (exporter/preemption/ counts them, the work each lost and the wait to resume).

    ``cause``: Slurm's PreemptMode word for what happened to the job (``requeue``: pending
    again with its Restarts count grown, which an operator's requeue also does; ``suspend``)
    or the reason of a pod's ``DisruptionTarget`` condition (``preemption``, ``eviction``,
    ``kubelet``, ``taint``, ``gc``; ``other`` for one Kubernetes adds later)."""

    cause: str
    time: float | None = None  # unix seconds it happened; None: the source does not say
    count: int = 1  # times the job has been stopped so far (Slurm's Restarts): a new count is a new one


@dataclass(frozen=True, slots=True)
class Allocation:
    job: str
    placements: tuple[Placement, ...]
    namespace: str = ""
    pod: str = ""
    priority: int = 0
    qos: str = ""
    user: str = ""
    account: str = ""
    start_time: float | None = None  # unix seconds
    last_checkpoint_time: float | None = None
    gpu_memory_need_bytes: int | None = None  # per GPU, when the job states it
    allowed_models: tuple[str, ...] = ()  # empty: any model
    interrupted: Interruption | None = None  # suspended, or a pod being preempted or evicted

    @property
    def gpu_count(self) -> int:
        return sum(len(p.gpus) for p in self.placements)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.placements)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A pending job: demand the cluster could not place yet."""

    job: str
    gpu_count: int
    gpu_share: float = 1.0
    cpus: float = 0.0
    node_count: int = 1
    models: tuple[str, ...] = ()
    pool: str = ""
    priority: int = 0
    submit_time: float | None = None
    last_checkpoint_time: float | None = None  # as Allocation's: what a preempted job kept
    interrupted: Interruption | None = None  # requeued by a preemption: waiting to resume


@dataclass(frozen=True, slots=True)
class TargetCount:
    """A running total of one target of a source (the series refused from it)."""

    target: str
    count: int


@dataclass(frozen=True, slots=True)
class SourceStatus:
    source: str
    up: bool
    duration_seconds: float
    last_success_time: float | None
    target: str = ""  # one endpoint of a multi-target source (dcgm), "" for the source itself
    error: str = ""
    parse_errors: int = 0
    # by the target that sent them, the series refused for speaking for a node not its own
    series_refused: tuple[TargetCount, ...] = ()


@dataclass(frozen=True, slots=True)
class UnmatchedGpus:
    """GPUs only one side of a composed snapshot saw (see :mod:`exporter.compose`)."""

    side: str  # "allocation" (the scheduler's) or "telemetry"
    count: int


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    taken_at: float  # unix seconds
    nodes: tuple[Node, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    pending: tuple[JobRequest, ...] = ()
    sources: tuple[SourceStatus, ...] = field(default=())
    unmatched: tuple[UnmatchedGpus, ...] = ()  # set only when sources were composed

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def held(self) -> tuple[dict[tuple[str, int], float], dict[str, float]]:
        """What the allocations hold: share per (node, GPU index), and CPU cores per node."""
        shares: dict[tuple[str, int], float] = {}
        cpus: dict[str, float] = {}
        for alloc in self.allocations:
            for part in alloc.placements:
                cpus[part.node] = cpus.get(part.node, 0.0) + part.cpus
                for index in part.gpus:
                    key = (part.node, index)
                    shares[key] = shares.get(key, 0.0) + part.gpu_share
        return shares, cpus

    def gpu_allocations(self) -> dict[tuple[str, int], list[tuple[Allocation, float]]]:
        """(node, gpu index) → [(allocation, share held)], for every allocated GPU."""
        held: dict[tuple[str, int], list[tuple[Allocation, float]]] = {}
        for alloc in self.allocations:
            for part in alloc.placements:
                for index in part.gpus:
                    held.setdefault((part.node, index), []).append((alloc, part.gpu_share))
        return held


def to_json(snapshot: FleetSnapshot) -> dict[str, Any]:
    """A plain-JSON form of the snapshot, served at ``GET /v1/snapshot``."""
    return dataclasses.asdict(snapshot)


# The JSON form is trusted only as far as its shape: a POSTed body has passed the API's
# limits first (exporter.advisor.bounds), a file given to analyze too; here an unknown
# field is refused by name (a typo would otherwise vanish), the values are taken as they are.
_FROM_JSON = Builder(lambda tp, value, key, meta: value, ValueError,
                     unknown="{record}: unknown field {name} (at {where})")


def from_json(data: Mapping[str, Any]) -> FleetSnapshot:
    """Rebuild a snapshot from :func:`to_json` output (``gpufleet analyze --snapshot``)."""
    return _FROM_JSON.build(FleetSnapshot, data)


def merge(taken_at: float, parts: Iterable[FleetSnapshot]) -> FleetSnapshot:
    """Concatenate partial snapshots from several sources into one."""
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    allocations: list[Allocation] = []
    pending: list[JobRequest] = []
    sources: list[SourceStatus] = []
    unmatched: list[UnmatchedGpus] = []
    for part in parts:
        nodes += part.nodes
        gpus += part.gpus
        allocations += part.allocations
        pending += part.pending
        sources += part.sources
        unmatched += part.unmatched
    return FleetSnapshot(
        taken_at, tuple(nodes), tuple(gpus), tuple(allocations), tuple(pending), tuple(sources),
        tuple(unmatched),
    )
