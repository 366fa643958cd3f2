"""Render a snapshot to Prometheus text exposition, once per snapshot.

Names, types and HELP texts come from the catalogue (:mod:`exporter.metrics`);
this module supplies only values: the per-GPU families are a table
(:data:`GPU_FAMILIES`) of a catalogue entry and a small value function, the
others are built by :func:`snapshot_families`. The identity labels every per-GPU series
carries (``gpu``, ``model``, ``node``, ``pool``, ``uuid``) are added in one
place. Job and pod metadata live only on ``gpufleet_gpu_allocation_info``,
which keeps per-GPU cardinality bounded as jobs come and go.

One copy of each series (issue 15): node mode and cluster mode run side by side under
one Prometheus, and a family is served only by its producer. ``exposition.per_gpu``
(``auto``: off when the ``prometheus`` source is enabled) turns off every family read
from the GPUs and nodes (``node`` in the catalogue: the per-GPU telemetry, ``gpu_info``,
MIG, ``node_info``, ``node_cpu_cores``); the scheduler's joins stay where the scheduler
is read; the fleet-level families (fragmentation, pools, advisor, source health, build
info) are always served. :class:`ExpositionOptions` says it in code. The config's
``cluster`` label is merged into every series by the label-text functions.

Our renderer writes exactly the bytes ``prometheus_client.generate_latest``
writes for the same families (sorted labels, Go float formatting); a test
proves it. It exists because ``generate_latest`` costs about a second per
100k series, and we render once per snapshot rather than once per scrape.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import gzip
import itertools
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from types import ModuleType
from typing import Any

import msgspec
import numpy as np
from prometheus_client.utils import floatToGoString

from exporter import __version__, metrics
from exporter.metrics import Family, FamilySpec, Labels
from exporter.snapshot import Allocation, FleetSnapshot, Gpu

Pairs = Sequence[tuple[tuple[str, ...], float]]  # a labelled family's (extra label values, value)


@dataclass(frozen=True, slots=True)
class GpuFamily:
    """A "gpu" family of the catalogue and the value each GPU gives it (None: absent; a bool
    is 1 or 0). Where the value is a top-level field, ``value`` is an ``attrgetter``: a render
    reads a block's values with ``map`` in C, 108,800 GPUs a family every snapshot."""

    spec: FamilySpec
    value: Callable[[Gpu], float | bool | None]
    # "health" / "performance": the value is read from that immutable part of the GPU alone,
    # so a block whose GPUs hold the same parts as last time is reused without a call
    part: str | None = None


@dataclass(frozen=True, slots=True)
class GpuLabelledFamily:
    """A "gpu_labelled" family: each GPU gives (extra label values, value) pairs, the values in
    the order ``spec.labels`` lists them after the identity labels."""

    spec: FamilySpec
    samples: Callable[[Gpu], Pairs]
    part: str | None = None  # as GpuFamily.part


def _field(path: str) -> Callable[[Gpu], Any]:
    """The value at ``path`` (``FamilySpec.read``) of a GPU: None where its part is None."""
    part, _, name = path.rpartition(".")
    if not part:
        return attrgetter(name)
    of_gpu, of_part = attrgetter(part), attrgetter(name)

    def value(gpu: Gpu) -> Any:
        held = of_gpu(gpu)
        return None if held is None else of_part(held)

    return value


def _series_samples(series: tuple[metrics.Series, ...]) -> Callable[[Gpu], Pairs]:
    """Per GPU, the pairs of the series whose field is known: an unsupported counter has no
    series, never 0. A series with a ``bit`` is 1 while that bit of its field is set."""
    reads = [(s.labels, _field(s.path), s.bit) for s in series]

    def samples(gpu: Gpu) -> Pairs:
        out = []
        for labels, value_of, bit in reads:
            value = value_of(gpu)
            if value is not None:
                out.append((labels, (1.0 if value & bit else 0.0) if bit else value))
        return out

    return samples


def _field_samples(read: metrics.FromField) -> Callable[[Gpu], Pairs]:
    value_of, make = _field(read.path), read.samples

    def samples(gpu: Gpu) -> Pairs:
        value = value_of(gpu)
        return [] if value is None else make(value)

    return samples


def gpu_family(spec: FamilySpec) -> GpuFamily | GpuLabelledFamily:
    """The renderer's entry for a per-GPU family, made from its catalogue record alone."""
    read = spec.read
    if spec.kind == "gpu":
        value = _field(read) if isinstance(read, str) else read
        assert callable(value), spec.name
        return GpuFamily(spec, value, spec.part)
    if isinstance(read, tuple):
        return GpuLabelledFamily(spec, _series_samples(read), spec.part)
    if isinstance(read, metrics.FromField):
        return GpuLabelledFamily(spec, _field_samples(read), spec.part)
    assert callable(read), spec.name
    return GpuLabelledFamily(spec, read, spec.part)


# Every family each GPU gives its values directly, in catalogue order (the body's).
GPU_FAMILIES: tuple[GpuFamily | GpuLabelledFamily, ...] = tuple(
    gpu_family(spec) for spec in metrics.CATALOGUE.values() if spec.kind in ("gpu", "gpu_labelled"))


def _bool(value: bool) -> float:
    return 1.0 if value else 0.0


def _go_float(value: float) -> str:
    # repr() already matches Go below 1e6; floatToGoString handles the exponent switch,
    # infinities and NaN. Skipping the call for the common case halves render time.
    if -1e6 < value < 1e6:
        return repr(value)
    if 1e6 <= value < _INF:  # floatToGoString's positive finite case, inlined: counters
        text = repr(value)  # and byte sizes are most of the values this large
        dot = text.find(".")
        if dot > 6:
            mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
        return text
    return floatToGoString(value)


_INF = float("inf")

_encode_json = msgspec.json.Encoder().encode
_DIGITS = 10.0 ** np.arange(1, 17)  # a whole number v >= 10 has searchsorted(v) + 1 digits
_POWERS = 10.0 ** np.arange(0, 17)  # exact as doubles
_EXPONENTS = [f"e+{k:02d}" for k in range(17)]


def go_texts(values: Sequence[float]) -> list[str]:
    """Go's text of each value, exactly as :func:`_go_float` gives it, made in C for a block.

    Formatting a float is most of a render's time (7 families change for every GPU every
    snapshot), and ``repr`` per value costs a Python call each. msgspec writes the shortest
    round-trip digits, as ``repr`` does, for a whole list at once; where ``repr`` writes
    positional notation (``1e-4 <= |v| < 1e16``) the two texts are the same, and Go's is
    ``repr``'s below 1e6. Whole numbers from 1e6 to 1e15 (byte counters, capacities) take
    :func:`_exponent_texts`; the rest (tiny, negative or fractional large values, NaN,
    infinities) :func:`_go_float`. tests/test_exposition.py compares all three with
    client_python's on random bit patterns and every decade.
    """
    if not values:
        return []
    floats = np.array(values, dtype=np.float64)
    magnitude = np.abs(floats)
    plain = (magnitude < 1e6) & ((magnitude >= 1e-4) | (floats == 0))
    if plain.all():
        return _encode_json(floats.tolist())[1:-1].decode().split(",")
    out = np.empty(len(floats), dtype=object)
    if plain.any():
        out[plain] = _encode_json(floats[plain].tolist())[1:-1].decode().split(",")
    whole = ~plain & (floats >= 1e6) & (floats < 1e15)
    candidates = np.where(whole, floats, 0.0)
    whole &= np.floor(candidates) == candidates
    if whole.any():
        out[whole] = _exponent_texts(floats[whole])
    for i in np.flatnonzero(~plain & ~whole).tolist():
        out[i] = _go_float(float(floats[i]))
    return out.tolist()  # type: ignore[no-any-return]


def _exponent_texts(numbers: np.ndarray) -> np.ndarray:
    """Go's text of whole numbers from 1e6 to 1e15: the shortest digits as ``d.ddd`` and the
    exponent. ``number / 10**exponent`` is the double nearest a decimal of at most 15 digits,
    whose shortest text is that decimal (msgspec writes it); a one-digit mantissa is an
    integer, as Go writes ``3e+09``, not ``3.0e+09``. One msgspec call per exponent: the
    exponent is then pasted after every mantissa by ``str.replace``."""
    exponent = np.searchsorted(_DIGITS, numbers, side="right")
    mantissa = numbers / _POWERS[exponent]
    units = mantissa == np.floor(mantissa)
    digits = mantissa.astype(object)
    if units.any():
        digits[units] = mantissa[units].astype(np.int64).tolist()
    texts = np.empty(len(numbers), dtype=object)
    for k in np.unique(exponent).tolist():
        at = exponent == k
        suffix = _EXPONENTS[k]
        body = _encode_json(digits[at].tolist())[1:-1].decode()
        texts[at] = (body.replace(",", suffix + ",") + suffix).split(",")
    return texts


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def label_text(labels: Labels, const: Labels = ()) -> str:
    """``{k="v",...}`` sorted by name, with ``const`` (the ``cluster`` label) merged in."""
    if const:
        labels = (*labels, *const)
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels))
    return "{" + inner + "}"


_IDENTITY_KEY = attrgetter("node", "index", "uuid", "model", "pool")  # what identity() reads


def identity(gpu: Gpu) -> Labels:
    return (("gpu", str(gpu.index)), ("model", gpu.model), ("node", gpu.node),
            ("pool", gpu.pool), ("uuid", gpu.uuid))


@dataclass(frozen=True, slots=True)
class ExpositionOptions:
    """What this process serves, so that node mode and cluster mode side by side under one
    Prometheus give one copy of each series (docs/deploy.md, "Node mode and cluster mode").

    Each catalogue family has a producer (:attr:`exporter.metrics.FamilySpec.producer`):

    - ``node``: read from the GPUs and nodes themselves: every per-GPU telemetry family
      (:data:`GPU_FAMILIES`), ``gpu_info``, the MIG families, ``node_info`` and
      ``node_cpu_cores``. Served only with ``per_gpu``: a cluster-mode process reading them
      from Prometheus would serve a second copy of what the node exporters serve.
    - ``scheduler``: the scheduler's view joined to the GPUs: ``gpu_allocated_ratio``,
      ``gpu_allocation_info``, ``allocation_*``, ``node_cpu_allocated_cores``, ``pending_*``.
      Served only where this process knows the jobs: it reads the scheduler (a source whose
      role is ``allocation``: Slurm, Kubernetes) or is one (the simulator; dcgm-exporter's pod
      labels; NVML with the kubelet's PodResources), whatever ``per_gpu`` says. Plain NVML
      knows no jobs: its zeros beside cluster mode's Slurm view would count every GPU idle.
      Read back from Prometheus they would be a copy.
    - ``fleet``: computed by this process over its whole snapshot, or about itself:
      fragmentation, pools, the advisor, source health, composition, build info. Always.

    ``cluster`` (the config's top-level key) is one more label on every series served,
    merged in sorted place by the label-text functions; empty: no label.
    """

    per_gpu: bool = True
    reads_scheduler: bool = True  # the defaults serve every family (the simulated fleet)
    cluster: str = ""

    def serves(self, spec: FamilySpec) -> bool:
        producer = spec.producer
        if producer == "node":
            return self.per_gpu
        if producer == "scheduler":
            # only where jobs are known: a plain NVML node exporter knows none, and its zeros
            # beside cluster mode's Slurm view would count every GPU as idle
            return self.reads_scheduler
        return True

    def serves_name(self, name: str) -> bool:
        spec = metrics.CATALOGUE.get(name)
        return spec is None or self.serves(spec)

    @property
    def const_labels(self) -> Labels:
        return (("cluster", self.cluster),) if self.cluster else ()


class LabelCache:
    """What one process reuses from one snapshot's rendering to the next: the identity label
    text per GPU (GPUs rarely change identity) and the rendered blocks (:class:`_Block`)."""

    def __init__(self) -> None:
        # per cluster label: (node, index, uuid, model, pool) -> label text
        self._cache: dict[Labels, dict[tuple[str, int, str, str, str], str]] = {}
        self.blocks: dict[tuple[str, int], _Block] = {}
        # per chunk of GPUs (its first index), the label texts and (per part) the health or
        # performance objects of the last render: what its blocks were made from
        self.chunk_texts: dict[int, list[str]] = {}
        self.parts: dict[tuple[str, int], list[object]] = {}
        # per (group of GPU_SNAPSHOT_FAMILIES, chunk): the inputs of the last render
        self.reads: dict[tuple[int, int], list[object]] = {}

    def texts(self, gpus: Sequence[Gpu], const: Labels = ()) -> list[str]:
        """Each GPU's identity label text; the keys made and looked up in C (``map``), as a
        render asks for all 108,800 every snapshot and misses only for new GPUs."""
        cache = self._cache.setdefault(const, {})
        keys = list(map(_IDENTITY_KEY, gpus))
        texts = list(map(cache.get, keys))
        if None in texts:
            for i, text in enumerate(texts):
                if text is None:
                    texts[i] = cache[keys[i]] = label_text(identity(gpus[i]), const)
        return texts  # type: ignore[return-value]


def _header(name: str, kind: str, help_text: str) -> str:
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


class _IdentitySplits:
    """One render's identity label pairs per GPU (``const`` merged in), joined once for each
    point at which a family's extra label falls in sorted order, and shared by every labelled
    family: a labelled series then costs one f-string, not a sort and an escape per label."""

    def __init__(self, gpus: Sequence[Gpu], const: Labels) -> None:
        self.gpus = gpus
        self.const = const
        self.names = sorted((*metrics.IDENTITY, *(k for k, _ in const)))
        self._pairs: list[list[str]] | None = None
        self._joined: dict[tuple[int, int], list[str]] = {}

    def joined(self, start: int, stop: int) -> list[str]:
        """Per GPU: its label pairs ``names[start:stop]``, comma-joined."""
        key = (start, stop)
        if key not in self._joined:
            if self._pairs is None:
                names = self.names
                self._pairs = []
                for gpu in self.gpus:
                    values = dict((*identity(gpu), *self.const))
                    self._pairs.append([f'{k}="{_escape(values[k])}"' for k in names])
            self._joined[key] = [",".join(pairs[start:stop]) for pairs in self._pairs]
        return self._joined[key]


class _SplitsChunk(_IdentitySplits):
    """GPUs ``start:stop`` of a render's :class:`_IdentitySplits`: the block renderer renders a
    labelled family per chunk of GPUs, and the pairs are then built once for all chunks."""

    def __init__(self, whole: _IdentitySplits, start: int, stop: int) -> None:
        super().__init__(whole.gpus[start:stop], whole.const)
        self.whole, self.start, self.stop = whole, start, stop

    def joined(self, start: int, stop: int) -> list[str]:
        return self.whole.joined(start, stop)[self.start:self.stop]


def _render_labelled(family: GpuLabelledFamily, gpus: Sequence[Gpu],
                     splits: _IdentitySplits) -> tuple[str, int]:
    """A labelled per-GPU family: its text and series count. Each GPU's text around the extra
    label values is built once from ``splits``, the values are formatted together
    (:func:`go_texts`) and the lines joined in one call. The extra values are gpufleet's own
    words and numbers (reasons, causes, XID codes), never text read from a source, so they
    need no escaping."""
    spec = family.spec
    extra = spec.labels[len(metrics.IDENTITY):]
    names = splits.names
    # where each extra label falls among the identity labels, in sorted order
    placed = sorted((bisect.bisect(names, label), label, i) for i, label in enumerate(extra))
    bounds = [0, *(p for p, _, _ in placed), len(names)]
    segments = [splits.joined(a, b) for a, b in itertools.pairwise(bounds)]
    labels = [label for _, label, _ in placed]
    order = [i for _, _, i in placed]
    prefixes: list[str] = []
    values: list[float] = []
    for g, samples in enumerate(map(family.samples, gpus)):
        if not samples:
            continue
        # pieces[k] precedes the k-th extra value (sorted order); the last closes the braces
        pieces = []
        text, first = spec.name + "{", True
        for k, label in enumerate(labels):
            segment = segments[k][g]
            if segment:
                text += segment if first else "," + segment
                first = False
            text += f'{label}="' if first else f',{label}="'
            pieces.append(text)
            text, first = '"', False
        segment = segments[-1][g]
        pieces.append(f'{text},{segment}}} ' if segment else f"{text}}} ")
        if len(order) == 1:
            head, tail = pieces
            for extra_values, value in samples:
                prefixes.append(f"{head}{extra_values[0]}{tail}")
                values.append(value)
            continue
        for extra_values, value in samples:
            line = pieces[0]
            for k, i in enumerate(order):
                line += extra_values[i] + pieces[k + 1]
            prefixes.append(line)
            values.append(value)
    count = len(values)
    lines: list[str] = ["\n"] * (3 * count)  # prefix, value, "\n" per line: filled by slices
    lines[0::3] = prefixes
    lines[1::3] = go_texts(values)
    return "".join(lines), count


def render_families(families: Iterable[Family],
                    options: ExpositionOptions = ExpositionOptions()) -> list[str]:
    out: list[str] = []
    const = options.const_labels
    for family in families:
        if not options.serves_name(family.name):
            continue
        out.append(_header(family.name, family.type, family.help))
        for labels, value in family.samples:
            out.append(f"{family.name}{label_text(labels, const)} {_go_float(float(value))}\n")
    return out


# the families gpu_snapshot_samples fills, in its order and the body's
GPU_SNAPSHOT_FAMILIES = (metrics.GPU_INFO, metrics.GPU_ALLOCATED_RATIO, metrics.GPU_ALLOCATION_INFO,
                         metrics.GPU_MIG_INSTANCE_INFO, metrics.GPU_MIG_MEMORY_TOTAL_BYTES,
                         metrics.GPU_MIG_MEMORY_USED_BYTES)
# which of a block's inputs each of them reads (the block renderer's groups): the GPU's
# identity and firmware, its holders, its MIG instances
_SNAPSHOT_READS = (0, 1, 1, 2, 2, 2)
# those whose text is kept per GPU, to be rebuilt per GPU: the holders and MIG instances change
# every snapshot somewhere (33 MB at 108,800 GPUs); gpu_info's identity and firmware rarely
# do, and its text would be 32 MB more
_KEPT_PER_GPU = frozenset(k for k, reads in enumerate(_SNAPSHOT_READS) if reads != 0)


def snapshot_families(snapshot: FleetSnapshot) -> list[Family]:
    """Every family that is not a plain per-GPU value: info, allocation, node and self-metrics."""
    samples = gpu_snapshot_samples(snapshot.gpus, _generations(snapshot),
                                   snapshot.gpu_allocations())
    return [spec.family(s) for spec, s in zip(GPU_SNAPSHOT_FAMILIES, samples, strict=True)] + \
        fleet_families(snapshot)


def _generations(snapshot: FleetSnapshot) -> dict[str, str]:
    return {n.name: n.generation for n in snapshot.nodes}


Samples = list[tuple[Labels, float]]


def gpu_snapshot_samples(
    gpus: Sequence[Gpu], generation: dict[str, str],
    held: dict[tuple[str, int], list[tuple[Allocation, float]]],
) -> tuple[Samples, Samples, Samples, Samples, Samples, Samples]:
    """The samples of :data:`GPU_SNAPSHOT_FAMILIES` for ``gpus``: identity, allocation, MIG."""
    out: tuple[Samples, Samples, Samples, Samples, Samples, Samples] = ([], [], [], [], [], [])
    for gpu in gpus:
        for samples, of_gpu in zip(out, _gpu_snapshot_samples(gpu, generation, held), strict=True):
            samples += of_gpu
    return out


def _gpu_snapshot_samples(
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


def fleet_families(snapshot: FleetSnapshot) -> list[Family]:
    """:func:`snapshot_families` after the per-GPU ones: nodes, pending, sources, build."""
    _, cpu_used = snapshot.held()
    node_info, node_cpus, node_cpus_alloc = [], [], []
    for node in snapshot.nodes:
        labels = (("node", node.name), ("pool", node.pool), ("model", node.model))
        node_info.append(((*labels, ("architecture", node.generation),
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
        metrics.NODE_INFO.family(node_info),
        metrics.NODE_CPU_CORES.family(node_cpus),
        metrics.NODE_CPU_ALLOCATED_CORES.family(node_cpus_alloc),
        metrics.PENDING_JOBS.family([((("pool", p),), v) for p, v in sorted(pending_jobs.items())]),
        metrics.PENDING_GPUS.family([((("pool", p),), v) for p, v in sorted(pending_gpus.items())]),
        metrics.SOURCE_UP.family(up),
        metrics.COLLECT_DURATION_SECONDS.family(duration),
        metrics.LAST_COLLECT_SUCCESS_TIMESTAMP_SECONDS.family(last_success),
        metrics.SOURCE_PARSE_ERRORS_TOTAL.family(parse_errors),
        metrics.COMPOSE_UNMATCHED_GPUS.family(
            [((("side", u.side),), float(u.count)) for u in snapshot.unmatched]),
        *allocation_families(snapshot),
        metrics.SNAPSHOT_TIMESTAMP_SECONDS.family([((), snapshot.taken_at)]),
        metrics.BUILD_INFO.family([((("version", __version__),), 1.0)]),
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
        metrics.ALLOCATION_CPU_CORES.family(list(cpus.items())),
        metrics.ALLOCATION_GPU_SHARE_RATIO.family(list(shares.items())),
    ]


# -- rendering in blocks (issue 14, Build 8) -------------------------------------------------------
#
# At 108,800 GPUs /metrics is about 5.8 M series and 900 MB of text; rendering it whole took
# about 30 s per snapshot (docs/performance.md). Most of it does not change between two
# snapshots (identity, limits, capacities, health counters), so the body is cut into blocks
# (a per-GPU family over _CHUNK GPUs, or one other family) and each block is kept as a gzip
# member with the inputs it was made from. The next snapshot formats and compresses only the
# blocks whose inputs differ, and the body is the members end to end: a gzip file is a series
# of members (RFC 1952, 2.2), which Go's gzip reader (Prometheus) and Python's read as one.
# The uncompressed text is made only when a client asks for it (Rendered.text).
#
# A block is reused when its label texts and values compare equal. 0.0 == -0.0, so a value
# that only changes sign at zero would keep its old text; no GPU metric does that.

_CHUNK = 1024  # GPUs per block: 107 blocks per family at 108,800 GPUs

_isal_gzip: ModuleType | None
try:  # ISA-L's gzip: the same format at several times zlib's speed (docs/performance.md)
    from isal import igzip as _isal_gzip
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    _isal_gzip = None


def _isal_level(level: int) -> int:
    """zlib's 1-9 on ISA-L's 0-3: ISA-L's 1 compresses about as well as zlib's 5, 5x faster."""
    return 1 if level <= 6 else 2 if level <= 8 else 3


def gzip_member(data: bytes, level: int) -> bytes:
    if _isal_gzip is not None:
        return _isal_gzip.compress(data, _isal_level(level), mtime=0)
    return gzip.compress(data, compresslevel=level, mtime=0)


def gunzip(data: bytes) -> bytes:
    if _isal_gzip is not None:
        return _isal_gzip.decompress(data)
    return gzip.decompress(data)


@dataclass(slots=True)
class _Block:
    """One block of the body: the inputs it was rendered from and its gzip member."""

    texts: object  # the label texts (per-GPU blocks), or None
    values: object  # the values, or samples, it was rendered from
    member: bytes
    series: int
    size: int  # bytes of text
    pieces: list[str] | None = None  # the text per GPU, where a block is rebuilt per GPU


# what makes a block: its text and series, and (blocks rebuilt per GPU) the text per GPU
_Made = tuple[str, int] | tuple[str, int, list[str]]


class _GoFloats(dict[float, str]):
    """Go float text per value for one render: limits, capacities and 0/1 flags repeat across
    GPUs, and a dict lookup is a third of a repr. Zeros are never stored (0.0 == -0.0)."""

    def __missing__(self, value: float) -> str:
        text = _go_float(float(value))
        if value:
            self[value] = text
        return text


@dataclass(frozen=True)
class Rendered:
    snapshot: FleetSnapshot
    gzipped: bytes  # gzip members, one per block, end to end
    series: int
    render_seconds: float
    text_bytes: int  # length of the uncompressed body

    @functools.cached_property
    def text(self) -> bytes:
        """The uncompressed body, made on first use: Prometheus always asks for gzip."""
        return gunzip(self.gzipped)


def _render_blocks(snapshot: FleetSnapshot, labels: LabelCache, extra: Iterable[Family],
                   options: ExpositionOptions, level: int) -> tuple[bytes, int, int]:
    const = options.const_labels
    gpus = snapshot.gpus
    served = [f for f in GPU_FAMILIES if options.serves(f.spec)]
    specs = [spec for spec in GPU_SNAPSHOT_FAMILIES if options.serves(spec)]
    texts = labels.texts(gpus, const) if served or specs else []
    fmt = _GoFloats()
    splits = _IdentitySplits(gpus, const)  # built on the first labelled chunk that changed
    previous = labels.blocks
    blocks: list[_Block] = []
    next_blocks: dict[tuple[str, int], _Block] = {}

    # The GPUs of each block, and their label texts: where these equal the last render's, the
    # last render's very list, so that each of the ~45 blocks of a chunk compares its texts
    # (and, below, its health or performance parts) by identity, not element by element.
    chunks: list[tuple[int, tuple[Gpu, ...], list[str]]] = []
    for start in range(0, max(len(gpus), 1), _CHUNK):
        chunk_texts = texts[start:start + _CHUNK]
        last = labels.chunk_texts.get(start)
        chunks.append((start, gpus[start:start + _CHUNK],
                       last if last == chunk_texts and last is not None else chunk_texts))
    labels.chunk_texts = {start: chunk_texts for start, _, chunk_texts in chunks}

    def add(key: tuple[str, int], chunk_texts: object, values: object,
            make: Callable[[], _Made]) -> None:
        block = previous.get(key)
        if (block is None or (block.values is not values and block.values != values)
                or (block.texts is not chunk_texts and block.texts != chunk_texts)):
            text, series, *pieces = make()
            data = text.encode()
            block = _Block(chunk_texts, values, gzip_member(data, level), series, len(data),
                           pieces[0] if pieces else None)
        next_blocks[key] = block
        blocks.append(block)

    # per (part, chunk): the chunk's GPUs' health or performance objects, read once a render
    parts: dict[tuple[str, int], list[object]] = {}

    def part_of(part: str, start: int, chunk: Sequence[Gpu]) -> list[object]:
        key = (part, start)
        objects = parts.get(key)
        if objects is None:
            objects = list(map(attrgetter(part), chunk))
            last = labels.parts.get(key)
            parts[key] = objects = last if last == objects and last is not None else objects
        return objects

    for gpu_family in served:
        spec = gpu_family.spec
        name = spec.name
        header = _header(name, spec.type, spec.help)
        for start, chunk, chunk_texts in chunks:
            head = header if start == 0 else ""
            if gpu_family.part is not None:
                # the block is a function of the part alone: unchanged objects (the same,
                # or equal: they are frozen) reuse it without reading a value
                add((name, start), chunk_texts, part_of(gpu_family.part, start, chunk),
                    _part_block(gpu_family, chunk, chunk_texts, head, splits, start))
                continue
            if isinstance(gpu_family, GpuLabelledFamily):
                samples = list(map(gpu_family.samples, chunk))

                def make_labelled(chunk=chunk, head=head, family=gpu_family,
                                  start=start) -> tuple[str, int]:
                    view = _SplitsChunk(splits, start, start + len(chunk))
                    text, series = _render_labelled(family, chunk, view)
                    return head + text, series

                add((name, start), chunk_texts, samples, make_labelled)
                continue
            values = list(map(gpu_family.value, chunk))

            def make(chunk_texts=chunk_texts, values=values, head=head,
                     name=name) -> tuple[str, int]:
                text, series = _value_lines(name, chunk_texts, values)
                return head + text, series

            add((name, start), chunk_texts, values, make)

    # gpu_info, allocation and MIG, per chunk, rebuilt only where a GPU's inputs changed, and
    # then only that GPU's lines: a job that starts changes the holders of a few hundred GPUs
    # of 108,800, spread over most chunks
    generation = _generations(snapshot)
    held = snapshot.gpu_allocations()
    firmware = attrgetter("driver_version", "vbios_version", "pci_bus_id", "serial")
    by_node, gpu_key, mig = attrgetter("node"), attrgetter("node", "index"), attrgetter("mig")
    # per chunk: its GPUs, label texts, and per group of families the inputs with the indices
    # of the GPUs whose inputs differ from the last render's (None: no last render to compare)
    snapshot_chunks: list[tuple[int, tuple[Gpu, ...], list[str],
                                list[tuple[list[object], list[int] | None]],
                                dict[int, tuple[Samples, ...]]]] = []
    reads_now: dict[tuple[int, int], list[object]] = {}
    for start, part, chunk_texts in chunks:
        # what _gpu_snapshot_samples reads, per group of families (_SNAPSHOT_READS): the
        # label text and node's generation and firmware; the holders (Allocation objects
        # compare by value); the MIG instances. A job that starts re-renders the allocation
        # lines of its GPUs, not their gpu_info.
        inputs: tuple[list[object], ...] = (
            list(zip(chunk_texts, map(generation.get, map(by_node, part)), map(firmware, part),
                     strict=True)),
            list(zip(chunk_texts, map(held.get, map(gpu_key, part)), strict=True)),
            list(zip(chunk_texts, map(mig, part), strict=True)),
        ) if specs else ([], [], [])
        groups: list[tuple[list[object], list[int] | None]] = []
        for group, group_reads in enumerate(inputs):
            # compared once for all the group's families: holders and MIG instances are new
            # objects each snapshot, and compare field by field in Python
            last_reads = labels.reads.get((group, start))
            changed = None
            if last_reads is not None and len(last_reads) == len(group_reads):
                changed = list(itertools.compress(itertools.count(),
                                                  map(operator.ne, last_reads, group_reads)))
                if not changed:
                    group_reads = last_reads  # its blocks then compare by identity
            reads_now[(group, start)] = group_reads
            groups.append((group_reads, changed))
        snapshot_chunks.append((start, part, chunk_texts, groups, {}))
    for k, spec in enumerate(GPU_SNAPSHOT_FAMILIES):
        if spec not in specs:
            continue
        for start, part, chunk_texts, groups, built in snapshot_chunks:
            key = (spec.name, start)
            reads, changed = groups[_SNAPSHOT_READS[k]]

            def make_snapshot(part=part, built=built, k=k, spec=spec, start=start,
                              changed=changed, chunk_texts=chunk_texts, key=key) -> _Made:
                # the GPUs whose inputs equal the last render's keep their lines, where the
                # block was made from that render's inputs
                old = previous.get(key)
                kept = old.pieces if (old is not None and changed is not None and old.values
                                      is labels.reads.get((_SNAPSHOT_READS[k], start))) else None
                pieces = list(kept) if kept is not None else [""] * len(part)
                for i in changed if kept is not None else range(len(part)):  # type: ignore[union-attr]
                    samples = built.get(i)
                    if samples is None:  # the first family of this GPU to change builds them all
                        samples = built[i] = _gpu_snapshot_samples(part[i], generation, held)
                    pieces[i] = _snapshot_lines(spec, samples[k], chunk_texts[i], const, fmt)
                body = "".join(pieces)
                head = _header(spec.name, spec.type, spec.help) if not start else ""
                if k in _KEPT_PER_GPU:
                    return head + body, body.count("\n"), pieces
                return head + body, body.count("\n")

            add(key, None, reads, make_snapshot)

    for family in [*fleet_families(snapshot), *extra]:
        if not options.serves_name(family.name):
            continue
        family_samples = list(family.samples)

        def make_family(family=family) -> tuple[str, int]:
            lines = render_families([family], options)
            return "".join(lines), len(lines) - 1

        # a family's name is unique in the body; -1: not a GPU chunk
        add((family.name, -1), const, family_samples, make_family)

    labels.blocks = next_blocks
    labels.parts = parts
    labels.reads = reads_now
    return (b"".join(block.member for block in blocks), sum(b.series for b in blocks),
            sum(b.size for b in blocks))


def _part_block(family: GpuFamily | GpuLabelledFamily, chunk: Sequence[Gpu], chunk_texts: list[str],
                head: str, splits: _IdentitySplits, start: int) -> Callable[[], tuple[str, int]]:
    """What makes one chunk's block of a family read from one part of each GPU (
    :attr:`GpuFamily.part`), called only when that part changed."""

    def make() -> tuple[str, int]:
        if isinstance(family, GpuLabelledFamily):
            view = _SplitsChunk(splits, start, start + len(chunk))
            text, series = _render_labelled(family, chunk, view)
            return head + text, series
        text, series = _value_lines(family.spec.name, chunk_texts, list(map(family.value, chunk)))
        return head + text, series

    return make


def _snapshot_lines(spec: FamilySpec, samples: Samples, text: str, const: Labels,
                    fmt: _GoFloats) -> str:
    """One GPU's lines of a :data:`GPU_SNAPSHOT_FAMILIES` family, as :func:`render_families`
    writes them; ``gpu_allocated_ratio`` carries the identity labels only, whose text is
    ``text``."""
    if spec is metrics.GPU_ALLOCATED_RATIO:
        return "".join(f"{spec.name}{text} {fmt[v]}\n" for _, v in samples)
    return "".join(f"{spec.name}{label_text(labels, const)} {_go_float(float(v))}\n"
                   for labels, v in samples)


def _value_lines(name: str, texts: list[str], values: list[float | None]) -> tuple[str, int]:
    """One line per GPU with a value, and their count; the value texts from :func:`go_texts`,
    the lines joined in one call."""
    if None in values:
        present = [(t, v) for t, v in zip(texts, values, strict=True) if v is not None]
        texts = [t for t, _ in present]
        values = [v for _, v in present]
    numbers = go_texts(values)  # type: ignore[arg-type]
    count = len(numbers)
    pieces = [name] * (5 * count)  # name, labels, " ", value, "\n" per line: filled by slices
    pieces[1::5] = texts
    pieces[2::5] = [" "] * count
    pieces[3::5] = numbers
    pieces[4::5] = ["\n"] * count
    return "".join(pieces), count


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for one render: a render allocates millions of
    short-lived strings and tuples, none in a cycle, and each generation-2 pass it triggers
    walks the whole fleet held in memory (a quarter of a render at 108,800 GPUs)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def render_text(
    snapshot: FleetSnapshot, labels: LabelCache | None = None, extra: Iterable[Family] = (),
    options: ExpositionOptions = ExpositionOptions(),
) -> bytes:
    return render(snapshot, labels, extra, options=options).text


def render(
    snapshot: FleetSnapshot,
    labels: LabelCache | None = None,
    extra: Iterable[Family] = (),
    gzip_level: int = 5,
    options: ExpositionOptions = ExpositionOptions(),
) -> Rendered:
    """The gzip body for one snapshot (the text on demand); runs in a worker thread, never
    on the loop. ``labels`` carries the blocks of the last render: pass the same one each time."""
    started = time.perf_counter()
    with _collector_paused():
        gzipped, series, size = _render_blocks(snapshot, labels or LabelCache(), extra, options,
                                               gzip_level)
    return Rendered(snapshot, gzipped, series, time.perf_counter() - started, size)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

__all__ = ["CONTENT_TYPE", "GPU_FAMILIES", "ExpositionOptions", "Family", "LabelCache", "Rendered",
           "render"]
