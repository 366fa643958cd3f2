"""Placement policies: each scores every node's best choice for a task, vectorised over nodes.

A score is lower-is-better; ``inf`` means the task does not fit the node. A
second score breaks ties: for ``bestfit`` the free share of
the GPUs the choice takes (the fuller GPU wins), for ``packing`` its order
within a tier. Remaining ties go to the first node. What each policy scores, with the
reference simulator's plugin it follows (hkust-adsl/kubernetes-scheduler-
simulator, ``pkg/simulator/plugin``):

- ``fgd``: how much the node's F_n(M) grows, i.e. minus its decrease (FGD,
  ``fgd_score.go``). A fractional task tries each GPU it fits on (GPUs with
  the same free share give the same F_n, so one of each); a whole-GPU task
  takes fully free GPUs; a CPU-only task changes only the node's CPU. Each
  node's score is its least growth (a property test checks it by brute
  force). A task of several fractional GPUs (none in the openb trace) is
  scored on its tightest GPUs only, not on every subset. Among nodes whose
  growth is a near-tie with the least (:class:`FgdTies`), the fuller node
  wins: the one left with the fewest free GPUs.
- ``bestfit``: the free CPU and GPU left after placing, each normalised by the
  largest node and weighted 1/2 (``best_fit_score.go``).
- ``packing``: GPUs already shared first (the fuller the better), then a node
  already in use (the fewer fresh GPUs the better), then an empty node (the
  fewer GPUs the better) (``gpu_packing_score.go``). A CPU-only task has no
  GPU to pack: every node that fits scores the same, so it goes to the first in
  node order. The reference gives it to its first too, but its node order is a
  seeded random one (docs/replay.md, "packing and dotprod, line by line").
- ``dotprod``: the dot product of the node's free vector and the task's
  request, both normalised by the largest node (Tetris' alignment score). The
  smallest product wins, as in the reference's ``dot_product_score.go``: the
  task goes where its request overlaps least with spare capacity, i.e. where
  it fills a gap rather than opens a new node. Scored as the reference scores
  it (``-dimext merge -norm max``): ``int(100 * (1 - product / 2))``, so
  products within a hundredth tie, and ties go to the first node.
- ``random``: any node it fits on, any GPU it fits on.
- ``tiered`` is ``fgd`` on the models its tier allows (see :mod:`.tiers`).
- ``lookahead`` is scored as ``fgd``; the placer then picks among fgd's best
  few by the pod queued behind (:meth:`~exporter.placement.engine.Placer.place`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exporter.analysis.fgd import CompiledWorkload, rows_fragmentation
from exporter.analysis.state import EPS
from exporter.placement.task import Ask

# What decides among fgd's near-ties (FgdTies.second): "fuller" the node left with the fewest
# free GPUs (the default), "first" the first node in the fleet's order, "cpufit" the node
# left with the fewest free cores, "leastfrag" the node whose F_n is least after placing.
FGD_SECONDS = ("fuller", "first", "cpufit", "leastfrag")


@dataclass(frozen=True, slots=True)
class FgdTies:
    """Which of fgd's choices count as equally good, and what decides among them.

    A node is a near-tie when its growth of F is within ``gpus + relative * |least|``
    of the least growth. Why a band at all: F(M) is an expectation over the
    *typical* workload (the most common shapes, covering 95% of pods), so it
    cannot see the rarer 2-, 4- and 8-GPU pods, and a difference of a few
    hundredths of a GPU between two choices, or of a fifth of a large growth,
    is below what that estimate knows. Why ``fuller`` decides: packing near-
    ties onto the node with the fewest free GPUs keeps other nodes whole for
    the pods the estimate does not see. docs/replay.md has the measurements
    that chose this over best CPU fit, the least F after placing and node
    order (the reference simulator's accidental rule), and over other bands.
    ``FgdTies(0.0, 0.0, "first")`` is fgd as defined, exact ties to the first node.
    """

    gpus: float = 0.02
    relative: float = 0.3
    second: str = "fuller"

    def __post_init__(self) -> None:
        if not (0 <= self.gpus <= 1 and 0 <= self.relative <= 1):
            raise ValueError(f"fgd ties: gpus and relative must be in [0, 1], "
                             f"got {self.gpus}, {self.relative}")
        if self.second not in FGD_SECONDS:
            raise ValueError(f"fgd ties: second must be one of {', '.join(FGD_SECONDS)}, got {self.second!r}")

    def band(self, least: float) -> float:
        """How far above the least growth a growth still ties with it."""
        return self.gpus + self.relative * abs(least)


FGD_TIES = FgdTies()


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the policies read of a fleet, one row per node; they never write to it.

    The arrays are the placer's own, not copies (a copy would copy the whole fleet to score
    the one or two nodes that changed); the placer changes them between calls, never during one.
    """

    cpu_free: np.ndarray  # [N] free cores
    gpu_free: np.ndarray  # [N, G] free share of each GPU slot
    gpu_count: np.ndarray  # [N] usable GPUs
    model: np.ndarray  # [N] model index, into the workload's models
    norms: tuple[float, float]  # cores and GPUs of the largest node (bestfit, dotprod)
    workload: CompiledWorkload | None  # the target workload (fgd)
    node_fragmented: np.ndarray | None  # [N] F_n(M) now, against ``workload`` (fgd)
    fgd_second: str = "fuller"  # what breaks fgd's near-ties: one of FGD_SECONDS


@dataclass(frozen=True, slots=True)
class Choice:
    key: np.ndarray  # lower is better; inf: does not fit
    second: np.ndarray  # breaks ties of key
    slot: np.ndarray  # the GPU slot, for a task of one fractional GPU


def evaluate(policy: str, view: NodeView, nodes: np.ndarray, ask: Ask) -> Choice:
    """Each of ``nodes``' best choice for ``ask`` under ``policy`` (``tiered`` is scored as ``fgd``)."""
    n = len(nodes)
    free = view.gpu_free[nodes]
    cpu = view.cpu_free[nodes]
    key = np.full(n, np.inf)
    second = np.zeros(n)
    slot = np.full(n, -1, dtype=np.intp)
    fits = cpu >= ask.cpus - EPS
    room = None
    if ask.kind == "whole":
        room = free >= 1.0 - EPS
        fits &= room.sum(axis=1) >= ask.gpus
    elif ask.kind != "cpu":
        room = free >= ask.share - EPS
        fits &= room.sum(axis=1) >= ask.gpus
    ok = np.flatnonzero(fits)
    if len(ok) == 0:
        return Choice(key, second, slot)
    free, cpu = free[ok], cpu[ok]
    if ask.kind == "frac1":
        assert room is not None
        roomy = np.where(room[ok], free, np.inf)
        best = roomy.argmin(axis=1)
        slot[ok] = best
        second[ok] = roomy[np.arange(len(ok)), best]
    elif ask.kind == "fracn":
        assert room is not None
        roomy = np.sort(np.where(room[ok], free, np.inf), axis=1)[:, : ask.gpus]
        second[ok] = roomy.sum(axis=1)
    elif ask.kind == "whole":
        second[ok] = float(ask.gpus)

    if policy == "fgd":
        score, best_slot = _fgd(view, nodes[ok], free, cpu, ask)
        key[ok] = score
        second[ok] = _fgd_second(view, nodes[ok], free, cpu, ask, score)
        if best_slot is not None:
            slot[ok] = best_slot
    elif policy == "bestfit":
        cpu_norm, gpu_norm = view.norms
        key[ok] = (0.5 * (cpu - ask.cpus) / cpu_norm
                   + 0.5 * (free.sum(axis=1) - ask.demand) / gpu_norm)
    elif policy == "dotprod":
        cpu_norm, gpu_norm = view.norms
        product = ((cpu / cpu_norm) * (ask.cpus / cpu_norm)
                   + (free.sum(axis=1) / gpu_norm) * (ask.demand / gpu_norm))
        # the reference's whole-number score, int(100 * (1 - product / 2)) (two dimensions, merged),
        # and its ties to the first node: the exact product with the fuller GPU breaking ties
        # allocated 1.04 points less on the default trace at 130% (docs/replay.md)
        key[ok] = -np.floor(100.0 * (1.0 - product / 2.0) + 1e-9)
        second[ok] = 0.0
    elif policy == "packing":
        key[ok], second[ok] = _packing(view, nodes[ok], free, ask)
    elif policy == "random":
        key[ok] = 0.0
        second[ok] = 0.0
    else:
        raise ValueError(f"unknown placement policy {policy!r}")
    return Choice(key, second, slot)


def _fgd_second(view: NodeView, nodes: np.ndarray, free: np.ndarray, cpu: np.ndarray, ask: Ask,
                growth: np.ndarray) -> np.ndarray:
    """fgd's tie-break for each node's best choice, lower wins (see :data:`FGD_SECONDS`)."""
    if view.fgd_second == "fuller":
        return free.sum(axis=1) - ask.demand
    if view.fgd_second == "cpufit":
        return cpu - ask.cpus
    if view.fgd_second == "leastfrag":
        assert view.node_fragmented is not None
        return view.node_fragmented[nodes] + growth
    return np.zeros(len(nodes))  # first: the placer gives equal seconds to the first node


def _packing(view: NodeView, nodes: np.ndarray, free: np.ndarray, ask: Ask) -> tuple[np.ndarray, np.ndarray]:
    """(tier, score within it): 0 only shared GPUs, 1 fresh GPUs on a node in use, 2 an empty node.

    Within a tier, as the reference scores it: the free share left on the shared GPUs
    in steps of 10% of a GPU, the number of fresh GPUs taken, the node's GPU count.
    """
    n = len(nodes)
    if ask.kind == "cpu":
        return np.zeros(n), np.zeros(n)
    whole_free = free >= 1.0 - EPS
    empty = whole_free.sum(axis=1) == view.gpu_count[nodes]
    if ask.kind == "whole":
        fresh = np.full(n, float(ask.gpus))
        shared_left = np.zeros(n)
    else:
        chosen = np.sort(np.where(free >= ask.share - EPS, free, np.inf), axis=1)[:, : ask.gpus]
        fresh = (chosen >= 1.0 - EPS).sum(axis=1).astype(float)
        shared_left = np.floor(np.floor(chosen * 100 + EPS).sum(axis=1) / 10)
    shared_only = fresh == 0
    tier = np.where(shared_only, 0.0, np.where(empty, 2.0, 1.0))
    within = np.where(shared_only, shared_left,
                      np.where(empty, view.gpu_count[nodes].astype(float), fresh))
    return tier, within


def _fgd(view: NodeView, nodes: np.ndarray, free: np.ndarray, cpu: np.ndarray,
         ask: Ask) -> tuple[np.ndarray, np.ndarray | None]:
    """F_n(M) growth of each node's best choice; for one fractional GPU, also which slot."""
    cw = view.workload
    assert cw is not None and view.node_fragmented is not None
    before = view.node_fragmented[nodes]
    model = view.model[nodes]
    cpu_after = cpu - ask.cpus
    if ask.kind == "cpu":
        return rows_fragmentation(cpu_after, free, model, cw) - before, None
    if ask.kind == "whole":
        room = free >= 1.0 - EPS
        taken = room & (np.cumsum(room, axis=1) <= ask.gpus)
        return rows_fragmentation(cpu_after, free - taken, model, cw) - before, None
    roomy = np.where(free >= ask.share - EPS, free, np.inf)
    if ask.kind == "fracn":
        order = np.argsort(roomy, axis=1, kind="stable")[:, : ask.gpus]
        after = free.copy()
        np.put_along_axis(after, order, np.take_along_axis(free, order, axis=1) - ask.share, axis=1)
        return rows_fragmentation(cpu_after, after, model, cw) - before, None
    # one fractional GPU: every GPU it fits on is a candidate, tightest first within a node
    order = np.argsort(roomy, axis=1, kind="stable")
    shares = np.take_along_axis(roomy, order, axis=1)
    candidate = np.isfinite(shares)
    candidate[:, 1:] &= shares[:, 1:] != shares[:, :-1]  # equal free shares give the same F_n
    row, rank = np.nonzero(candidate)  # grouped by node, tightest GPU first
    gpu = order[row, rank]
    after = free[row]
    after[np.arange(len(row)), gpu] -= ask.share
    growth = rows_fragmentation(cpu_after[row], after, model[row], cw) - before[row]
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    lowest = np.minimum.reduceat(growth, starts)
    counts = np.diff(np.r_[starts, len(row)])
    good = growth <= np.repeat(lowest, counts) + 1e-9
    # the first good candidate of each node is its tightest GPU among the best
    first = np.minimum.reduceat(np.where(good, np.arange(len(row)), len(row)), starts)
    return growth[first], gpu[first]
