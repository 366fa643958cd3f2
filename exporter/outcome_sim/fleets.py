"""The fleets a run simulates, and the job shapes it draws from.

- ``default``: the simulated reference fleet of ``gpufleet serve`` (its
  ``sources.sim`` pools: 32 H200, 64 H100, 32 A100-80GB and 8 B200 nodes of
  8 GPUs, 1,088 GPUs), with no MIG nodes: MIG slices are a model of their own
  to the engine, and the openb shapes ask for time-sliced shares, not slices.
- ``openb``: the openb trace's 1,213 GPU nodes (6,212 GPUs), pools by model.
- ``gfs``: the Alibaba spot-GPU trace's 4,278 nodes (10,412 GPUs of 1, 4 or 8 GPUs,
  6 models: the GFS paper's cluster), as ``node_info_df.csv`` lists them, pools by
  model. A model the GPU catalogue knows takes its catalogue name (A100-SXM4-80GB is
  the catalogue's A100-80GB, A10 is A10); the others keep the trace's name (H800,
  A800-SXM4-80GB, and the undisclosed GPU-series-1 and GPU-series-2), so their specs
  are unknown, not guessed.

The shapes (the fleet's typical workload, what the fragmentation index and the FGD
policies score against) are the openb default trace's pods on the default and openb
fleets; on the default fleet their model constraints are dropped (they name openb's
models; the default trace states none anyway). On the gfs fleet they are the parts of
jobs drawn from the trace's own job mix (exporter/outcome_sim/demand.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from exporter.analysis import openb
from exporter.analysis.state import FleetState, build
from exporter.analysis.workload import Shape
from exporter.gpu_catalogue import default_catalogue
from exporter.outcome_sim.demand import GfsDemand, gfs_demand, read_gfs_nodes, typical_shapes
from exporter.snapshot import Gpu, Node
from exporter.sources.sim.options import SimSource

FLEETS = ("default", "openb", "gfs")


@dataclass(frozen=True, eq=False)
class SimFleet:
    name: str
    nodes: tuple[Node, ...]  # as a snapshot lists them
    gpus: tuple[Gpu, ...]  # no telemetry: the advisor's decisions read allocations only
    shapes: tuple[Shape, ...]  # what jobs ask for, one per trace pod
    # the GFS trace's model names and the fleet's for them; empty: the fleet has none of them
    trace_models: tuple[tuple[str, str], ...] = ()

    @property
    def capacity(self) -> int:
        return sum(n.gpu_count for n in self.nodes)

    @cached_property
    def gfs_demand(self) -> GfsDemand:
        """The GFS trace's job mix on this fleet (``--demand gfs``), built once."""
        return gfs_demand(dict(self.trace_models))

    @property
    def openb_shapes(self) -> tuple[Shape, ...]:
        """What ``--demand openb`` draws from: the fleet's shapes, or on the gfs fleet the openb
        pods with no model constraint (they name openb's models)."""
        return trace_shapes(keep_models=False) if self.trace_models else self.shapes

    def empty_state(self) -> FleetState:
        return build([n.name for n in self.nodes], [n.model for n in self.nodes],
                     [n.pool for n in self.nodes], [n.cpu_cores for n in self.nodes],
                     [n.cpu_cores for n in self.nodes], [[1.0] * n.gpu_count for n in self.nodes])


def _gpus(nodes: tuple[Node, ...]) -> tuple[Gpu, ...]:
    return tuple(Gpu(n.name, i, f"GPU-{n.name}-{i}", n.model, n.pool)
                 for n in nodes for i in range(n.gpu_count))


def trace_shapes(keep_models: bool) -> tuple[Shape, ...]:
    trace = openb.named_trace(openb.DEFAULT_TRACE)
    pods = openb.load_pods(trace.pods)
    return tuple(p.shape if keep_models else Shape(p.shape.cpus, p.shape.gpu_share, p.shape.gpus)
                 for p in pods)


def default_fleet() -> SimFleet:
    config = SimSource(mig_nodes=0)
    catalogue = default_catalogue()
    nodes = tuple(Node(name, catalogue.get(pool.model).name, float(pool.cpu_cores), pool.name,
                       catalogue.get(pool.model).architecture, pool.gpus_per_node)
                  for name, pool in config.node_names())
    return SimFleet("default", nodes, _gpus(nodes), trace_shapes(keep_models=False))


def openb_fleet() -> SimFleet:
    trace = openb.named_trace(openb.DEFAULT_TRACE)
    mapper = openb.ModelMapper()
    listed = openb.load_nodes(trace.nodes, mapper)
    nodes = tuple(Node(n.name, n.model, n.cpus, n.model or openb.NO_GPU_POOL, "unknown", n.gpus)
                  for n in listed if n.gpus)
    pods = openb.load_pods(trace.pods, mapper)
    return SimFleet("openb", nodes, _gpus(nodes), tuple(p.shape for p in pods))


def catalogue_name(trace_model: str) -> str:
    """The GPU catalogue's name for a model of the GFS trace, or the trace's own when unknown."""
    spec = default_catalogue().find(trace_model)
    return spec.name if spec is not None else trace_model


def gfs_fleet() -> SimFleet:
    catalogue = default_catalogue()
    listed = read_gfs_nodes()
    width = len(str(len(listed) - 1))
    nodes = []
    for name, model, gpus, cpus in listed:
        known = catalogue_name(model)
        spec = catalogue.find(known)
        label = name.zfill(width) if name.isdigit() else name
        nodes.append(Node(f"gfs-{label}", known, cpus, known, spec.architecture if spec else "unknown", gpus))
    fleet_nodes = tuple(nodes)
    trace_models = tuple(sorted({(model, catalogue_name(model)) for _, model, _, _ in listed}))
    demand = gfs_demand(dict(trace_models))
    fleet = SimFleet("gfs", fleet_nodes, _gpus(fleet_nodes), typical_shapes(demand), trace_models)
    fleet.__dict__["gfs_demand"] = demand  # built already: the cached property's value
    return fleet


def load_fleet(name: str) -> SimFleet:
    if name == "default":
        return default_fleet()
    if name == "openb":
        return openb_fleet()
    if name == "gfs":
        return gfs_fleet()
    raise ValueError(f"unknown fleet {name!r}; one of {', '.join(FLEETS)}")


__all__ = ["FLEETS", "SimFleet", "catalogue_name", "default_fleet", "gfs_fleet", "load_fleet", "openb_fleet",
           "trace_shapes"]
