"""What the advisor expects its plans to save, and what they saved: typed values only.

Built by :mod:`realised` (the oracle's bound, the ledger of delivered plans), carried in
:class:`~exporter.advisor.advice.Advice` as ``saving``, written as JSON by :mod:`wire`
(docs/advisor.md, "Expected and realised saving"). Plain frozen dataclasses, no logic
beyond sums, so the advice module stays free of the planner's imports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# what "otherwise" is in every expected saving: a job the plan lets start would have waited
# as long again as it has waited (planner.waiting_saved); no source reads the scheduler's own
# expected start of a pending job (Slurm's StartTime of a pending job is not read)
BASIS = "wait_so_far"


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job a delivered plan let start: what was expected of it and what came of it."""

    job: str
    gpus: float  # GPUs asked (a shared GPU counting its share)
    waited: float  # seconds it had waited when the plan was proposed
    expected: float  # GPU-hours of waiting expected saved: gpus x waited
    started_at: float | None  # when it was seen running; None while not (yet)
    realised: float | None  # GPU-hours saved; None while it waits and the plan is watched


@dataclass(frozen=True, slots=True)
class PlanOutcome:
    """A delivered plan, watched until ``closes_at`` or until all its jobs started."""

    plan_id: str
    proposed_at: float
    closes_at: float
    expected: float  # the plan's gpu_hours_waiting_saved
    oracle: float | None  # the oracle's bound at its snapshot (GPU-hours); None: not computed
    jobs: tuple[JobOutcome, ...]
    closed: bool

    @property
    def realised(self) -> float | None:
        """GPU-hours of waiting saved; None while a job still waits and the plan is open."""
        values = [j.realised for j in self.jobs]
        if any(v is None for v in values):
            return None
        return round(sum(v for v in values if v is not None), 3)

    @property
    def started(self) -> int:
        return sum(1 for j in self.jobs if j.started_at is not None)


@dataclass(frozen=True, slots=True)
class RealisedTotals:
    """Every plan closed since the ledger began (not only those still listed)."""

    plans: int = 0
    jobs: int = 0
    started: int = 0
    expected: float = 0.0  # GPU-hours
    realised: float = 0.0

    @property
    def ratio(self) -> float | None:
        """Realised over expected; None with nothing expected."""
        return None if self.expected <= 0 else round(self.realised / self.expected, 6)


@dataclass(frozen=True, slots=True)
class Saving:
    """``/v1/advice``'s ``saving``: the delivered plans watched (newest last) and the totals."""

    plans: tuple[PlanOutcome, ...] = ()
    totals: RealisedTotals = field(default_factory=RealisedTotals)
    basis: str = BASIS


def share(expected: float, oracle: float | None) -> float | None:
    """An expected saving over the oracle's bound; None without a bound above zero."""
    if oracle is None or oracle <= 0 or not math.isfinite(oracle):
        return None
    return round(expected / oracle, 6)
