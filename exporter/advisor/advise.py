"""One evaluation of the advisor, engine and planner together: the entry point that takes a
snapshot and returns typed advice, with no HTTP, outbox or webhook in it.

The engine (:mod:`engine`) decides and the planner (:mod:`planner`) plans; neither calls
the other. :func:`advise` runs the engine's first half (:meth:`Advisor.assess`), the planner
when that asks for a plan, and the engine's second half (:meth:`Advisor.decide`). The
service (:mod:`service`) calls it on every snapshot and then delivers what it returns; a
simulation calls it in a loop with simulated snapshots and an :class:`Advisor` whose
``clock`` is the simulated one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.advisor.advice import Advice, WhatIf
from exporter.advisor.engine import Advisor
from exporter.advisor.plan import CompactionPlan
from exporter.advisor.planner import plan_compaction
from exporter.analysis.index import Report
from exporter.snapshot import FleetSnapshot

# (snapshot, report, scope, now) -> plan; scope is "cluster" or "pool:<name>". The planner
# with its settings: functools.partial(plan_compaction, settings=PlanSettings(...))
PlanFunction = Callable[[FleetSnapshot, Report, str, float], CompactionPlan]


def advise(advisor: Advisor, snapshot: FleetSnapshot, report: Report,
           plan: PlanFunction = plan_compaction, trigger: str = "snapshot",
           scaling: tuple[dict[str, Any], ...] | None = None) -> Advice:
    """Evaluate ``snapshot``: update ``advisor``'s state, plan when compaction is due, decide.

    ``report`` is the snapshot's analysis (:func:`exporter.analysis.index.evaluate` of
    :func:`exporter.analysis.state.from_snapshot`; the live server's analyzer makes it once
    for the exposition and the advisor). Time is ``advisor.clock()``, read once: dwell,
    cooldown, plan expiry and idle clocks all follow it, so a simulated clock gives a
    simulated timeline. ``plan`` runs only when the engine asks for a plan, on the snapshot
    with memory needs raised to the measured peaks. ``trigger`` says why ("snapshot", or
    the Alertmanager notification's alerts); ``scaling`` is copied into the advice.

    Returns the advice, also kept as ``advisor.advice``; a new plan is ``advice.plan`` with
    ``advice.decision == "compact"``, for the caller to deliver (and then to tell the
    advisor :meth:`~Advisor.durable` or :meth:`~Advisor.not_durable`).
    """
    assessment = advisor.assess(snapshot, report, trigger)
    proposed = None
    if assessment.plan_scope is not None:
        proposed = plan(assessment.measured, report, assessment.plan_scope, assessment.now)
    return advisor.decide(assessment, proposed, scaling)


def what_if(advisor: Advisor, snapshot: FleetSnapshot, report: Report,
            plan: PlanFunction = plan_compaction) -> WhatIf:
    """The plan for this snapshot alone, ignoring dwell and cooldown; changes no state."""
    now = advisor.clock()
    scope = advisor.what_if_scope(report)
    proposed = None if scope is None else plan(snapshot, report, scope, now)
    return advisor.what_if(snapshot, report, now, proposed)
