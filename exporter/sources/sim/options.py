"""Options of the ``sim`` source (``sources.sim``): the simulated fleet's layout and scenarios.

A module of their own, like every source's options: the simulator
(:mod:`exporter.fleet_sim`) and the source (:mod:`exporter.sources.sim.source`) both
read them, and neither has to import the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.errors import ConfigError
from exporter.options import Duration, opt
from exporter.policy_names import POLICIES  # not exporter.placement: numpy


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

SCENARIO_KINDS = ("overheat", "idle_allocated", "fragmented_pool", "gpu_lost", "xid", "straggler")
MAX_XID = 1023  # NVML's XID codes are below 200 today; a larger one is a typo

# The reference layout is 1,088 GPUs; 100 copies (108,800 GPUs, 1.6 M series) is the largest
# fleet bench/scrape.py measures: 4.8 s and 226 MB of text per snapshot (docs/performance.md),
# so ten times that would not render within a collect interval. scale 1,000,000 said
# "serving", then raised MemoryError six times.
MAX_SCALE = 100
MAX_GPUS = MAX_SCALE * sum(p.nodes * p.gpus_per_node for p in REFERENCE_POOLS)


@dataclass(frozen=True)
class Scenario:
    kind: str = opt(help="What to force.", choices=SCENARIO_KINDS)
    node: str = opt("", help="Node name (overheat, idle_allocated, gpu_lost, xid, straggler).")
    gpu: int = opt(0, help="GPU index on that node.", min=0)
    pool: str = opt("", help="Pool name (fragmented_pool).")
    start_after: Duration = opt(Duration(0), help="Simulated time before it starts.", min=0)
    value: float = opt(
        0.0, help="Forced value: temperature in Celsius for overheat (0 means 90); the XID "
        "code for xid (required, e.g. 79); for straggler the share of its peers' pace the GPU "
        "keeps, 0..1 (0 means 0.5).", min=0
    )


@dataclass(frozen=True)
class SimSource:
    enabled: bool = opt(True, help="Serve the built-in simulated fleet.")
    seed: int = opt(42, help="Random seed: the same seed gives the same run.", min=0)
    speed: float = opt(
        1.0, help="Simulated seconds per wall-clock second (60 = one hour a minute).", min=0.001
    )
    scale: int = opt(
        1, help=f"Copies of the pool layout (10 gives 10,880 GPUs); at most {MAX_SCALE}, "
        f"{MAX_GPUS:,} GPUs, the largest fleet benchmarked (4.8 s to render a snapshot "
        "before issue 16's values; see health).",
        min=1, max=MAX_SCALE,
    )
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
    health: bool = opt(
        True, help="Simulate issue 16's health and performance values (clocks, ECC, throttle "
        "reasons, GPM activity, ...): about 3.6x the series and /metrics bytes per GPU. Off "
        "for the largest fleets when only allocation and fragmentation matter.",
    )
    role: str = opt(
        "full", help="full: the whole simulated fleet; allocation: only the scheduler's view, "
        "joined with a telemetry source (nvml, dcgm, prometheus) by node and GPU index.",
        choices=("full", "allocation"),
    )

    def check(self, prefix: str) -> None:
        gpus = self.scale * sum(p.nodes * p.gpus_per_node for p in self.pools)
        if gpus > MAX_GPUS:  # pools of many nodes get there at scale 1
            raise ConfigError(f"{prefix}.pools: {gpus:,} simulated GPUs; at most {MAX_GPUS:,} "
                              f"(scale {MAX_SCALE} of the reference layout)")
        self._check_scenarios(prefix)

    def node_names(self) -> list[tuple[str, SimPool]]:
        """Every simulated node's name and pool, in the simulator's order.

        The simulator names its nodes from this list, so a scenario is checked
        against the same names the fleet will have.
        """
        total = sum(p.nodes for p in self.pools) * self.scale
        offset = self.first_node - 1  # slices of one fleet get disjoint node names
        width = max(3, len(str(total + offset)))
        layout = [pool for _ in range(self.scale) for pool in self.pools for _ in range(pool.nodes)]
        return [(f"gpu-{number + offset:0{width}d}", pool)
                for number, pool in enumerate(layout, start=1)]

    def _check_scenarios(self, prefix: str) -> None:
        """A scenario naming a node, GPU or pool the fleet lacks would start "ready" and
        force nothing (issue 15): it is a config error, naming the key."""
        if not self.scenarios:
            return
        nodes = dict(self.node_names())
        first, last = next(iter(nodes)), next(reversed(nodes))
        pools = [p.name for p in self.pools]
        for number, scenario in enumerate(self.scenarios):
            key = f"{prefix}.scenarios[{number}]"
            if scenario.kind == "fragmented_pool":
                if scenario.pool not in pools:
                    raise ConfigError(f"{key}.pool: no pool {scenario.pool or '(empty)'} in the "
                                      f"simulated fleet ({', '.join(pools)})")
                continue
            if scenario.kind == "xid" and not (
                    scenario.value == int(scenario.value) and 1 <= scenario.value <= MAX_XID):
                raise ConfigError(f"{key}.value: the XID code, a whole number 1..{MAX_XID} "
                                  f"(e.g. 79, fallen off the bus), not {scenario.value:g}")
            if scenario.kind == "straggler" and scenario.value > 1:
                raise ConfigError(f"{key}.value: the share of its peers' pace the GPU keeps, "
                                  f"0..1 (0 means 0.5), not {scenario.value:g}")
            pool = nodes.get(scenario.node)
            if pool is None:
                raise ConfigError(f"{key}.node: no node {scenario.node or '(empty)'} in the "
                                  f"simulated fleet ({first}..{last})")
            if scenario.gpu >= pool.gpus_per_node:
                raise ConfigError(f"{key}.gpu: {scenario.node} has {pool.gpus_per_node} GPUs "
                                  f"(0..{pool.gpus_per_node - 1})")
