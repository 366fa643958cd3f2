"""One evaluation of the advisor, engine and planner together: the entry point that takes a
snapshot and returns typed advice, with no HTTP, store or webhook in it.

The engine (:mod:`engine`) decides and the planner (:mod:`planner`) plans; neither calls
the other, and :func:`advise` runs them in one direction: the engine's first half
(:meth:`Advisor.assess`, which says what to plan), the planner on what it asked for, and
the engine's second half (:meth:`Advisor.decide`, with every plan in hand). The
service (:mod:`service`) calls it on every snapshot and then delivers what it returns; a
simulation calls it in a loop with simulated snapshots and an :class:`Advisor` whose
``clock`` is the simulated one, built from the ``advisor`` config section as ``gpufleet
serve`` builds it: ``Advisor(decision_settings(config), clock=...)`` and
``planner_for(config)``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.advisor.advice import Advice, Steering, SteeringLevel, WhatIf
from exporter.advisor.engine import Advisor, DecisionSettings, idle_rule, pending_gate
from exporter.advisor.plan import CompactionPlan
from exporter.advisor.planner import SURGE_RULES, KeptState, PlanSettings, plan_compaction, plan_for_pending
from exporter.advisor.realised import Ledger, oracle_waiting_saved, with_oracle
from exporter.advisor.surge import SmallDemand
from exporter.analysis.index import Report
from exporter.errors import ConfigError
from exporter.health.settings import health_settings as health_settings  # moved there
from exporter.pool_load.tracker import PoolAdvice
from exporter.snapshot import FleetSnapshot, JobRequest
from exporter.thresholds.defaults import clear_below_for, follows_table

if TYPE_CHECKING:  # annotations only: building an advisor needs no config module loaded
    from exporter.config import AdvisorConfig
    from exporter.thresholds import Thresholds

log = logging.getLogger(__name__)

# (snapshot, report, scope, now) -> plan; scope is "cluster" or "pool:<name>". The planner
# with its settings: functools.partial(plan_compaction, settings=PlanSettings(...))
PlanFunction = Callable[[FleetSnapshot, Report, str, float], CompactionPlan]
# (snapshot, report, pending job, now) -> the plan that lets it start, or None
PendingPlanFunction = Callable[[FleetSnapshot, Report, JobRequest, float], "CompactionPlan | None"]


def advise(advisor: Advisor, snapshot: FleetSnapshot, report: Report,
           plan: PlanFunction = plan_compaction, trigger: str = "snapshot",
           scaling: tuple[PoolAdvice, ...] | None = None,
           plan_pending: PendingPlanFunction | None = None,
           steering: Steering | None = None, ledger: Ledger | None = None) -> Advice:
    """Evaluate ``snapshot``: update ``advisor``'s state, plan what it asks for, decide.

    ``report`` is the snapshot's analysis (:func:`exporter.analysis.index.evaluate` of
    :func:`exporter.analysis.state.from_snapshot`; the live server's analyzer makes it once
    for the exposition and the advisor). Time is ``advisor.clock()``, read once: dwell,
    cooldown, plan expiry and idle clocks all follow it, so a simulated clock gives a
    simulated timeline. ``trigger`` says why ("snapshot", or the Alertmanager notification's
    alerts); ``scaling`` and ``steering`` (:class:`Steerer`) are copied into the advice.

    One direction: the engine's assessment says what to plan (:meth:`Advisor.assess`: a
    pending job, a compaction scope, both or neither), the planner plans each of those on the
    snapshot with memory needs raised to the measured peaks, and the engine decides with every
    plan in hand (:meth:`Advisor.decide`). ``plan`` plans for a scope; ``plan_pending`` for a
    pending job (default: ``plan``'s own ``for_pending`` when it is a :class:`Planner`, else
    :func:`plan_for_pending` with default settings).

    Each plan carries the oracle's bound on its snapshot
    (:func:`~exporter.advisor.realised.oracle_waiting_saved`). ``ledger`` (default: ``plan``'s
    own when it is a :class:`Planner`) sees the snapshot (the jobs of the plans it watches that
    now run) and records a new plan; the advice carries what it holds as ``saving``.

    Returns the advice, also kept as ``advisor.advice``; a new plan is ``advice.plan`` with
    ``advice.decision == "compact"``, for the caller to deliver (and then to tell the
    advisor :meth:`~Advisor.durable` or :meth:`~Advisor.not_durable`).
    """
    asked = advisor.assess(snapshot, report, trigger)
    observe = getattr(plan, "observe", None)
    if observe is not None:  # a planner that forecasts from every evaluation, not only those it plans in
        observe(snapshot, asked.now)
    pending_plan = None
    if asked.pending_job is not None:
        if plan_pending is None:
            plan_pending = getattr(plan, "for_pending", plan_for_pending)
        pending_plan = plan_pending(asked.measured, report, asked.pending_job, asked.now)

        def proposable(candidate: CompactionPlan | None, job: JobRequest) -> bool:
            return candidate is not None and bool(candidate.migrations) and pending_gate(
                candidate, job, advisor.settings) is None

        # the other partitions' heads in turn, until one's plan would be proposed; none: the
        # first head's stands, and its miss is remembered
        if not proposable(pending_plan, asked.pending_job):
            for job in asked.other_heads:
                other = plan_pending(asked.measured, report, job, asked.now)
                if proposable(other, job):
                    asked, pending_plan = dataclasses.replace(asked, pending_job=job), other
                    break
    compaction = None if asked.plan_scope is None else plan(asked.measured, report, asked.plan_scope,
                                                            asked.now)
    if compaction is not None or pending_plan is not None:
        oracle = _oracle(asked.measured, report, asked.now)
        compaction, pending_plan = with_oracle(compaction, oracle), with_oracle(pending_plan, oracle)
    advice = advisor.decide(asked, compaction, scaling, pending_plan)
    if ledger is None:
        ledger = getattr(plan, "ledger", None)
    extra: dict[str, object] = {}
    if ledger is not None:
        ledger.observe(asked.measured, asked.now)
        if advice.decision == "compact" and advice.plan is not None \
                and advice.plan_proposed_at == advice.evaluated_at:
            ledger.record(advice.plan, asked.measured, asked.now)
        extra["saving"] = ledger.saving()
    if steering is not None:
        extra["steering"] = steering
    if extra:
        advice = advisor.advice = dataclasses.replace(advice, **extra)  # type: ignore[arg-type]
    return advice


def _oracle(snapshot: FleetSnapshot, report: Report, now: float) -> float | None:
    """The oracle's bound for the plans of this evaluation; None, logged, if it fails: a
    figure beside the plan must not cost the plan."""
    try:
        return oracle_waiting_saved(snapshot, report, now)
    except Exception:
        log.exception("the oracle's bound not computed for this evaluation")
        return None


STEER_EVERY = 300.0  # seconds between two computations: 2.5 s at 13,600 nodes (bench/steer.py)


def steering_of(report: Report, now: float, snapshot_time: float) -> Steering:
    """Every GPU node's Slurm weight (:func:`exporter.advisor.steer.preferences` on the
    report's state and workload), grouped by weight; nodes without GPUs are not steered."""
    from exporter.advisor import steer

    prefs = steer.preferences(report.state, report.workload)
    by_weight: dict[int, list[steer.NodePreference]] = {}
    for p, gpus in zip(prefs, report.state.gpu_count, strict=True):
        # a node without GPUs is left out: weighted last, it would send CPU-only jobs to
        # the GPU nodes first
        if gpus > 0:
            by_weight.setdefault(p.weight, []).append(p)
    levels = []
    for weight in sorted(by_weight):
        finite = [p.growth for p in by_weight[weight] if math.isfinite(p.growth)]
        levels.append(SteeringLevel(weight, tuple(p.node for p in by_weight[weight]),
                                    round(min(finite), 6) if finite else None,
                                    round(max(finite), 6) if finite else None))
    return Steering(now, snapshot_time, tuple(levels))


@dataclass
class Steerer:
    """The placement preferences the advice carries: computed when the advisor evaluates a
    snapshot at least ``every`` seconds (of the advisor's clock) after the last computation,
    and carried between, so their cost (one FGD evaluation per workload shape over every
    node) is paid once per interval, not once per cycle."""

    every: float = STEER_EVERY
    last: Steering | None = None

    def __call__(self, report: Report, now: float, snapshot_time: float) -> Steering:
        last = self.last
        if last is None or not 0 <= now - last.computed_at < self.every:
            last = self.last = steering_of(report, now, snapshot_time)
        return last


def what_if(advisor: Advisor, snapshot: FleetSnapshot, report: Report,
            plan: PlanFunction = plan_compaction) -> WhatIf:
    """The plan for this snapshot alone, ignoring dwell and cooldown; changes no state."""
    now = advisor.clock()
    scope = advisor.what_if_scope(report)
    proposed = None if scope is None else plan(snapshot, report, scope, now)
    if proposed is not None:
        proposed = with_oracle(proposed, _oracle(snapshot, report, now))
    return advisor.what_if(snapshot, report, now, proposed)


def decision_settings(config: AdvisorConfig, table: Thresholds | None = None) -> DecisionSettings:
    """The engine's settings from the ``advisor`` config section.

    ``table`` is the threshold table in force (``serve --thresholds FILE``, and each reload
    of it): the trigger, the clear bound and the checkpoint interval that the config leaves
    at their defaults are read from it (exporter/thresholds/defaults.py); a value set in the
    config stays. Without one, the defaults the config was built with (the installed table).
    A clear bound set in the config at or above the table's trigger is a one-line
    ConfigError: at the start it stops it, at a reload the old table stays.
    """
    trigger = config.trigger
    if table is not None and follows_table(trigger):
        trigger = table.compaction_threshold()
    clear_below = config.clear_below
    if follows_table(clear_below):
        clear_below = clear_below_for(trigger)
    elif clear_below >= trigger:
        where = f", the fragmentation level of {table.source}" if follows_table(config.trigger) \
            and table is not None else ""
        raise ConfigError(f"advisor.clear_below: must be below advisor.trigger "
                          f"({clear_below:g} >= {trigger:g}{where}); lower it, or remove it to "
                          "follow the trigger")
    return DecisionSettings(
        trigger=trigger, clear_below=clear_below, dwell_seconds=config.dwell,
        cooldown_seconds=config.cooldown,
        min_recovered_per_migration=config.min_recovered_per_migration,
        min_nodes_freed_per_migration=config.min_nodes_freed_per_migration,
        hold_recheck_seconds=config.hold_recheck,
        require_pending=config.require_pending,
        checkpoint_interval_seconds=_checkpoint_interval(config, table),
        idle=None if table is None else idle_rule(table),
    )


def _checkpoint_interval(config: AdvisorConfig, table: Thresholds | None) -> float:
    if not config.assume_checkpointing:
        return 0.0
    if table is not None and follows_table(config.checkpoint_interval):
        return table.checkpoint_interval()
    return float(config.checkpoint_interval)


def plan_settings(config: AdvisorConfig, table: Thresholds | None = None) -> PlanSettings:
    """The planner's settings from the ``advisor`` config section (``table``: as
    :func:`decision_settings`)."""
    return PlanSettings(
        max_migrations=config.max_migrations, max_per_node=config.max_migrations_per_node,
        max_per_namespace=config.max_migrations_per_namespace,
        move_high_priority=config.move_high_priority, high_priority=config.high_priority,
        min_runtime_seconds=config.min_runtime, ttl_seconds=config.plan_ttl,
        checkpoint_interval_seconds=_checkpoint_interval(config, table), rule=config.rule,
    )


@dataclass(frozen=True, slots=True)
class Planner:
    """Both planning modes with one set of settings: called, :func:`plan_compaction` for a
    scope; :meth:`for_pending`, :func:`plan_for_pending` for a pending job.

    It holds the planner's kept state (:class:`~exporter.advisor.planner.KeptState`): what
    one plan leaves for the next on a fleet that changed little; and the ledger of the plans
    delivered (:class:`~exporter.advisor.realised.Ledger`), which :func:`advise` updates.
    Whoever runs the advisor holds one planner over its evaluations (the serving cycle until
    the table is reloaded, a simulation for its run); a call meanwhile from another thread
    plans on its own copy. :meth:`keeping` hands the ledger on to the planner of a new table.
    """

    settings: PlanSettings = field(default_factory=PlanSettings)
    kept: KeptState = field(default_factory=KeptState, compare=False, repr=False)
    # the delivered plans and what came of them (advise updates it; /v1/advice's saving)
    ledger: Ledger = field(default_factory=Ledger, compare=False, repr=False)
    # the small jobs' hourly demand (advise has it observe every evaluation), which the
    # horizon-surge and horizon-lull rules forecast from; kept only under those
    demand: SmallDemand = field(default_factory=SmallDemand, compare=False, repr=False)

    def __call__(self, snapshot: FleetSnapshot, report: Report, scope: str, now: float) -> CompactionPlan:
        return plan_compaction(snapshot, report, scope, now, self.settings, self.kept)

    def for_pending(self, snapshot: FleetSnapshot, report: Report, job: JobRequest,
                    now: float) -> CompactionPlan | None:
        return plan_for_pending(snapshot, report, job, now, self.settings, self.kept, self.demand)

    def observe(self, snapshot: FleetSnapshot, now: float) -> None:
        """Record the small jobs' demand in ``snapshot``, under the rule that reads it."""
        if self.settings.rule in SURGE_RULES:
            self.demand.observe(snapshot, now)

    def keeping(self, previous: object) -> Planner:
        """This planner with ``previous``'s ledger and small jobs' demand, when ``previous`` is
        a planner: a reloaded table changes the settings, not what the plans delivered so far
        came to, nor the demand seen."""
        ledger = getattr(previous, "ledger", None)
        demand = getattr(previous, "demand", None)
        kept = self if not isinstance(ledger, Ledger) else dataclasses.replace(self, ledger=ledger)
        return kept if not isinstance(demand, SmallDemand) else dataclasses.replace(kept, demand=demand)


def planner_for(config: AdvisorConfig, table: Thresholds | None = None,
                previous: object = None) -> PlanFunction:
    """The planner with the ``advisor`` section's settings: what :func:`advise` is given;
    with ``previous`` (the planner it replaces, at a table's reload), that one's ledger."""
    return Planner(plan_settings(config, table)).keeping(previous)
