"""What the advisor says, as typed values: advice, what-ifs, the lists of waste, and the
state it keeps over a restart.

Plain frozen dataclasses, built by :mod:`engine` and :mod:`right_sizing`, read by the
service and its metrics. None of them knows JSON: :mod:`wire` writes them, once, where
they leave the process (the HTTP API, the webhook body, ``gpufleet plan``, the durable
store), so the wire format is spelled in one place (docs/advisor.md,
docs/advisor-plan.schema.json).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from exporter.advisor.plan import CompactionPlan
from exporter.advisor.saving import Saving
from exporter.pool_load.tracker import PoolAdvice
from exporter.preemption.advice import PreemptionAdvice

Decision = Literal["none", "cooldown", "hold", "compact"]


@dataclass(frozen=True, slots=True)
class ScopeStatus:
    """One scope's state as an evaluation saw it ("cluster" or "pool:<name>")."""

    index: float  # rounded to 2 places in the advice; as measured in the kept state
    recommended: bool
    above_since: float | None  # when the index last rose above the trigger


@dataclass(frozen=True, slots=True)
class HeldGpus:
    """A job's GPUs in a pool: what every entry of the waste lists starts with."""

    job: str
    namespace: str
    account: str
    pool: str
    model: str
    gpus: float  # GPUs held, a shared GPU counting its share


@dataclass(frozen=True, slots=True)
class Reclaim(HeldGpus):
    """A job whose GPUs stayed below the idle threshold for its duration; never acted on."""

    ACTION = "reclaim"

    utilization_ratio: float
    idle_since: float
    gpu_hours_wasted: float
    reason: str


@dataclass(frozen=True, slots=True)
class RightSizing(HeldGpus):
    """A job on a higher memory tier than its need, in a pool under pressure; never moved."""

    ACTION = "right_size"

    declared_need_gb: float
    measured_peak_gb: float | None  # None: no whole GPU of the job was measured
    suitable_models: tuple[str, ...]
    gpu_hours_held: float
    reason: str


@dataclass(frozen=True, slots=True)
class NvlinkMixed:
    """A multi-node job over GPUs of more than one NVLink generation."""

    job: str
    namespace: str
    nodes: tuple[str, ...]
    nvlink_generations: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class SteeringLevel:
    """The nodes at one Slurm ``Weight`` (:mod:`steer`), with the range of their expected
    growth of fragmentation (GPUs; None where no typical job fits any of them)."""

    weight: int
    nodes: tuple[str, ...]  # in the fleet's node order
    growth_min: float | None
    growth_max: float | None


@dataclass(frozen=True, slots=True)
class Steering:
    """Where the next GPU job should go: every GPU node's Slurm ``Weight``, grouped by level.

    Computed from the snapshot of ``snapshot_time`` at ``computed_at`` (it is one FGD
    evaluation per workload shape over every node, so the advisor computes it at most once
    per interval and carries it between). ``gpu_hours_waiting_saved`` is None: the advisor
    does not estimate the saving of steering yet (the simulator measures it).
    """

    computed_at: float
    snapshot_time: float
    levels: tuple[SteeringLevel, ...]  # weight ascending, only levels with nodes
    gpu_hours_waiting_saved: float | None = None


@dataclass(frozen=True, slots=True)
class Advice:
    """One evaluation: the decision with its reasons, the plan in force, and the waste lists.

    ``plan`` is this evaluation's new plan (``decision`` compact, ``plan_proposed_at`` ==
    ``evaluated_at``) or, until it expires, the last one proposed (an older
    ``plan_proposed_at``). ``scope`` is None when nothing is due (decision none).
    """

    evaluated_at: float
    snapshot_time: float
    trigger: str  # "snapshot", or the Alertmanager notification's alerts
    scopes: Mapping[str, ScopeStatus]  # sorted by scope
    decision: Decision
    reasons: tuple[str, ...]
    scope: str | None = None
    plan: CompactionPlan | None = None
    plan_proposed_at: float | None = None
    reclaim: tuple[Reclaim, ...] = ()
    right_sizing: tuple[RightSizing, ...] = ()
    nvlink_mixed: tuple[NvlinkMixed, ...] = ()
    # the pools' scaling hints (exporter/pool_load/tracker.py, LoadTracker.advice); None where the
    # load tracker is off
    scaling: tuple[PoolAdvice, ...] | None = None
    # the placement preferences in force (the last computed); None where steering is off
    steering: Steering | None = None
    # the delivered plans' expected and realised savings (realised.Ledger); None: not kept
    saving: Saving | None = None
    # the victims for the blocked high-priority head and the spot quota (exporter/preemption/advice.py)
    preemption: PreemptionAdvice | None = None


@dataclass(frozen=True, slots=True)
class WhatIf:
    """``POST /v1/plan``'s answer: the plan for one snapshot, ignoring dwell and cooldown.

    ``plan`` is the planner's plan whenever it has a move, even when the gate refuses it
    (``decision`` hold), so a reader sees what was refused.
    """

    evaluated_at: float
    snapshot_time: float
    scopes: Mapping[str, float]  # scope -> index, rounded to 2 places
    decision: Decision
    reasons: tuple[str, ...]
    scope: str | None = None
    plan: CompactionPlan | None = None


@dataclass(frozen=True, slots=True)
class AdvisorState:
    """What a restart must not lose (:meth:`engine.Advisor.durable_state`): the cooldown, the
    plan in force and each scope's dwell clock. The durable store keeps it as JSON
    (:func:`wire.advisor_state_text`).

    Holds, alert stamps and the idle and peak clocks are not in it: they are rebuilt from the
    next snapshots and alerts, and a lost one errs on the side of waiting, never of a plan.
    """

    last_plan_at: float | None  # the cooldown runs from here
    carried: CompactionPlan | None  # the plan in force, until it expires
    carried_at: float | None  # when ``carried`` was proposed
    scopes: Mapping[str, ScopeStatus]  # sorted by scope
