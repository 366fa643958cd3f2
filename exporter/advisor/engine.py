"""When compaction pays: hysteresis, dwell, cooldown and a gain-per-disruption gate.

Every evaluation yields *advice*: a decision with its reasons in words, and a
plan when one is proposed. Compaction is recommended for a scope (the cluster
or one pool) once its index has stayed above ``trigger`` for ``dwell``; the
recommendation clears only when the index falls below ``clear_below``, so an
index hovering around the trigger doesn't flap. A cooldown separates plans,
and a plan is proposed only if it recovers enough fragmented GPUs, and frees
enough whole nodes, per migration: moving jobs costs work, and a plan that
moves ten jobs to recover one GPU is worse than no plan.

Alertmanager's fragmentation alert has already waited its own ``for`` (15 min
in the table) before it reaches ``POST /v1/alerts``: a firing alert for a
scope counts as its dwell served, so the advisor does not wait a second time.
A plan that would leave its scope above the trigger is still proposed (part of
the way is better than none) but says so in its reasons, with the index it
reaches, so no receiver takes it for the whole cure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.advisor.plan import CompactionPlan
from exporter.analysis.index import Report
from exporter.snapshot import FleetSnapshot

log = logging.getLogger(__name__)

# (snapshot, report, scope, now) -> plan; scope is "cluster" or "pool:<name>"
Planner = Callable[[FleetSnapshot, Report, str, float], CompactionPlan]


@dataclass(frozen=True, slots=True)
class DecisionSettings:
    trigger: float = 50.0
    clear_below: float = 40.0
    dwell_seconds: float = 600.0
    cooldown_seconds: float = 1800.0
    min_recovered_per_migration: float = 0.5
    min_nodes_freed_per_migration: float = 0.0
    # after a hold, planning again on every snapshot (every few seconds, up to a second
    # of CPU on a large fleet each) would find the same nothing; an alert still re-plans at once
    hold_recheck_seconds: float = 60.0
    # the threshold table's row for the pool fragmentation index (rules/thresholds.yaml)
    compaction_alert: str = "GpuClusterFragmentationHigh"


@dataclass
class ScopeState:
    index: float = 0.0
    above_since: float | None = None
    recommended: bool = False


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _scope_name(scope: str) -> str:
    return "cluster" if scope == "cluster" else f"pool {scope.removeprefix('pool:')}"


def scope_indices(report: Report) -> dict[str, float]:
    indices = {"cluster": report.cluster.index}
    for pool in report.pools:
        indices[f"pool:{pool.name}"] = pool.index
    return indices


def gate(plan: CompactionPlan, settings: DecisionSettings) -> str | None:
    """None when the plan is worth its disruption, else why not."""
    moves = len(plan.migrations)
    if moves == 0:
        return None
    recovered = plan.fragmented_gpus_recovered / moves
    freed = sum(plan.nodes_freed.values()) / moves
    if recovered < settings.min_recovered_per_migration:
        return (f"plan recovers {plan.fragmented_gpus_recovered:.1f} fragmented GPUs with {moves} "
                f"migrations ({recovered:.2f} per migration < {settings.min_recovered_per_migration:g})")
    if freed < settings.min_nodes_freed_per_migration:
        return (f"plan frees {sum(plan.nodes_freed.values())} whole nodes with {moves} migrations "
                f"({freed:.2f} per migration < {settings.min_nodes_freed_per_migration:g})")
    return None


def shortfall(plan: CompactionPlan, settings: DecisionSettings) -> str | None:
    """None when the plan brings its scope's index to the trigger or below, else how far it gets."""
    if plan.after.index <= settings.trigger:
        return None
    return (f"partial plan: {_scope_name(plan.scope)} index {plan.before.index:.1f} -> "
            f"{plan.after.index:.1f}, still above the trigger {settings.trigger:g} within the "
            f"migration budget; the recommendation stays, and another plan may follow the cooldown")


def describe_gain(plan: CompactionPlan) -> str:
    freed = sorted(plan.nodes_freed.items())
    parts = [f"{n} whole {pool} node{'s' if n != 1 else ''}" for pool, n in freed if n]
    moves = len(plan.migrations)
    what = " and ".join(parts) if parts else "no whole node"
    return (f"plan frees {what} and recovers {plan.fragmented_gpus_recovered:.1f} fragmented GPUs "
            f"with {moves} migration{'s' if moves != 1 else ''}")


@dataclass
class Advisor:
    planner: Planner
    settings: DecisionSettings = field(default_factory=DecisionSettings)
    clock: Callable[[], float] = time.time
    scopes: dict[str, ScopeState] = field(default_factory=dict)
    last_plan_at: float | None = None  # the cooldown runs from here
    _cooldown_before: float | None = None  # last_plan_at before the latest proposal
    last_hold: tuple[float, str, list[str]] | None = None  # when, scope, reasons
    alert_served: dict[str, float] = field(default_factory=dict)  # scope -> when its alert fired
    advice: dict[str, Any] | None = None
    plan: CompactionPlan | None = None

    def alert_firing(self, alerts: list[dict[str, Any]]) -> list[str]:
        """Alertmanager says these alerts fire: the compaction alert's scopes have served dwell.

        Only scopes the advisor already measures are taken (labels are the sender's
        text, and this state must stay bounded by the fleet); the scopes taken are returned.
        """
        now = self.clock()
        taken = []
        for alert in alerts:
            labels = alert.get("labels") or {}
            if labels.get("alertname") != self.settings.compaction_alert:
                continue
            if alert.get("status", "firing") != "firing":
                continue
            pool = labels.get("pool")
            scope = f"pool:{pool}" if isinstance(pool, str) and pool else "cluster"
            if scope in self.scopes:
                self.alert_served[scope] = now
                taken.append(scope)
        return taken

    def observe(self, snapshot: FleetSnapshot, report: Report, trigger: str = "snapshot") -> dict[str, Any]:
        """Update the per-scope state with this report and decide. Called on every snapshot."""
        now = self.clock()
        s = self.settings
        for scope, index in scope_indices(report).items():
            state = self.scopes.setdefault(scope, ScopeState())
            state.index = index
            if index > s.trigger:
                if state.above_since is None:
                    state.above_since = now
                if now - state.above_since >= s.dwell_seconds or scope in self.alert_served:
                    state.recommended = True
            elif index < s.clear_below:
                state.above_since = None
                state.recommended = False
                self.alert_served.pop(scope, None)
        advice = self._decide(snapshot, report, now, trigger)
        self.advice = advice
        return advice

    def _decide(self, snapshot: FleetSnapshot, report: Report, now: float, trigger: str) -> dict[str, Any]:
        s = self.settings
        due = [k for k, st in self.scopes.items() if st.recommended]
        base = {"evaluated_at": now, "snapshot_time": snapshot.taken_at, "trigger": trigger,
                "scopes": {k: {"index": round(st.index, 2), "recommended": st.recommended,
                               "above_since": st.above_since} for k, st in sorted(self.scopes.items())}}
        if not due:
            reasons = []
            for scope, st in sorted(self.scopes.items()):
                if st.above_since is not None:
                    reasons.append(f"{_scope_name(scope)} index {st.index:.0f} > {s.trigger:g} for "
                                   f"{_minutes(now - st.above_since)}, dwell is {_minutes(s.dwell_seconds)}")
            if not reasons:
                reasons.append(f"cluster index {report.cluster.index:.0f} <= {s.trigger:g}")
            return {**base, "decision": "none", "reasons": reasons, "plan": None}
        # the cluster first, else the pool with the highest index
        scope = "cluster" if "cluster" in due else max(due, key=lambda k: self.scopes[k].index)
        st = self.scopes[scope]
        why_due = (f"{_scope_name(scope)} index {st.index:.0f} > {s.trigger:g} for "
                   f"{_minutes(now - (now if st.above_since is None else st.above_since))}")
        if scope in self.alert_served:
            why_due += f" (Alertmanager's {s.compaction_alert} fired: its own 'for' served as dwell)"
        if self.last_plan_at is not None and now - self.last_plan_at < s.cooldown_seconds:
            until = self.last_plan_at + s.cooldown_seconds
            return {**base, "decision": "cooldown", "scope": scope, "plan": None,
                    "reasons": [why_due, f"last plan {_minutes(now - self.last_plan_at)} ago; "
                                f"cooldown until {time.strftime('%H:%M:%S', time.gmtime(until))} UTC"]}
        if (self.last_hold is not None and trigger == "snapshot" and self.last_hold[1] == scope
                and now - self.last_hold[0] < s.hold_recheck_seconds):
            return {**base, "decision": "hold", "scope": scope, "plan": None,
                    "reasons": [why_due, *self.last_hold[2][1:]]}
        plan = self.planner(snapshot, report, scope, now)
        refused = gate(plan, s)
        if not plan.migrations:
            allocated = report.cluster.allocated_ratio * 100
            refused = f"index high but nothing worth moving: cluster {allocated:.0f}% allocated"
        if refused is not None:
            reasons = [why_due, refused, *(plan.reasons if not plan.migrations else ())]
            self.last_hold = (now, scope, reasons)
            return {**base, "decision": "hold", "scope": scope, "plan": None, "reasons": reasons}
        self.last_hold = None
        self._cooldown_before, self.last_plan_at = self.last_plan_at, now
        self.plan = plan
        short = shortfall(plan, s)
        reasons = [f"{why_due}; {describe_gain(plan)}", *([short] if short else []), *plan.reasons]
        plan_json = plan.to_json()
        plan_json["reasons"] = reasons
        return {**base, "decision": "compact", "scope": scope, "reasons": reasons, "plan": plan_json}

    def not_durable(self) -> None:
        """The plan just proposed could not be written to the outbox: take back its cooldown.

        A cooldown for a plan no receiver can get would lose the plan for its length;
        instead every evaluation may propose again until one is written, and the
        caller starts the cooldown then (:meth:`durable`).
        """
        self.last_plan_at = self._cooldown_before

    def durable(self, at: float) -> None:
        """A proposed plan reached the outbox at ``at``: the cooldown runs from then."""
        self.last_plan_at = at

    def what_if(self, snapshot: FleetSnapshot, report: Report) -> dict[str, Any]:
        """The plan for this snapshot alone, ignoring dwell and cooldown, changing no state."""
        now = self.clock()
        indices = scope_indices(report)
        above = {k: v for k, v in indices.items() if v > self.settings.trigger}
        base = {"evaluated_at": now, "snapshot_time": snapshot.taken_at, "what_if": True,
                "scopes": {k: {"index": round(v, 2)} for k, v in sorted(indices.items())}}
        if not above:
            return {**base, "decision": "none", "plan": None,
                    "reasons": [f"cluster index {report.cluster.index:.0f} <= {self.settings.trigger:g}"]}
        scope = "cluster" if "cluster" in above else max(above, key=above.__getitem__)
        plan = self.planner(snapshot, report, scope, now)
        refused = gate(plan, self.settings) if plan.migrations else "nothing worth moving"
        decision = "compact" if refused is None else "hold"
        reasons = [f"{_scope_name(scope)} index {indices[scope]:.0f} > {self.settings.trigger:g}",
                   describe_gain(plan) if refused is None else refused]
        if refused is None and (short := shortfall(plan, self.settings)):
            reasons.append(short)
        return {**base, "decision": decision, "scope": scope, "reasons": reasons,
                "plan": plan.to_json() if plan.migrations else None}
