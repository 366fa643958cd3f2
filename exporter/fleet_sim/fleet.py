"""The simulated fleet: the reference cluster with a job mix that arrives and finishes.

It mirrors the reference cluster (H200, H100, A100 and B200 partitions of
8-GPU nodes, 1,088 GPUs) with the job mix of :mod:`exporter.fleet_sim.jobs`:

- multi-node 8-GPU training needing more than 80 GB per GPU, on H200/B200;
- single-GPU inference on H100;
- fractional (time-sliced) inference on H100 and MIG slices on A100;
- small dev jobs on A100.

A job may run on the models of its kind that its memory need fits, of the
need's memory tier or a higher one: the tier table of
:mod:`exporter.placement.tiers` (over 120 GB per GPU: B200 only; 80 to 120 GB:
H200 or B200). Jobs are placed by the placement engine (:mod:`exporter.placement`) with the
policy of ``sources.sim.policy``. The default, ``bestfit``, is what most
schedulers without a notion of fragmentation do (Slurm's select/cons_tres,
Kubernetes' MostAllocated scoring, binpack GPU-sharing plugins): it fills the
fullest node that fits, which is good at packing and blind to which idle
shares the coming jobs can use, so fragmentation arises as jobs come and go,
as it does in real clusters; ``fgd`` or ``tiered`` show what a fragmentation-
aware scheduler would have done instead. Telemetry follows the jobs: power and temperature follow utilization,
memory follows the job, NVLink traffic only flows for multi-GPU jobs, idle
GPUs sit near idle power. All randomness comes from one seeded generator and
simulated time advances by ``speed`` x wall time, so the same seed and the
same clock give the same run. Counters (energy, NVLink bytes) advance by their
gauge x wall time, so their rates per wall second match the gauges at any speed.

Health and performance (issue 16) are plausible, not measured: clocks follow
load up to the model's maximum, the power-cap reason is set at the cap and the
thermal ones above ``THROTTLE_CELSIUS``, GPM activity (Hopper and Blackwell
only, as NVML) follows utilisation, single-bit ECC errors are rare and grow,
other error counters are small and fixed, so the default fleet pages no one;
the ``xid`` scenario puts a named XID on a named GPU, and ``straggler`` (issue 31) keeps
one GPU at a share of the pace of the job it runs (utilisation, then power, clocks and SM
activity with it): a GPU of a multi-GPU job out of step with its peers. They come from a second
generator seeded from ``seed``, so adding them changed no job or telemetry value.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exporter.fleet_sim.config import FleetConfig
from exporter.fleet_sim.jobs import JOB_KINDS, JobKind, SimJob, relative_rates, scenario_start
from exporter.gpu_catalogue import GB, Catalogue, default_catalogue
from exporter.placement.engine import Placer
from exporter.placement.task import Task
from exporter.placement.tiers import REFERENCE_TIERS, tier_of
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    GpuHealth,
    GpuPerformance,
    MigInstance,
    Node,
    Placement,
    XidCount,
)

MIG_SLICES = 7  # A100 80GB in 7 x 1g.10gb
CHECKPOINT_INTERVAL = 900.0  # the reference cluster checkpoints every 15 min
MAX_STEP = 600.0  # longest simulated step; longer gaps are walked in steps
# MIG nodes are a model of their own to the placement engine, so only MIG jobs go there
# (and MIG jobs nowhere else); the catalogue still reads "A100-80GB MIG" as an A100-80GB.
MIG_MODEL_SUFFIX = " MIG"
# issue 16: plausible per-architecture figures (MHz: SM maximum, memory; PCIe generation)
CLOCKS_MHZ = {"hopper": (1980.0, 2619.0), "blackwell": (1965.0, 3996.0), "ampere": (1410.0, 1593.0)}
PCIE_GENERATION = {"hopper": 5, "blackwell": 5, "ampere": 4}
GPM_ARCHITECTURES = ("hopper", "blackwell")  # NVML's GPM metrics: Hopper and later
SIM_DRIVER_VERSION = "550.127.08"  # a plausible R550 data-centre driver, for gpu_info
SIM_VBIOS_VERSION = "96.00.99.00.01"
THROTTLE_CELSIUS = 88.0  # thermal slowdown (sw_thermal and hw_thermal) from here
SBE_PER_GPU_HOUR = 0.002  # single-bit ECC errors: rare, and each one corrected
REASON_SW_POWER_CAP, REASON_SW_THERMAL, REASON_HW_THERMAL = 0x04, 0x20, 0x40


@dataclass
class Fleet:
    """Static layout plus mutable per-GPU state arrays."""

    nodes: list[Node]
    node_pool: np.ndarray  # pool index per node
    node_cpus: np.ndarray
    gpu_node: np.ndarray  # node index per GPU
    gpu_local: np.ndarray  # index within its node
    gpu_model: list[str]
    gpu_mig: np.ndarray  # bool
    free: np.ndarray  # free share per GPU (0..1); MIG GPUs in multiples of 1/7
    cpu_free: np.ndarray  # per node
    uuids: list[str]
    pools: list[str]
    holders: list[list[str]] = field(default_factory=list)  # job ids per GPU


class Simulation:
    """The whole simulated fleet. ``advance(now)`` moves it to simulated time ``now``."""

    def __init__(self, config: FleetConfig, start_time: float, catalogue: Catalogue | None = None):
        self.config = config
        self.catalogue = catalogue or default_catalogue()
        self._tier_of_model: dict[str, int] = {}  # model -> the highest tier listing it
        self.rng = np.random.default_rng(config.seed)
        self.now = start_time
        self.start_time = start_time
        self.fleet = self._layout()
        counts = np.array([n.gpu_count for n in self.fleet.nodes])
        self._node_offsets = np.concatenate([[0], np.cumsum(counts)])
        self.placer = self._make_placer()
        self.jobs: dict[str, SimJob] = {}
        self._next_job = 1
        g = len(self.fleet.gpu_model)
        self.energy = np.zeros(g)
        self.nvlink_tx = np.zeros(g)
        self.nvlink_rx = np.zeros(g)
        self.utilization = np.zeros(g)
        self.power = np.zeros(g)
        self.temperature = np.zeros(g)
        self.memory_used = np.zeros(g)
        self.lost = np.zeros(g, dtype=bool)
        self.overheat: dict[int, float] = {}
        self.straggling: dict[int, float] = {}  # GPU -> the share of its job's pace it keeps
        self._scenarios_started: set[int] = set()
        by_model = {m: self.catalogue.get(m) for m in set(self.fleet.gpu_model)}  # 1 s at scale 100 per GPU
        specs = [by_model[m] for m in self.fleet.gpu_model]
        self.tdp = np.array([s.tdp_watts or 300.0 for s in specs])
        self.memory_total = np.array([s.memory_bytes or 16 * GB for s in specs], dtype=float)
        self.nvlink_capacity = np.array(
            [s.nvlink_bandwidth_bytes_per_second or 0.0 for s in specs]
        )
        self.ambient = 24.0 + self.rng.normal(0, 2.0, len(self.fleet.nodes))
        self._health_state(specs)
        self._fill()
        self._start_scenarios()
        self._telemetry(0.0)

    def _health_state(self, specs: list[Any]) -> None:
        """Issue 16's per-GPU state, drawn from its own generator so that the job stream and
        the telemetry above stay what they were for the same seed."""
        g = len(specs)
        rng = self.health_rng = np.random.default_rng([self.config.seed, 16])
        architectures = [s.architecture for s in specs]
        clocks = np.array([CLOCKS_MHZ.get(a, (1500.0, 1500.0)) for a in architectures]) * 1e6
        self.sm_clock_max = clocks[:, 0]
        self.memory_clock = clocks[:, 1]
        self.pcie_generation = [PCIE_GENERATION.get(a, 4) for a in architectures]
        self.has_gpm = np.array([a in GPM_ARCHITECTURES for a in architectures]) \
            & ~self.fleet.gpu_mig
        has_nvlink = self.nvlink_capacity > 0
        self.sbe_aggregate = rng.poisson(0.3, g)  # the GPU's life before this run
        self.sbe_volatile = np.zeros(g, dtype=np.int64)
        self.remapped_correctable = rng.poisson(0.05, g)
        self.pcie_replays = rng.poisson(0.5, g)
        self.nvlink_crc_flit = np.where(has_nvlink, rng.poisson(2.0, g), -1)  # -1: no NVLink
        self.nvlink_replay = np.where(has_nvlink, rng.poisson(1.0, g), -1)
        self.sm_efficiency = rng.uniform(0.55, 0.85, g)  # SM activity per unit of utilization
        self.xids: dict[int, dict[int, int]] = {}  # GPU -> XID code -> count
        self.last_xid: dict[int, tuple[int, float]] = {}  # GPU -> (XID, unix time)

    # -- layout -----------------------------------------------------------------

    def _layout(self) -> Fleet:
        pools = self.config.pools
        names = [name for name, _ in self.config.node_names()]  # what scenarios are checked against
        nodes: list[Node] = []
        node_pool, node_cpus = [], []
        gpu_node, gpu_local, gpu_model, gpu_mig, uuids = [], [], [], [], []
        mig_left = {p.name: self.config.mig_nodes for p in pools if p.model.startswith("A100")}
        number = 0
        for copy in range(self.config.scale):
            for pool_index, pool in enumerate(pools):
                spec = self.catalogue.get(pool.model)
                for _ in range(pool.nodes):
                    number += 1
                    name = names[number - 1]
                    node_index = len(nodes)
                    nodes.append(
                        Node(name, spec.name, float(pool.cpu_cores), pool.name,
                             spec.architecture, pool.gpus_per_node)
                    )
                    node_pool.append(pool_index)
                    node_cpus.append(pool.cpu_cores)
                    # the last mig_nodes nodes of each A100 pool (first copy) run MIG
                    remaining = pool.nodes - (number - 1 - sum(p.nodes for p in pools[:pool_index])
                                              - copy * sum(p.nodes for p in pools))
                    is_mig = copy == 0 and pool.name in mig_left and remaining <= mig_left[pool.name]
                    for local in range(pool.gpus_per_node):
                        gpu_node.append(node_index)
                        gpu_local.append(local)
                        gpu_model.append(spec.name)
                        gpu_mig.append(is_mig)
                        uuids.append(_uuid(self.config.seed, name, local))
        g = len(gpu_node)
        return Fleet(
            nodes=nodes,
            node_pool=np.array(node_pool),
            node_cpus=np.array(node_cpus, dtype=float),
            gpu_node=np.array(gpu_node),
            gpu_local=np.array(gpu_local),
            gpu_model=gpu_model,
            gpu_mig=np.array(gpu_mig, dtype=bool),
            free=np.ones(g),
            cpu_free=np.array(node_cpus, dtype=float),
            uuids=uuids,
            pools=[p.name for p in pools],
            holders=[[] for _ in range(g)],
        )

    # -- jobs ------------------------------------------------------------------

    def _new_job(self, kind: JobKind, start: float) -> SimJob | None:
        rng = self.rng
        node_count = int(rng.choice(kind.nodes))
        gpus = 8 if node_count else int(rng.choice(kind.gpus))
        share = float(rng.choice(kind.share))
        memory_gb = float(rng.uniform(*kind.memory_gb))
        # log-normal durations: most jobs are short, a few run for days
        duration = float(rng.lognormal(math.log(kind.mean_hours * 3600) - 0.5, 1.0))
        job = SimJob(
            id=f"{kind.name}-{self._next_job:06d}",
            kind=kind,
            placements=[],
            start=start,
            end=start + max(duration, 300.0),
            utilization=float(rng.uniform(*kind.utilization)),
            memory_bytes=memory_gb * GB,
            # a healthy multi-GPU job keeps its links busy (at least ~half their capacity
            # while it computes): NVLink-starved jobs come from scenarios, not the default
            # fleet, whose alerts are the noise budget's baseline (docs/alerting.md)
            nvlink_level=float(rng.uniform(0.6, 0.95)) if (node_count or gpus > 1) else 0.0,
        )
        self._next_job += 1
        models = self._models_for(kind, memory_gb * GB)
        if kind.mig:
            models = [m + MIG_MODEL_SUFFIX for m in models]
        placements = self._place(models, max(node_count, 1), gpus, share, int(memory_gb * GB))
        if placements is None:
            return None
        job.placements = placements
        self._apply(job, +1)
        self.jobs[job.id] = job
        return job

    def _models_for(self, kind: JobKind, need_bytes: float) -> list[str]:
        """The models of ``kind`` a job needing ``need_bytes`` per GPU may run on: those it
        fits on whose tier (:mod:`exporter.placement.tiers`) is the need's own or higher.

        Higher, unlike the ``tiered`` policy's strict rule: the simulated scheduler is
        tier-blind, so a 100 GB job lands on an H200 or a B200, whichever fits first.
        """
        need_tier = tier_of(need_bytes)
        return [m for m in kind.pools
                if need_bytes <= self._model_memory(m) and self._top_tier(m) >= need_tier]

    def _model_memory(self, model: str) -> float:
        return float(self.catalogue.get(model).memory_bytes or 0)

    def _top_tier(self, model: str) -> int:
        """The highest tier listing the model; -1 for a model the tier table lacks."""
        if model not in self._tier_of_model:
            name = self.catalogue.get(model).name
            self._tier_of_model[model] = max(
                (i for i, tier in enumerate(REFERENCE_TIERS) if name in tier.models), default=-1)
        return self._tier_of_model[model]

    def _make_placer(self) -> Placer:
        """The engine's view of the empty fleet, and the job mix as its target workload."""
        fleet = self.fleet
        offsets = self._node_offsets
        models = [n.model + (MIG_MODEL_SUFFIX if fleet.gpu_mig[offsets[i]] else "")
                  for i, n in enumerate(fleet.nodes)]
        target = []
        for kind, rate in zip(JOB_KINDS, relative_rates(), strict=True):
            parts = float(np.mean(kind.nodes)) or 1.0  # a multi-node job is one 8-GPU task per node
            allowed = tuple(m + MIG_MODEL_SUFFIX for m in kind.pools) if kind.mig else kind.pools
            for gpus in ((8,) if any(kind.nodes) else kind.gpus):
                for share in kind.share:
                    task = Task((8.0 if share >= 1.0 else 4.0) * gpus, gpus, share, allowed)
                    target.append((task, rate * parts / (len(kind.gpus) * len(kind.share))))
        return Placer.for_nodes([n.name for n in fleet.nodes], models, [n.pool for n in fleet.nodes],
                                list(fleet.node_cpus), [n.gpu_count for n in fleet.nodes], target,
                                self.catalogue)

    def _place(self, models: list[str], node_count: int, gpus: int, share: float,
               memory_bytes: int) -> list[tuple[int, list[int], float, float]] | None:
        """Nodes and GPUs for a job by the configured policy; all its nodes of one model."""
        placer = self.placer
        cpus = (8.0 if share >= 1.0 else 4.0) * gpus
        allowed = list(models)
        while allowed:
            task = Task(cpus, gpus, share, tuple(allowed), memory_bytes)
            first = placer.place(task, self.config.policy, self.rng)
            if first is None:
                return None
            placer.apply(first)
            parts = [first]
            model = placer.model_names[placer.model[first.node]]
            rest = Task(cpus, gpus, share, (model,), memory_bytes)
            while len(parts) < node_count:
                found = placer.place(rest, self.config.policy, self.rng)
                if found is None:
                    break
                placer.apply(found)
                parts.append(found)
            if len(parts) == node_count:
                return [(p.node, [int(self._node_offsets[p.node]) + s for s in p.slots], share, cpus)
                        for p in parts]
            # not enough nodes of that model: give them back and try the job's other models
            for part in parts:
                placer.release(part)
            allowed.remove(model)
        return None

    def _node_gpus(self, node_index: int) -> np.ndarray:
        offsets = self._node_offsets
        return np.arange(offsets[node_index], offsets[node_index + 1])


    def _apply(self, job: SimJob, sign: int) -> None:
        fleet = self.fleet
        for node_index, gpus, share, cpus in job.placements:
            fleet.cpu_free[node_index] -= sign * cpus
            for g in gpus:
                fleet.free[g] = round(fleet.free[g] - sign * share, 9)
                if sign > 0:
                    fleet.holders[g].append(job.id)
                else:
                    fleet.holders[g].remove(job.id)
            # the fleet's arrays are the truth; the engine's copy of the node follows them
            node_gpus = self._node_gpus(node_index)
            self.placer.set_node(node_index, fleet.cpu_free[node_index], fleet.free[node_gpus])

    def _finish(self, job: SimJob) -> None:
        self._apply(job, -1)
        del self.jobs[job.id]

    def _arrival_rates(self) -> list[float]:
        """Jobs per simulated second of each kind that keep the fleet near its target."""
        gpus = len(self.fleet.gpu_model)
        return [self.config.target_allocation * gpus * rate / 3600 for rate in relative_rates()]

    def _fill(self) -> None:
        """Start mid-life: fill towards the target with jobs of random age, then let some go.

        Filling past the target and removing a random part of the jobs leaves the
        holes that departures leave in a real cluster.
        """
        total = len(self.fleet.gpu_model)
        weights = np.array([k.weight for k in JOB_KINDS])
        weights /= weights.sum()
        failures = 0
        target = min(1.0, self.config.target_allocation * 1.15)
        # kept as a running sum: re-adding every GPU per job cost 0.6 s at scale 100
        allocated = float((1 - self.fleet.free).sum())
        while allocated < target * total and failures < 200:
            kind = JOB_KINDS[int(self.rng.choice(len(JOB_KINDS), p=weights))]
            age = float(self.rng.uniform(0, kind.mean_hours * 3600))
            job = self._new_job(kind, self.now - age)
            if job is None:
                failures += 1
                continue
            allocated += sum(len(gpus) * share for _, gpus, share, _ in job.placements)
            job.end = max(job.end, self.now + 300.0)
        ids = sorted(self.jobs)
        leave = self.rng.random(len(ids)) < 0.15
        for job_id, gone in zip(ids, leave, strict=True):
            if gone:
                self._finish(self.jobs[job_id])

    # -- scenarios --------------------------------------------------------------

    def _gpu_at(self, node: str, gpu: int) -> int:
        for i, n in enumerate(self.fleet.nodes):
            if n.name == node:
                idx = self._node_gpus(i)
                if gpu < len(idx):
                    return int(idx[gpu])
        raise ValueError(f"scenario names GPU {node}/{gpu}, which the simulated fleet lacks")

    def _start_scenarios(self) -> None:
        for number, scenario in enumerate(self.config.scenarios):
            if number in self._scenarios_started:
                continue
            if self.now - self.start_time < scenario.start_after:
                continue
            self._scenarios_started.add(number)
            if scenario.kind == "overheat":
                self.overheat[self._gpu_at(scenario.node, scenario.gpu)] = scenario.value or 90.0
            elif scenario.kind == "gpu_lost":
                self.lost[self._gpu_at(scenario.node, scenario.gpu)] = True
            elif scenario.kind == "idle_allocated":
                self._idle_allocated(self._gpu_at(scenario.node, scenario.gpu))
            elif scenario.kind == "fragmented_pool":
                self._fragment_pool(scenario.pool)
            elif scenario.kind == "xid":
                self._xid(self._gpu_at(scenario.node, scenario.gpu), int(scenario.value))
            elif scenario.kind == "straggler":
                self.straggling[self._gpu_at(scenario.node, scenario.gpu)] = scenario.value or 0.5

    def _xid(self, g: int, xid: int) -> None:
        """The driver reports an XID on GPU ``g``, as NVML's event set would."""
        counts = self.xids.setdefault(g, {})
        counts[xid] = counts.get(xid, 0) + 1
        self.last_xid[g] = (xid, self.now)

    def _pin(self, job: SimJob) -> None:
        job.pinned = True
        job.end = math.inf

    def _idle_allocated(self, g: int) -> None:
        """A job holds this GPU and does nothing with it (the classic forgotten notebook)."""
        for job_id in list(self.fleet.holders[g]):
            self._finish(self.jobs[job_id])
        node_index = int(self.fleet.gpu_node[g])
        kind = JOB_KINDS[-1]
        job = SimJob(f"idle-{self._next_job:06d}", kind, [(node_index, [g], 1.0, 8.0)],
                     scenario_start(self.config.seed, self._next_job, kind, self.now),
                     math.inf, 0.0, 2 * GB, 0.0, pinned=True)
        self._next_job += 1
        self._apply(job, +1)
        self.jobs[job.id] = job

    def _fragment_pool(self, pool: str) -> None:
        """Scatter single-GPU jobs and time-sliced slices so every node keeps idle GPU
        shares but no GPU is whole.

        This is what a fragmentation-blind scheduler with departures converges to
        on a busy pool running shared inference: idle capacity on every node, yet
        no whole-GPU job, let alone an 8-GPU one, can start.
        """
        if pool not in self.fleet.pools:
            raise ValueError(f"scenario names pool {pool!r}, which the simulated fleet lacks")
        pool_index = self.fleet.pools.index(pool)
        kind = next(k for k in JOB_KINDS if k.name == "infer")
        slices = next(k for k in JOB_KINDS if k.name == "slice")
        for node_index in range(len(self.fleet.nodes)):
            if self.fleet.node_pool[node_index] != pool_index:
                continue
            gpus = self._node_gpus(node_index)
            for g in gpus:
                for job_id in list(self.fleet.holders[int(g)]):
                    job = self.jobs.get(job_id)
                    if job is not None and not job.pinned:  # other scenarios' jobs stay
                        self._finish(job)
            busy = self.rng.choice(gpus, size=int(self.rng.integers(5, 8)), replace=False)
            for g in sorted(int(x) for x in busy):
                if self.fleet.free[g] < 1.0:
                    continue
                job = SimJob(f"scatter-{self._next_job:06d}", kind, [(node_index, [g], 1.0, 8.0)],
                             scenario_start(self.config.seed, self._next_job, kind, self.now),
                             math.inf, float(self.rng.uniform(0.3, 0.8)),
                             float(self.rng.uniform(20, 60)) * GB, 0.0, pinned=True)
                self._next_job += 1
                self._apply(job, +1)
                self.jobs[job.id] = job
            # A time-sliced inference slice on every other GPU, so no GPU stays whole either:
            # with whole-GPU jobs the bulk of the workload, those idle shares are fragments
            # (FGD), which is what pushes the pool's fragmentation index above 50.
            for g in sorted(set(int(x) for x in gpus) - set(int(x) for x in busy)):
                if self.fleet.free[g] < 1.0:
                    continue
                share = float(self.rng.choice(slices.share))
                job = SimJob(f"scatter-{self._next_job:06d}", slices,
                             [(node_index, [g], share, 4.0)],
                             scenario_start(self.config.seed, self._next_job, slices, self.now),
                             math.inf, float(self.rng.uniform(0.2, 0.6)),
                             float(self.rng.uniform(5, 18)) * GB, 0.0, pinned=True)
                self._next_job += 1
                self._apply(job, +1)
                self.jobs[job.id] = job
        # nothing else may land in the pool while the scenario holds it
        self._frozen_pools = getattr(self, "_frozen_pools", set()) | {pool}

    # -- time -------------------------------------------------------------------

    def advance(self, now: float) -> None:
        while self.now < now:
            step = min(MAX_STEP, now - self.now)
            self._step(step)

    def _step(self, dt: float) -> None:
        self.now += dt
        for job in [j for j in self.jobs.values() if j.end <= self.now]:
            self._finish(job)
        frozen: set[str] = getattr(self, "_frozen_pools", set())
        for kind, rate in zip(JOB_KINDS, self._arrival_rates(), strict=True):
            for _ in range(int(self.rng.poisson(rate * dt))):
                arrival = self._new_job(kind, self.now)
                if arrival is not None and frozen & {self.fleet.nodes[p[0]].pool for p in arrival.placements}:
                    self._finish(arrival)
        self._start_scenarios()
        self._telemetry(dt)

    def _telemetry(self, dt: float) -> None:
        """Derive every GPU's telemetry from the jobs on it, then integrate counters."""
        g = len(self.fleet.gpu_model)
        util = np.zeros(g)
        memory = np.full(g, 0.45 * GB)  # driver context of an idle GPU
        nvlink = np.zeros(g)
        efficiency = self.sm_efficiency.copy()
        for job in self.jobs.values():
            for _, gpus, share, _ in job.placements:
                util[gpus] += job.utilization * share
                memory[gpus] += job.memory_bytes * (share if share < 1 else 1.0)
                nvlink[gpus] = np.maximum(nvlink[gpus], job.nvlink_level)
                if share >= 1:
                    efficiency[gpus] = _job_efficiency(job.id, self.sm_efficiency[gpus])
        self.job_efficiency = efficiency
        noise = self.rng.normal(0.0, 0.02, g)
        util = np.clip(util + noise * (util > 0), 0.0, 1.0)
        for gpu, share in self.straggling.items():
            # issue 31: a GPU that lags its job's peers (thermal, a bad link, failing HBM);
            # power, clocks and SM activity follow utilisation below
            util[gpu] *= share
        idle_power = 0.1 * self.tdp
        power = idle_power + (self.tdp - idle_power) * util**0.9 + self.rng.normal(0, 3.0, g)
        power = np.clip(power, 0.05 * self.tdp, self.tdp)
        # A healthy GPU at full load runs 70-80 °C (below the table's 80 °C warning): the
        # default fleet must page no one, so heat above that comes from scenarios only.
        temperature = self.ambient[self.fleet.gpu_node] + 6 + 45 * util + self.rng.normal(0, 0.8, g)
        for gpu, value in self.overheat.items():
            temperature[gpu] = value + float(self.rng.normal(0, 0.3))
            power[gpu] = self.tdp[gpu]
        self.utilization = util
        self.memory_used = np.minimum(memory, self.memory_total)
        self.power = power
        self.temperature = temperature
        # Counters advance by gauge x wall-clock time (simulated time / speed): Prometheus
        # takes rate() per wall second, and at speed 60 simulated-time counters implied
        # 39,573 W on a 650 W GPU. The gauges themselves follow simulated time.
        wall = dt / self.config.speed
        self.energy += power * wall
        rate = self.nvlink_capacity * nvlink * util / 2  # capacity counts both directions
        self.nvlink_tx += rate * wall
        self.nvlink_rx += rate * wall * float(self.rng.uniform(0.97, 1.03))
        if self.config.health:
            self._health_telemetry(dt, util, power, temperature)

    def _health_telemetry(self, dt: float, util: np.ndarray, power: np.ndarray,
                          temperature: np.ndarray) -> None:
        """Issue 16: clocks, throttle reasons, activity and the growing ECC count, vectorised
        (108,800 GPUs at the largest scale)."""
        rng = self.health_rng
        g = len(util)
        self.sbe_volatile += rng.poisson(SBE_PER_GPU_HOUR * dt / 3600, g)
        capped = power >= 0.98 * self.tdp
        hot = temperature >= THROTTLE_CELSIUS
        self.reasons = (np.where(capped, REASON_SW_POWER_CAP, 0)
                        | np.where(hot, REASON_SW_THERMAL | REASON_HW_THERMAL, 0))
        floor = 0.17 * self.sm_clock_max  # an idle Hopper sits near 345 MHz
        sm = floor + (self.sm_clock_max - floor) * np.minimum(1.0, util * 1.6)
        sm = np.where(capped | hot, 0.9 * sm, sm)
        self.sm_clock = np.round(sm / 15e6) * 15e6  # NVML's clock steps are 15 MHz
        self.memory_temperature = np.round(temperature + 3.0 + 4.0 * util, 1)
        self.sm_active = np.round(util * self.job_efficiency, 4)
        self.memory_bandwidth = np.round(np.clip(util * 0.6 + rng.normal(0, 0.01, g), 0, 1), 4)
        self.pcie_rx = np.round(util * 2.5e9 * rng.uniform(0.6, 1.0, g), -3)
        self.pcie_tx = np.round(util * 0.6e9 * rng.uniform(0.6, 1.0, g), -3)

    def _xid_only(self, g: int) -> GpuHealth | None:
        """The XIDs of GPU ``g`` alone (a lost GPU, or health values off); None if none."""
        last = self.last_xid.get(g)
        if last is None:
            return None
        counts = self.xids[g]
        return GpuHealth(xid_counts=tuple(XidCount(x, n) for x, n in sorted(counts.items())),
                         last_xid=last[0], last_xid_time=last[1])

    def _health_rows(self) -> tuple[list[GpuHealth | None], list[GpuPerformance | None]]:
        """Each GPU's health and performance, built from plain lists (tolist once, not a numpy
        scalar per value: this runs for every GPU of every snapshot)."""
        health: list[GpuHealth | None] = []
        performance: list[GpuPerformance | None] = []
        gpm = self.has_gpm.tolist()
        # Most GPUs share one of a few hundred combinations of these small counts, and a
        # GpuHealth is immutable: one object per combination (8x fewer built at 10,880 GPUs).
        shared: dict[tuple[int, ...], GpuHealth] = {}
        for g, key in enumerate(zip(
                self.sbe_volatile.tolist(), self.sbe_aggregate.tolist(),
                self.remapped_correctable.tolist(), self.pcie_replays.tolist(),
                self.nvlink_crc_flit.tolist(), self.nvlink_replay.tolist(),
                self.reasons.tolist(), strict=True)):
            counts = self.xids.get(g)
            if not counts and key in shared:
                health.append(shared[key])
                continue
            sbe_vol, sbe_agg, rows, replays, flit, replay, reasons = key
            last = self.last_xid.get(g)
            nvlink = flit >= 0
            row = GpuHealth(
                xid_counts=tuple(XidCount(x, n) for x, n in sorted(counts.items())) if counts else (),
                last_xid=last[0] if last else None, last_xid_time=last[1] if last else None,
                ecc_single_bit_volatile=sbe_vol, ecc_double_bit_volatile=0,
                ecc_single_bit_aggregate=sbe_agg + sbe_vol, ecc_double_bit_aggregate=0,
                remapped_rows_correctable=rows, remapped_rows_uncorrectable=0,
                remapped_rows_pending=False, remapped_rows_failure=False,
                nvlink_crc_flit_errors=flit if nvlink else None,
                nvlink_crc_data_errors=0 if nvlink else None,
                nvlink_replay_errors=replay if nvlink else None,
                nvlink_recovery_errors=0 if nvlink else None,
                pcie_replay_errors=replays, clock_event_reasons=reasons)
            health.append(row)
            if not counts:
                shared[key] = row
        for g, (sm, sm_max, memory_clock, memory_temp, util, active, bandwidth, rx, tx,
                generation) in enumerate(zip(
                self.sm_clock.tolist(), self.sm_clock_max.tolist(), self.memory_clock.tolist(),
                self.memory_temperature.tolist(), self.utilization.tolist(),
                self.sm_active.tolist(), self.memory_bandwidth.tolist(), self.pcie_rx.tolist(),
                self.pcie_tx.tolist(), self.pcie_generation, strict=True)):
            activity = gpm[g]
            performance.append(GpuPerformance(
                sm_clock_hertz=sm, memory_clock_hertz=memory_clock, graphics_clock_hertz=sm,
                sm_clock_max_hertz=sm_max, memory_clock_max_hertz=memory_clock,
                graphics_clock_max_hertz=sm_max, memory_temperature_celsius=memory_temp,
                performance_state=0 if util > 0 else 8, pcie_link_generation=generation,
                pcie_link_width=16, pcie_transmit_bytes_per_second=tx,
                pcie_receive_bytes_per_second=rx, encoder_utilization_ratio=0.0,
                decoder_utilization_ratio=0.0, memory_bandwidth_utilization_ratio=bandwidth,
                graphics_engine_active_ratio=round(util, 4) if activity else None,
                sm_active_ratio=active if activity else None,
                sm_occupancy_ratio=round(active * 0.5, 4) if activity else None,
                tensor_active_ratio=round(active * 0.6, 4) if activity else None,
                dram_active_ratio=round(bandwidth * 0.85, 4) if activity else None))
        return health, performance

    # -- snapshot ---------------------------------------------------------------

    def snapshot(self) -> FleetSnapshot:
        fleet = self.fleet
        gpus = []
        health: list[GpuHealth | None]
        performance: list[GpuPerformance | None]
        if self.config.health:
            health, performance = self._health_rows()
        else:  # XIDs are still events worth their series (the xid scenario)
            health = [self._xid_only(g) for g in range(len(fleet.gpu_model))]
            performance = [None] * len(fleet.gpu_model)
        for g in range(len(fleet.gpu_model)):
            node = fleet.nodes[int(fleet.gpu_node[g])]
            mig: tuple[MigInstance, ...] = ()
            if fleet.gpu_mig[g]:
                used_slices = round((1 - fleet.free[g]) * MIG_SLICES)
                mig = tuple(
                    MigInstance(i, "1g.10gb", 10 * GB, int(4 * GB) if i < used_slices else 0)
                    for i in range(MIG_SLICES)
                )
            if self.lost[g]:
                gpus.append(Gpu(node.name, int(fleet.gpu_local[g]), fleet.uuids[g],
                                fleet.gpu_model[g], node.pool, up=False,
                                health=self._xid_only(g)))
                continue
            gpus.append(
                Gpu(
                    node=node.name,
                    index=int(fleet.gpu_local[g]),
                    uuid=fleet.uuids[g],
                    model=fleet.gpu_model[g],
                    pool=node.pool,
                    memory_total_bytes=int(self.memory_total[g]),
                    memory_used_bytes=int(self.memory_used[g]),
                    utilization_ratio=round(float(self.utilization[g]), 4),
                    temperature_celsius=round(float(self.temperature[g]), 1),
                    power_watts=round(float(self.power[g]), 2),
                    power_limit_watts=float(self.tdp[g]),
                    energy_joules=round(float(self.energy[g]), 3),
                    nvlink_transmit_bytes=float(int(self.nvlink_tx[g])),
                    nvlink_receive_bytes=float(int(self.nvlink_rx[g])),
                    nvlink_capacity_bytes_per_second=float(self.nvlink_capacity[g]) or None,
                    mig=mig,
                    pci_bus_id=f"00000000:{0x18 + int(fleet.gpu_local[g]) * 0x10:02X}:00.0",
                    driver_version=SIM_DRIVER_VERSION,
                    vbios_version=SIM_VBIOS_VERSION,
                    health=health[g],
                    performance=performance[g],
                )
            )
        allocations = tuple(self._allocation(job) for job in sorted(self.jobs.values(), key=_job_order))
        return FleetSnapshot(
            taken_at=self.now,
            nodes=tuple(fleet.nodes),
            gpus=tuple(gpus),
            allocations=allocations,
        )

    def _allocation(self, job: SimJob) -> Allocation:
        fleet = self.fleet
        placements = tuple(
            Placement(fleet.nodes[n].name, tuple(int(fleet.gpu_local[g]) for g in gpus), share, cpus)
            for n, gpus, share, cpus in job.placements
        )
        ran = max(0.0, self.now - job.start)
        checkpoint = job.start + math.floor(ran / CHECKPOINT_INTERVAL) * CHECKPOINT_INTERVAL
        kind = job.kind
        name = self.config.job_prefix + job.id  # slices of one fleet get disjoint job names
        return Allocation(
            job=name,
            placements=placements,
            namespace=kind.namespace,
            pod=f"{name}-0",
            priority=kind.priority,
            qos=kind.qos,
            user=f"user{int(job.id.split('-')[-1]) % 17:02d}",
            account=kind.namespace,
            start_time=job.start,
            last_checkpoint_time=checkpoint if kind.name == "train" and ran >= CHECKPOINT_INTERVAL else None,
            gpu_memory_need_bytes=int(job.memory_bytes),
        )


def _job_efficiency(job: str, gpus: np.ndarray) -> np.ndarray:
    """SM activity per unit of utilisation on the GPUs a job holds whole: the job's kernels'
    (0.55 to 0.83, from a hash of its id: no draw from the generators, so no other value moves),
    within 1.5 % from GPU to GPU. The GPUs of one data-parallel job run the same kernels and
    read alike (issue 31: a per-GPU efficiency put one GPU of a 4-GPU job 27 % below its
    peers, a straggler that was not one)."""
    digest = int.from_bytes(hashlib.blake2b(job.encode(), digest_size=8).digest(), "big")
    kernel = 0.55 + 0.28 * digest / 2 ** 64
    return kernel * (1.0 + (gpus - 0.70) * 0.1)


def _job_order(job: SimJob) -> str:
    return job.id


def _uuid(seed: int, node: str, index: int) -> str:
    """A stable, UUID-shaped GPU id: the same node and index always get the same one."""
    digest = hashlib.sha1(f"{seed}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
