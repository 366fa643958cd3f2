"""Render a snapshot to Prometheus text exposition, once per snapshot.

Metric families are a declarative table (:data:`GPU_FAMILIES`): name, type,
help and a small value function. The identity labels every per-GPU series
carries (``gpu``, ``model``, ``node``, ``pool``, ``uuid``) are added in one
place. Job and pod metadata live only on ``gpufleet_gpu_allocation_info``,
which keeps per-GPU cardinality bounded as jobs come and go.

Our renderer writes exactly the bytes ``prometheus_client.generate_latest``
writes for the same families (sorted labels, Go float formatting); a test
proves it. It exists because ``generate_latest`` costs about a second per
100k series, and we render once per snapshot rather than once per scrape.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from exporter import __version__
from exporter.snapshot import FleetSnapshot, Gpu

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family ready to render: samples are (labels, value)."""

    name: str  # full sample name, counters end in _total
    type: str  # gauge | counter
    help: str
    samples: Sequence[tuple[Labels, float]]


@dataclass(frozen=True, slots=True)
class GpuFamilySpec:
    name: str
    type: str
    help: str
    value: Callable[[Gpu], float | None]


def _bool(value: bool) -> float:
    return 1.0 if value else 0.0


GPU_FAMILIES: tuple[GpuFamilySpec, ...] = (
    GpuFamilySpec("gpufleet_gpu_up", "gauge",
                  "1 if the GPU answered its last read, 0 if it is lost or every read failed.",
                  lambda g: _bool(g.up)),
    GpuFamilySpec("gpufleet_gpu_stale", "gauge",
                  "1 if the values served are the last good sample because the source failed.",
                  lambda g: _bool(g.stale)),
    GpuFamilySpec("gpufleet_gpu_utilization_ratio", "gauge",
                  "Fraction of time a kernel ran on the GPU (0-1).",
                  lambda g: g.utilization_ratio),
    GpuFamilySpec("gpufleet_gpu_memory_used_bytes", "gauge",
                  "GPU framebuffer memory in use, in bytes (reserved memory excluded).",
                  lambda g: g.memory_used_bytes),
    GpuFamilySpec("gpufleet_gpu_memory_total_bytes", "gauge",
                  "GPU framebuffer memory in total, in bytes.",
                  lambda g: g.memory_total_bytes),
    GpuFamilySpec("gpufleet_gpu_temperature_celsius", "gauge",
                  "GPU core temperature in degrees Celsius.",
                  lambda g: g.temperature_celsius),
    GpuFamilySpec("gpufleet_gpu_power_watts", "gauge",
                  "GPU power draw in watts.",
                  lambda g: g.power_watts),
    GpuFamilySpec("gpufleet_gpu_power_limit_watts", "gauge",
                  "Enforced GPU power limit (cap) in watts.",
                  lambda g: g.power_limit_watts),
    GpuFamilySpec("gpufleet_gpu_energy_joules_total", "counter",
                  "Energy the GPU consumed since the driver loaded, in joules.",
                  lambda g: g.energy_joules),
    GpuFamilySpec("gpufleet_gpu_nvlink_transmit_bytes_total", "counter",
                  "Bytes the GPU sent over all its NVLink links.",
                  lambda g: g.nvlink_transmit_bytes),
    GpuFamilySpec("gpufleet_gpu_nvlink_receive_bytes_total", "counter",
                  "Bytes the GPU received over all its NVLink links.",
                  lambda g: g.nvlink_receive_bytes),
    GpuFamilySpec("gpufleet_gpu_nvlink_capacity_bytes_per_second", "gauge",
                  "NVLink bandwidth of the GPU, both directions together, from the GPU catalogue.",
                  lambda g: g.nvlink_capacity_bytes_per_second),
    GpuFamilySpec("gpufleet_gpu_dcgm_nvlink_bandwidth_raw", "gauge",
                  "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as reported: a rate of uncertain unit "
                  "(see docs/sources.md); dcgm source only.",
                  lambda g: g.dcgm_nvlink_bandwidth_raw),
)

IDENTITY = ("gpu", "model", "node", "pool", "uuid")


def _go_float(value: float) -> str:
    # repr() already matches Go below 1e6; floatToGoString handles the exponent switch,
    # infinities and NaN. Skipping the call for the common case halves render time.
    if -1e6 < value < 1e6:
        return repr(value)
    return floatToGoString(value)


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def label_text(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels))
    return "{" + inner + "}"


def identity(gpu: Gpu) -> Labels:
    return (("gpu", str(gpu.index)), ("model", gpu.model), ("node", gpu.node),
            ("pool", gpu.pool), ("uuid", gpu.uuid))


class LabelCache:
    """Identity label text per GPU, reused across snapshots: GPUs rarely change identity."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int, str, str, str], str] = {}

    def get(self, gpu: Gpu) -> str:
        key = (gpu.node, gpu.index, gpu.uuid, gpu.model, gpu.pool)
        text = self._cache.get(key)
        if text is None:
            text = label_text(identity(gpu))
            self._cache[key] = text
        return text


def _header(name: str, kind: str, help_text: str) -> str:
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


def render_gpu_families(gpus: Sequence[Gpu], labels: LabelCache) -> list[str]:
    out: list[str] = []
    label_texts = [labels.get(g) for g in gpus]
    for spec in GPU_FAMILIES:
        out.append(_header(spec.name, spec.type, spec.help))
        prefix = spec.name
        value_of = spec.value
        for gpu, text in zip(gpus, label_texts, strict=True):
            value = value_of(gpu)
            if value is None:
                continue
            out.append(f"{prefix}{text} {_go_float(float(value))}\n")
    return out


def render_families(families: Iterable[Family]) -> list[str]:
    out: list[str] = []
    for family in families:
        out.append(_header(family.name, family.type, family.help))
        for labels, value in family.samples:
            out.append(f"{family.name}{label_text(labels)} {_go_float(float(value))}\n")
    return out


def snapshot_families(snapshot: FleetSnapshot) -> list[Family]:
    """Every family that is not a plain per-GPU value: info, allocation, node and self-metrics."""
    gpus = snapshot.gpus
    held = snapshot.gpu_allocations()
    generation = {n.name: n.generation for n in snapshot.nodes}
    info, allocated, allocation_info, mig_info, mig_total, mig_used = [], [], [], [], [], []
    for gpu in gpus:
        ident = identity(gpu)
        spec_labels = (("architecture", generation.get(gpu.node, "unknown")),)
        info.append(((*ident, *spec_labels), 1.0))
        holders = held.get(gpu.key, [])
        allocated.append((ident, min(1.0, round(sum(share for _, share in holders), 6))))
        for alloc, _share in holders:
            allocation_info.append(((
                *ident,
                ("job", alloc.job),
                ("namespace", alloc.namespace),
                ("pod", alloc.pod),
                ("job_gpus", str(alloc.gpu_count)),
                ("priority", str(alloc.priority)),
            ), 1.0))
        for inst in gpu.mig:
            mig_labels = (*ident, ("instance", str(inst.instance_id)), ("profile", inst.profile))
            mig_info.append((mig_labels, 1.0))
            if inst.memory_total_bytes is not None:
                mig_total.append((mig_labels, float(inst.memory_total_bytes)))
            if inst.memory_used_bytes is not None:
                mig_used.append((mig_labels, float(inst.memory_used_bytes)))

    _, cpu_used = snapshot.held()
    node_info, node_cpus, node_cpus_alloc = [], [], []
    for node in snapshot.nodes:
        labels = (("node", node.name), ("pool", node.pool), ("model", node.model))
        node_info.append(((*labels, ("generation", node.generation),
                           ("gpus", str(node.gpu_count))), 1.0))
        node_cpus.append((labels, node.cpu_cores))
        node_cpus_alloc.append((labels, cpu_used.get(node.name, 0.0)))

    pending_jobs: dict[str, float] = {}
    pending_gpus: dict[str, float] = {}
    for request in snapshot.pending:
        pending_jobs[request.pool] = pending_jobs.get(request.pool, 0) + 1
        pending_gpus[request.pool] = (
            pending_gpus.get(request.pool, 0) + request.gpu_count * request.gpu_share
        )

    up, duration, last_success, parse_errors = [], [], [], []
    for status in snapshot.sources:
        source_labels: tuple[tuple[str, str], ...] = (("source", status.source),)
        if status.target:
            source_labels = (*source_labels, ("target", status.target))
        up.append((source_labels, _bool(status.up)))
        if status.target:
            continue
        duration.append((source_labels, status.duration_seconds))
        if status.last_success_time is not None:
            last_success.append((source_labels, status.last_success_time))
        parse_errors.append((source_labels, float(status.parse_errors)))

    return [
        Family("gpufleet_gpu_info", "gauge",
               "GPU identity and catalogue data; always 1.", info),
        Family("gpufleet_gpu_allocated_ratio", "gauge",
               "Share of the GPU held by jobs (0-1); 1 is a whole GPU allocated.", allocated),
        Family("gpufleet_gpu_allocation_info", "gauge",
               "The job holding the GPU, one series per job; always 1.", allocation_info),
        Family("gpufleet_gpu_mig_instance_info", "gauge",
               "A MIG GPU instance and its profile; always 1.", mig_info),
        Family("gpufleet_gpu_mig_memory_total_bytes", "gauge",
               "Memory of a MIG GPU instance in bytes.", mig_total),
        Family("gpufleet_gpu_mig_memory_used_bytes", "gauge",
               "Memory in use on a MIG GPU instance in bytes.", mig_used),
        Family("gpufleet_node_info", "gauge",
               "Node with its pool, GPU model, generation and GPU count; always 1.", node_info),
        Family("gpufleet_node_cpu_cores", "gauge", "CPU cores of the node.", node_cpus),
        Family("gpufleet_node_cpu_allocated_cores", "gauge",
               "CPU cores of the node held by jobs.", node_cpus_alloc),
        Family("gpufleet_pending_jobs", "gauge",
               "Jobs waiting for GPUs, by the pool they asked for.",
               [((("pool", p),), v) for p, v in sorted(pending_jobs.items())]),
        Family("gpufleet_pending_gpus", "gauge",
               "GPUs asked for by waiting jobs, by pool.",
               [((("pool", p),), v) for p, v in sorted(pending_gpus.items())]),
        Family("gpufleet_source_up", "gauge",
               "1 if the source (or one target of it) answered its last read.", up),
        Family("gpufleet_collect_duration_seconds", "gauge",
               "How long the last read of the source took.", duration),
        Family("gpufleet_last_collect_success_timestamp_seconds", "gauge",
               "Unix time of the source's last successful read.", last_success),
        Family("gpufleet_source_parse_errors_total", "counter",
               "Lines or fields the source could not parse and skipped.", parse_errors),
        Family("gpufleet_compose_unmatched_gpus", "gauge",
               "GPUs only one side of a composed snapshot saw: the scheduler (allocation) "
               "or telemetry.", [((("side", u.side),), float(u.count)) for u in snapshot.unmatched]),
        *allocation_families(snapshot),
        Family("gpufleet_snapshot_timestamp_seconds", "gauge",
               "Unix time the served snapshot was taken.", [((), snapshot.taken_at)]),
        Family("gpufleet_build_info", "gauge", "gpufleet version; always 1.",
               [((("version", __version__),), 1.0)]),
    ]


def allocation_families(snapshot: FleetSnapshot) -> list[Family]:
    """What each job holds on each node besides GPU indices: CPUs and the share of each GPU.

    With ``gpufleet_gpu_allocation_info`` these let a reader of Prometheus (the
    ``prometheus`` source in cluster mode) rebuild every placement exactly.
    """
    cpus: dict[Labels, float] = {}
    shares: dict[Labels, float] = {}
    for alloc in snapshot.allocations:
        for part in alloc.placements:
            # one series per (job, node) even if a source lists a node twice
            labels = (("job", alloc.job), ("node", part.node))
            cpus[labels] = cpus.get(labels, 0.0) + part.cpus
            shares[labels] = max(shares.get(labels, 0.0), part.gpu_share)
    return [
        Family("gpufleet_allocation_cpu_cores", "gauge",
               "CPU cores the job holds on the node.", list(cpus.items())),
        Family("gpufleet_allocation_gpu_share_ratio", "gauge",
               "Share of each of its GPUs on the node the job holds (0-1); 1 is whole GPUs.",
               list(shares.items())),
    ]


@dataclass(frozen=True, slots=True)
class Rendered:
    snapshot: FleetSnapshot
    text: bytes
    gzipped: bytes
    series: int
    render_seconds: float


def render_text(
    snapshot: FleetSnapshot, labels: LabelCache | None = None, extra: Iterable[Family] = ()
) -> bytes:
    parts = render_gpu_families(snapshot.gpus, labels or LabelCache())
    parts += render_families(snapshot_families(snapshot))
    parts += render_families(extra)
    return "".join(parts).encode()


def render(
    snapshot: FleetSnapshot,
    labels: LabelCache | None = None,
    extra: Iterable[Family] = (),
    gzip_level: int = 5,
) -> Rendered:
    """Text and gzip bodies for one snapshot; runs in a worker thread, never on the loop."""
    started = time.perf_counter()
    text = render_text(snapshot, labels, extra)
    gzipped = gzip.compress(text, compresslevel=gzip_level, mtime=0)
    series = text.count(b"\n") - text.count(b"\n#") - (1 if text.startswith(b"#") else 0)
    return Rendered(snapshot, text, gzipped, series, time.perf_counter() - started)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

__all__ = ["CONTENT_TYPE", "GPU_FAMILIES", "Family", "LabelCache", "Rendered", "render"]
