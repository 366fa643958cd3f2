"""What a strategy acts on during a run, and the settings of a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.analysis.fgd import CompiledWorkload
from exporter.outcome_sim.cluster import Cluster, MoveCost
from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.scheduler import Scheduler
from exporter.outcome_sim.timeline import Job, TimelineSettings


@dataclass(frozen=True, slots=True)
class RunSettings:
    timeline: TimelineSettings = field(default_factory=TimelineSettings)
    policy: str = "bestfit"  # the scheduler's placement policy (sources.sim's default)
    mode: str = "fifo"  # fifo (with backfill) or kube
    backfill_depth: int = 100
    cost: MoveCost = field(default_factory=MoveCost)
    sample_interval: float = 600.0
    advisor_interval: float = 60.0
    descheduler_interval: float = 600.0
    consolidate_interval: float = 60.0
    # the advisor's snapshot lists the nodes as one partition, as the simulated scheduler uses
    # them; False: a pool per model (AdvisorStrategy.one_partition)
    advisor_one_partition: bool = True
    advisor_rule: str = "queue"  # the advisor's planning rule: queue or head (PlanSettings.rule)
    demand: str = ""  # what jobs are drawn from: openb or gfs (demand.DEMANDS); empty: the fleet's default
    preemption: str = "none"  # who high-priority jobs preempt: none, slurm, kube, advisor (preemption.py)
    preempt_exempt: float = 1800.0  # seconds a spot job runs after a (re)start before it may be preempted
    # advisor: spot jobs beyond the advisor's quota wait (preemption.SpotGate); borrow: they wait
    # only while a high-priority job is queued for their pool, and are the first victims
    spot_quota: str = "none"


@dataclass
class Sim:
    """What a strategy acts on: the fleet, the queue, the fleet's static description."""

    fleet: SimFleet
    cluster: Cluster
    scheduler: Scheduler
    settings: RunSettings
    workload: CompiledWorkload
    plans: int = 0
    moves_dropped: int = 0
    # jobs a strategy evicted back into the queue since the run last looked: their second wait counts
    requeued: list[Job] = field(default_factory=list)


__all__ = ["RunSettings", "Sim"]
