"""Where a task goes: one node and its exact GPUs, chosen by a placement policy.

:class:`Placer` keeps a working copy of the fleet for loops that place many
tasks: trace replay, the simulated fleet, the advisor's planner (which releases
a job and re-places it elsewhere), and :func:`place_all` for ``gpufleet
analyze``. It remembers, per task shape, each node's best choice and score, and
re-evaluates only the nodes that changed since that shape was last placed. One
placement changes one node, so most placements re-evaluate a handful of nodes.

A policy scores each node's best choice for the task and the lowest score
wins (for ``fgd``, any score within its near-tie band, the fuller node first:
see :class:`~exporter.placement.policies.FgdTies`). Remaining ties go to the
first node in the state's order (name order for the openb trace and the
simulated fleet), as in the reference simulator, whose
scheduler picks the smallest node name among equal scores "for
reproducibility": placements are deterministic, and ties pack onto the first
nodes. Only ``random`` draws from the random generator. Within a node a
whole-GPU task takes fully free GPUs (which ones changes no measure) and a
fractional task takes the smallest GPU it fits on, unless the policy says
otherwise (``fgd`` tries each; ``random`` picks one at random).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.fgd import (
    CompiledWorkload,
    compile_workload,
    one_node_fragmentation,
    rows_fragmentation,
)
from exporter.analysis.state import EPS, FleetState, build
from exporter.analysis.workload import Shape, Workload, from_weighted
from exporter.gpu_catalogue import Catalogue, default_catalogue
from exporter.placement import policies
from exporter.placement.task import Ask, Task
from exporter.placement.tiers import tier_models
from exporter.policy_names import POLICIES

TOL = 1e-9  # scores this close are ties (F_n sums carry 1e-16 noise)
CACHE_LIMIT = 2048  # task shapes remembered before the cache starts over
LOG_KEPT = 4096  # changes the placer's log keeps at least (Placer.changed_since)
# lookahead's candidates per task: fgd's best few (4 took 95.70% on the default trace at 130%, seeds 42-45,
# against fgd's 95.31%; docs/replay.md)
LOOKAHEAD_CANDIDATES = 4


@dataclass(frozen=True, slots=True)
class Placement:
    """A node and the GPUs on it: ``slots`` index the state's ``gpu_free`` row, ``gpus``
    are the GPU indices on the node (the same unless GPUs are down)."""

    node: int
    node_name: str
    slots: tuple[int, ...]
    gpus: tuple[int, ...]
    gpu_share: float
    cpus: float
    host_memory_bytes: float = 0.0


@dataclass(eq=False)
class _Entry:
    """One task shape's per-node choices, valid for nodes whose version is ``seen``."""

    nodes: np.ndarray  # node indices the shape may use
    key: np.ndarray  # score of each node's best choice; inf where it does not fit
    second: np.ndarray  # the policy's tie-break
    slot: np.ndarray  # the GPU slot chosen, for a fractional one-GPU task
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class Placer:
    """A working copy of a fleet that places tasks fast and remembers what it placed.

    ``workload`` is the target workload the ``fgd`` and ``tiered`` policies
    measure fragmentation against; with it the placer also keeps every node's
    F_n(M) current (:attr:`node_fragmented`), which the replay reports.
    """

    def __init__(self, state: FleetState, workload: Workload | CompiledWorkload | None = None,
                 catalogue: Catalogue | None = None, fgd_ties: policies.FgdTies = policies.FGD_TIES,
                 host_memory: Sequence[float] | np.ndarray | None = None) -> None:
        self.names = state.names
        self.model_names = state.model_names
        self.model = state.model
        self.gpu_count = state.gpu_count
        self.cpu_total = state.cpu_total
        self.gpu_index = state.gpu_index
        self._template = state
        self.cpu_free = state.cpu_free.astype(float, copy=True)
        self.gpu_free = state.gpu_free.astype(float, copy=True)
        self.catalogue = catalogue or default_catalogue()
        if isinstance(workload, Workload):
            workload = compile_workload(workload, state.model_names)
        if workload is not None and workload.model_names != state.model_names:
            raise ValueError("workload was compiled for another fleet's models; compile it again")
        self.workload = workload
        self.node_fragmented = (rows_fragmentation(self.cpu_free, self.gpu_free, self.model, workload)
                                if workload is not None else None)
        finite = state.cpu_total[np.isfinite(state.cpu_total)]
        # bestfit and dotprod normalise by the largest node, as the reference simulator does
        # with its MaxSpec constants (128 cores and 8 GPUs, the largest openb node)
        self.norms = (float(finite.max()) if len(finite) and finite.max() > 0 else 1.0,
                      float(max(1, int(state.gpu_count.max(initial=1)))))
        self.fgd_ties = fgd_ties
        # node memory in bytes: when given, a task fits only where its host memory does too
        # (a filter, as Kubernetes' NodeResourcesFit; no policy scores memory, nor does F)
        self.memory_free = None if host_memory is None else np.asarray(host_memory, dtype=float).copy()
        self.version = np.zeros(len(state.names), dtype=np.int64)
        # per node, a rank placed before the policy's score (steering's Slurm weights): a task goes
        # to the lowest rank among the nodes where it fits, then by the policy. A filter at each
        # place(), like memory: the cached scores never depend on it, so a change of rank leaves
        # them valid. None: the policy alone
        self.preference: np.ndarray | None = None
        self._clock = 0
        # each change, oldest first: the clock after it and its node, the last LOG_KEPT to
        # LOG_KEPT * 2 of them (:meth:`changed_since`); _log_cut: the latest clock dropped
        self._log_clock: list[int] = []
        self._log_node: list[int] = []
        self._log_cut = 0
        self._cache: dict[tuple, _Entry] = {}
        self._subsets: dict[tuple, tuple[np.ndarray, tuple[str, ...]]] = {}
        self._sorted = np.zeros((0, 0))
        self._sorted_at = -1

    @classmethod
    def for_nodes(cls, names: Sequence[str], models: Sequence[str], pools: Sequence[str],
                  cpu_total: Sequence[float], gpu_counts: Sequence[int],
                  target: Sequence[tuple[Task, float]] = (), catalogue: Catalogue | None = None,
                  fgd_ties: policies.FgdTies = policies.FGD_TIES) -> Placer:
        """An empty fleet from plain per-node lists, its target workload as (task, weight) pairs.

        For a fleet that is not a snapshot: the simulated one places its jobs with this.
        """
        state = build(names, models, pools, cpu_total, cpu_total, [[1.0] * g for g in gpu_counts])
        workload = from_weighted([(Shape(t.cpus, t.gpu_share if t.gpus else 0.0, t.gpus, t.models), w)
                                  for t, w in target]) if target else None
        return cls(state, workload, catalogue, fgd_ties)

    # -- state -----------------------------------------------------------------

    @property
    def state(self) -> FleetState:
        """The fleet as it is now, as an immutable state (a copy)."""
        t = self._template
        return FleetState(t.names, t.model_names, t.pool_names, t.model, t.pool, t.cpu_total,
                          self.cpu_free.copy(), self.gpu_free.copy(), t.gpu_count, t.gpu_index)

    @property
    def idle_gpus(self) -> float:
        return float(self.gpu_free.sum())

    @property
    def fragmented_gpus(self) -> float:
        if self.node_fragmented is None:
            raise ValueError("this placer has no target workload to measure fragmentation against")
        return float(self.node_fragmented.sum())

    # -- placing ----------------------------------------------------------------

    def place(self, task: Task, policy: str, rng: np.random.Generator | None = None,
              exclude: Sequence[int] = (), nvlink_generation: int | None = None,
              queued: Task | None = None) -> Placement | None:
        """The node and GPUs ``policy`` picks for ``task``, or None when it fits nowhere.

        Nothing changes until :meth:`apply`. ``rng`` drives ``random`` (and is
        required for it); every other policy is deterministic. ``exclude`` lists
        node indices the task must not go to (the advisor moving a job *off* a node).
        ``nvlink_generation`` keeps the task to nodes whose GPUs are of that NVLink
        generation (catalogue ``nvlink_generation``): a multi-node job's other parts are
        there, and generations do not interconnect (Blackwell's NVLink 5, Hopper's 4).
        ``queued`` is the task waiting behind this one, when the caller's queue holds
        one: ``lookahead`` uses it (see :meth:`_look_ahead`); without it, it is ``fgd``.
        """
        if policy not in POLICIES:
            raise ValueError(f"unknown placement policy {policy!r}; one of {', '.join(POLICIES)}")
        if policy == "random" and rng is None:
            raise ValueError("the random policy needs a random generator")
        scoring = "fgd" if policy in ("tiered", "lookahead") else policy
        if scoring == "fgd" and self.workload is None:
            raise ValueError(f"the {policy} policy needs a target workload to measure fragmentation")
        scored = self._scores(task, policy, exclude, nvlink_generation)
        if scored is None:
            return None
        nodes, key, entry, ask = scored
        if self.preference is not None:
            key = preferred(key, self.preference[nodes])
        if policy == "lookahead" and queued is not None:
            pick = self._look_ahead(nodes, key, entry, ask, queued, task.host_memory_bytes)
        else:
            tie = TOL
            if scoring == "fgd":
                least = key.min() if len(key) else np.inf
                tie = max(self.fgd_ties.band(float(least)), TOL) if np.isfinite(least) else TOL
            pick = select(key, entry.second, tie, rng if policy == "random" else None)
        if pick is None:
            return None
        node = int(nodes[pick])
        slots = self._slots(node, ask, policy, int(entry.slot[pick]), rng)
        memory = task.host_memory_bytes if self.memory_free is not None else 0.0
        return self._placement(node, slots, ask, memory)

    def place_on(self, task: Task, node: int, policy: str) -> Placement | None:
        """Where ``task`` goes on ``node`` under ``policy``, or None when it does not fit there:
        what :meth:`place` answers with every other node excluded, from ``node``'s score alone
        (the advisor asks this node by node, as jobs leave one; scoring the fleet for it cost
        a fleet's evaluation per new task shape). Not for ``random``."""
        if policy not in POLICIES or policy == "random":
            raise ValueError(f"place_on takes a deterministic placement policy, not {policy!r}")
        scoring = "fgd" if policy in ("tiered", "lookahead") else policy
        if scoring == "fgd" and self.workload is None:
            raise ValueError(f"the {policy} policy needs a target workload to measure fragmentation")
        nodes, _ = self._nodes_for(task, policy)
        at = int(np.searchsorted(nodes, node))  # nodes is sorted (flatnonzero)
        if at >= len(nodes) or nodes[at] != node:
            return None  # its model is not one the task may use
        if (self.memory_free is not None and task.host_memory_bytes > 0
                and self.memory_free[node] < task.host_memory_bytes - 0.5):
            return None
        ask = Ask.of(task)
        if not self._room_on(node, ask):
            return None  # evaluate's own test, on one row: most asks of a node being emptied fail
        choice = policies.evaluate(scoring, self._view(), nodes[at:at + 1], ask)
        if not np.isfinite(choice.key[0]):
            return None
        slots = self._slots(node, ask, policy, int(choice.slot[0]), None)
        memory = task.host_memory_bytes if self.memory_free is not None else 0.0
        return self._placement(node, slots, ask, memory)

    @property
    def changes(self) -> int:
        """How many changes the arrays have had: equal numbers, the same free room."""
        return self._clock

    def changed_since(self, clock: int) -> list[int] | None:
        """The nodes changed after the clock was ``clock`` (:attr:`changes`), a node once per
        change; None when the log no longer reaches back that far. A caller that found no
        room at ``clock`` reads only these nodes again: the others' rows are as they were."""
        if clock < self._log_cut:
            return None
        return self._log_node[bisect.bisect_right(self._log_clock, clock):]

    def room(self, task: Task, policy: str) -> np.ndarray:
        """Per node, whether ``task`` fits there now: a model it may use, its memory, and
        :func:`policies.evaluate`'s own test of free cores and GPUs. Where it is False,
        :meth:`place` never picks the node, whatever the policy; where it is True, a policy
        may still score the node out. A bool row per node, for a caller that asks of many
        nodes at once whether a task could go anywhere."""
        nodes, _ = self._nodes_for(task, policy)
        ask = Ask.of(task)
        fits = np.zeros(len(self.names), dtype=bool)
        ok = self.cpu_free[nodes] >= ask.cpus - EPS
        if ask.kind != "cpu":
            need = 1.0 - EPS if ask.kind == "whole" else ask.share - EPS
            if ask.gpus > self.gpu_free.shape[1]:
                return fits
            # as many GPUs with ``need`` free as it asks: its ask-th fullest free share has it
            ok &= self._descending()[nodes, ask.gpus - 1] >= need
        if self.memory_free is not None and task.host_memory_bytes > 0:
            ok &= self.memory_free[nodes] >= task.host_memory_bytes - 0.5
        fits[nodes] = ok
        return fits

    def _descending(self) -> np.ndarray:
        """Each node's free GPU shares, largest first, as the arrays are now (kept until they change)."""
        if self._sorted_at != self._clock:
            self._sorted = -np.sort(-self.gpu_free, axis=1)
            self._sorted_at = self._clock
        return self._sorted

    def _room_on(self, node: int, ask: Ask) -> bool:
        """Whether ``ask`` fits ``node``'s free cores and GPUs: the test :func:`policies.evaluate`
        makes before it scores (a node it fails gets an infinite key), on one row."""
        if self.cpu_free[node] < ask.cpus - EPS:
            return False
        if ask.kind == "cpu":
            return True
        need = 1.0 - EPS if ask.kind == "whole" else ask.share - EPS
        return int(np.count_nonzero(self.gpu_free[node] >= need)) >= ask.gpus

    def _scores(self, task: Task, policy: str, exclude: Sequence[int] = (),
                nvlink_generation: int | None = None) -> tuple[np.ndarray, np.ndarray, _Entry, Ask] | None:
        """The nodes ``task`` may use, each one's score now (inf: not there), the cache entry, the ask."""
        scoring = "fgd" if policy in ("tiered", "lookahead") else policy
        nodes, allowed = self._nodes_for(task, policy)
        if len(nodes) == 0:
            return None
        ask = Ask.of(task)
        cache_key = (scoring, ask, allowed)
        entry = self._cache.get(cache_key)
        if entry is None:
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            n = len(nodes)
            entry = _Entry(nodes, np.full(n, np.inf), np.zeros(n), np.full(n, -1, dtype=np.intp),
                           np.full(n, -1, dtype=np.int64))
            self._cache[cache_key] = entry
        now = self.version[nodes]
        dirty = np.flatnonzero(now != entry.seen)
        if len(dirty):
            choice = policies.evaluate(scoring, self._view(), nodes[dirty], ask)
            entry.key[dirty] = choice.key
            entry.second[dirty] = choice.second
            entry.slot[dirty] = choice.slot
            entry.seen[dirty] = now[dirty]
        key = entry.key
        if nvlink_generation is not None:  # a filter, like memory: the cached scores stay valid
            key = np.where(self._nvlink_generations()[self.model[nodes]] == nvlink_generation,
                           key, np.inf)
        if self.memory_free is not None and task.host_memory_bytes > 0:
            # memory only filters, so the remembered scores stay valid: mask them per task
            key = np.where(self.memory_free[nodes] >= task.host_memory_bytes - 0.5, key, np.inf)
        if len(exclude):  # a mask over the fleet: np.isin sorts both sides on every call
            barred = np.zeros(len(self.names), dtype=bool)
            barred[np.asarray(exclude, dtype=np.intp)] = True
            key = np.where(barred[nodes], np.inf, key)
        return nodes, key, entry, ask

    def _view(self) -> policies.NodeView:
        return policies.NodeView(self.cpu_free, self.gpu_free, self.gpu_count, self.model, self.norms,
                                 self.workload, self.node_fragmented, self.fgd_ties.second)

    def _look_ahead(self, nodes: np.ndarray, key: np.ndarray, entry: _Entry, ask: Ask,
                    queued: Task, memory: float) -> int | None:
        """``lookahead``: of fgd's best few choices for this task, the one after which F grows least
        over this task *and* the queued one, the queued one placed by fgd (a failure counts as
        fragmenting the GPUs it asked for).

        The candidates are fgd's first :data:`LOOKAHEAD_CANDIDATES` in its own order (near-ties,
        fuller first, then by growth). Each is on its own node, so all of them are applied to
        the arrays at once, the queued task is scored on those nodes alone, and the arrays are
        put back: one vectorised evaluation per task, and no cached score goes stale. The
        queued task's best elsewhere is its cached score, the least over the other nodes.
        """
        finite = np.flatnonzero(np.isfinite(key))
        if len(finite) == 0:
            return None
        least = float(key[finite].min())
        near = key[finite] <= least + max(self.fgd_ties.band(least), TOL)
        rank = np.where(near, least, key[finite])
        order = finite[np.lexsort((finite, np.where(near, entry.second[finite], 0.0), rank))]
        candidates = order[:LOOKAHEAD_CANDIDATES]
        if len(candidates) == 1:
            return int(candidates[0])
        scored = self._scores(queued, "fgd")
        if scored is None:  # the queued task fits no node's models: nothing to keep room for
            return int(candidates[0])
        q_nodes, q_key, _, q_ask = scored
        targets = nodes[candidates]
        # the queued task's best on a node no candidate touches: the two least, for when the
        # least is on the candidate's own node
        q_order = np.argsort(q_key, kind="stable")[:2]
        q_best = [(int(q_nodes[i]), float(q_key[i])) for i in q_order]
        after = self._peek(targets, [self._slots(int(n), ask, "fgd", int(entry.slot[c]), None)
                                     for n, c in zip(targets, candidates, strict=True)],
                           ask, memory, queued, q_ask)
        total = np.empty(len(candidates))
        for i, node in enumerate(targets):
            elsewhere = next((k for n, k in q_best if n != node), np.inf)
            best = min(elsewhere, after[i])
            total[i] = key[candidates[i]] + (best if np.isfinite(best) else queued.gpu_demand)
        return int(candidates[int(np.flatnonzero(total <= total.min() + TOL)[0])])

    def _peek(self, targets: np.ndarray, slots: list[tuple[int, ...]], ask: Ask, memory: float,
              queued: Task, q_ask: Ask) -> np.ndarray:
        """The queued task's fgd score on each target node with this task's choice there applied
        (inf where it would not fit, or may not go), leaving the placer as it was."""
        saved = (self.cpu_free[targets].copy(), self.gpu_free[targets].copy())
        assert self.node_fragmented is not None and self.workload is not None
        saved_fragmented = self.node_fragmented[targets].copy()
        try:
            for node, chosen in zip(targets, slots, strict=True):
                self.cpu_free[node] = max(0.0, self.cpu_free[node] - ask.cpus)
                if chosen:
                    row = self.gpu_free[node]
                    row[list(chosen)] = np.maximum(row[list(chosen)] - ask.share, 0.0)
            self.node_fragmented[targets] = rows_fragmentation(
                self.cpu_free[targets], self.gpu_free[targets], self.model[targets], self.workload)
            allowed, _ = self._nodes_for(queued, "fgd")
            score = policies.evaluate("fgd", self._view(), targets, q_ask).key
            # allowed is sorted (flatnonzero): a binary search says which targets are in it
            at = np.minimum(np.searchsorted(allowed, targets), len(allowed) - 1)
            score = np.where(allowed[at] == targets, score, np.inf)
            if self.memory_free is not None and queued.host_memory_bytes > 0:
                left = self.memory_free[targets] - memory  # this task's memory comes off first
                score = np.where(left >= queued.host_memory_bytes - 0.5, score, np.inf)
            return score
        finally:
            self.cpu_free[targets], self.gpu_free[targets] = saved
            self.node_fragmented[targets] = saved_fragmented

    def apply(self, placement: Placement) -> None:
        """Hold the placement's CPUs and GPU shares."""
        node, slots = placement.node, list(placement.slots)
        row = self.gpu_free[node]
        short_of_memory = (self.memory_free is not None
                           and self.memory_free[node] < placement.host_memory_bytes - 0.5)
        if ((row[slots] < placement.gpu_share - EPS).any() or self.cpu_free[node] < placement.cpus - EPS
                or short_of_memory):
            raise ValueError(f"placement on {placement.node_name} no longer fits")
        row[slots] = np.maximum(row[slots] - placement.gpu_share, 0.0)
        self.cpu_free[node] = max(0.0, self.cpu_free[node] - placement.cpus)
        if self.memory_free is not None:
            self.memory_free[node] -= placement.host_memory_bytes
        self._changed(node)

    def release(self, placement: Placement) -> None:
        """Give back what :meth:`apply` held (a job that finished or moves away)."""
        node, slots = placement.node, list(placement.slots)
        row = self.gpu_free[node]
        row[slots] = np.minimum(row[slots] + placement.gpu_share, 1.0)
        self.cpu_free[node] = min(float(self.cpu_total[node]), self.cpu_free[node] + placement.cpus)
        if self.memory_free is not None:
            self.memory_free[node] += placement.host_memory_bytes
        self._changed(node)

    def set_node(self, node: int, cpu_free: float, gpu_free: Sequence[float] | np.ndarray) -> None:
        """A node's free CPU and GPU shares changed outside this placer (a job ended, an operator
        pinned one): take them over. ``gpu_free`` is the node's row, slot by slot."""
        row = np.clip(np.asarray(gpu_free, dtype=float), 0.0, 1.0)
        self.gpu_free[node, : len(row)] = row
        self.cpu_free[node] = max(0.0, float(cpu_free))
        self._changed(node)

    def sync(self, state: FleetState) -> None:
        """Take over ``state``'s free CPUs and GPUs, a fleet of this placer's layout: only the
        nodes that differ are re-measured and have their remembered scores dropped, so a
        placer kept from one snapshot to the next places as a new one would, without scoring
        every node again for each task shape (the simulated advisor plans every minute)."""
        t = self._template
        same_index = (state.gpu_index is None and t.gpu_index is None) or (
            state.gpu_index is not None and t.gpu_index is not None
            and np.array_equal(state.gpu_index, t.gpu_index))
        if (state.names != t.names or state.model_names != t.model_names or state.pool_names != t.pool_names
                or state.gpu_free.shape != self.gpu_free.shape or not same_index
                or not all(np.array_equal(a, b) for a, b in (
                    (state.model, t.model), (state.pool, t.pool), (state.cpu_total, t.cpu_total),
                    (state.gpu_count, t.gpu_count)))):
            raise ValueError("sync takes a state of the placer's own layout; build a new placer")
        changed = np.flatnonzero((self.cpu_free != state.cpu_free)
                                 | (self.gpu_free != state.gpu_free).any(axis=1))
        self._template = state
        if not len(changed):
            return
        self.cpu_free[changed] = state.cpu_free[changed]
        self.gpu_free[changed] = state.gpu_free[changed]
        self._clock += 1
        self.version[changed] = self._clock
        for node in changed.tolist():
            self._log(node)
        if self.workload is not None:
            assert self.node_fragmented is not None
            self.node_fragmented[changed] = rows_fragmentation(
                self.cpu_free[changed], self.gpu_free[changed], self.model[changed], self.workload)

    def _changed(self, node: int) -> None:
        self._clock += 1
        self.version[node] = self._clock
        self._log(node)
        if self.workload is not None:
            assert self.node_fragmented is not None
            self.node_fragmented[node] = one_node_fragmentation(
                float(self.cpu_free[node]), self.gpu_free[node], int(self.model[node]), self.workload)

    def _log(self, node: int) -> None:
        self._log_clock.append(self._clock)
        self._log_node.append(node)
        if len(self._log_clock) >= 2 * LOG_KEPT:  # the oldest half goes
            self._log_cut = self._log_clock[LOG_KEPT - 1]
            del self._log_clock[:LOG_KEPT], self._log_node[:LOG_KEPT]

    def _nodes_for(self, task: Task, policy: str) -> tuple[np.ndarray, tuple[str, ...]]:
        """The nodes whose model the task may use (``tiered``: by its memory need), and those models."""
        tiered = policy == "tiered" and task.gpu_memory_need_bytes is not None and not task.cpu_only
        key = (task.models if not task.cpu_only else (), task.gpu_memory_need_bytes if tiered else None)
        found = self._subsets.get(key)
        if found is None:
            if tiered:
                assert task.gpu_memory_need_bytes is not None
                allowed = tier_models(task.gpu_memory_need_bytes, self.model_names, key[0], self.catalogue)
            elif key[0]:
                allowed = tuple(m for m in self.model_names if m in key[0])
            else:
                allowed = self.model_names
            ids = [i for i, m in enumerate(self.model_names) if m in allowed]
            found = (np.flatnonzero(np.isin(self.model, ids)), allowed)
            self._subsets[key] = found
        return found

    def _nvlink_generations(self) -> np.ndarray:
        """Each model's NVLink generation by model index; -1 without NVLink or unknown.
        Built per call: only the parts of multi-node jobs ask, over a handful of models."""
        specs = [self.catalogue.find(m) for m in self.model_names]
        return np.array([-1 if s is None or s.nvlink_generation is None else s.nvlink_generation
                         for s in specs], dtype=np.int64)

    def _slots(self, node: int, ask: Ask, policy: str, cached: int,
               rng: np.random.Generator | None) -> tuple[int, ...]:
        row = self.gpu_free[node]
        if ask.kind == "cpu":
            return ()
        if ask.kind == "whole":
            # any fully free GPUs leave the node in the same state: take the first ones
            return tuple(int(s) for s in np.flatnonzero(row >= 1.0 - EPS)[: ask.gpus])
        if ask.kind == "frac1":
            if policy == "random":
                assert rng is not None
                return (int(rng.choice(np.flatnonzero(row >= ask.share - EPS))),)
            return (cached,)
        # several fractional GPUs: the tightest ones the task fits on
        tight = np.where(row >= ask.share - EPS, row, np.inf)
        return tuple(int(s) for s in np.argsort(tight, kind="stable")[: ask.gpus])

    def _placement(self, node: int, slots: tuple[int, ...], ask: Ask, memory: float) -> Placement:
        gpus = slots if self.gpu_index is None else tuple(int(self.gpu_index[node, s]) for s in slots)
        return Placement(node, self.names[node], slots, gpus, ask.share if slots else 0.0, ask.cpus, memory)


def room_after_moves(free_gpus: float, demands: Iterable[float], moves: int, task: Task) -> bool:
    """Whether ``task`` could find its GPUs on a node with ``free_gpus`` idle once at most
    ``moves`` of its jobs leave, each freeing its GPUs (``demands``). A task fits only where
    its GPUs' free shares add up to its demand, less EPS each; so False means no evacuation
    of that many moves makes room, and the advisor's pending planner and the consolidate
    baseline skip the node rather than try."""
    return free_gpus + sum(heapq.nlargest(moves, demands)) >= task.gpu_demand - task.gpus * EPS - 1e-6


def preferred(key: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """``key`` kept only where ``rank`` is the lowest among the nodes where the task fits (a
    finite key), inf elsewhere: whether it fits anywhere is unchanged, only where it goes."""
    fits = np.isfinite(key)
    if not fits.any():
        return key
    return np.where(rank <= rank[fits].min(), key, np.inf)


def select(key: np.ndarray, second: np.ndarray, tie: float = TOL,
           rng: np.random.Generator | None = None) -> int | None:
    """Position of the best choice: the lowest ``key`` (within ``tie``), then the lowest ``second``,
    then the first position, or a random one when ``rng`` is given; None if every key is inf."""
    if len(key) == 0:
        return None
    best = key.min()
    if not np.isfinite(best):
        return None
    ties = np.flatnonzero(key <= best + tie)
    if len(ties) > 1:
        s = second[ties]
        ties = ties[s <= s.min() + TOL]
    if len(ties) == 1 or rng is None:
        return int(ties[0])
    return int(ties[rng.integers(len(ties))])


def place_all(state: FleetState, tasks: Sequence[Task], policy: str, rng: np.random.Generator | None = None,
              *, workload: Workload | CompiledWorkload | None = None) -> tuple[FleetState, int]:
    """Place tasks one after another (arrivals only); the final state and how many fit nowhere."""
    placer = Placer(state, workload)
    failed = 0
    for i, task in enumerate(tasks):
        # lookahead knows the next task, as a scheduler with a queue of two would
        found = placer.place(task, policy, rng, queued=tasks[i + 1] if i + 1 < len(tasks) else None)
        if found is None:
            failed += 1
        else:
            placer.apply(found)
    return placer.state, failed


__all__ = ["Placement", "Placer", "place_all", "preferred", "room_after_moves", "select"]
