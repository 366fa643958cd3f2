"""The ``prometheus`` source: the whole fleet from a Prometheus server's HTTP API.

Large sites already scrape every GPU node into Prometheus (and Thanos or Mimir
scale that past one machine), so cluster mode reads the fleet from there rather
than fanning out to the nodes itself.

Cost is per metric family, never per node: 11 instant queries read a fleet of any size
(``bench/prometheus_source.py`` measures 10k GPUs against one query per node), 18 with
``gpu_telemetry``, 53 for DCGM metrics. A backend's cost is per series selected, so only the
value families the cycle uses are read (``USED_VALUES``); the TSDB already holds the rest.
Identity (``gpufleet_gpu_info``, the heaviest answer) is read at the first read, every
``identity_refresh`` and whenever ``gpufleet_gpu_up`` answers for other GPUs than it lists,
through VictoriaMetrics' ``/api/v1/export/csv`` where the backend has it, over half of
``max_sample_age`` (the whole of it where up answers for a GPU the half missed and no row is
held for it; the query API otherwise, or when the export's window lists other GPUs than up),
and held as rows; a GPU
that appears is read with the read that first sees its up (or its node's summary count) change,
one whose identity changes in place (another UUID) within ``identity_refresh``. Memory total
does not change while identity does not: read at the first read (with ``node_summaries``, from
each node's ``gpufleet_node_gpu_memory_total_bytes``, 1 series a node, and each GPU's only for
the nodes it does not cover), then only for the nodes whose identity changed. All
queries are evaluated at the same ``time``, so the snapshot is one instant, and each answer
is decoded in a worker thread as soon as it arrives (value families by msgspec, into rows).
Where the backend has the export API (VictoriaMetrics), the value families other than up and
stale are exported instead (:mod:`.export`: about half the backend's CPU a series and half the
bytes), each GPU's newest row over about one scrape interval, as the last read's rows showed it
(half of ``max_sample_age`` at first, the whole after a miss); a GPU up and fresh that the
window missed is read by query for its node.

What it reads (``metrics: gpufleet``): the families per-node gpufleet exporters
serve. When a node's series vanish (its exporter stopped answering and
Prometheus marked them stale), the node's last good reading (its GPUs, values
and placements) is kept, marked stale, until ``lost_after`` passes: per node,
what the collector does for a whole source. A GPU is also stale when its
exporter says so (``gpufleet_gpu_stale``) or its newest sample is older than
``max_sample_age`` (remote-write lag, a stalled federation). The memory of lost
nodes lives in this process; a restart forgets them.

With ``metrics: dcgm`` it reads dcgm-exporter's families instead, one raw query
per DCGM field, through the dcgm source's own mapping
(:mod:`exporter.sources.dcgm.fields`): the same unit fixes (MiB, percent, mJ,
NVLink rates integrated into byte counters), MIG instances, and allocations from
the ``pod``/``namespace`` labels of ``--kubernetes``.

Failures: a query for identity, nodes or allocations that fails fails the read
(the collector keeps the last good snapshot, stale). A failed query for values,
MIG or targets leaves those fields absent and counts in
``gpufleet_source_parse_errors_total``: partial data, never made-up data. With
DCGM metrics, the read fails only when no field query answers. One malformed series
(a non-finite or out-of-bounds value, a GPU index that is no index, a MIG series
without ``gpu_instance``) is dropped and counted there too; the rest stands.

Caps (issue 32), checked before an answer is decoded: ``max_answer_bytes`` per
answer, cut as it streams in; ``max_gpus`` per per-GPU query; ``max_series`` over
the whole read. Past one the read fails, so the collector serves the last good view
stale with the source down. An answer with no GPU at all (a selector matching
nothing, a backend not filled yet) is a down source too, never a fleet of none.

A node speaks only for itself: a node's summary, each of its GPUs' series, its MIG instances,
node record and the jobs placed on it count only from the scrape target (``job``,
``instance``) that serves the node's identity (an allocation's ``job`` is the scheduler's where
the scrape honours labels: then by ``instance`` alone), the jobs also from the scheduler's
exporter ``allocation_selector`` names; another target's are refused (counted in
``gpufleet_source_parse_errors_total`` and by target in
``gpufleet_source_series_refused_total``, logged once per target and change), and a node whose
identity several targets serve is left out of the read, its last good reading served stale
(docs/sources.md, "Prometheus").

Labels: Prometheus renames an exporter's ``job`` and ``instance`` labels to
``exported_job``/``exported_instance`` unless the scrape sets ``honor_labels``;
both spellings are read. gpufleet's own labels avoid the target labels (the MIG
GPU instance is ``gpu_instance``), so only the scheduler's ``job`` is renamed.

Pending jobs are exported only as per-pool totals, so they cannot be rebuilt
job by job here; demand comes from the Slurm source.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import csv
import dataclasses
import gc
import io
import json
import logging
import math
import operator
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import msgspec

from exporter import http_client, metrics
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    MigInstance,
    Node,
    Placement,
    TargetCount,
)
from exporter.sources import Clock, SourceReading, SourceStartupError, TargetStatus
from exporter.sources.dcgm.fields import (
    GPU_FIELDS,
    MAX_GPU_INDEX,
    MIG_ID_LABEL,
    NODE_LABELS,
    UUID_LABELS,
    DcgmFleetBuilder,
    RateIntegrator,
    first_label,
)
from exporter.sources.dcgm.identity import (
    MAX_NAMED,
    REFUSED,
    Part,
    claim,
    conflicts,
    identity,
)
from exporter.sources.gpu_models import ModelResolver, catalogue_resolver
from exporter.sources.lastgood import LastGood
from exporter.sources.prometheus.export import VALUE_FORMAT, next_window, values_from_csv
from exporter.sources.prometheus.options import PrometheusSource as PrometheusConfig

log = logging.getLogger(__name__)

# The reverse map: per-GPU value family -> the Gpu field it fills and that field's type, for
# every "gpu" family of the catalogue (exporter.metrics, a leaf module: sources may import it,
# never exposition) that reads a top-level Gpu field. A family added to the catalogue is read
# back with no edit here. The health and performance parts are not read back (yet): node-mode
# exporters serve them, and cluster mode serves no per-GPU telemetry. The round-trip test
# through a real Prometheus checks the fields against what exposition writes.
_TYPES: dict[str, type] = {"boolean": bool, "integer": int, "number": float}
GPU_VALUES: dict[str, tuple[str, type]] = {
    spec.name: (spec.read, _TYPES[spec.bound.type])
    for spec in metrics.CATALOGUE.values()
    if spec.kind == "gpu" and isinstance(spec.read, str) and "." not in spec.read
    and spec.bound is not None
}
# What the cycle uses of each GPU, read every time: up and stale (health, the pools' load),
# utilisation and memory (analysis, the advisor, the pools' load) and power (the stragglers).
# The other value families are read only with ``gpu_telemetry``, to be re-exported: the TSDB
# already holds them, and a backend's cost is per series selected, not per byte returned.
USED_VALUES = frozenset({
    metrics.GPU_UP.name, metrics.GPU_STALE.name, metrics.GPU_UTILIZATION_RATIO.name,
    metrics.GPU_MEMORY_USED_BYTES.name, metrics.GPU_MEMORY_TOTAL_BYTES.name,
    metrics.GPU_POWER_WATTS.name,
})
assert GPU_VALUES.keys() >= USED_VALUES
# Of those, what does not change while a GPU's identity does not: read with identity at the
# first read, then again only for the nodes whose GPUs' identity changed when identity is read
# again, and held between: a backend's cost is per series selected (108,800 a family at
# 108,800 GPUs), and an identity read that also read these took 11 s at 108,800 GPUs
STATIC_VALUES = frozenset({metrics.GPU_MEMORY_TOTAL_BYTES.name})
ALLOCATION_FAMILIES = (
    metrics.GPU_ALLOCATION_INFO.name,
    metrics.ALLOCATION_CPU_CORES.name,
    metrics.ALLOCATION_GPU_SHARE_RATIO.name,
)
MIG_FAMILIES = (
    metrics.GPU_MIG_INSTANCE_INFO.name,
    metrics.GPU_MIG_MEMORY_TOTAL_BYTES.name,
    metrics.GPU_MIG_MEMORY_USED_BYTES.name,
)
NODE_FAMILIES = (metrics.NODE_INFO.name, metrics.NODE_CPU_CORES.name)

# Without these the snapshot would be wrong, not just thinner: fail the read.
REQUIRED = ("identity", "nodes", "allocations", "scheduler_allocations")
# The labels the scrape adds that name a target: a node's summary is believed only from the
# target that serves the node's identity (see summarised)
TARGET_LABELS = ("instance", "job")
TARGET = ", ".join(TARGET_LABELS)
SUMMARY_BY = f"node, state, {TARGET}"
# each GPU's series by the target too: one counts only from the target that serves its node's
# identity, as a summary does (see own)
GPU_BY = f"node, gpu, {TARGET}"


class PrometheusQueryError(Exception):
    """One query failed; the message names the query and why, never a credential."""


class _HttpStatus(PrometheusQueryError):
    """The backend answered with an HTTP error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class PrometheusAnswerOverCap(PrometheusQueryError):
    """An answer is larger than a cap of ``sources.prometheus`` (bytes, series, GPUs): the
    whole read fails, so the collector serves the last good view stale with the source
    down, rather than the process running out of memory decoding it (issue 32)."""


# What one malformed series raises while it is read: it is dropped and counted, the rest
# of the read stands (issue 32, "partial data, as promised").
_BAD_SERIES = (ValueError, KeyError, TypeError, IndexError, AttributeError)


@dataclass
class _Dropped:
    """The series of one read that were dropped as malformed, and why the first one was."""

    count: int = 0
    first: str = ""

    def add(self, query: str, exc: BaseException) -> None:
        self.count += 1
        if not self.first:
            self.first = f"query {query}: {type(exc).__name__}: {exc}"[:300]


@dataclass
class _SeriesBudget:
    """The series one read may still decode, across its answers: decoded JSON costs about
    0.6-1.1 KB a series (measured at 108,800 GPUs), and every answer of a read is held
    until the snapshot is built, so the total is what bounds memory, not one answer.
    Decoders run in several threads, hence the lock."""

    left: int
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, series: int) -> bool:
        with self.lock:
            self.left -= series
            return self.left >= 0


def _index(text: str) -> int:
    """A GPU index label: an int in NVML's range, or ValueError (``abc``, ``-3``, ``10**30``)."""
    index = int(text)
    if not 0 <= index <= MAX_GPU_INDEX:
        raise ValueError(f"GPU index {text[:24]!r} outside 0-{MAX_GPU_INDEX}")
    return index


def _amount(sample: Mapping[str, Any], high: float = math.inf) -> float | None:
    """A size or count (bytes, CPUs, a share): finite, from 0 to ``high``; None for NaN."""
    value = _value(sample)
    if value is not None and not (math.isfinite(value) and 0 <= value <= high):
        raise ValueError(f"value {value:g} outside 0-{high:g}")
    return value


def build_queries(config: PrometheusConfig) -> dict[str, str]:
    """Query name -> PromQL: 12 instant queries whatever the fleet size (19 with
    ``gpu_telemetry``); identity among them, which the source sends only now and then.

    Each per-GPU value family has its own query (a family is ~11k series at 10k GPUs),
    so Prometheus evaluates and encodes them on several cores while we decode the
    ones already answered. ``max by (node, gpu, instance, job)`` keeps only the labels the
    join needs and the scrape target that served the series (a series counts only from the
    target serving its node's identity: :func:`own`): far fewer bytes to encode and decode
    than the raw series with their identity labels, which identity already carries once. The small node,
    allocation and MIG families go one ``__name__`` regex each.
    (Measured in docs/performance.md, "Cluster sources".)
    """
    inner = config.selector
    sel = f", {inner}" if inner else ""
    window = f"{int(config.lost_after)}s"  # targets: those that exported within lost_after

    def regex(families: Sequence[str]) -> str:
        return f'{{__name__=~"{"|".join(families)}"{sel}}}'

    queries = {
        # the plain selector: last_over_time over lost_after cost 7x more (measured),
        # and lost nodes are remembered by the source instead
        "identity": f"{metrics.GPU_INFO.name}{{{inner}}}",
        # only the GPUs whose newest sample is too old: usually an empty answer
        "old": (f"max by ({GPU_BY}) (time() - timestamp({metrics.GPU_UP.name}{{{inner}}}))"
                f" > {config.max_sample_age:g}"),
        "nodes": regex(NODE_FAMILIES),
        "allocations": regex(ALLOCATION_FAMILIES),
        # the scheduler's exporter (allocation_selector): its allocations count on any node
        **({"scheduler_allocations": (f'{{__name__=~"{"|".join(ALLOCATION_FAMILIES)}", '
                                      f'{config.allocation_selector}}}')}
           if config.allocation_selector else {}),
        "mig": regex(MIG_FAMILIES),
        "targets": (
            f"up and on (job, instance) last_over_time({metrics.BUILD_INFO.name}{{{inner}}}[{window}])"
        ),
    }
    for family in GPU_VALUES:
        if config.gpu_telemetry or family in USED_VALUES:
            queries[family] = f"max by ({GPU_BY}) ({family}{{{inner}}})"
    if config.node_summaries:
        # by the scrape target too: a summary counts only from the target that serves the
        # node's identity (a node speaks only for itself), so another's are told apart
        summary = f"{metrics.NODE_GPUS.name}{{{inner}}}"
        queries["summary"] = f"sum by ({SUMMARY_BY}) ({summary})"
        queries["summary_old"] = (f"max by (node, {TARGET}) (time() - timestamp({summary}))"
                                  f" > {config.max_sample_age:g}")
        # each node's memory total, by its target as the summary: sent only where memory
        # total is read for every GPU (the first read), in place of each GPU's
        queries[NODE_MEMORY] = (f"max by (node, {TARGET}) "
                                f"({metrics.NODE_GPU_MEMORY_TOTAL_BYTES.name}{{{inner}}})")
    return queries


# What stands in for each GPU's memory total where it is read for every GPU: its node's
# (gpufleet_node_gpu_memory_total_bytes, one series a node, not one a GPU), from the target that
# serves the node's identity; each GPU's is read only for the nodes it does not cover
NODE_MEMORY = "node_memory_total"
# What a node's summary (gpufleet_node_gpus) stands in for: each GPU's up and stale, and the
# GPUs whose up sample is old; read per GPU only for the nodes a summary does not cover
SUMMARISED = (metrics.GPU_UP.name, metrics.GPU_STALE.name, "old")
# The value families read through the export API where the backend has one (VictoriaMetrics):
# half its CPU a series selected and half the bytes of the query. Up and stale stay queries:
# they decide which GPUs are there and fresh, which the export's window is checked against
EXPORTED_VALUES = frozenset(GPU_VALUES) - set(SUMMARISED) - STATIC_VALUES
# past this many nodes to read per GPU, every GPU is read: a selector naming thousands of
# nodes costs the backend a regex over every node name, more than the plain selector
MAX_NODES_NAMED = 500
_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$")


@dataclass(frozen=True)
class SummaryCover:
    """What the nodes' summaries give: the GPUs they cover (all up, none stale, fresh), the
    nodes whose GPUs must be read one by one, and the summaries not believed: (node, target)
    -> why, each a series ignored."""

    covered: list[tuple[str, str]]
    uncovered: list[str]
    ignored: dict[tuple[str, str], str] = field(default_factory=dict)
    every_gpu: bool = False  # too many nodes uncovered to name: every GPU's series are read
    # each covered node's target (instance, job): the rows below are that target's word
    owner: Mapping[str, tuple[str, str] | None] = field(default_factory=dict)

    def results(self) -> dict[str, _Result]:
        """Each GPU's up, stale and old answers for the covered GPUs, as :func:`compact`'s rows
        from the target that serves the node (its summary said so)."""
        def rows(value: str) -> list[Compact]:
            out = []
            for node, gpu in self.covered:
                target = self.owner.get(node) or ("", "")
                out.append((node, gpu, value, *target))
            return out

        covered = len(self.covered)
        return {
            metrics.GPU_UP.name: _Result(metrics.GPU_UP.name, rows("1"), restated=covered),
            metrics.GPU_STALE.name: _Result(metrics.GPU_STALE.name, rows("0"), restated=covered),
            "old": _Result("old", []),
        }


def _target(labels: Mapping[str, str]) -> str:
    """The scrape target that served a series, as ``job/instance`` (the labels the scrape
    adds, not an exporter's own, which a scrape without honor_labels renames exported_*)."""
    return f"{labels.get('job', '')}/{labels.get('instance', '')}"


def owner_targets(identity: Sequence[Any]) -> dict[str, tuple[str, str] | None]:
    """Node -> the one scrape target, ``(instance, job)``, that serves its identity, or None
    where several do. Identity rows carry the target as their last two fields; a malformed
    series kept as it came names none."""
    out: dict[str, tuple[str, str] | None] = {}
    for row in identity:
        if type(row) is tuple and len(row) == len(IDENTITY_LABELS):
            node, target = row[0], (row[5], row[6])
        elif isinstance(row, dict) and isinstance(labels := row.get("metric"), dict):
            node = labels.get("node", "")
            target = (labels.get("instance", ""), labels.get("job", ""))
        else:
            continue
        if node in out and out[node] != target:
            out[node] = None
        elif node not in out:
            out[node] = target
    return out


def owners(identity: Sequence[Any]) -> dict[str, str | None]:
    """:func:`owner_targets` with each target spelled ``job/instance`` (then no summary
    speaks for a node several targets serve)."""
    return {node: None if t is None else f"{t[1]}/{t[0]}"
            for node, t in owner_targets(identity).items()}


def own(samples: Sequence[Any], owner: Mapping[str, tuple[str, str] | None],
        refused: _Refused, name: str) -> list[Any]:
    """The per-GPU series of ``samples`` (:func:`compact`'s rows, or series as they came) that
    their node's own target exported: a node speaks only for itself, as its summary does. A
    series from another target, or for a node several targets serve identity for, is left out
    and counted in ``refused``; one for a node identity does not list is kept (it names no GPU
    the snapshot has; a new node's up brings identity to be read again)."""
    out: list[Any] = []
    for sample in samples:
        if type(sample) is tuple:
            node, target = sample[0], sample[3:5]
        else:
            try:
                labels = sample["metric"]
                node = labels.get("node", "")
                target = (labels.get("instance", ""), labels.get("job", ""))
            except _BAD_SERIES:
                out.append(sample)  # malformed: dropped and counted where it is read
                continue
        if node not in owner:
            out.append(sample)
            continue
        mine = owner[node]
        if mine == target:
            out.append(sample)
            continue
        refused.add(name, node, f"{target[1]}/{target[0]}", mine)
    return out


def own_allocations(samples: Sequence[Any], owner: Mapping[str, tuple[str, str] | None],
                    refused: _Refused, trusted: Sequence[Any] = ()) -> list[Any]:
    """The allocation series of ``samples`` that their node's own target exported, as
    :func:`own` for each GPU's series, plus ``trusted``: those of the scheduler's exporter
    (``allocation_selector``), which speaks for every node's jobs. An allocation series'
    ``job`` is the scheduler's job where the scrape honours labels (then there is no
    ``exported_job``), so the scrape job is unknown and the tie is by ``instance`` alone; a
    series that ``trusted`` holds too is the scheduler's, neither counted twice nor refused."""
    out: list[Any] = list(trusted)
    theirs = {_label_key(s) for s in trusted}
    for sample in samples:
        try:
            labels = sample["metric"]
            node = labels.get("node", "")
            instance = labels.get("instance", "")
            job = labels.get("job", "") if "exported_job" in labels else None
        except _BAD_SERIES:
            out.append(sample)  # malformed: dropped and counted where it is read
            continue
        if theirs and (key := _label_key(sample)) is not None and key in theirs:
            continue
        if node not in owner:
            out.append(sample)
            continue
        mine = owner[node]
        if mine is not None and mine[0] == instance and job in (None, mine[1]):
            out.append(sample)
            continue
        refused.add("allocations", node, f"{job or ''}/{instance}", mine)
    return out


# Distinct targets gpufleet_source_series_refused_total keeps apart: where a scrape honours
# labels a node names its own ``instance``, so a liar could otherwise grow the counter's
# series (and this process's memory) without end by changing it each scrape.
MAX_REFUSED_TARGETS = 256
OTHER_TARGETS = "other"


def count_refused(counts: dict[str, int], target: str, n: int,
                  cap: int = MAX_REFUSED_TARGETS) -> None:
    """Add ``n`` refused series to ``target``'s count; past ``cap`` targets, new ones count
    together under ``other``."""
    if target not in counts and len(counts) >= cap:
        target = OTHER_TARGETS
    counts[target] = counts.get(target, 0) + n


def _label_key(sample: Any) -> tuple[tuple[str, str], ...] | None:
    """A series' labels, name included, as a key; None for a malformed one."""
    try:
        key = tuple(sorted(sample["metric"].items()))
        hash(key)
        return key
    except _BAD_SERIES:
        return None


@dataclass
class _Refused:
    """The series of one read left out because a target spoke for a node not its own
    (:func:`own`, :func:`own_allocations`): (node, target) -> (why, series), the total, and
    the series by target (``job/instance``)."""

    series: int = 0
    claims: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    by_target: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, node: str, target: str, owner: tuple[str, str] | None) -> None:
        self.series += 1
        self.by_target[target] = self.by_target.get(target, 0) + 1
        why = ("several targets serve the node's identity" if owner is None
               else f"the node's identity comes from {owner[1]}/{owner[0]}")
        _, count = self.claims.get((node, target), (why, 0))
        self.claims[(node, target)] = (why, count + 1)


def summarised(summary: _Result | None, old: _Result | None,
               identity: Sequence[Any] | None) -> SummaryCover | None:
    """The GPUs the nodes' summaries cover and the nodes to read per GPU; None where every
    GPU is to be read (a summary query that failed, no identity yet), and ``every_gpu`` where
    more than ``MAX_NODES_NAMED`` nodes are uncovered. A node is uncovered when its summary
    is missing, old, not a number, has a GPU not up, or counts other GPUs than identity lists.

    A node speaks only for itself: a summary counts only from the scrape target (its
    ``job`` and ``instance``) that serves the node's identity. One from another target, or
    for a node identity does not list, or for a node whose identity several targets serve,
    is ignored (in ``ignored``) and the node is read per GPU: what its own series say
    decides (a node identity does not list brings identity to be read again if it has GPUs)."""
    if summary is None or summary.series is None or old is None or old.series is None:
        return None
    if not identity:
        return None
    keys = sorted(_keys(identity))
    owner = owners(identity)
    listed: dict[str, int] = {}
    for node, _ in keys:
        listed[node] = listed.get(node, 0) + 1
    uncovered: set[str] = set()
    ignored: dict[tuple[str, str], str] = {}

    def believed(node: str, target: str) -> bool:
        if node not in owner:
            why = "no identity lists the node"
        elif owner[node] is None:
            why = "several targets serve the node's identity"
        elif owner[node] != target:
            why = f"the node's identity comes from {owner[node]}"
        else:
            return True
        ignored[(node, target)] = why
        uncovered.add(node)
        return False

    counts: dict[str, dict[str, float]] = {}
    for sample in summary.series:
        try:
            labels = sample["metric"]
            node, state, target = labels.get("node", ""), labels.get("state", ""), _target(labels)
        except _BAD_SERIES:
            return None  # no node to blame it on
        if not believed(node, target):
            continue
        states = counts.setdefault(node, {})
        try:
            value = _value(sample)
        except _BAD_SERIES:
            value = None
        if value is None:
            uncovered.add(node)
            continue
        states[state] = states.get(state, 0.0) + value
    for sample in old.series:
        try:
            labels = sample["metric"]
            node, target = _label(labels, "node"), _target(labels)
        except _BAD_SERIES:
            return None
        if believed(node, target):
            uncovered.add(node)
    uncovered |= listed.keys() - counts.keys()
    for node, states in counts.items():
        if {k: v for k, v in states.items() if v} != {"up": float(listed[node])}:
            uncovered.add(node)
    if len(uncovered) > MAX_NODES_NAMED:
        return SummaryCover([], [], ignored, every_gpu=True)
    return SummaryCover([k for k in keys if k[0] not in uncovered], sorted(uncovered), ignored,
                        owner=owner_targets(identity))


def undercounted(summary: _Result | None, identity: Sequence[Any]) -> bool:
    """Whether a node's summary counts more GPUs than ``identity`` lists on it (a half window
    that missed them). Any target's summary counts here: a lie costs one export of the whole
    window at the first read, never a GPU in the snapshot."""
    if summary is None or summary.series is None:
        return False
    listed: dict[str, int] = {}
    for row in identity:
        if type(row) is tuple:
            listed[row[0]] = listed.get(row[0], 0) + 1
    counted: dict[str, float] = {}
    for sample in summary.series:
        try:
            node, value = sample["metric"].get("node", ""), _value(sample)
        except _BAD_SERIES:
            continue
        if value is not None:
            counted[node] = counted.get(node, 0.0) + value
    return any(n > listed.get(node, 0) for node, n in counted.items())


@dataclass(frozen=True)
class MemoryCover:
    """What the nodes' memory totals give: each GPU's memory total on the nodes they cover, as
    :func:`compact`'s rows from the target that serves the node; the nodes whose GPUs must be
    read one by one; the totals not believed, (node, target) -> why, each a series ignored;
    and ``every_gpu`` where every GPU's is to be read instead (too many nodes uncovered to
    name, or none covered)."""

    rows: list[Compact]
    uncovered: list[str]
    ignored: dict[tuple[str, str], str] = field(default_factory=dict)
    every_gpu: bool = False


def memory_summarised(answer: _Result | None, identity: Sequence[Any] | None
                      ) -> MemoryCover | None:
    """Each GPU's memory total from its node's (``gpufleet_node_gpu_memory_total_bytes``, as
    :func:`compact`'s rows: node, gpu, value, instance, job); None where every GPU's is to be
    read (the node query failed, a malformed series, no identity). A node exports the family
    only where all its GPUs report one and the same total, so its GPUs' rows are what each
    GPU's own series would have said.

    A node speaks only for itself: a node's total counts only from the scrape target that
    serves its identity. One from another target, or for a node whose identity several
    targets serve or that no identity lists, is ignored (in ``ignored``), and the node's GPUs
    are read one by one, as are those of a node with no total or one that is no legal byte
    count (the read per GPU drops and counts it)."""
    if answer is None or answer.series is None or not identity:
        return None
    owner = owner_targets(identity)
    gpus: dict[str, list[str]] = {}
    for node, gpu in sorted(_keys(identity)):
        gpus.setdefault(node, []).append(gpu)
    totals: dict[str, str] = {}
    lied: set[str] = set()
    ignored: dict[tuple[str, str], str] = {}
    for sample in answer.series:
        if type(sample) is not tuple:  # decoded by compact(): one that is not has no node
            return None
        node, text, target = sample[0], sample[2], (sample[3], sample[4])
        mine = owner.get(node)
        if mine != target:
            why = ("no identity lists the node" if node not in owner
                   else "several targets serve the node's identity" if mine is None
                   else f"the node's identity comes from {mine[1]}/{mine[0]}")
            ignored[(node, f"{target[1]}/{target[0]}")] = why
            lied.add(node)
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value) and 0 <= value <= metrics.BYTES.high:  # NaN is not
            totals[node] = text
    covered = sorted(n for n in totals if n not in lied and n in gpus)
    uncovered = sorted(gpus.keys() - set(covered))
    if not covered or len(uncovered) > MAX_NODES_NAMED:
        return MemoryCover([], [], ignored, every_gpu=True)
    rows: list[Compact] = []
    for node in covered:
        served = owner[node]
        assert served is not None  # a node several targets serve has none believed
        rows += [(node, gpu, totals[node], *served) for gpu in gpus[node]]
    return MemoryCover(rows, uncovered, ignored)


def changed_nodes(held: Sequence[Any], read: Sequence[Any],
                  static: Sequence[_Result | None]) -> set[str] | None:
    """The nodes whose static families (memory total) must be read again after identity was
    read: those with a GPU whose identity row is new or changed (another UUID, model, pool or
    target), or with no static row held; None for every node (no static family held, a
    malformed row, or more than ``MAX_NODES_NAMED`` such nodes, which a selector would cost
    more to name than to read)."""
    if any(s is None or s.series is None for s in static):
        return None
    rows = set()
    for row in held:
        if type(row) is tuple:
            rows.add(row)
    have = [{(r[0], r[1]) for r in s.series or () if type(r) is tuple} for s in static if s]
    nodes: set[str] = set()
    for row in read:
        if type(row) is not tuple:
            return None
        if row not in rows or any((row[0], row[1]) not in keys for keys in have):
            nodes.add(row[0])
    return None if len(nodes) > MAX_NODES_NAMED else nodes


def nodes_matcher(nodes: Sequence[str]) -> str:
    """A PromQL matcher for exactly these node names: RE2's special characters escaped, then
    the string's own backslashes and quotes."""
    alternatives = "|".join("".join("\\" + c if c in _REGEX_SPECIAL else c for c in node)
                            for node in nodes)
    return 'node=~"' + alternatives.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class _CycleCollectionPause:
    """Pause the cyclic GC while decoding: 10k series are ~150k new containers, which
    trigger collections that rescan them all (about 30% of decode time, measured)
    although decoded JSON holds no cycles. Reference counting still frees everything.
    Decoders run in several threads at once: the first one in pauses, the last one out
    restores what was there before."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    holders: int = 0
    was_enabled: bool = False

    @contextlib.contextmanager
    def __call__(self):
        with self.lock:
            if self.holders == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.holders += 1
        try:
            yield
        finally:
            with self.lock:
                self.holders -= 1
                if self.holders == 0 and self.was_enabled:
                    gc.enable()


_no_cycle_collection = _CycleCollectionPause()


def _label(labels: Mapping[str, str], name: str) -> str:
    """An exporter's own label, whether or not the scrape honoured it."""
    return labels.get(f"exported_{name}", labels.get(name, ""))


def _value(sample: Mapping[str, Any]) -> float | None:
    value = float(sample["value"][1])
    return None if value != value else value  # NaN is absence, never a value


_Csv = TypeVar("_Csv")  # what an export's CSV decodes to (identity's rows, a family's)

# a value family's series once decoded: (node, gpu, the value's text, instance, job), the
# last two the scrape target that exported it
Compact = tuple[str, str, str, str, str]


def compact(series: list[Any]) -> list[Any]:
    """A value family's series as (node, gpu, value text, instance, job), the labels
    interned: decoded, each series is two dicts, a list and six strings, and a read holds
    every answer until the snapshot is built (13 value families: 0.85 GB of them alone);
    as tuples about 130 bytes. A series that does not have that shape is kept as it came, so
    that :func:`build_snapshot` drops and counts it as before."""
    out: list[Any] = []
    intern = sys.intern
    for sample in series:
        try:
            labels = sample["metric"]
            value = sample["value"][1]
            node, gpu = labels.get("node", ""), labels.get("gpu", "0")
            instance, job = labels.get("instance", ""), labels.get("job", "")
            if all(type(v) is str for v in (value, node, gpu, instance, job)):
                out.append((intern(node), intern(gpu), value, intern(instance), intern(job)))
                continue
        except _BAD_SERIES:
            pass
        out.append(sample)
    return out


# one GPU's identity as the source holds it between reads: (node, gpu, uuid, model, pool,
# instance, job), the last two the scrape target that serves it (whose summary is believed)
IdentityRow = tuple[str, str, str, str, str, str, str]
IDENTITY_LABELS = ("node", "gpu", "uuid", "model", "pool", *TARGET_LABELS)
# VictoriaMetrics' /api/v1/export/csv columns for identity: 5x fewer bytes than the query's
# answer (no architecture, no JSON), and no label dict per GPU to decode. Memory total is not
# exported with it: its rows in the export (two a GPU in the window) cost us more to receive
# and decode than its query, and as much of VictoriaMetrics (docs/performance.md)
EXPORT_FORMAT = ",".join(("__timestamp__:unix_ms", "__value__", *IDENTITY_LABELS))
# what a backend without the export API answers it (Prometheus, Thanos, Mimir: 404)
NO_EXPORT = (400, 404, 405, 501)


def identity_rows(series: list[Any]) -> list[Any]:
    """Identity series as :data:`IdentityRow` tuples, the labels interned: decoded, each is
    a dict of every label (about 1.5 KB a GPU), and the source holds identity between reads.
    A series without that shape is kept as it came, so that :func:`build_snapshot` drops and
    counts it as before."""
    out: list[Any] = []
    intern = sys.intern
    for sample in series:
        try:
            labels = sample["metric"]
            row = tuple(labels.get(k, "0" if k == "gpu" else "") for k in IDENTITY_LABELS)
            if all(type(v) is str for v in row):
                # a UUID is one GPU's own: interning it would only grow the interned table
                out.append(tuple(v if i == 2 else intern(v) for i, v in enumerate(row)))
                continue
        except _BAD_SERIES:
            pass
        out.append(sample)
    return out


def identity_from_csv(body: bytes) -> list[IdentityRow]:
    """Identity from an ``/api/v1/export/csv`` answer in :data:`EXPORT_FORMAT`: the export
    holds every sample of the window, so of each GPU's series (node, gpu and the scrape target)
    only its newest row counts, and none when that one is NaN (a staleness marker: the series
    ended). Two targets serving one GPU stay two rows, as the query answers them. ValueError
    when the answer is not that CSV."""
    newest: dict[tuple[str, ...], tuple[int, IdentityRow | None]] = {}
    intern = sys.intern
    for fields in csv.reader(io.StringIO(body.decode())):
        if len(fields) != 2 + len(IDENTITY_LABELS):
            raise ValueError(f"a row of {len(fields)} fields, expected {2 + len(IDENTITY_LABELS)}")
        at, value = int(fields[0]), float(fields[1])
        node, gpu, model, pool, instance, job = (
            intern(f) for f in (fields[2], fields[3] or "0", *fields[5:]))
        row = (node, gpu, fields[4], model, pool, instance, job)
        key = (node, gpu, instance, job)
        if key not in newest or at >= newest[key][0]:
            newest[key] = (at, None if value != value else row)
    return [row for _, row in newest.values() if row is not None]


class _GpuLabels(msgspec.Struct, gc=False):
    node: str = ""
    gpu: str = "0"
    instance: str = ""
    job: str = ""


class _ValueSample(msgspec.Struct, gc=False):
    metric: _GpuLabels
    value: tuple[float, str]


class _ValueVector(msgspec.Struct, gc=False):
    resultType: str  # the API's name
    result: list[_ValueSample]


class _ValueAnswer(msgspec.Struct, gc=False):
    """A value family's answer (``max by (node, gpu, instance, job)``) as msgspec reads it:
    only those labels and the value, no dict per series (json.loads and :func:`compact` took 4x as
    long at 108,800 GPUs). An answer of another shape fails to decode; json.loads then reads
    it and one malformed series is dropped and counted, as before."""

    data: _ValueVector
    warnings: list[str] = []


def compact_answer(body: bytes) -> tuple[list[Compact], list[str]] | None:
    """A value family's answer as :func:`compact`'s tuples and its warnings; None when it does
    not have the plain shape (the caller reads it with json.loads)."""
    try:
        answer = msgspec.json.decode(body, type=_ValueAnswer)
    except msgspec.MsgspecError:
        return None
    if answer.data.resultType != "vector":
        return None
    intern = sys.intern
    return ([(intern(s.metric.node), intern(s.metric.gpu), s.value[1], intern(s.metric.instance),
              intern(s.metric.job)) for s in answer.data.result], answer.warnings)


@dataclass(frozen=True, slots=True)
class _Result:
    name: str
    series: list[Any] | None  # None: the query failed (value families: compact()'s tuples)
    error: str = ""
    over_cap: bool = False  # failed for a cap: the whole read fails
    exported: bool = False  # identity read through the export API, not the query
    held: frozenset[Any] = frozenset()  # identity rows kept from before: not in the export
    narrow: bool = False  # identity exported over half the window (Source._narrow)
    # up and stale from the nodes' summaries: their first rows restate a Gpu's defaults (up,
    # not stale) for the GPUs the summaries cover, from the node's own target
    restated: int = 0
    # a value family exported: how old its oldest newest row was and its series' spacing (s),
    # the window it needed (next_window)
    reach: tuple[float, float | None] | None = None


async def read_capped(resp: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The body of ``resp``, or PrometheusAnswerOverCap as soon as it passes ``limit`` bytes
    (decompressed, so a gzip bomb is cut too): ``resp.read()`` would hold a 2 GB answer
    whole before anyone looked at its size."""
    try:
        return await http_client.read_capped(resp, limit)
    except http_client.AnswerTooLarge as exc:
        if exc.declared is not None:
            raise PrometheusAnswerOverCap(f"{what}: answer of {exc.declared:,} bytes, over "
                                          f"max_answer_bytes {limit:,}") from None
        raise PrometheusAnswerOverCap(
            f"{what}: answer over max_answer_bytes {limit:,} (read stopped there)") from None


def build_snapshot(
    taken_at: float, results: Mapping[str, _Result], refused: _Refused | None = None,
) -> tuple[FleetSnapshot, tuple[TargetStatus, ...], int]:
    """A snapshot from decoded query results, the scrape targets' status, and the number
    of failed optional queries and series dropped or refused. Each GPU's series count only
    from the target that serves its node's identity (:func:`own`); the others are refused,
    counted in ``refused`` and in the number returned."""
    if refused is None:
        refused = _Refused()
    failed = [r for r in results.values() if r.series is None]
    for result in failed:
        if result.name in REQUIRED:
            raise PrometheusQueryError(result.error)

    def series(name: str) -> list[Any]:
        result = results.get(name)
        return result.series or [] if result is not None else []

    def answered(name: str) -> bool:
        result = results.get(name)
        return result is not None and result.series is not None

    dropped = _Dropped()
    # identity: every GPU with a current series, keyed by its label strings so the
    # 100k+ value samples below cost one dict lookup each
    fields_of: dict[tuple[str, str], dict[str, Any]] = {}
    # a node speaks only for itself: of each GPU's series, only its node's own target's. A
    # node whose identity several targets serve has none: nothing says which one lies, so
    # its GPUs are left out of this read (its last good reading is served stale, as a lost
    # node's) rather than one target's word taken for another's
    owner = owner_targets(series("identity"))
    for sample in series("identity"):
        try:
            if type(sample) is tuple:  # the source's identity rows (IdentityRow)
                node, gpu, uuid, model, pool = sample[:5]
                target = sample[5:7]
            else:
                labels = sample["metric"]
                node, gpu = labels.get("node", ""), labels.get("gpu", "0")
                uuid, model = labels.get("uuid", ""), labels.get("model", "")
                pool = labels.get("pool", "")
                target = (labels.get("instance", ""), labels.get("job", ""))
            if node in owner and owner[node] is None:
                refused.add("identity", node, f"{target[1]}/{target[0]}", None)
                continue
            fields_of[(node, gpu)] = {
                "node": node, "index": _index(gpu), "uuid": uuid, "model": model, "pool": pool,
            }
        except _BAD_SERIES as exc:
            dropped.add("identity", exc)
    up_name = metrics.GPU_UP.name
    current: set[tuple[str, str]] = set()  # the GPUs up answers for, from their own target
    for family, (attr, kind) in GPU_VALUES.items():
        bound = metrics.CATALOGUE[family].bound
        assert bound is not None  # GPU_VALUES holds only bounded families
        low, high, is_up = bound.low, bound.high, family == up_name
        answer = results.get(family)
        rows = answer.series or [] if answer is not None else []
        if answer is not None and answer.restated:
            # the nodes' summaries' rows, first: up 1 and stale 0, a Gpu's defaults, from the
            # node's own target (SummaryCover): only which GPUs up answers for
            if is_up:
                current.update([(s[0], s[1]) for s in rows[:answer.restated]])
            rows = rows[answer.restated:]
        for sample in rows:
            try:
                value: float | None
                if type(sample) is tuple:  # compact(): (node, gpu, value text, instance, job)
                    # a node speaks only for itself (own(), in the same pass: 650,000 rows a
                    # read at 108,800 GPUs)
                    node = sample[0]
                    mine = owner.get(node, _NOT_LISTED)
                    if mine is not _NOT_LISTED and mine != sample[3:5]:
                        refused.add(family, node, f"{sample[4]}/{sample[3]}", mine)
                        continue
                    key = (node, sample[1])
                    if is_up:
                        current.add(key)
                    fields = fields_of.get(key)
                    number = float(sample[2])
                    value = None if number != number else number  # NaN: absence, as _value
                else:
                    if not own([sample], owner, refused, family):
                        continue
                    if is_up:
                        current.update(_keys([sample]))
                    labels = sample["metric"]
                    fields = fields_of.get((labels.get("node", ""), labels.get("gpu", "0")))
                    value = _value(sample)
                if fields is None or value is None:
                    continue
                # the catalogue's bound is the one record of a field's legal values:
                # +Inf memory or -80 GB is no reading, and is dropped, not served
                legal = value in (0.0, 1.0) if kind is bool else low <= value <= high
                if not legal:
                    raise ValueError(f"value {value:g} outside the bounds of {family}")
                fields[attr] = bool(value) if kind is bool else kind(value)
            except _BAD_SERIES as exc:
                dropped.add(family, exc)
    # stale: the exporter said so, its newest sample is too old, or it has identity but
    # no current up sample (the series are going stale one family after another)
    old = _keys(own(series("old"), owner, refused, "old"))
    presence_known = answered(up_name)
    for key, fields in fields_of.items():
        if key in old or (presence_known and key not in current):
            fields["stale"] = True

    mig: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for sample in own(series("mig"), owner, refused, "mig"):  # a node's MIG: its own word
        try:
            labels = sample["metric"]
            key = (labels.get("node", ""), labels.get("gpu", "0"))
            instance = int(labels.get("gpu_instance", ""))  # none: no instance to file it under
            if instance < 0:
                raise ValueError(f"gpu_instance {instance} is negative")
            name, value = labels.get("__name__", ""), _amount(sample, metrics.BYTES.high)
            entry = mig.setdefault(key, {}).setdefault(
                instance, {"profile": labels.get("profile", ""), "total": None, "used": None})
            if name == metrics.GPU_MIG_MEMORY_TOTAL_BYTES.name and value is not None:
                entry["total"] = int(value)
            elif name == metrics.GPU_MIG_MEMORY_USED_BYTES.name and value is not None:
                entry["used"] = int(value)
        except _BAD_SERIES as exc:
            dropped.add("mig", exc)
    for key, instances in mig.items():
        if key in fields_of:
            fields_of[key]["mig"] = tuple(
                MigInstance(i, e["profile"], e["total"], e["used"])
                for i, e in sorted(instances.items()))
    gpus = tuple(sorted([Gpu(**fields) for fields in fields_of.values()], key=_GPU_ORDER))

    nodes_info: dict[str, tuple[dict[str, str], int]] = {}  # name -> labels, GPU count
    cpu_cores: dict[str, float] = {}
    for sample in own(series("nodes"), owner, refused, "nodes"):  # its CPUs, GPUs: its own
        try:
            labels = sample["metric"]
            if labels.get("__name__") == metrics.NODE_INFO.name:
                count = int(labels.get("gpus", "0"))
                if not 0 <= count <= MAX_GPU_INDEX + 1:
                    raise ValueError(f"gpus {count} outside 0-{MAX_GPU_INDEX + 1}")
                nodes_info[labels.get("node", "")] = (labels, count)
            else:
                value = _amount(sample)
                if value is not None:
                    cpu_cores[labels.get("node", "")] = value
        except _BAD_SERIES as exc:
            dropped.add("nodes", exc)
    nodes = tuple(
        Node(name, labels.get("model", ""), cpu_cores.get(name, 0.0), labels.get("pool", ""),
             labels.get("architecture", ""), count)
        for name, (labels, count) in sorted(nodes_info.items())
    )

    # a node's jobs: its own target's word, or the scheduler's exporter's
    allocations = _allocations(
        own_allocations(series("allocations"), owner, refused, series("scheduler_allocations")),
        dropped)
    snapshot = FleetSnapshot(taken_at, nodes, gpus, allocations)
    targets = _targets(series("targets"), dropped)
    if dropped.count:
        log.warning("prometheus series dropped as malformed; the rest of the read stands",
                    extra={"source": "prometheus", "dropped": dropped.count,
                           "err": dropped.first})
    return snapshot, targets, len(failed) + dropped.count + refused.series


def fresh_keys(results: Mapping[str, _Result]) -> set[tuple[str, str]] | None:
    """The GPUs up and fresh in this read: up 1, their newest sample not too old (``old``);
    None where up is unknown (its query failed)."""
    up, old = results.get(metrics.GPU_UP.name), results.get("old")
    if up is None or up.series is None:
        return None
    return ({(s[0], s[1]) for s in up.series if type(s) is tuple and s[2] == "1"}
            - _keys(old.series or [] if old is not None else []))


# owner_targets' answer for a node identity does not list (told apart by identity: every
# target there is a tuple built as identity is read)
_NOT_LISTED: tuple[str, str] = ("", "")
_GPU_ORDER = operator.attrgetter("node", "index")  # Gpu.key, without a call of Python code each


def _keys(samples: Sequence[Any]) -> set[tuple[str, str]]:
    """The (node, gpu) labels of ``samples`` (series, or :func:`compact`'s tuples); a
    malformed one names no GPU."""
    keys = set()
    for sample in samples:
        if isinstance(sample, tuple):
            keys.add((sample[0], sample[1]))
        elif isinstance(sample, dict) and isinstance(labels := sample.get("metric"), dict):
            keys.add((labels.get("node", ""), labels.get("gpu", "0")))
    return keys


def _targets(samples: Sequence[Mapping[str, Any]], dropped: _Dropped | None = None,
             ) -> tuple[TargetStatus, ...]:
    """Prometheus' ``up`` of each scrape target, by its ``instance`` label."""
    out = []
    for sample in samples:
        try:
            out.append(TargetStatus(sample["metric"].get("instance", ""),
                                    up=_value(sample) == 1.0))
        except _BAD_SERIES as exc:
            if dropped is not None:
                dropped.add("targets", exc)
    return tuple(sorted(out, key=lambda t: t.target))


def _allocations(samples: Sequence[Mapping[str, Any]], dropped: _Dropped,
                 ) -> tuple[Allocation, ...]:
    gpus: dict[str, dict[str, list[int]]] = {}  # job -> node -> GPU indices
    meta: dict[str, tuple[Mapping[str, str], int]] = {}  # job -> labels, priority
    cpus: dict[tuple[str, str], float] = {}
    shares: dict[tuple[str, str], float] = {}
    for sample in samples:
        try:
            labels = sample["metric"]
            name = labels.get("__name__", "")
            job, node = _label(labels, "job"), labels.get("node", "")
            if name == metrics.GPU_ALLOCATION_INFO.name:
                index = _index(labels.get("gpu", "0"))
                priority = int(labels.get("priority", "0") or 0)
                gpus.setdefault(job, {}).setdefault(node, []).append(index)
                meta.setdefault(job, (labels, priority))
                continue
            value = _amount(sample)
            if value is None:
                continue
            if name == metrics.ALLOCATION_CPU_CORES.name:
                cpus[(job, node)] = value
            elif name == metrics.ALLOCATION_GPU_SHARE_RATIO.name:
                shares[(job, node)] = value
        except _BAD_SERIES as exc:
            dropped.add("allocations", exc)
    for job, node in cpus:  # placements holding CPUs but no GPU
        gpus.setdefault(job, {}).setdefault(node, [])
    out = []
    for job in sorted(gpus):
        labels, priority = meta.get(job, ({}, 0))
        placements = tuple(
            Placement(node, tuple(sorted(indices)), shares.get((job, node), 1.0),
                      cpus.get((job, node), 0.0))
            for node, indices in sorted(gpus[job].items())
        )
        out.append(Allocation(job, placements, namespace=labels.get("namespace", ""),
                              pod=labels.get("pod", ""), account=labels.get("account", ""),
                              priority=priority))
    return tuple(out)


def carry_over(current: FleetSnapshot, previous: FleetSnapshot, lost: set[str]) -> FleetSnapshot:
    """``current`` plus the last good reading of the ``lost`` nodes, their GPUs stale."""
    gpus = current.gpus + tuple(dataclasses.replace(g, stale=True)
                                for g in previous.gpus if g.node in lost)
    known = {n.name for n in current.nodes}
    nodes = current.nodes + tuple(n for n in previous.nodes if n.name in lost
                                  and n.name not in known)
    by_job = {a.job: a for a in current.allocations}
    for alloc in previous.allocations:
        kept = tuple(p for p in alloc.placements if p.node in lost)
        if not kept:
            continue
        now = by_job.get(alloc.job)
        if now is not None:  # a node left out of a read may still have its placements read
            kept = tuple(p for p in kept if p.node not in {q.node for q in now.placements})
        if not kept:
            continue
        if now is None:
            by_job[alloc.job] = dataclasses.replace(alloc, placements=kept)
        else:
            placements = tuple(sorted(now.placements + kept, key=lambda p: p.node))
            by_job[alloc.job] = dataclasses.replace(now, placements=placements)
    return dataclasses.replace(
        current,
        gpus=tuple(sorted(gpus, key=lambda g: g.key)),
        nodes=tuple(sorted(nodes, key=lambda n: n.name)),
        allocations=tuple(by_job[job] for job in sorted(by_job)),
    )


def node_parts(snapshot: FleetSnapshot, only: Set[str] | None = None
               ) -> dict[str, SourceReading]:
    """Per node with GPUs (of ``only``, where given): its Node, its GPUs, and its placements of
    each allocation."""
    gpus: dict[str, list[Gpu]] = {}
    for gpu in snapshot.gpus:
        if only is None or gpu.node in only:
            gpus.setdefault(gpu.node, []).append(gpu)
    allocations: dict[str, list[Allocation]] = {}
    for alloc in snapshot.allocations:
        for placement in alloc.placements:
            if placement.node in gpus:
                allocations.setdefault(placement.node, []).append(
                    dataclasses.replace(alloc, placements=(placement,)))
    nodes = {n.name: n for n in snapshot.nodes if n.name in gpus}
    return {name: SourceReading((nodes[name],) if name in nodes else (), tuple(node_gpus),
                                tuple(allocations.get(name, ())))
            for name, node_gpus in gpus.items()}


# -- DCGM metrics (``metrics: dcgm``) -------------------------------------------------------


def build_dcgm_queries(config: PrometheusConfig) -> dict[str, str]:
    """One raw query per DCGM field the dcgm source maps (the labels carry the GPU, MIG
    instance and pod), every series of a MIG instance (some carry only profiling fields,
    yet name the instance), and the targets: 53 queries whatever the fleet size."""
    inner = config.selector
    sel = f", {inner}" if inner else ""
    queries = {field_name: f"{field_name}{{{inner}}}" for field_name in GPU_FIELDS}
    queries["mig"] = f'{{__name__=~"DCGM_FI_.+", {MIG_ID_LABEL}!=""{sel}}}'
    queries["targets"] = f"up{{{inner}}}"  # name the dcgm scrape job in the selector
    return queries


def build_dcgm_snapshot(
    taken_at: float, results: Mapping[str, _Result], integrator: RateIntegrator,
    resolve_model: ModelResolver,
) -> tuple[FleetSnapshot, tuple[TargetStatus, ...], int]:
    """The same mapping and unit fixes as the dcgm source (:mod:`exporter.sources.dcgm.fields`), fed by
    Prometheus instead of a scrape. A series without ``Hostname`` is named after its
    target's host, as the dcgm source does; a ``pool`` label, if the scrape adds one,
    sets the GPU's pool.

    A scrape target (``instance``) speaks for its own node only, as a dcgm target does
    (:mod:`exporter.sources.dcgm.identity`): its series name one node, a node name, the
    host of ``instance`` when that is a host name, and no node another target names with
    other GPUs. A target that does not is refused: none of its series is used, and its
    status is down with the reason. Series without ``instance`` (federated, recorded) are
    not checked: nothing says whose they are."""
    failed = [r for r in results.values() if r.series is None]
    if all(results.get(name) is None or results[name].series is None for name in GPU_FIELDS):
        # not one field answered: Prometheus is down, not just thin
        raise PrometheusQueryError(failed[0].error if failed else "no DCGM field was queried")
    builders, bad, claims = _feed_dcgm(results, resolve_model, frozenset())
    refused = _refused_instances(claims)
    if refused:  # rare: build again without them (the first pass did not know)
        builders, bad, _ = _feed_dcgm(results, resolve_model, frozenset(refused))
    failed += bad
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    allocations: list[Allocation] = []
    skipped = 0
    for pool in sorted(builders):
        fleet = builders[pool].build()
        nodes += fleet.nodes
        gpus += integrator.apply(fleet, taken_at)
        allocations += fleet.allocations
        skipped += fleet.skipped
    integrator.forget_except(g.uuid for g in gpus)
    targets = results.get("targets")
    snapshot = FleetSnapshot(taken_at, tuple(sorted(nodes, key=lambda n: n.name)),
                             tuple(sorted(gpus, key=lambda g: g.key)),
                             tuple(sorted(allocations, key=lambda a: a.job)))
    statuses = _targets((targets.series or []) if targets is not None else [])
    if refused:
        statuses = tuple(sorted(
            [s for s in statuses if s.target not in refused]
            + [TargetStatus(instance, up=False, error=why) for instance, why in refused.items()],
            key=lambda t: t.target))
    return snapshot, statuses, len(failed) + skipped


# instance -> (node names, GPU UUIDs) its series name
_Claims = dict[str, tuple[set[str], set[str]]]


def _feed_dcgm(results: Mapping[str, _Result], resolve_model: ModelResolver,
               skip: frozenset[str]) -> tuple[dict[str, DcgmFleetBuilder], list[_Result], _Claims]:
    """Every answered series into a builder per pool, less those of the ``skip`` instances."""
    builders: dict[str, DcgmFleetBuilder] = {}
    failed: list[_Result] = []
    claims: _Claims = {}
    for name in (*GPU_FIELDS, "mig"):
        result = results.get(name)
        for sample in (result.series or []) if result is not None else []:
            labels = sample["metric"]
            instance = labels.get("instance", "")
            if instance in skip:
                continue
            node = first_label(labels, NODE_LABELS)
            if not node:
                node = instance.rpartition(":")[0] or instance
                labels = {**labels, "Hostname": node}
            if instance:
                claim_ = claims.get(instance)
                if claim_ is None:
                    claim_ = claims[instance] = (set(), set())
                claim_[0].add(node)
                claim_[1].add(first_label(labels, UUID_LABELS))
            pool = labels.get("pool", "")
            builder = builders.get(pool)
            if builder is None:
                builder = builders[pool] = DcgmFleetBuilder(pool=pool, resolve_model=resolve_model)
            try:
                value = float(sample["value"][1])
            except _BAD_SERIES:
                failed.append(_Result(name, None, "a series without a number"))  # counted
                continue
            builder.add(labels.get("__name__", name), labels, value)
    return builders, failed, claims


def _refused_instances(claims: _Claims) -> dict[str, str]:
    """Scrape target -> why none of its series is used (see build_dcgm_snapshot)."""
    refused: dict[str, str] = {}
    parts: list[Part] = []
    for instance, (names, uuids) in claims.items():
        host = instance.rpartition(":")[0] or instance
        known = identity(host, "")
        node, why = claim(known, names)
        if why:
            refused[instance] = why
        else:
            parts.append(Part(instance, known, node, frozenset(uuids)))
    refused.update(conflicts(parts))
    return refused


def _secret(path: str, env: str, what: str) -> str:
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise SourceStartupError(f"sources.prometheus.{what}_file: cannot read {path}: "
                                     f"{exc.strerror}") from None
    if env:
        value = os.environ.get(env)
        if value is None:
            raise SourceStartupError(f"sources.prometheus.{what}_env: ${env} is not set")
        return value.strip()
    return ""


def auth_headers(config: PrometheusConfig) -> dict[str, str]:
    """Authorization for a secured endpoint, read fresh so rotated tokens are picked up."""
    token = _secret(config.bearer_token_file, config.bearer_token_env, "bearer_token")
    if token:
        return {"Authorization": f"Bearer {token}"}
    if config.basic_auth_username:
        password = _secret(config.basic_auth_password_file, config.basic_auth_password_env,
                           "basic_auth_password")
        raw = f"{config.basic_auth_username}:{password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
    return {}


def _where(url: str) -> str:
    """The URL without user info, safe for logs and errors."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass
class PrometheusFleetSource:
    config: PrometheusConfig
    clock: Clock
    name: str = "prometheus"
    queries_made: int = 0  # for bench/prometheus_source.py
    _session: aiohttp.ClientSession | None = None
    _parse_errors: int = 0
    _blind_since: str = ""  # the reason logged for the current no-GPU outage; "" when none
    # per node: its part of the last reading it answered in, served stale for lost_after
    _last_good: LastGood[str, SourceReading] = field(init=False)
    # the last read as read (no node carried over), when, and its nodes with GPUs: a node
    # missing now is remembered from it
    _answered: tuple[FleetSnapshot, float, frozenset[str]] | None = None
    _queries: dict[str, str] = field(default_factory=dict)
    _integrator: RateIntegrator = field(default_factory=RateIntegrator)  # DCGM NVLink rates
    # DCGM scrape targets refused for naming a node not their own, as last logged
    _refused: dict[str, str] = field(default_factory=dict)
    # identity as last read (rows), the GPUs it lists, and when: read again after
    # identity_refresh, or when gpufleet_gpu_up answers for other GPUs
    _identity: list[Any] | None = None
    _identity_keys: set[tuple[str, str]] = field(default_factory=set)
    _identity_at: float = 0.0
    _export: bool = True  # False once the backend has shown it has no export API
    _wide_next: bool = False  # the next export of identity over the whole window
    _missed: frozenset[Any] = frozenset()  # the rows the last narrow export missed
    # the window of the value families' export (s; 0: the whole max_sample_age), and per
    # family the GPUs it answered for at the last read: a fresh GPU among them that the window
    # misses is read by query
    _value_window: float = 0.0
    _value_keys: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    identity_reads: int = 0  # for tests and benches: how often identity was read
    summarised_reads: int = 0  # reads whose up and stale came from the nodes' summaries
    summaries_ignored: int = 0  # summary series not believed: from a target not the node's
    node_memory_reads: int = 0  # reads whose memory total came from the nodes' own totals
    # the static families (STATIC_VALUES) as last answered, read with identity
    _static: dict[str, _Result] = field(default_factory=dict)
    # the nodes whose static families are to be read again, as of the last identity read: those
    # whose GPUs' identity changed; None for every node
    _changed: set[str] | None = None
    _static_names: tuple[str, ...] = ()
    # the summaries (and memory totals) not believed at the last read they were read,
    # (node, target) -> why, as last logged, by what they summarise
    _ignored: dict[str, dict[tuple[str, str], str]] = field(default_factory=dict)
    series_refused: int = 0  # each GPU's series left out: from a target not their node's
    # every series refused since start (those and the summaries ignored), by the target
    # (job/instance) that sent it: gpufleet_source_series_refused_total
    refused_by_target: dict[str, int] = field(default_factory=dict)
    # target -> the nodes it spoke for at the last read (their series refused) and why, as
    # last logged
    _claims: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._last_good = LastGood(SourceReading.marked_stale, max_age=self.config.lost_after)
        dcgm = self.config.metrics == "dcgm"
        self._queries = build_dcgm_queries(self.config) if dcgm else build_queries(self.config)
        self._resolve_model = catalogue_resolver() if dcgm else None
        base = self.config.url.rstrip("/")
        self._endpoint = base + "/api/v1/query"
        self._export_endpoint = base + "/api/v1/export/csv"
        self._per_gpu = set() if dcgm else {"identity", "old", *GPU_VALUES}
        self._static_names = tuple(n for n in self._queries if n in STATIC_VALUES and not dcgm)
        self._exported = frozenset() if dcgm else EXPORTED_VALUES & self._queries.keys()

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = http_client.client_session(
                timeout=aiohttp.ClientTimeout(total=self.config.query_timeout),
            )
        return self._session

    async def _query(self, name: str, expr: str, at: float, headers: dict[str, str]) -> bytes:
        form = {"query": expr, "time": f"{at:.3f}", "timeout": f"{self.config.query_timeout:g}s"}
        return await self._post(name, self._endpoint, form, headers)

    async def _post(self, name: str, endpoint: str, form: dict[str, str],
                    headers: dict[str, str]) -> bytes:
        session = self._ensure_session()
        self.queries_made += 1
        where = _where(self.config.url)
        try:
            # a redirect is not followed: it would take the query (a 307 re-sends the form)
            # to whichever host it names
            async with http_client.request(session, "POST", endpoint, data=form,
                                           headers=headers) as resp:
                if resp.status in http_client.REDIRECTS:
                    raise PrometheusQueryError(
                        f"{where}: query {name}: {http_client.redirect_refused(resp.status)}")
                body = await read_capped(resp, self.config.max_answer_bytes,
                                         f"{where}: query {name}")
                if resp.status in (401, 403):
                    raise PrometheusQueryError(
                        f"{where}: HTTP {resp.status} {resp.reason} (check the bearer token or "
                        "basic auth of sources.prometheus)")
                if resp.status != 200:
                    raise _HttpStatus(f"{where}: query {name}: {_api_error(resp, body)}",
                                      resp.status)
                return body
        except TimeoutError:
            raise PrometheusQueryError(
                f"{where}: query {name}: no answer within {self.config.query_timeout:g}s"
            ) from None
        except aiohttp.ClientError as exc:
            raise PrometheusQueryError(f"{where}: query {name}: {type(exc).__name__}: {exc}") \
                from None

    def _decode(self, name: str, body: bytes, budget: _SeriesBudget) -> _Result:
        # each series has one "metric" key (inside a string it would be escaped), so
        # counting them is a cheap, linear upper bound before anything is decoded
        series = body.count(b'"metric"')
        where = f"{_where(self.config.url)}: query {name}"
        # identity, old and the value families answer one series per GPU by construction
        # (``max by (node, gpu)``): more than max_gpus is no fleet we can hold
        if name in self._per_gpu and series > self.config.max_gpus:
            return _Result(name, None, f"{where}: {series:,} series, over max_gpus "
                           f"{self.config.max_gpus:,}", over_cap=True)
        if not budget.take(series):
            return _Result(name, None, f"{where}: {series:,} series, and the read over "
                           f"max_series {self.config.max_series:,}", over_cap=True)
        compacted = name in GPU_VALUES or name == NODE_MEMORY
        if compacted and self._resolve_model is None:
            with _no_cycle_collection():
                fast = compact_answer(body)
            if fast is not None:
                self._warn(name, fast[1])
                return _Result(name, fast[0])
        try:
            with _no_cycle_collection():
                payload = json.loads(body)
            data = payload["data"]
            if data["resultType"] != "vector":
                raise ValueError(f"result type {data['resultType']}, expected vector")
        except (ValueError, KeyError, TypeError) as exc:
            return _Result(name, None, f"query {name}: unexpected answer: {exc}")
        if compacted and self._resolve_model is None:
            data["result"] = compact(data["result"])
        elif name == "identity":
            data["result"] = identity_rows(data["result"])
        self._warn(name, payload.get("warnings") or [])
        return _Result(name, data["result"])

    def _warn(self, name: str, warnings: Sequence[Any]) -> None:
        for warning in warnings:
            # Thanos/Mimir: a store did not answer, so this family may be partial
            log.warning("prometheus answered with a warning",
                        extra={"source": self.name, "query": name, "err": warning})

    async def _fetch(self, name: str, expr: str, at: float, headers: dict[str, str],
                     in_flight: asyncio.Semaphore, budget: _SeriesBudget,
                     export: bool = True) -> _Result:
        exported: bytes | None = None
        try:
            async with in_flight:  # an export and its query fallback: one slot
                if name == "identity" and export and self._export:
                    exported = await self._export_body(at, headers)
                elif name in self._exported and export and self._export:
                    exported = await self._export_values(name, at, headers)
                if exported is None:
                    body = await self._query(name, expr, at, headers)
        except PrometheusQueryError as exc:
            return _Result(name, None, str(exc),
                           over_cap=isinstance(exc, PrometheusAnswerOverCap))
        loop = asyncio.get_running_loop()
        if exported is not None:
            result = await loop.run_in_executor(
                None, *((self._decode_export, exported) if name == "identity" else
                        (self._decode_values, name, exported, at, budget)))
            if result is not None:
                return result
            return await self._fetch(name, expr, at, headers, in_flight, budget, export=False)
        # decoding 10k+ series is CPU work: off the loop that serves /metrics, and
        # overlapping the queries Prometheus is still answering
        return await loop.run_in_executor(None, self._decode, name, body, budget)

    def _narrow(self) -> bool:
        """Whether identity's export reads the narrow window: unless the last one missed more
        than 1% of the GPUs held, or a GPU twice running. With identity held a GPU it misses
        keeps its row; with none held (the first read) one it misses that up answers for
        brings the whole window at once (:meth:`_read_identity`)."""
        return not self._wide_next

    async def _export_body(self, at: float, headers: dict[str, str]) -> bytes | None:
        """Identity through the export API (VictoriaMetrics), the samples of the last
        ``max_sample_age``, or of its half (:meth:`_narrow`: a row a GPU, not two, at a
        scrape interval of half of it); None where the backend has none or
        it failed: the query then reads it. The caller checks it against ``gpufleet_gpu_up``
        (the window may still hold a GPU that is gone)."""
        window = float(self.config.max_sample_age) / (2 if self._narrow() else 1)
        return await self._export_window("identity", self._queries["identity"], EXPORT_FORMAT,
                                         window, at, headers)

    async def _export_values(self, name: str, at: float, headers: dict[str, str]
                             ) -> bytes | None:
        """A value family through the export API, over the window the last read's exports
        needed (:func:`next_window`), half of ``max_sample_age`` at first (a row a GPU at a
        scrape interval of half of it, not two; four at a quarter of it); None where the
        backend has none or it failed: the query then reads it."""
        window = self._value_window or float(self.config.max_sample_age) / 2
        return await self._export_window(name, f"{name}{{{self.config.selector}}}", VALUE_FORMAT,
                                         window, at, headers)

    async def _export_window(self, name: str, match: str, columns: str, window: float,
                             at: float, headers: dict[str, str]) -> bytes | None:
        form = {"match[]": match, "format": columns,
                "start": f"{at - window:.3f}", "end": f"{at:.3f}"}
        try:
            return await self._post(name, self._export_endpoint, form, headers)
        except _HttpStatus as exc:
            if exc.status in NO_EXPORT:
                self._export = False  # Prometheus, Thanos, Mimir: the query from now on
                return None
            why = str(exc)
        except PrometheusQueryError as exc:  # a cap, a redirect, a timeout: the query decides
            why = str(exc)
        log.info("export failed; read by query", extra={"source": self.name, "query": name,
                                                        "err": why})
        return None

    def _read_csv(self, name: str, body: bytes, decode: Callable[[bytes], _Csv]) -> _Csv | None:
        """``decode(body)``; None where the export is not the CSV asked for: quoted with Go's
        escapes, which CSV readers do not undo (the query this time), or unreadable (the query
        from now on: this backend's export is another)."""
        if b"\\" in body:
            return None
        try:
            with _no_cycle_collection():
                return decode(body)
        except (ValueError, UnicodeDecodeError) as exc:
            self._export = False
            log.info("export unreadable; read by query from now on",
                     extra={"source": self.name, "query": name,
                            "err": f"{type(exc).__name__}: {exc}"[:300]})
            return None

    def _decode_values(self, name: str, body: bytes, at: float, budget: _SeriesBudget
                       ) -> _Result | None:
        """A value family's exported rows, as its query's; None when they are not the CSV
        asked for (the query from now on, as for identity) or more GPUs than ``max_gpus``
        (the window's: the query decides the cap)."""
        got = self._read_csv(name, body, values_from_csv)
        if got is None or len(got.rows) > self.config.max_gpus:
            return None
        if not budget.take(len(got.rows)):
            return _Result(name, None, f"{_where(self.config.url)}: query {name}: "
                           f"{len(got.rows):,} series, and the read over max_series "
                           f"{self.config.max_series:,}", over_cap=True)
        reach = None if got.oldest_ms is None else (
            max(0.0, at - got.oldest_ms / 1000),
            None if got.spacing_ms is None else got.spacing_ms / 1000)
        return _Result(name, got.rows, exported=True, reach=reach)

    def _decode_export(self, body: bytes) -> _Result | None:
        """The export's identity rows; None when they are not the CSV asked for (the query
        from now on: this backend's export is another) or more GPUs than ``max_gpus`` (the
        window's, not the instant's: the query decides the cap)."""
        rows = self._read_csv("identity", body, identity_from_csv)
        if rows is None:
            return None
        if len(rows) > self.config.max_gpus:
            return None
        held: frozenset[Any] = frozenset()
        narrow = self._narrow()
        if narrow:
            # a GPU with no sample in the narrow window keeps the row held (_read_identity
            # drops it where up no longer answers for the GPU); past 1% of them, or a GPU
            # missed twice running, the next export reads the whole window, so that every GPU
            # is read again within three identity_refresh whatever its scrape interval
            got = {(r[0], r[1], r[5], r[6]) for r in rows}
            held = frozenset(r for r in self._identity or () if type(r) is tuple
                             and len(r) == len(IDENTITY_LABELS)
                             and (r[0], r[1], r[5], r[6]) not in got)
            self._wide_next = (len(held) > len(self._identity or ()) // 100
                               or not held.isdisjoint(self._missed))
            self._missed = held
            rows = [*rows, *held]
        else:
            self._wide_next, self._missed = False, frozenset()
        return _Result("identity", list(rows), exported=True, held=held, narrow=narrow)

    async def _read_identity(self, at: float, headers: dict[str, str],
                             in_flight: asyncio.Semaphore, budget: _SeriesBudget,
                             results: dict[str, _Result]) -> _Result:
        """This read's identity: read now (in ``results``), or the rows kept from an earlier
        read while ``gpufleet_gpu_up`` answers for the same GPUs, or read again now. An
        exported identity that lists other GPUs than up does is read again by query."""
        up = results.get(metrics.GPU_UP.name)
        # the GPUs up answers for, less those a target claims for a node another one serves
        # (a liar naming GPUs would otherwise have identity read again, by query, every read;
        # a node several serve is left out of the snapshot, not read again)
        served = {n: t for n, t in owner_targets(self._identity or []).items() if t is not None}
        up_keys = None if up is None or up.series is None else _keys(
            own(up.series, served, _Refused(), up.name))
        identity = results.get("identity")
        if identity is None:
            if up_keys is not None and up_keys == self._identity_keys:
                return _Result("identity", self._identity)
            identity = await self._fetch("identity", self._queries["identity"], at, headers,
                                         in_flight, budget)
        if identity.held and up_keys is not None:  # kept only for GPUs up still answers for
            identity = dataclasses.replace(identity, series=[
                r for r in identity.series or () if r not in identity.held or r[:2] in up_keys])
        if identity.narrow and (not up_keys <= _keys(identity.series or []) if up_keys is not None
                                else not self._identity):
            # up answers for a GPU the half window missed and no row is held for (the first
            # read; a node new since): the whole window before the query, which costs 40x more.
            # With up unknown and nothing held, the whole window too: the half would leave out
            # every GPU scraped less often than it
            identity = await self._whole_window(at, headers, in_flight, budget)
        if identity.exported and up_keys is not None and _keys(identity.series or []) != up_keys:
            identity = await self._fetch("identity", self._queries["identity"], at, headers,
                                         in_flight, budget, export=False)
        elif identity.exported and not budget.take(len(identity.series or [])):
            identity = _Result("identity", None, f"{_where(self.config.url)}: query identity: "
                               f"and the read over max_series {self.config.max_series:,}",
                               over_cap=True)
        if identity.over_cap:
            raise PrometheusAnswerOverCap(identity.error)
        if identity.series is not None:
            self.identity_reads += 1
            self._changed = changed_nodes(self._identity or [], identity.series,
                                          [self._static.get(n) for n in self._static_names])
            self._identity, self._identity_at = identity.series, at
            self._identity_keys = _keys(identity.series)
        return identity

    async def _whole_window(self, at: float, headers: dict[str, str],
                            in_flight: asyncio.Semaphore, budget: _SeriesBudget) -> _Result:
        """Identity again, exported over the whole of ``max_sample_age`` (the query where the
        backend has no export): after a half window that missed GPUs nothing is held for."""
        self._wide_next = True
        return await self._fetch("identity", self._queries["identity"], at, headers, in_flight,
                                 budget)

    def _identity_due(self, at: float) -> bool:
        return not self._identity or not 0 <= at - self._identity_at < self.config.identity_refresh

    async def _fetch_all(self, at: float, headers: dict[str, str], in_flight: asyncio.Semaphore,
                         budget: _SeriesBudget, names: Sequence[str]) -> list[_Result]:
        """Every query's result, in query order; the first answer over a cap fails the read at
        once, the queries still running cancelled: waiting for them (each cut at its own cap,
        19 x 64 MiB against a hostile backend) ran the read past ``source_timeout`` (issue 32,
        finding 2, re-run), so the source was down as "timed out", not with the reason."""
        tasks = [asyncio.ensure_future(self._fetch(name, self._queries[name], at, headers,
                                                   in_flight, budget))
                 for name in names]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    result = task.result()
                    if result.over_cap:
                        raise PrometheusAnswerOverCap(result.error)
            return [task.result() for task in tasks]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            tasks.clear()  # the raised error's traceback holds this frame: not the answers too

    async def read(self) -> SourceReading:
        at = self.clock()
        headers = auth_headers(self.config)
        if not self.config.gzip:
            # on a LAN, Prometheus gzipping 30 MB of JSON costs more than sending it
            headers["Accept-Encoding"] = "identity"
        # a few at a time: all 19 at once cost Prometheus ~15% more CPU (measured) for
        # no gain, while 4 keep it busy as we decode the answers already in
        in_flight = asyncio.Semaphore(self.config.max_in_flight)
        budget = _SeriesBudget(self.config.max_series)
        identity = "identity" in self._queries
        # the nodes' summaries first: each GPU's up and stale only where they fall short
        deferred = SUMMARISED if "summary" in self._queries else ()
        # identity changes rarely: read with the rest when due, else only if up says so; the
        # static families with it at the first read, later only for the GPUs whose identity
        # changed (_static_values)
        due = self._identity_due(at)
        first = due and not self._identity
        # with the nodes' memory totals, theirs at the first read, each GPU's only where they
        # fall short (_every_static)
        static = () if first and NODE_MEMORY not in self._queries else self._static_names
        names = [n for n in self._queries
                 if (due or n != "identity") and n not in static and n not in deferred
                 and (first or n != NODE_MEMORY)]
        answers = await self._fetch_all(at, headers, in_flight, budget, names)
        results = {r.name: r for r in answers}
        if deferred:
            read = results.get("identity")
            if (read is not None and read.narrow and not self._identity
                    and read.series is not None and undercounted(results.get("summary"),
                                                                 read.series)):
                # the first read's half window missed GPUs the nodes' summaries count: the
                # whole window now, before the cover, or those nodes are read per GPU
                read = results["identity"] = await self._whole_window(at, headers, in_flight,
                                                                      budget)
            held = read.series if read is not None else self._identity
            results.update(await self._by_summary(
                summarised(results.get("summary"), results.get("summary_old"), held),
                at, headers, in_flight, budget))
            results = {n: results[n] for n in self._queries if n in results}  # query order
            answers = list(results.values())
        if self._exported:
            results.update(await self._values_missed(results, at, headers, in_flight, budget))
            answers = list(results.values())
        if identity:
            reads = self.identity_reads
            results["identity"] = await self._read_identity(at, headers, in_flight, budget,
                                                            results)
            results.update(await self._static_values(
                self.identity_reads > reads, results, at, headers, in_flight, budget))
            results = {n: results[n] for n in self._queries  # query order
                       if n in results and n != NODE_MEMORY}
            answers = list(results.values())
        for result in answers:
            if result.series is None and result.name not in REQUIRED:
                log.warning("prometheus query failed; its fields are left out",
                            extra={"source": self.name, "query": result.name,
                                   "err": result.error})
        loop = asyncio.get_running_loop()
        refused = _Refused()
        snapshot, targets, failed = await loop.run_in_executor(None, self._build, at, results,
                                                               refused)
        self._parse_errors += failed
        self._log_refused(targets)
        self._log_claims(refused)
        if len(snapshot.gpus) > self.config.max_gpus:
            raise PrometheusAnswerOverCap(
                f"{_where(self.config.url)}: {len(snapshot.gpus):,} GPUs, over max_gpus "
                f"{self.config.max_gpus:,}")
        error = self._blind(bool(snapshot.gpus))
        snapshot = self._carry_over_lost_nodes(snapshot, at)
        return SourceReading.of(snapshot, parse_errors=self._parse_errors, targets=targets,
                                error=error, series_refused=tuple(
                                    TargetCount(target, count) for target, count
                                    in sorted(self.refused_by_target.items())))

    async def _by_summary(self, cover: SummaryCover | None, at: float, headers: dict[str, str],
                          in_flight: asyncio.Semaphore, budget: _SeriesBudget
                          ) -> dict[str, _Result]:
        """Each GPU's up, stale and old: from the summaries where they cover, read per GPU for
        the other nodes (named in the selector), or for every GPU without a cover."""
        self._log_ignored(cover.ignored if cover is not None else {}, "node summary")
        if cover is None or cover.every_gpu:
            return {r.name: r for r in await self._fetch_all(at, headers, in_flight, budget,
                                                             SUMMARISED)}
        self.summarised_reads += 1
        results = cover.results()
        if not cover.uncovered:
            return results
        for answer in await self._fetch_nodes(SUMMARISED, cover.uncovered, at, headers,
                                               in_flight, budget):
            if answer.series is None:
                results[answer.name] = answer  # failed: as when every GPU's query fails
            else:
                covered = results[answer.name].series
                assert covered is not None  # cover.results() made it a list
                covered.extend(answer.series)
        return results

    async def _values_missed(self, results: Mapping[str, _Result], at: float,
                             headers: dict[str, str], in_flight: asyncio.Semaphore,
                             budget: _SeriesBudget) -> dict[str, _Result]:
        """The exported value families with what their window missed read by query: a GPU up
        and fresh now that the family answered for at the last read (at the first, any GPU up
        and fresh) but the window did not hold (a scrape later than the window allowed for),
        its node's series by query (every GPU's past ``MAX_NODES_NAMED`` nodes). Sets the next
        read's window (:func:`next_window`), the whole ``max_sample_age`` after a miss."""
        fresh = fresh_keys(results) or set()
        out: dict[str, _Result] = {}
        missed = False
        # each family's GPUs as answered, once (108,800 a family at 108,800 GPUs): what the
        # next read expects
        answered: dict[str, set[tuple[str, str]]] = {}
        for name in self._exported:
            result = results.get(name)
            if result is None or result.series is None:
                continue
            got = answered[name] = _keys(result.series)
            if not result.exported:
                continue
            known = self._value_keys.get(name)
            expected = fresh if known is None else known & fresh
            nodes = sorted({node for node, _ in expected - got})
            if not nodes:
                continue
            missed = True
            if len(nodes) > MAX_NODES_NAMED:
                answer = await self._fetch(name, self._queries[name], at, headers, in_flight,
                                           budget, export=False)
            else:
                (answer,) = await self._fetch_nodes([name], nodes, at, headers, in_flight,
                                                    budget)
                if answer.series is not None:
                    named = set(nodes)
                    answer = _Result(name, [r for r in result.series if r[0] not in named]
                                     + answer.series)
            if answer.over_cap:
                raise PrometheusAnswerOverCap(answer.error)
            # failed: the window's rows stand (the GPUs it missed have no value this read)
            if answer.series is not None:
                out[name] = answer
                answered[name] = _keys(answer.series)
        reaches = [r.reach for n in self._exported if (r := results.get(n)) is not None
                   and r.exported and r.reach is not None]
        whole = float(self.config.max_sample_age)
        self._value_window = whole if missed or not fresh else next_window(
            reaches, self._value_window or whole / 2, whole)
        self._value_keys.update(answered)
        return out

    async def _fetch_nodes(self, names: Sequence[str], nodes: Sequence[str], at: float,
                           headers: dict[str, str], in_flight: asyncio.Semaphore,
                           budget: _SeriesBudget) -> list[_Result]:
        """The answers of the families ``names`` for ``nodes`` only (named in the selector), in
        that order; an answer over its cap ends the read."""
        selector = ", ".join(s for s in (self.config.selector, nodes_matcher(nodes)) if s)
        queries = build_queries(dataclasses.replace(self.config, selector=selector))
        answers = await asyncio.gather(*(self._fetch(name, queries[name], at, headers, in_flight,
                                                     budget, export=False)
                                         for name in names))
        for answer in answers:
            if answer.over_cap:
                raise PrometheusAnswerOverCap(answer.error)
        return list(answers)

    async def _static_values(self, identity_read: bool, results: Mapping[str, _Result],
                             at: float, headers: dict[str, str], in_flight: asyncio.Semaphore,
                             budget: _SeriesBudget) -> dict[str, _Result]:
        """The static families' answers for this read: read with identity at the first read;
        when identity was read again, read now for the nodes whose GPUs' identity changed
        (every GPU's past ``MAX_NODES_NAMED`` such nodes, or with none held); else those held
        from the last time they answered (a failed one leaves its fields absent until it
        answers again)."""
        now = {n: results[n] for n in self._static_names if n in results}
        missing = [n for n in self._static_names if n not in now]
        if identity_read and missing and self._changed is None:  # every GPU's
            now.update(await self._every_static(missing, results, at, headers, in_flight,
                                                budget))
        elif identity_read and missing and self._changed:
            # only the nodes whose GPUs' identity changed (or have none held): theirs replace
            # what was held of those nodes, the rest stand
            for answer in await self._fetch_nodes(missing, sorted(self._changed), at, headers,
                                                   in_flight, budget):
                held = self._static.get(answer.name)
                if answer.series is not None and held is not None and held.series is not None:
                    kept = [r for r in held.series
                            if not (type(r) is tuple and r[0] in self._changed)]
                    answer = _Result(answer.name, kept + answer.series)
                now[answer.name] = answer
        for answer in now.values():
            if answer.series is not None:
                self._static[answer.name] = answer
        return {n: now.get(n) or self._static.get(n) or _Result(n, None, f"query {n}: not read yet")
                for n in self._static_names}

    async def _every_static(self, names: Sequence[str], results: Mapping[str, _Result],
                            at: float, headers: dict[str, str], in_flight: asyncio.Semaphore,
                            budget: _SeriesBudget) -> dict[str, _Result]:
        """The static families ``names`` for every GPU. Memory total, with the nodes' totals
        (``node_summaries``): from them where they cover (:func:`memory_summarised`; read
        with the first read's other queries, else now), each GPU's for the nodes they do not
        cover (named in the selector), and every GPU's past ``MAX_NODES_NAMED`` such nodes,
        with none covered, or when the node query failed."""
        out: dict[str, _Result] = {}
        memory = metrics.GPU_MEMORY_TOTAL_BYTES.name
        if NODE_MEMORY in self._queries and memory in names:
            nodes = results.get(NODE_MEMORY)
            if nodes is None:
                (nodes,) = await self._fetch_all(at, headers, in_flight, budget, [NODE_MEMORY])
            identity = results.get("identity")
            cover = memory_summarised(nodes, identity.series if identity is not None else None)
            self._log_ignored(cover.ignored if cover is not None else {}, "node memory total")
            if cover is not None and not cover.every_gpu:
                self.node_memory_reads += 1
                out[memory] = _Result(memory, cover.rows)
                if cover.uncovered:
                    (answer,) = await self._fetch_nodes([memory], cover.uncovered, at, headers,
                                                        in_flight, budget)
                    # failed: as when every GPU's query fails
                    out[memory] = answer if answer.series is None else _Result(
                        memory, cover.rows + answer.series)
        rest = [n for n in names if n not in out]
        if rest:
            out.update((r.name, r) for r in await self._fetch_all(at, headers, in_flight,
                                                                  budget, rest))
        return out

    def _log_ignored(self, ignored: Mapping[tuple[str, str], str], what: str) -> None:
        """Summaries (``what``) not believed: each a series skipped
        (``gpufleet_source_parse_errors_total``), and logged once while it goes on, not every
        read."""
        self.summaries_ignored += len(ignored)
        self._parse_errors += len(ignored)
        for _, target in ignored:
            count_refused(self.refused_by_target, target, 1)
        last = self._ignored.get(what, {})
        for (node, target), why in sorted(ignored.items()):
            if last.get((node, target)) != why:
                log.warning(f"{what} ignored: a node speaks only for itself; its GPUs are "
                            "read one by one", extra={"source": self.name, "node": node,
                                                      "target": target, "err": why})
        self._ignored[what] = dict(ignored)

    def _log_claims(self, refused: _Refused) -> None:
        """Each GPU's series refused for coming from a target not their node's: counted in
        ``gpufleet_source_parse_errors_total`` (by ``build_snapshot``), and logged once per
        target while its claims go on, not every read: the nodes it spoke for, how many
        series, and why the first was refused."""
        self.series_refused += refused.series
        for target, count in refused.by_target.items():
            count_refused(self.refused_by_target, target, count)
        by_target: dict[str, list[tuple[str, str, int]]] = {}
        for (node, target), (why, count) in sorted(refused.claims.items()):
            by_target.setdefault(target, []).append((node, why, count))
        claims = {target: tuple((node, why) for node, why, _ in rows)
                  for target, rows in by_target.items()}
        for target, rows in by_target.items():
            if self._claims.get(target) == claims[target]:
                continue
            nodes = [node for node, _, _ in rows]
            named = ", ".join(nodes[:MAX_NAMED]) + (
                f" and {len(nodes) - MAX_NAMED} more" if len(nodes) > MAX_NAMED else "")
            log.warning("GPU series refused: a node speaks only for itself; they are left out",
                        extra={"source": self.name, "target": target, "nodes": named,
                               "series": sum(count for _, _, count in rows),
                               "err": rows[0][1]})
        self._claims = claims

    def _log_refused(self, targets: Sequence[TargetStatus]) -> None:
        refused = {t.target: t.error for t in targets if t.error.startswith(REFUSED)}
        if refused != self._refused:  # once per change, not every read
            for target, why in sorted(refused.items()):
                if self._refused.get(target) != why:
                    log.warning("scrape target refused: it names a node not its own",
                                extra={"source": self.name, "target": target, "err": why})
            self._refused = refused

    def _blind(self, has_gpus: bool) -> str:
        """No blind green (issue 30): an answer that lists no GPU is a selector matching
        nothing, or a backend with no series yet (a VictoriaMetrics still filling up),
        far more often than a fleet of none. The source is then down, with the reason,
        logged once per outage; the lost nodes' last good view is still served stale."""
        if has_gpus:
            if self._blind_since:
                log.info("prometheus lists GPUs again", extra={"source": self.name})
                self._blind_since = ""
            return ""
        what = "GPU field" if self.config.metrics == "dcgm" else "identity"
        error = (f"no GPU series: the {what} queries matched no series at "
                 f"{_where(self.config.url)} (check sources.prometheus.selector "
                 f"{self.config.selector!r}, and that the exporters are scraped)")
        if not self._blind_since:
            log.warning("prometheus lists no GPU", extra={"source": self.name, "err": error})
            self._blind_since = error
        return error

    def _carry_over_lost_nodes(self, current: FleetSnapshot, at: float) -> FleetSnapshot:
        """``current`` plus, for each node with GPUs that stopped answering less than
        ``lost_after`` ago, its part of the last reading it answered in, stale."""
        answering = {gpu.node for gpu in current.gpus}
        if self._answered is not None:
            # a node's part is taken when it goes missing, from the read before: not every
            # node's part at every read (13,600 of them at 108,800 GPUs) for the few that go
            was, then, nodes = self._answered
            for node, part in node_parts(was, nodes - answering).items():
                self._last_good.remember(node, part, then)
        self._answered = (current, at, frozenset(answering))
        lost: dict[str, SourceReading] = {}
        for node in self._last_good:
            if node in answering:
                self._last_good.forget(node)  # back: its part, if it goes again, is newer
            elif (last := self._last_good.recall(node, at)) is not None:
                lost[node] = last
        if not lost:
            return current
        previous = FleetSnapshot(at, tuple(n for p in lost.values() for n in p.nodes),
                                 tuple(g for p in lost.values() for g in p.gpus),
                                 tuple(a for p in lost.values() for a in p.allocations))
        return carry_over(current, previous, set(lost))

    def _build(self, at: float, results: Mapping[str, _Result], refused: _Refused
               ) -> tuple[FleetSnapshot, tuple[TargetStatus, ...], int]:
        with _no_cycle_collection():
            if self._resolve_model is not None:
                return build_dcgm_snapshot(at, results, self._integrator, self._resolve_model)
            return build_snapshot(at, results, refused)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _api_error(resp: aiohttp.ClientResponse, body: bytes) -> str:
    try:
        payload = json.loads(body)
        return f"HTTP {resp.status}: {payload.get('errorType', '')}: {payload.get('error', '')}"
    except ValueError:
        return f"HTTP {resp.status} {resp.reason}"


def build(config: PrometheusConfig, clock: Clock) -> PrometheusFleetSource:
    parts = urlsplit(config.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceStartupError(
            f"sources.prometheus.url: must be an http(s) URL, got {_where(config.url)!r}")
    if (config.bearer_token_file or config.bearer_token_env) and config.basic_auth_username:
        raise SourceStartupError(
            "sources.prometheus: set a bearer token or basic auth, not both")
    if (config.basic_auth_password_file or config.basic_auth_password_env) \
            and not config.basic_auth_username:
        raise SourceStartupError(
            "sources.prometheus.basic_auth_username: required with a basic-auth password")
    auth_headers(config)  # a missing token file or variable stops the start, not the first read
    return PrometheusFleetSource(config, clock)
