"""The reference cluster's tier rule: a job's GPU-memory need picks the GPU model.

Per GPU, in decimal GB as the catalogue states memory: more than 120 GB goes
to B200; more than 80 up to 120 GB to H200; 40 to 80 GB to H100; under 40 GB
to A100 or H100. A need that falls in a tier this fleet has no GPUs of moves
up to the next tier it has, so a fleet without H200 sends a 100 GB job to
B200 rather than nowhere. With no tier above either, the need goes to the
largest tier below whose GPUs still hold it, flagged as over its tier's
capacity: the reference cluster's Kubernetes rules, written for a fleet
without B200, say "more than 80 GB goes to H200", so a 130 GB job goes to
H200 (141 GB) there, not nowhere (:func:`tier_fit`). The rule is strict
otherwise: a full tier does not spill into the next, and a job that names its
models gets only those of its tier (none, if it names only other tiers' models).

The one rule serves the planner, the ``tiered`` placement policy and the
simulator, so none of them can disagree on where a job belongs.

Node models are matched through the GPU catalogue, so a product name
("NVIDIA H100 80GB HBM3") or a variant the simulated fleet uses ("A100-80GB
MIG") counts as its catalogue model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.gpu_catalogue import GB, Catalogue, default_catalogue


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    up_to_bytes: float  # the largest need per GPU in this tier
    inclusive: bool  # whether a need of exactly up_to_bytes belongs here
    models: tuple[str, ...]  # catalogue names

    def takes(self, need_bytes: float) -> bool:
        return need_bytes <= self.up_to_bytes if self.inclusive else need_bytes < self.up_to_bytes


REFERENCE_TIERS = (
    Tier("under 40 GB", 40 * GB, False, ("A100", "A100-80GB", "H100")),
    Tier("40-80 GB", 80 * GB, True, ("H100",)),
    Tier("80-120 GB", 120 * GB, True, ("H200",)),
    Tier("over 120 GB", math.inf, True, ("B200",)),
)


def tier_of(need_bytes: float, tiers: Sequence[Tier] = REFERENCE_TIERS) -> int:
    """Index of the tier a per-GPU memory need falls in."""
    for i, tier in enumerate(tiers):
        if tier.takes(need_bytes):
            return i
    return len(tiers) - 1


@dataclass(frozen=True, slots=True)
class TierFit:
    models: tuple[str, ...]  # fleet models the job may go to; empty: none
    over_capacity: bool  # the need is above every tier this fleet has: placed on a smaller one


def tier_fit(need_bytes: float, fleet_models: Sequence[str], allowed: Sequence[str] = (),
             catalogue: Catalogue | None = None,
             tiers: Sequence[Tier] = REFERENCE_TIERS) -> TierFit:
    """The fleet models a job needing ``need_bytes`` per GPU may go to, by the tier rule.

    The tier is the need's own, or the next one up that this fleet has GPUs of;
    failing that, the largest tier below whose models' memory still holds the need
    (``over_capacity``). ``allowed`` (the job's own models, empty for any) then
    narrows it. Empty when no GPU of the fleet holds the need, or the job allows
    none of its tier's models.
    """
    catalogue = catalogue or default_catalogue()
    # catalogue models ("H100-PCIe" counts as H100); an unknown one (openb's G2, G3) is in no tier
    specs = {m: catalogue.find(m) for m in fleet_models}
    names = {m: spec.family if spec else None for m, spec in specs.items()}

    def narrowed(present: list[str]) -> tuple[str, ...]:
        return tuple(m for m in present if not allowed or m in allowed)

    own = tier_of(need_bytes, tiers)
    for tier in tiers[own:]:
        present = [m for m in fleet_models if names[m] in tier.models]
        if present:
            return TierFit(narrowed(present), False)
    for tier in reversed(tiers[:own]):
        # a smaller tier only where its GPUs physically hold the need (H200's 141 GB holds 130)
        present = [m for m in fleet_models if names[m] in tier.models
                   and (spec := specs[m]) is not None and spec.memory_bytes is not None
                   and spec.memory_bytes >= need_bytes]
        if present:
            return TierFit(narrowed(present), True)
    return TierFit((), False)


def tier_models(need_bytes: float, fleet_models: Sequence[str], allowed: Sequence[str] = (),
                catalogue: Catalogue | None = None,
                tiers: Sequence[Tier] = REFERENCE_TIERS) -> tuple[str, ...]:
    """:func:`tier_fit`'s models alone."""
    return tier_fit(need_bytes, fleet_models, allowed, catalogue, tiers).models
