"""The oracle: the most compaction could save on a window, to measure the strategies against.

Moves are free and instant (:meth:`~exporter.outcome_sim.cluster.Cluster.relocate`:
no work lost, no restore), of any single-node job, high-priority ones included,
and memory-safe: each only to a GPU model the advisor's planner allows it
(:func:`~exporter.outcome_sim.strategies.destinations`: at least the memory per
GPU of the one it runs on) where it runs at least as fast (a move that slowed a
job would cost it time: the oracle's moves cost nothing).
Gangs stay where they are: a gang's parts move together or not at all, and each
part of the trace's gangs holds a whole node, which no repack needs moved.

Head by head: at each tick, while the queue's head does not fit, the fewest moves
after which it fits (:func:`~exporter.outcome_sim.strategies.unblock`, with a
budget of ``max_moves`` and ``candidates`` nodes tried, far above the baselines');
the run then starts it, and the oracle goes on with the next head
(:attr:`heads_per_tick`), until a head no repack lets start. It is a greedy bound,
not an optimum: the fewest moves for each head in turn, never a plan for several
heads together, and no move made for a job still to come.

Which heads: ``oracle-heads`` (:attr:`Oracle.every_head`) tries each partition's blocked
head in queue order, the bound the matrix and ``share_of_oracle_saving`` are against
(:data:`~exporter.outcome_sim.outcomes.ORACLE`); ``oracle`` tries the queue's first only,
which on a fleet of model-pinned jobs is often a head of a full model no move can start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.outcome_sim.strategies import any_single_node, unblock, unblock_a_head

if TYPE_CHECKING:
    from exporter.outcome_sim.sim import Sim


@dataclass
class Oracle:
    name: str = "oracle"
    interval: float = 60.0  # as often as consolidation looks
    max_moves: int = 64  # moves for one head
    candidates: int = 64  # nodes tried per part, the cheapest-looking first
    heads_per_tick: int = 256  # heads unblocked one after the other at a tick, each then started
    every_head: bool = False  # each partition's blocked head, not only the queue's first (oracle-heads)
    # head -> the releases when no way was found for it
    _tried: dict[int, int] = field(default_factory=dict, repr=False)

    def tick(self, sim: Sim, now: float) -> None:
        """Unblock the queue's head (or a partition's, ``every_head``), if moves can: the run
        starts it and ticks again."""
        unblock_a_head(sim, self.every_head, self._tried,
                       lambda head: unblock(sim, head, self.max_moves, self.candidates, any_single_node,
                                            rule="no-slower", base=any_single_node),
                       lambda job, destination: sim.cluster.relocate(job, destination, now))


__all__ = ["Oracle", "any_single_node"]
