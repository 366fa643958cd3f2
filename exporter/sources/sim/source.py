"""The ``sim`` source: the simulated fleet, read on a clock. The default source.

So gpufleet runs anywhere without a GPU. The fleet itself, its job mix and its
telemetry are :mod:`exporter.fleet_sim`; this module only advances it to the
clock's simulated time (``speed`` x wall time since the first read) on every
read and returns what it holds. Its options (``sources.sim``) are declared
in :mod:`exporter.sources.sim.options`, and the simulator takes them as they are.

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

from exporter.snapshot import FleetSnapshot, Gpu
from exporter.sources import Clock, SourceReading
from exporter.sources.sim.options import SimSource


class FleetModel(Protocol):
    """What the source needs of a simulator (:class:`exporter.fleet_sim.fleet.Simulation`)."""

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

    # the simulator is its own scheduler: it places jobs, so it serves their joins
    schedules = True

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
    """The source with the simulator of :mod:`exporter.fleet_sim` (imported here, when
    the source is built, not when this module is)."""
    from exporter.fleet_sim.fleet import Simulation

    return SimulatedFleetSource(config, clock, Simulation)
