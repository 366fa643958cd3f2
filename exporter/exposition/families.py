"""The family table: every family /metrics serves, and how its samples are made from a snapshot.

Names, types, HELP texts and, for the per-GPU families, the field each reads all come
from the catalogue (:mod:`exporter.metrics`): :data:`GPU_FAMILIES` is made from those
records alone (:func:`gpu_family`). The families joined from several parts of the snapshot
(``gpu_info``, allocation, MIG: :data:`GPU_JOINED_FAMILIES`) and the fleet-level ones
(:func:`fleet_families`) are built by the functions here. The identity labels every
per-GPU series carries are added in one place (:func:`~exporter.exposition.lines.identity`).
Job and pod metadata live only on ``gpufleet_gpu_allocation_info``, which keeps per-GPU
cardinality bounded as jobs come and go.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

from exporter import __version__, metrics
from exporter.exposition.lines import identity
from exporter.gpu_catalogue import default_catalogue
from exporter.metrics import Family, FamilySpec, Labels, Pairs
from exporter.snapshot import Allocation, FleetSnapshot, Gpu


@dataclass(frozen=True, slots=True)
class GpuFamily:
    """A "gpu" family of the catalogue and the value each GPU gives it (None: absent; a bool
    is 1 or 0). ``values`` reads a block's GPUs in one call, in C where it can (``map`` of an
    ``attrgetter``): a render reads 108,800 GPUs a family every snapshot. ``value`` is the
    same read of one GPU."""

    spec: FamilySpec
    values: Callable[[Sequence[Gpu]], list[float | bool | None]]
    # "health" / "performance": the value is read from that immutable part of the GPU alone,
    # so a block whose GPUs hold the same parts as last time is reused without a call
    part: str | None = None

    def value(self, gpu: Gpu) -> float | bool | None:
        return self.values((gpu,))[0]


@dataclass(frozen=True, slots=True)
class GpuLabelledFamily:
    """A "gpu_labelled" family: each GPU gives (extra label values, value) pairs, the values in
    the order ``spec.labels`` lists them after the identity labels. ``samples_of`` reads a
    block's GPUs in one call (no Python call per GPU); ``samples`` is the same read of one."""

    spec: FamilySpec
    samples_of: Callable[[Sequence[Gpu]], list[Pairs]]
    part: str | None = None  # as GpuFamily.part

    def samples(self, gpu: Gpu) -> Pairs:
        return self.samples_of((gpu,))[0]


Reader = Callable[[Sequence[Gpu]], list[Any]]


def _reader(part: str, of_part: Callable[[Any], Any]) -> Reader:
    """Per GPU of a block, ``of_part`` of its ``part`` ("" for the Gpu itself), None where the
    part is None. Where every GPU has the part (all of them, or none, in a fleet) both reads
    are ``map`` in C, with no Python call per GPU (docs/performance.md, issue 27: per-GPU
    closures made a render with health values 6-9% slower than hand-written functions)."""
    if not part:
        return lambda gpus: list(map(of_part, gpus))
    of_gpu = attrgetter(part)

    def read(gpus: Sequence[Gpu]) -> list[Any]:
        held = list(map(of_gpu, gpus))
        if all(held):  # no part is None (a part object is always true): both in C
            return list(map(of_part, held))
        return [None if h is None else of_part(h) for h in held]

    return read


def _field(path: str) -> Reader:
    """The value at ``path`` (``FamilySpec.read``) of each GPU: None where its part is None."""
    part, _, name = path.rpartition(".")
    return _reader(part, attrgetter(name))


def _series_samples(series: tuple[metrics.Series, ...]) -> Callable[[Sequence[Gpu]], list[Pairs]]:
    """Per GPU, the pairs of the series whose field is known: an unsupported counter has no
    series, never 0. A series with a ``bit`` is 1 while that bit of its field is set.

    Specialised by the series' shape, as a render with health values reads 8 such families
    for every GPU every snapshot: fields in one part (or all at its top level) are read
    together, by one ``attrgetter`` in C, and paired in C where all are reported; the bits of
    one field (clock event reasons) are tested against that one value."""
    parts = {s.path.rpartition(".")[0] for s in series}
    # per GPU, a row of one value per series, of the same length as these by construction:
    # the zips below are not strict (one check fewer per GPU)
    labels = [s.labels for s in series]
    bits = [s.bit for s in series]
    if len(parts) != 1:  # not in one part: each field on its own
        fields = [_field(s.path) for s in series]

        def each(gpus: Sequence[Gpu]) -> list[Pairs]:
            columns = [read(gpus) for read in fields]
            return [[(label, (1.0 if value & bit else 0.0) if bit else value)
                     for label, value, bit in zip(labels, row, bits, strict=False) if value is not None]
                    for row in zip(*columns, strict=False)]

        return each
    part = parts.pop()
    names = list(dict.fromkeys(s.path.rpartition(".")[2] for s in series))
    if len(names) == 1 and all(bits):  # the bits of one field: each series one bit of it
        masks = _reader(part, attrgetter(names[0]))
        flags = list(zip(labels, bits, strict=True))

        def bits_of(gpus: Sequence[Gpu]) -> list[Pairs]:
            return [[] if mask is None else [(label, 1.0 if mask & bit else 0.0) for label, bit in flags]
                    for mask in masks(gpus)]

        return bits_of
    if any(bits):  # bits and values mixed: each series' field of the tuple read
        of_series = attrgetter(*(s.path.rpartition(".")[2] for s in series))
        rows = _reader(part, of_series if len(series) > 1 else lambda held: (of_series(held),))

        def mixed(gpus: Sequence[Gpu]) -> list[Pairs]:
            return [[] if row is None else
                    [(label, (1.0 if value & bit else 0.0) if bit else value)
                     for label, value, bit in zip(labels, row, bits, strict=False) if value is not None]
                    for row in rows(gpus)]

        return mixed
    of_fields = attrgetter(*(s.path.rpartition(".")[2] for s in series))
    values = _reader(part, of_fields if len(series) > 1 else lambda held: (of_fields(held),))
    paired, unreported = _paired(labels), (None,) * len(series)

    def reported(gpus: Sequence[Gpu]) -> list[Pairs]:
        rows = values(gpus)
        if None not in rows and None not in itertools.chain.from_iterable(rows):
            return paired(rows)  # every GPU has the part and reports every field: most fleets
        # a GPU that reports none of them (a counter its driver lacks) costs no zip
        return [[] if row is None or row == unreported else
                [(label, value) for label, value in zip(labels, row, strict=False) if value is not None]
                for row in rows]

    return reported


def _paired(labels: list[tuple[str, ...]]) -> Callable[[list[tuple[Any, ...]]], list[Pairs]]:
    """Each row of values paired with ``labels``, its series' label values. The catalogue's
    families of fields have 2 to 4 series (retired pages, clocks, ECC): for those the pairs are
    list displays, two and a half times as fast as a ``zip`` per GPU (its keyword alone costs
    a dict), which made the health families 10% slower than the hand-written functions."""
    if len(labels) == 2:
        a, b = labels
        return lambda rows: [[(a, x), (b, y)] for x, y in rows]
    if len(labels) == 3:
        a, b, c = labels
        return lambda rows: [[(a, x), (b, y), (c, z)] for x, y, z in rows]
    if len(labels) == 4:
        a, b, c, d = labels
        return lambda rows: [[(a, w), (b, x), (c, y), (d, z)] for w, x, y, z in rows]
    return lambda rows: [list(zip(labels, row, strict=True)) for row in rows]


def _field_samples(read: metrics.FromField) -> Callable[[Sequence[Gpu]], list[Pairs]]:
    """Per GPU, the pairs ``read.samples`` makes of the field's value; none while it is absent
    or empty (no XID seen: most GPUs, without a call)."""
    values, make = _field(read.path), read.samples
    return lambda gpus: [make(value) if value else [] for value in values(gpus)]


def _or_catalogue(read: metrics.OrCatalogue) -> Reader:
    """The field where set and not 0, else the GPU catalogue's value for the GPU's model."""
    catalogue, values = default_catalogue(), _field(read.path)

    def of_model(model: str) -> Any:
        found = catalogue.find(model)
        return getattr(found, read.spec) if found is not None else None

    return lambda gpus: [value or of_model(gpu.model)
                         for gpu, value in zip(gpus, values(gpus), strict=True)]


def gpu_family(spec: FamilySpec) -> GpuFamily | GpuLabelledFamily:
    """The renderer's entry for a per-GPU family, made from its catalogue record alone."""
    read = spec.read
    if spec.kind == "gpu":
        if isinstance(read, str):
            return GpuFamily(spec, _field(read), spec.part)
        if isinstance(read, metrics.OrCatalogue):
            return GpuFamily(spec, _or_catalogue(read), spec.part)
        assert callable(read), spec.name
        return GpuFamily(spec, _reader("", read), spec.part)
    if isinstance(read, tuple):
        return GpuLabelledFamily(spec, _series_samples(read), spec.part)
    if isinstance(read, metrics.FromField):
        return GpuLabelledFamily(spec, _field_samples(read), spec.part)
    assert callable(read), spec.name
    return GpuLabelledFamily(spec, _reader("", read), spec.part)


# Every family each GPU gives its values directly, in catalogue order (the body's).
GPU_FAMILIES: tuple[GpuFamily | GpuLabelledFamily, ...] = tuple(
    gpu_family(spec) for spec in metrics.CATALOGUE.values() if spec.kind in ("gpu", "gpu_labelled"))


def _bool(value: bool) -> float:
    return 1.0 if value else 0.0


@dataclass(frozen=True, slots=True)
class JoinedFamily:
    """A "gpu_joined" family and what its samples of a GPU are made from: ``identity`` (the
    GPU's label text, firmware and its node's generation), ``holders`` (the allocations
    holding it) or ``mig`` (its MIG instances). The block renderer compares those inputs,
    once per block for all the families that share them."""

    spec: FamilySpec
    inputs: Literal["identity", "holders", "mig"]

    @property
    def kept_per_gpu(self) -> bool:
        """Whether its blocks keep each GPU's text, to remake only the GPUs whose inputs
        changed: holders and MIG instances change every snapshot somewhere (33 MB at 108,800
        GPUs); identity and firmware rarely do, and gpu_info's text would be 32 MB more."""
        return self.inputs != "identity"


# In the order gpu_snapshot_samples returns their samples, and the body's (the catalogue's).
GPU_JOINED_FAMILIES: tuple[JoinedFamily, ...] = (
    JoinedFamily(metrics.GPU_INFO, "identity"),
    JoinedFamily(metrics.GPU_ALLOCATED_RATIO, "holders"),
    JoinedFamily(metrics.GPU_ALLOCATION_INFO, "holders"),
    JoinedFamily(metrics.GPU_MIG_INSTANCE_INFO, "mig"),
    JoinedFamily(metrics.GPU_MIG_MEMORY_TOTAL_BYTES, "mig"),
    JoinedFamily(metrics.GPU_MIG_MEMORY_USED_BYTES, "mig"),
)
GPU_SNAPSHOT_FAMILIES: tuple[FamilySpec, ...] = tuple(f.spec for f in GPU_JOINED_FAMILIES)


def snapshot_families(snapshot: FleetSnapshot) -> list[Family]:
    """Every family that is not a plain per-GPU value: info, allocation, node and self-metrics."""
    samples = gpu_snapshot_samples(snapshot.gpus, generations(snapshot),
                                   snapshot.gpu_allocations())
    return [spec.family(s) for spec, s in zip(GPU_SNAPSHOT_FAMILIES, samples, strict=True)] + \
        fleet_families(snapshot)


def generations(snapshot: FleetSnapshot) -> dict[str, str]:
    return {n.name: n.generation for n in snapshot.nodes}


Samples = list[tuple[Labels, float]]


def gpu_snapshot_samples(
    gpus: Sequence[Gpu], generation: dict[str, str],
    held: dict[tuple[str, int], list[tuple[Allocation, float]]],
) -> tuple[Samples, Samples, Samples, Samples, Samples, Samples]:
    """The samples of :data:`GPU_SNAPSHOT_FAMILIES` for ``gpus``: identity, allocation, MIG."""
    out: tuple[Samples, Samples, Samples, Samples, Samples, Samples] = ([], [], [], [], [], [])
    for gpu in gpus:
        for samples, of_gpu in zip(out, gpu_joined_samples(gpu, generation, held), strict=True):
            samples += of_gpu
    return out


def gpu_joined_samples(
    gpu: Gpu, generation: dict[str, str],
    held: dict[tuple[str, int], list[tuple[Allocation, float]]],
) -> tuple[Samples, Samples, Samples, Samples, Samples, Samples]:
    """One GPU's samples of :data:`GPU_SNAPSHOT_FAMILIES`."""
    ident = identity(gpu)
    spec_labels: Labels = (("architecture", generation.get(gpu.node, "unknown")),
                           ("driver_version", gpu.driver_version or ""),
                           ("vbios_version", gpu.vbios_version or ""),
                           ("pci_bus_id", gpu.pci_bus_id or ""))
    if gpu.serial is not None:  # only where the site exports serials (off by default)
        spec_labels = (*spec_labels, ("serial", gpu.serial))
    holders = held.get(gpu.key, [])
    allocation_info: Samples = [((
        *ident,
        ("job", alloc.job),
        ("namespace", alloc.namespace),
        ("pod", alloc.pod),
        ("account", alloc.account),
        ("job_gpus", str(alloc.gpu_count)),
        ("priority", str(alloc.priority)),
    ), 1.0) for alloc, _share in holders]
    mig_info: Samples = []
    mig_total: Samples = []
    mig_used: Samples = []
    for inst in gpu.mig:
        mig_labels = (*ident, ("gpu_instance", str(inst.instance_id)), ("profile", inst.profile))
        mig_info.append((mig_labels, 1.0))
        if inst.memory_total_bytes is not None:
            mig_total.append((mig_labels, float(inst.memory_total_bytes)))
        if inst.memory_used_bytes is not None:
            mig_used.append((mig_labels, float(inst.memory_used_bytes)))
    return ([((*ident, *spec_labels), 1.0)],
            [(ident, min(1.0, round(sum(share for _, share in holders), 6)))],
            allocation_info, mig_info, mig_total, mig_used)


def fleet_families(snapshot: FleetSnapshot, serves: Callable[[str], bool] = lambda name: True
                   ) -> list[Family]:
    """:func:`snapshot_families` after the per-GPU ones: nodes, pending, sources, build. The
    per-node summaries over every GPU are worked out only where ``serves`` their name (not in
    cluster mode, which reads them: a walk over 108,800 GPUs each render for nothing)."""
    _, cpu_used = snapshot.held()
    node_info, node_cpus, node_cpus_alloc, drained = [], [], [], []
    for node in snapshot.nodes:
        labels = (("node", node.name), ("pool", node.pool), ("model", node.model))
        node_info.append(((*labels, ("architecture", node.generation),
                           ("gpus", str(node.gpu_count))), 1.0))
        node_cpus.append((labels, node.cpu_cores))
        node_cpus_alloc.append((labels, cpu_used.get(node.name, 0.0)))
        if node.drained:
            drained.append(((("node", node.name), ("pool", node.pool)), 1.0))

    # the per-node summary cluster mode reads instead of each GPU's up and stale
    gpu_states: dict[tuple[tuple[str, str], ...], float] = {}
    for gpu in snapshot.gpus if serves(metrics.NODE_GPUS.name) else ():
        state = "stale" if gpu.stale else "up" if gpu.up else "down"
        key = (("node", gpu.node), ("pool", gpu.pool), ("model", gpu.model), ("state", state))
        gpu_states[key] = gpu_states.get(key, 0.0) + 1.0
    memory_total = (node_memory_totals(snapshot.gpus)
                    if serves(metrics.NODE_GPU_MEMORY_TOTAL_BYTES.name) else [])

    pending_jobs: dict[str, float] = {}
    pending_gpus: dict[str, float] = {}
    for request in snapshot.pending:
        pending_jobs[request.pool] = pending_jobs.get(request.pool, 0) + 1
        pending_gpus[request.pool] = (
            pending_gpus.get(request.pool, 0) + request.gpu_count * request.gpu_share
        )

    up, duration, last_success, parse_errors, refused = [], [], [], [], []
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
        refused += [((*source_labels, ("target", t.target)), float(t.count))
                    for t in status.series_refused]

    return [
        metrics.NODE_INFO.family(node_info),
        metrics.NODE_CPU_CORES.family(node_cpus),
        metrics.NODE_GPUS.family(sorted(gpu_states.items())),
        metrics.NODE_GPU_MEMORY_TOTAL_BYTES.family(memory_total),
        metrics.NODE_CPU_ALLOCATED_CORES.family(node_cpus_alloc),
        metrics.NODE_DRAINED.family(drained),
        metrics.PENDING_JOBS.family([((("pool", p),), v) for p, v in sorted(pending_jobs.items())]),
        metrics.PENDING_GPUS.family([((("pool", p),), v) for p, v in sorted(pending_gpus.items())]),
        metrics.SOURCE_UP.family(up),
        metrics.COLLECT_DURATION_SECONDS.family(duration),
        metrics.LAST_COLLECT_SUCCESS_TIMESTAMP_SECONDS.family(last_success),
        metrics.SOURCE_PARSE_ERRORS_TOTAL.family(parse_errors),
        metrics.SOURCE_SERIES_REFUSED_TOTAL.family(refused),
        metrics.COMPOSE_UNMATCHED_GPUS.family(
            [((("side", u.side),), float(u.count)) for u in snapshot.unmatched]),
        *allocation_families(snapshot),
        metrics.SNAPSHOT_TIMESTAMP_SECONDS.family([((), snapshot.taken_at)]),
        metrics.BUILD_INFO.family([((("version", __version__),), 1.0)]),
    ]


def node_memory_totals(gpus: Sequence[Gpu]) -> list[tuple[Labels, float]]:
    """The per-node summary cluster mode reads instead of each GPU's memory total: a node's
    one value where every GPU of it reports a memory total, all the same, in one pool and
    model; none for a node whose GPUs differ or one of which reports none (a lost GPU), so
    that what cluster mode fills in for each GPU is what each GPU's own series says."""
    seen: dict[str, tuple[str, str, int | None]] = {}
    mixed: set[str] = set()
    for gpu in gpus:
        total = gpu.memory_total_bytes
        this = (gpu.pool, gpu.model, total)
        if total is None or seen.setdefault(gpu.node, this) != this:
            mixed.add(gpu.node)
    return [((("node", node), ("pool", pool), ("model", model)), float(total))
            for node, (pool, model, total) in sorted(seen.items())
            if node not in mixed and total is not None]


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
        metrics.ALLOCATION_CPU_CORES.family(list(cpus.items())),
        metrics.ALLOCATION_GPU_SHARE_RATIO.family(list(shares.items())),
    ]
