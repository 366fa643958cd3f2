"""Per node, how many of its GPUs have a share free, kept up to date from the placer's log.

The scheduler asks it of every node whenever it looks for room, and the wait split whenever
it tells why the queue waits; both asked again after every change of the fleet, and an event
changes one node or two. Counting every node's row again each time (``np.count_nonzero`` over
the whole fleet) was a sixth of openb's run with the advisor; the rows the placer's log names
(:meth:`~exporter.placement.engine.Placer.changed_since`) are counted again instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from exporter.analysis.state import EPS

if TYPE_CHECKING:
    from exporter.placement.engine import Placer

# past this many changes since the last count, every node is counted again: one pass over the
# fleet costs about what a few dozen rows read one by one do
MAX_CHANGED = 64


def share_needed(share: float) -> float:
    """The share a GPU must have free for a part asking ``share`` (a whole one from 1 down)."""
    return 1.0 if share >= 1.0 - EPS else share


@dataclass
class FreeCounts:
    """Per node, its GPUs with ``need`` free (:meth:`counts`), and per GPU model how many of its
    nodes have at least ``g`` such GPUs (:meth:`at_least`), for each ``need`` asked so far.

    What either returns holds until the placer next changes: the arrays and tables are brought
    up to date in place at the next call after a change."""

    placer: Placer
    _clock: int = -1  # the placer's clock when last brought up to date
    # each need asked since the last count of every node: its row of ``_counts``
    _rows: dict[float, int] = field(default_factory=dict)
    _cuts: np.ndarray = field(default_factory=lambda: np.empty(0))  # per row, its need less EPS
    _counts: np.ndarray = field(default_factory=lambda: np.empty((0, 0), dtype=np.intp))  # [row][node]
    # need -> [model][g]: the model's nodes with g GPUs or more with ``need`` free
    _tables: dict[float, list[list[int]]] = field(default_factory=dict)

    def counts(self, need: float) -> np.ndarray:
        """Per node, its GPUs with ``need`` free now (of a GPU's one, ``share_needed``)."""
        self._sync()
        row = self._rows.get(need)
        if row is None:
            row = self._rows[need] = len(self._rows)
            self._cuts = np.append(self._cuts, need - EPS)
            fresh = np.count_nonzero(self.placer.gpu_free >= need - EPS, axis=1)
            self._counts = np.vstack([self._counts.reshape(row, len(fresh)), fresh])
        return self._counts[row]

    def at_least(self, need: float) -> list[list[int]]:
        """Per model (the placer's index), per ``g`` from 0 to the widest node's GPUs, how many of
        the model's nodes have at least ``g`` GPUs with ``need`` free now."""
        counts = self.counts(need)
        table = self._tables.get(need)
        if table is None:
            placer = self.placer
            top = placer.gpu_free.shape[1]
            cells = np.bincount(placer.model * (top + 1) + counts,
                                minlength=len(placer.model_names) * (top + 1))
            # as lists: read a cell at a time, which numpy's scalars make slow
            table = self._tables[need] = cells.reshape(-1, top + 1)[:, ::-1].cumsum(axis=1)[:, ::-1].tolist()
        return table

    def forget(self) -> None:
        """Drop every count: each need asked again is counted over every node."""
        self._rows.clear()
        self._tables.clear()
        self._cuts = np.empty(0)
        self._counts = np.empty((0, 0), dtype=np.intp)

    def _sync(self) -> None:
        placer = self.placer
        if self._clock == placer.changes:
            return
        changed = placer.changed_since(self._clock) if self._rows else None
        if changed is None or len(changed) > MAX_CHANGED:
            self.forget()
        elif changed:
            nodes = sorted(set(changed))
            # every need's count of the changed nodes in one call: [row][changed node]
            now = np.count_nonzero(placer.gpu_free[nodes][None, :, :] >= self._cuts[:, None, None], axis=2)
            was = self._counts[:, nodes]
            self._counts[:, nodes] = now
            if self._tables:
                self._move_tables(nodes, was, now)
        self._clock = placer.changes

    def _move_tables(self, nodes: list[int], was: np.ndarray, now: np.ndarray) -> None:
        """Move each kept table by the changed nodes' counts, ``was`` to ``now`` ([row][node])."""
        rows, columns = np.nonzero(was != now)
        if not len(rows):
            return
        needs = list(self._rows)  # in row order: rows are numbered as needs are first asked
        models = self.placer.model[nodes].tolist()
        for row, column, before, after in zip(rows.tolist(), columns.tolist(), was[rows, columns].tolist(),
                                              now[rows, columns].tolist(), strict=True):
            table = self._tables.get(needs[row])
            if table is None:
                continue
            counts = table[models[column]]
            for g in range(after + 1, before + 1):  # fewer now: off the counts above
                counts[g] -= 1
            for g in range(before + 1, after + 1):  # more now
                counts[g] += 1


__all__ = ["FreeCounts", "share_needed"]
