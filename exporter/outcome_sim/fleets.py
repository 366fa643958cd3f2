"""The fleets a run simulates, and the job shapes it draws from.

- ``default``: the simulated reference fleet of ``gpufleet serve`` (its
  ``sources.sim`` pools: 32 H200, 64 H100, 32 A100-80GB and 8 B200 nodes of
  8 GPUs, 1,088 GPUs), with no MIG nodes: MIG slices are a model of their own
  to the engine, and the openb shapes ask for time-sliced shares, not slices.
- ``openb``: the openb trace's 1,213 GPU nodes (6,212 GPUs), pools by model.

The shapes are the openb default trace's pods. On the default fleet their
model constraints are dropped (they name openb's models; the default trace
states none anyway).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.analysis import openb
from exporter.analysis.state import FleetState, build
from exporter.analysis.workload import Shape
from exporter.gpu_catalogue import default_catalogue
from exporter.snapshot import Gpu, Node
from exporter.sources.sim.options import SimSource

FLEETS = ("default", "openb")


@dataclass(frozen=True, eq=False)
class SimFleet:
    name: str
    nodes: tuple[Node, ...]  # as a snapshot lists them
    gpus: tuple[Gpu, ...]  # no telemetry: the advisor's decisions read allocations only
    shapes: tuple[Shape, ...]  # what jobs ask for, one per trace pod

    @property
    def capacity(self) -> int:
        return sum(n.gpu_count for n in self.nodes)

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


def load_fleet(name: str) -> SimFleet:
    if name == "default":
        return default_fleet()
    if name == "openb":
        return openb_fleet()
    raise ValueError(f"unknown fleet {name!r}; one of {', '.join(FLEETS)}")


__all__ = ["FLEETS", "SimFleet", "default_fleet", "load_fleet", "openb_fleet", "trace_shapes"]
