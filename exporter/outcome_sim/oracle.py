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

import numpy as np

from exporter.outcome_sim.strategies import Moves, _models, any_single_node, unblock, unblock_a_head

if TYPE_CHECKING:
    from exporter.outcome_sim.cluster import Cluster
    from exporter.outcome_sim.sim import Sim
    from exporter.outcome_sim.timeline import Job

RULE = "no-slower"  # where the oracle's moves may send a job (strategies.RULES)


@dataclass
class Unchanged:
    """The job shapes whose search found no way, each with the placer's clock after it.

    A search for a head (:func:`~exporter.outcome_sim.strategies.unblock`) reads only the nodes
    of the models it may use, their jobs, and the nodes of the models those jobs may move to
    (:func:`~exporter.outcome_sim.strategies._models`), and so on: its *reach*. Every change of
    a node (a job started, ended or moved there, a search's trial and its undoing) stamps the
    node with the placer's clock (``Placer.version``). So while no node of its reach has a stamp
    later than the failed search, the same search finds no way again: on the GFS fleet, where
    each job may use one model, the reach of a head is its model's nodes, and another model's
    ends (most of them: A10's) leave it as it was. The reach is walked from the head's models
    outwards, each step's nodes checked unchanged before their jobs are read (unchanged nodes
    hold the jobs they held, so the walk is the one the failed search had)."""

    answered: int = 0  # searches answered so, unsearched
    _failed: dict[tuple, int] = field(default_factory=dict)  # shape -> placer clock after the search
    # (a job's models, the model it runs on, its speed) -> the models it may move to, as indices
    _to: dict[tuple, frozenset[int]] = field(default_factory=dict)

    def searched(self, cluster: Cluster, head: Job, none: bool) -> None:
        if none:
            self._failed[head.shape_key] = cluster.placer.changes
        else:
            self._failed.pop(head.shape_key, None)

    def holds(self, cluster: Cluster, head: Job) -> bool:
        """Whether a search for ``head`` surely finds no way again: one for its shape did, and
        no node of its reach changed since."""
        at = self._failed.get(head.shape_key)
        if at is None:
            return False
        placer = cluster.placer
        names = placer.model_names
        reach = {i for i, m in enumerate(names) if not head.models or m in head.models}
        walked: set[int] = set()
        while reach - walked:
            step = np.zeros(len(names), dtype=bool)
            step[sorted(reach - walked)] = True
            nodes = step[placer.model]
            if int(placer.version[nodes].max(initial=0)) > at:
                return False
            walked |= reach
            index = cluster.single
            for node in np.flatnonzero(nodes & (index.count > 0)).tolist():
                for job in index.on(node):
                    reach |= self._destinations(cluster, job, int(placer.model[node]))
        self.answered += 1
        return True

    def _destinations(self, cluster: Cluster, job: Job, model: int) -> frozenset[int]:
        names = cluster.placer.model_names
        if not job.gpus:  # a task of no GPU goes to any node, whatever its models
            return frozenset(range(len(names)))
        key = (job.models, model, job.speed)
        found = self._to.get(key)
        if found is None:
            allowed = _models(cluster, job, RULE)
            found = frozenset(i for i, m in enumerate(names) if allowed is None or m in allowed)
            self._to[key] = found
        return found


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

    remember: bool = True  # answer a search again unsearched while what it reads is unchanged
    _unchanged: Unchanged = field(default_factory=Unchanged, repr=False)

    def tick(self, sim: Sim, now: float) -> None:
        """Unblock the queue's head (or a partition's, ``every_head``), if moves can: the run
        starts it and ticks again."""
        unblock_a_head(sim, self.every_head, self._tried, lambda head: self._search(sim, head),
                       lambda job, destination: sim.cluster.relocate(job, destination, now))

    def _search(self, sim: Sim, head: Job) -> Moves | None:
        cluster = sim.cluster
        if self.remember and self._unchanged.holds(cluster, head):
            return None
        found = unblock(sim, head, self.max_moves, self.candidates, any_single_node, rule=RULE,
                        base=any_single_node)
        if self.remember:
            self._unchanged.searched(cluster, head, found is None)
        return found


__all__ = ["Oracle", "Unchanged", "any_single_node"]
