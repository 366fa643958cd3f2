"""The ``sim`` source: the simulated fleet, read on a clock. The default source.

So gpufleet runs anywhere without a GPU. The fleet itself, its job mix and its
telemetry are :mod:`exporter.simulation`; this module only advances it to the
clock's simulated time (``speed`` x wall time since the first read) on every
read and returns what it holds. Its options (``sources.sim``) are declared
here too, and the simulator takes them as they are.

The simulator places jobs with the placement engine, and a source never imports
placement (nor numpy: a source module must stay cheap to import). So this
module does not import the simulator: :func:`build`, the factory the registry
calls, hands the source one (``simulate``), and the source knows it only as a
:class:`FleetModel`. Importing this module loads neither; building the source does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from exporter.options import Duration, opt
from exporter.policy_names import POLICIES  # not exporter.placement: numpy
from exporter.snapshot import FleetSnapshot, Gpu
from exporter.sources import Clock, SourceReading


@dataclass(frozen=True)
class SimPool:
    name: str = opt(help="Pool (partition) name, e.g. gpu-h200.")
    model: str = opt(help="GPU model, a catalogue name such as H200.")
    nodes: int = opt(help="Number of nodes in the pool.", min=1)
    gpus_per_node: int = opt(8, help="GPUs per node.", min=1, max=64)
    cpu_cores: int = opt(128, help="CPU cores per node.", min=1)


REFERENCE_POOLS = (
    SimPool("gpu-h200", "H200", 32, 8, 192),
    SimPool("gpu-h100", "H100", 64, 8, 128),
    SimPool("gpu-a100", "A100-80GB", 32, 8, 128),
    SimPool("gpu-b200", "B200", 8, 8, 224),
)

SCENARIO_KINDS = ("overheat", "idle_allocated", "fragmented_pool", "gpu_lost")


@dataclass(frozen=True)
class Scenario:
    kind: str = opt(help="What to force.", choices=SCENARIO_KINDS)
    node: str = opt("", help="Node name (overheat, idle_allocated, gpu_lost).")
    gpu: int = opt(0, help="GPU index on that node.", min=0)
    pool: str = opt("", help="Pool name (fragmented_pool).")
    start_after: Duration = opt(Duration(0), help="Simulated time before it starts.", min=0)
    value: float = opt(
        0.0, help="Forced value: temperature in Celsius for overheat (0 means 90).", min=0
    )


@dataclass(frozen=True)
class SimSource:
    enabled: bool = opt(True, help="Serve the built-in simulated fleet.")
    seed: int = opt(42, help="Random seed: the same seed gives the same run.", min=0)
    speed: float = opt(
        1.0, help="Simulated seconds per wall-clock second (60 = one hour a minute).", min=0.001
    )
    scale: int = opt(1, help="Copies of the pool layout (10 gives 10,880 GPUs).", min=1)
    target_allocation: float = opt(
        0.8, help="Fraction of GPUs the job mix tries to keep busy.", min=0.0, max=1.0
    )
    mig_nodes: int = opt(2, help="A100 nodes whose GPUs run in MIG mode (7 x 1g.10gb).", min=0)
    pools: tuple[SimPool, ...] = opt(REFERENCE_POOLS, help="Pool layout of the simulated fleet.")
    scenarios: tuple[Scenario, ...] = opt((), help="Conditions to force for demos and tests.")
    policy: str = opt(
        "bestfit", help="How the simulated scheduler places jobs (bestfit: the fullest node that fits, "
        "blind to fragmentation, as most schedulers are).", choices=POLICIES,
    )
    first_node: int = opt(
        1, help="Number of the first node (gpu-NNN), so simulated slices don't collide.", min=1
    )
    job_prefix: str = opt("", help="Prefix of simulated job names, so slices don't collide.")
    role: str = opt(
        "full", help="full: the whole simulated fleet; allocation: only the scheduler's view, "
        "joined with a telemetry source (nvml, dcgm, prometheus) by node and GPU index.",
        choices=("full", "allocation"),
    )


class FleetModel(Protocol):
    """What the source needs of a simulator (:class:`exporter.simulation.fleet.Simulation`)."""

    start_time: float

    def advance(self, now: float) -> None: ...

    def snapshot(self) -> FleetSnapshot: ...


@dataclass
class SimulatedFleetSource:
    """The ``sim`` source: advances the simulation to the clock's time on every read."""

    config: SimSource
    clock: Clock
    simulate: Callable[[SimSource, float], FleetModel]  # (options, start time) -> simulator
    name: str = "sim"
    simulation: FleetModel | None = None
    _wall_start: float = 0.0

    @property
    def role(self) -> str:
        """``allocation`` makes the collector join it with telemetry (see exporter.compose)."""
        return self.config.role

    def _ensure(self) -> FleetModel:
        if self.simulation is None:
            self._wall_start = self.clock()
            self.simulation = self.simulate(self.config, self._wall_start)
        return self.simulation

    def sim_time(self) -> float:
        sim = self._ensure()
        return sim.start_time + (self.clock() - self._wall_start) * self.config.speed

    async def read(self) -> SourceReading:
        sim = self._ensure()
        sim.advance(self.sim_time())
        snapshot = sim.snapshot()
        if self.role == "allocation":
            # what a scheduler knows of a GPU: where it is, nothing measured, no UUID
            # (so the join goes by node and index, as it does for Slurm)
            bare = tuple(Gpu(g.node, g.index, "", g.model, g.pool) for g in snapshot.gpus)
            snapshot = dataclasses.replace(snapshot, gpus=bare)
        return SourceReading.of(snapshot)

    async def close(self) -> None:
        return None


def build(config: SimSource, clock: Clock) -> SimulatedFleetSource:
    """The source with the simulator of :mod:`exporter.simulation` (imported here, when
    the source is built, not when this module is)."""
    from exporter.simulation.fleet import Simulation

    return SimulatedFleetSource(config, clock, Simulation)
