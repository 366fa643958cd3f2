"""Jobs on the wrong memory tier: the plan's ``tier_misplacements`` and the advice's
``right_sizing`` list.

Its own module because both sides read it: the planner puts misplacements in every
plan, the engine lists right-sizing in every advice, and neither imports the other
(the engine decides, the planner plans; :mod:`advise` calls both).
"""

from __future__ import annotations

from exporter.advisor.advice import RightSizing
from exporter.advisor.plan import TierMisplacement
from exporter.analysis.index import Report
from exporter.gpu_catalogue import GB, default_catalogue
from exporter.placement.tiers import tier_fit
from exporter.snapshot import FleetSnapshot

PRESSURE = 0.9  # a tier whose pool is this allocated (or has pending demand) is under pressure


def pools_under_pressure(snapshot: FleetSnapshot, report: Report) -> set[str]:
    """Pools at least :data:`PRESSURE` allocated, or with pending demand."""
    pressure = {p.name for p in report.pools if p.allocated_ratio >= PRESSURE}
    return pressure | {r.pool for r in snapshot.pending if r.pool}


def tier_rank(model: str) -> int:
    return default_catalogue().get(model).tier or 0


def misplacements(snapshot: FleetSnapshot, report: Report) -> tuple[TierMisplacement, ...]:
    """Jobs on a tier their memory need does not call for.

    Two kinds: a job on a *higher* tier than it needs, listed while that tier is under
    pressure (it holds GPUs a larger job waits for); and a job on GPUs with *less*
    memory than it states it needs, listed always (it runs out of memory, or its
    stated need is wrong: either way someone should look).
    """
    state = report.state
    catalogue = default_catalogue()
    pressure = pools_under_pressure(snapshot, report)
    nodes = snapshot.node_map()
    out = []
    for alloc in snapshot.allocations:
        need = alloc.gpu_memory_need_bytes
        if not need or not alloc.placements:
            continue
        node = nodes.get(alloc.placements[0].node)
        if node is None:
            continue
        fit = tier_fit(need, state.model_names, alloc.allowed_models)
        suitable = fit.models
        held = catalogue.find(node.model)
        over = " (over the largest tier this fleet has)" if fit.over_capacity else ""
        if held is not None and held.memory_bytes is not None and held.memory_bytes < need:
            out.append(TierMisplacement(
                alloc.job, alloc.namespace, node.name, node.model, round(need / GB, 1), suitable,
                f"needs {need / GB:.0f} GB per GPU, more than {node.model}'s "
                f"{held.memory_bytes / GB:.0f} GB; fits {'/'.join(suitable) or 'no model here'}"
                f"{over}"))
            continue
        if node.pool not in pressure or not suitable or node.model in suitable:
            continue
        # a job on a lower tier that still holds its need is not misplaced, merely thrifty
        if tier_rank(node.model) <= max(tier_rank(m) for m in suitable):
            continue
        out.append(TierMisplacement(
            alloc.job, alloc.namespace, node.name, node.model, round(need / GB, 1), suitable,
            f"needs {need / GB:.0f} GB per GPU, fits {'/'.join(suitable)}{over}, holds "
            f"{node.model} in pool {node.pool} under pressure"))
    return tuple(sorted(out, key=lambda m: m.job))


def right_sizing(snapshot: FleetSnapshot, report: Report, peaks: dict[str, float],
                 now: float) -> tuple[RightSizing, ...]:
    """Jobs on a higher tier than their need, in a pool under pressure, with the GPU-hours held.

    The need is the larger of what the job declares and the peak GPU memory it was
    measured using (``peaks``, per GPU): a measured peak is a lower bound, so a job
    that declares nothing is never listed on it alone, and a job that used more than
    it declares is judged on what it used. Largest GPU-hours first; never acted on.
    """
    declaring = [a for a in snapshot.allocations if a.gpu_memory_need_bytes and a.placements]
    if not declaring:
        return ()
    state = report.state
    pressure = pools_under_pressure(snapshot, report)
    nodes = snapshot.node_map()
    out = []
    for alloc in declaring:
        declared = alloc.gpu_memory_need_bytes
        assert declared  # declaring's filter
        node = nodes.get(alloc.placements[0].node)
        if node is None or node.pool not in pressure:
            continue
        measured = peaks.get(alloc.job)
        need = max(declared, int(measured or 0))
        suitable = tier_fit(need, state.model_names, alloc.allowed_models).models
        if not suitable or node.model in suitable \
                or tier_rank(node.model) <= max(tier_rank(m) for m in suitable):
            continue
        gpus = sum(len(p.gpus) * p.gpu_share for p in alloc.placements)
        started = alloc.start_time if alloc.start_time is not None else now
        held = round(gpus * max(0.0, now - started) / 3600, 3)
        out.append(RightSizing(
            job=alloc.job, namespace=alloc.namespace, account=alloc.account,
            pool=node.pool, model=node.model, gpus=gpus,
            declared_need_gb=round(declared / GB, 1),
            measured_peak_gb=None if measured is None else round(measured / GB, 1),
            suitable_models=tuple(suitable), gpu_hours_held=held,
            reason=f"needs {need / GB:.0f} GB per GPU (declared {declared / GB:.0f}"
                   + (f", measured peak {measured / GB:.0f}" if measured is not None else
                      ", not measured") + f"), fits {'/'.join(suitable)}; holds {gpus:g} "
                   f"{node.model} GPU{'s' if gpus != 1 else ''} in pool {node.pool} under "
                   f"pressure ({held:g} GPU-hours so far); never moved automatically",
        ))
    return tuple(sorted(out, key=lambda r: (-r.gpu_hours_held, r.job)))
