"""The plan format: what the advisor tells a scheduler. Documented in docs/advisor.md.

A plan is plain data; :mod:`exporter.advisor.wire` writes it as JSON where it leaves
the process, and reads it back. Its id is a content hash of what it asks the scheduler
to do (the scope and the ordered migrations), so the same plan proposed twice
has the same id, and the store and the receivers' Idempotency-Key handling
make sure it is acted on once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

ACTIONS = ("checkpoint_then_migrate", "migrate", "wait_until")


@dataclass(frozen=True, slots=True)
class Endpoint:
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Migration:
    job: str
    namespace: str
    pod: str
    source: Endpoint
    destination: Endpoint
    action: str  # one of ACTIONS
    wait_until: float | None  # unix seconds, for action wait_until
    cost_gpu_seconds: float  # work lost: GPUs x seconds since the last checkpoint
    gpu_share: float = 1.0
    cpus: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Prediction:
    index: float
    fragmented_gpus: float


@dataclass(frozen=True, slots=True)
class TierMisplacement:
    job: str
    namespace: str
    node: str
    model: str
    memory_need_gb: float | None
    suitable_models: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class CompactionPlan:
    scope: str  # "cluster" or "pool:<name>"
    snapshot_time: float
    expires_at: float
    decision: str
    reasons: tuple[str, ...]
    before: Prediction
    after: Prediction
    nodes_freed: dict[str, int] = field(default_factory=dict)
    migrations: tuple[Migration, ...] = ()
    tier_misplacements: tuple[TierMisplacement, ...] = ()
    rejected_moves: int = 0  # candidate moves dropped: no destination, or F(M) would not drop
    # the pending jobs the plan lets start (together, in the source's order), and the GPU-hours
    # of waiting that saves, expected (planner.waiting_saved): the gain in the outcome's units
    lets_start: tuple[str, ...] = ()
    gpu_hours_waiting_saved: float = 0.0
    # the most any repack could save on the plan's snapshot, in the same units
    # (realised.oracle_waiting_saved); None where not computed (a plan from an older process)
    oracle_gpu_hours_waiting_saved: float | None = None

    @property
    def plan_id(self) -> str:
        content = {"scope": self.scope,
                   "migrations": [_migration_identity(m) for m in self.migrations]}
        digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
        return f"plan-{digest[:24]}"

    @property
    def fragmented_gpus_recovered(self) -> float:
        return max(0.0, self.before.fragmented_gpus - self.after.fragmented_gpus)


def _migration_identity(m: Migration) -> dict[str, Any]:
    return {"job": m.job, "from": [m.source.node, list(m.source.gpus)],
            "to": [m.destination.node, list(m.destination.gpus)], "action": m.action}
