"""The FGD fragmentation measure, vectorised over nodes x shapes.

For node n and task shape m, counted in GPUs (Weng et al., ATC'23, and the
reference simulator's ``NodeGpuShareFragAmount``):

- if m fits on n (enough free CPU, at least ``m.gpus`` GPUs each with a free
  share of at least ``m.gpu_share``, and a model m may use), the fragments are
  the GPUs whose free share is smaller than ``m.gpu_share``:
  ``F_n(m) = sum of those free shares``;
- otherwise (lacks GPU, lacks CPU, lacks both, wrong model, or m is CPU-only)
  every free share on n is a fragment: ``F_n(m) = idle GPUs of n``.

``F_n(M) = sum_m p_m F_n(m)``. Pool and cluster values are sums over nodes.

How it stays fast. A shape only asks, of each node, "how many GPUs have a
free share of at least s, and what do they hold?" for its own s, and a
workload has few distinct per-GPU shares (14 levels for the openb trace's 35
shapes). So each GPU is dropped into the bucket of the largest level it can
serve (one ``searchsorted``), per-node bucket histograms are made with two
``bincount`` calls, and reverse cumulative sums give, for every node and
level, the count and the sum of free shares at or above that level. What is
left per (node, shape) is a gather, three comparisons and one matrix-vector
product: ``F_n = idle_n * sum(p) - sum_m p_m * fits[n, m] * held_at_level[n, m]``.
This avoids the nodes x GPUs x shapes broadcast entirely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from exporter.analysis.state import EPS, FleetState
from exporter.analysis.workload import Shape, Workload

# Why an idle GPU share is a fragment (or not) for a shape. Order is the column order
# of :func:`breakdown`. A fitting shape's too-small GPUs count as lacks_gpu, as in the
# reference simulator (its Q3 fragments are booked to Q2LackGpu).
REASONS = ("fits", "lacks_gpu", "lacks_cpu", "lacks_both", "no_access", "cpu_only")
FRAGMENT_REASONS = REASONS[1:]


@dataclass(frozen=True, eq=False)
class CompiledWorkload:
    """A workload turned into arrays against one fleet's model ids."""

    workload: Workload
    model_names: tuple[str, ...]
    total_weight: float  # sum of all weights, CPU-only included
    cpu_only_weight: float
    levels: np.ndarray  # [K] distinct per-GPU shares of the GPU shapes, ascending
    thresholds: np.ndarray  # [K] levels - EPS, what searchsorted compares against
    level: np.ndarray  # [Mg] level index of each GPU shape
    cpus: np.ndarray  # [Mg] CPU cores asked (minus EPS, so >= tolerates float noise)
    gpus: np.ndarray  # [Mg] GPU count asked
    weight: np.ndarray  # [Mg] weight of each GPU shape
    access: np.ndarray  # [models, Mg] bool: may shape m run on that model

    @property
    def gpu_shapes(self) -> int:
        return len(self.weight)


def compile_workload(workload: Workload, model_names: Sequence[str]) -> CompiledWorkload:
    gpu_shapes = [(s, w) for s, w in zip(workload.shapes, workload.weights, strict=True)
                  if not s.cpu_only]
    shares = np.array([s.gpu_share for s, _ in gpu_shapes], dtype=float)
    levels = np.unique(np.round(shares, 9)) if len(shares) else np.zeros(0)
    access = np.ones((len(model_names), len(gpu_shapes)), dtype=bool)
    for m, (shape, _) in enumerate(gpu_shapes):
        if shape.models:
            allowed = set(shape.models)
            access[:, m] = [name in allowed for name in model_names]
    return CompiledWorkload(
        workload=workload,
        model_names=tuple(model_names),
        total_weight=float(sum(workload.weights)),
        cpu_only_weight=float(workload.cpu_only_share),
        levels=levels,
        thresholds=levels - EPS,
        level=np.searchsorted(levels, np.round(shares, 9)).astype(np.intp),
        cpus=np.array([s.cpus for s, _ in gpu_shapes], dtype=float) - EPS,
        gpus=np.array([s.gpus for s, _ in gpu_shapes], dtype=np.intp),
        weight=np.array([w for _, w in gpu_shapes], dtype=float),
        access=access,
    )


def reweight(cw: CompiledWorkload, workload: Workload) -> CompiledWorkload:
    """:func:`compile_workload` of ``workload``, whose shapes are ``cw``'s in the same order
    (only the weights differ: a live window's workload from one snapshot to the next), with
    ``cw``'s arrays of the shapes reused."""
    if workload.shapes != cw.workload.shapes:
        raise ValueError("reweight needs the same shapes in the same order")
    return replace(
        cw, workload=workload, total_weight=float(sum(workload.weights)),
        cpu_only_weight=float(workload.cpu_only_share),
        weight=np.array([w for s, w in zip(workload.shapes, workload.weights, strict=True)
                         if not s.cpu_only], dtype=float))


def _at_or_above(gpu_free: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node and level k: how many GPUs have a free share >= level k, and their free sum."""
    nodes = gpu_free.shape[0]
    width = len(thresholds) + 1
    bucket = np.searchsorted(thresholds, gpu_free, side="right")  # levels each GPU can serve
    flat = (bucket + (np.arange(nodes) * width)[:, None]).ravel()
    count = np.bincount(flat, minlength=nodes * width).reshape(nodes, width)
    held = np.bincount(flat, weights=gpu_free.ravel(), minlength=nodes * width).reshape(nodes, width)
    # a GPU in bucket b serves levels 0..b-1: sum buckets above k, right to left
    count_ge = np.cumsum(count[:, :0:-1], axis=1)[:, ::-1]
    held_ge = np.cumsum(held[:, :0:-1], axis=1)[:, ::-1]
    return count_ge, held_ge


def _fits(
    state: FleetState, cw: CompiledWorkload
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (node, GPU shape): does it fit, is CPU enough, are GPUs enough; and held-at-level."""
    return _fits_rows(state.cpu_free, state.gpu_free, state.model, cw)


def _fits_rows(
    cpu_free: np.ndarray, gpu_free: np.ndarray, model: np.ndarray, cw: CompiledWorkload
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    count_ge, held_ge = _at_or_above(gpu_free, cw.thresholds)
    gpu_ok = count_ge[:, cw.level] >= cw.gpus
    cpu_ok = cpu_free[:, None] >= cw.cpus
    access = cw.access[model]
    return access, cpu_ok, gpu_ok, held_ge[:, cw.level]


def node_fragmentation(state: FleetState, cw: CompiledWorkload) -> np.ndarray:
    """F_n(M) for every node at once, in GPUs."""
    _check(state, cw)
    idle = state.gpu_free.sum(axis=1)
    if cw.gpu_shapes == 0:
        return idle * cw.total_weight
    access, cpu_ok, gpu_ok, held = _fits(state, cw)
    fits = access & cpu_ok & gpu_ok
    return idle * cw.total_weight - np.where(fits, held, 0.0) @ cw.weight


def rows_fragmentation(cpu_free: np.ndarray, gpu_free: np.ndarray, model: np.ndarray,
                       cw: CompiledWorkload) -> np.ndarray:
    """F_n(M) of K node rows that need not be a fleet's: what placement asks of its candidates.

    Row k is a node with free CPU ``cpu_free[k]``, free GPU shares ``gpu_free[k]``
    (any order, zero-padded) and model id ``model[k]`` in ``cw.model_names``: the
    same node under K different GPU choices, or K nodes each after its own
    choice. One call over all candidates of a task costs about what one
    :func:`node_fragmentation` of that many nodes does.
    """
    idle = gpu_free.sum(axis=1)
    if cw.gpu_shapes == 0 or len(idle) == 0:
        return idle * cw.total_weight
    access, cpu_ok, gpu_ok, held = _fits_rows(cpu_free, gpu_free, model, cw)
    return idle * cw.total_weight - np.where(access & cpu_ok & gpu_ok, held, 0.0) @ cw.weight


def one_node_fragmentation(cpu_free: float, gpu_free: np.ndarray, model: int,
                           cw: CompiledWorkload) -> float:
    """F_n(M) of a single node: what the placement engine asks of every candidate.

    ``gpu_free`` is the node's row of free shares (any order, padding allowed);
    ``model`` its model id in ``cw.model_names``.
    """
    idle = float(gpu_free.sum())
    if cw.gpu_shapes == 0 or idle <= 0.0:
        return idle * cw.total_weight
    # one row is small (GPUs x levels), so a direct comparison beats the bucket histograms
    at_or_above = gpu_free[:, None] >= cw.thresholds
    count_ge = at_or_above.sum(axis=0)
    held_ge = gpu_free @ at_or_above
    fits = (count_ge[cw.level] >= cw.gpus) & (cw.cpus <= cpu_free) & cw.access[model]
    return idle * cw.total_weight - float(held_ge[cw.level] @ (fits * cw.weight))


def breakdown(state: FleetState, cw: CompiledWorkload) -> np.ndarray:
    """[N, len(REASONS)]: each node's idle GPUs split by reason, weighted by the workload.

    Rows sum to ``idle * total_weight``; everything but ``fits`` is fragment,
    so ``row[1:].sum()`` equals :func:`node_fragmentation`.
    """
    _check(state, cw)
    idle = state.gpu_free.sum(axis=1)
    out = np.zeros((len(state), len(REASONS)))
    out[:, REASONS.index("cpu_only")] = idle * cw.cpu_only_weight
    if cw.gpu_shapes == 0:
        return out
    access, cpu_ok, gpu_ok, held = _fits(state, cw)
    w = cw.weight
    fits = access & cpu_ok & gpu_ok

    def share(mask: np.ndarray) -> np.ndarray:
        return mask.astype(float) @ w

    usable = np.where(fits, held, 0.0) @ w
    out[:, 0] = usable
    out[:, 1] = idle * share(access & cpu_ok & ~gpu_ok) + (idle * share(fits) - usable)
    out[:, 2] = idle * share(access & ~cpu_ok & gpu_ok)
    out[:, 3] = idle * share(access & ~cpu_ok & ~gpu_ok)
    out[:, 4] = idle * share(~access)
    return out


def _check(state: FleetState, cw: CompiledWorkload) -> None:
    if state.model_names != cw.model_names:
        raise ValueError("workload was compiled for another fleet's models; compile it again")


def shape_fragmentation(cpu_free: float, gpu_free: Sequence[float], model: str, shape: Shape) -> float:
    """F_n(m) for one node and one shape, written out plainly: the measure's definition.

    The vectorised functions above must agree with it; ``bench/fragmentation.py``
    times a loop over it as the baseline.
    """
    idle = sum(gpu_free)
    if shape.cpu_only or (shape.models and model not in shape.models):
        return idle
    big_enough = [f for f in gpu_free if f >= shape.gpu_share - EPS]
    if cpu_free < shape.cpus - EPS or len(big_enough) < shape.gpus:
        return idle
    return sum(f for f in gpu_free if f < shape.gpu_share - EPS)


def node_fragmentation_loop(nodes: Sequence[tuple[float, Sequence[float], str]],
                            workload: Workload) -> list[float]:
    """F_n(M) per node with a plain Python loop over (cpu_free, gpu_free, model) tuples."""
    pairs = list(zip(workload.shapes, workload.weights, strict=True))
    return [sum(w * shape_fragmentation(cpu, free, model, s) for s, w in pairs)
            for cpu, free, model in nodes]
