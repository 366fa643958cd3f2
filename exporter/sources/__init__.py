"""Sources: where fleet data comes from. One module per source, one small contract.

What gpufleet's node_exporter ``collector.go`` is; read it before writing a source.

The contract
    A source has a ``name``, ``async read() -> SourceReading`` and ``async close()``
    (:class:`Source`). ``read`` returns the part of the fleet the source sees: its
    nodes, GPUs, allocations and pending jobs, the running total of records it had
    to skip (``parse_errors``, a counter), and for a source with several endpoints
    one :class:`TargetStatus` per endpoint. A source never builds a
    :class:`~exporter.snapshot.SourceStatus`; the framework does. A source that
    knows which job holds which GPU says so with ``role = "allocation"`` (the
    scheduler's view only: Slurm) or ``schedules = True`` (the simulator, dcgm's
    pod labels, nvml with the kubelet's PodResources): only such a process serves
    the scheduler's families (issue 15).

Who times, who isolates
    :mod:`exporter.collect` times every read with its own timer, bounds it by
    ``source_timeout``, catches whatever it raises, and turns the reading into the
    source's ``SourceStatus`` (``gpufleet_source_up``, ``_duration_seconds``,
    ``_last_success_timestamp_seconds``, ``_parse_errors_total``). One failing
    source never removes the others. Inside a source, one failing endpoint, node or
    GPU never fails the read: the source reports it (a down ``TargetStatus``, a GPU
    with ``up=False``) and returns the rest. A reading that came back but holds
    nothing fresh (every target down, every GPU wedged) sets ``error``; the source
    then counts as down.

Stale
    When a read fails (raises, times out), the collector serves the source's last
    good reading with every GPU marked stale, until the next good read. Sources do
    the same one level down: per target (dcgm, for ``stale_for``), per node
    (prometheus, for ``lost_after``) and per GPU (nvml, while its call is wedged).
    All four use :class:`exporter.sources.lastgood.LastGood`. Stale values are the
    last good sample, never made up; a value that could not be read is absent
    (``None``), never 0 or NaN.

NoData
    Raise :class:`NoData` for "nothing to read here" rather than a failure: the dcgm
    source raises it when its targets file lists no target. The collector reports
    the source down with ``error = "no data: ..."``, logs it at debug level, and
    forgets its last good reading (nothing is there any more, so nothing is served
    stale). A source that cannot start at all (no library, a bad option) raises
    :class:`SourceStartupError` from its ``build`` instead, naming the fix.

Imports
    A source may import :mod:`exporter.snapshot`, :mod:`exporter.gpu_catalogue`,
    :mod:`exporter.options`, :mod:`exporter.metrics` (family names only), leaves
    such as :mod:`exporter.aio`, :mod:`exporter.yamlfile` and
    :mod:`exporter.policy_names`, other modules of this package, and its own
    third-party client (aiohttp, pynvml), the heavy ones only where it reads, not
    where its options are declared. It never imports analysis, exposition, the
    server or placement (ruff's banned-api enforces it, and
    ``tests/test_source_isolation.py`` checks what a fresh import loads): data
    flows one way, from sources to the snapshot to everything else. The sim
    source's ``build`` alone reaches further: it hands the source the simulator
    (:mod:`exporter.fleet_sim`, which places jobs with the placement engine).

Adding a source
    One module, ``exporter/sources/<name>.py``, with its options dataclass (fields
    declared with :func:`exporter.options.opt`; in ``<name>_options.py`` if the
    module imports something heavy) and ``build(options, clock) -> Source``; and one
    entry in :data:`SOURCES`. :mod:`exporter.config` builds ``sources.<name>`` from
    the registry, ``--source <name>`` and ``gpufleet serve --help`` follow, and
    nothing central changes. ``docs/sources.md`` has a complete example.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, Node, TargetCount


class NoData(Exception):
    """Nothing to read here (no target configured yet): not a failure of the source."""


class SourceStartupError(Exception):
    """The source cannot start at all (missing library, bad option). Message names the fix."""


@dataclass(frozen=True, slots=True)
class TargetStatus:
    """One endpoint of a multi-target source (a dcgm-exporter, a Prometheus scrape target)."""

    target: str  # URL or host:port, as the source names it
    up: bool
    error: str = ""
    last_success_time: float | None = None  # unix seconds of its last good answer
    duration_seconds: float = 0.0  # its own scrape, which only the source sees


@dataclass(frozen=True, slots=True)
class SourceReading:
    """What one ``read()`` returns: the source's part of the fleet and how reading it went."""

    nodes: tuple[Node, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    pending: tuple[JobRequest, ...] = ()
    parse_errors: int = 0  # running total since start: gpufleet_source_parse_errors_total
    targets: tuple[TargetStatus, ...] = ()
    # running totals since start by the target that sent them, of the series refused for
    # speaking for a node not the target's own: gpufleet_source_series_refused_total
    series_refused: tuple[TargetCount, ...] = ()
    error: str = ""  # why the source counts as down although it answered; "" when up

    @classmethod
    def of(cls, fleet: FleetSnapshot, **status: Any) -> SourceReading:
        """The fleet part of a snapshot a source built (its ``sources`` must be empty)."""
        if fleet.sources:
            raise ValueError("a source reports TargetStatus, never SourceStatus")
        return cls(fleet.nodes, fleet.gpus, fleet.allocations, fleet.pending, **status)

    def marked_stale(self) -> SourceReading:
        """The same reading with every GPU stale, and no target statuses (they are not fresh)."""
        return dataclasses.replace(
            self, gpus=tuple(dataclasses.replace(g, stale=True) for g in self.gpus), targets=())


class Source(Protocol):
    name: str

    async def read(self) -> SourceReading: ...

    async def close(self) -> None: ...


Clock = Callable[[], float]

@dataclass(frozen=True, slots=True)
class Registered:
    """One source of the registry: where its code and its options are, and its help line."""

    module: str  # has build(options, clock) -> Source; imported only when the source is enabled
    options: str  # "module:Class" of its options dataclass, in a module cheap to import
    help: str  # what ``gpufleet serve --help`` says of ``sources.<name>``

    def options_class(self) -> type:
        module, _, name = self.options.partition(":")
        options: type = getattr(importlib.import_module(module), name)
        return options


# The registry: name (its YAML key and --source value) -> where it is. Source modules are
# imported only when their source is enabled, so a missing optional dependency of one
# cannot break the others; the config reads only the options modules.
SOURCES: dict[str, Registered] = {
    "sim": Registered("exporter.sources.sim.source", "exporter.sources.sim.options:SimSource",
                      "The simulated fleet."),
    "nvml": Registered("exporter.sources.nvml.source", "exporter.sources.nvml.options:NvmlSource",
                       "GPUs of this machine, through NVML (with pod_resources: the "
                       "kubelet's pods on them)."),
    "dcgm": Registered("exporter.sources.dcgm.source", "exporter.sources.dcgm.options:DcgmSource",
                       "dcgm-exporter endpoints."),
    "slurm": Registered("exporter.sources.slurm.source", "exporter.sources.slurm.options:SlurmSource",
                        "Slurm: inventory, allocations, demand."),
    "kubernetes": Registered("exporter.sources.kubernetes.source",
                             "exporter.sources.kubernetes.options:KubernetesSource",
                             "Kubernetes: GPU nodes, pods, MIG, time-slicing and DRA claims."),
    "prometheus": Registered("exporter.sources.prometheus.source",
                             "exporter.sources.prometheus.options:PrometheusSource",
                             "A Prometheus that scrapes the fleet's exporters."),
}


def build_source(name: str, config: Any, clock: Clock) -> Source:
    module = importlib.import_module(SOURCES[name].module)
    return module.build(config, clock)
