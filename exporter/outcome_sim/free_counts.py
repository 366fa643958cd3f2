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
    _counts: dict[float, np.ndarray] = field(default_factory=dict)
    # need -> [model][g]: the model's nodes with g GPUs or more with ``need`` free
    _tables: dict[float, list[list[int]]] = field(default_factory=dict)

    def counts(self, need: float) -> np.ndarray:
        """Per node, its GPUs with ``need`` free now (of a GPU's one, ``share_needed``)."""
        self._sync()
        found = self._counts.get(need)
        if found is None:
            found = self._counts[need] = np.count_nonzero(self.placer.gpu_free >= need - EPS, axis=1)
        return found

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

    def _sync(self) -> None:
        placer = self.placer
        if self._clock == placer.changes:
            return
        changed = placer.changed_since(self._clock) if self._counts else None
        if changed is None or len(changed) > MAX_CHANGED:
            self._counts.clear()
            self._tables.clear()
        elif changed:
            nodes = sorted(set(changed))
            rows = placer.gpu_free[nodes]
            models = placer.model[nodes].tolist()
            for need, counts in self._counts.items():
                now = np.count_nonzero(rows >= need - EPS, axis=1)
                table = self._tables.get(need)
                if table is not None:
                    was = counts[nodes].tolist()
                    for before, after, model in zip(was, now.tolist(), models, strict=True):
                        row = table[model]
                        for g in range(after + 1, before + 1):  # fewer now: off the counts above
                            row[g] -= 1
                        for g in range(before + 1, after + 1):  # more now
                            row[g] += 1
                counts[nodes] = now
        self._clock = placer.changes


__all__ = ["FreeCounts", "share_needed"]
