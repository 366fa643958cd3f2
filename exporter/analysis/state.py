"""The fleet as columns: what the fragmentation measure, placement and the advisor read.

Built once per snapshot (or from the openb node list), then read by
vectorised code. Per node: free CPU cores, the free share of each GPU (a row
padded with zeros to the widest node), GPU model and pool as small integer
ids. A GPU that is down holds no usable share, so it is left out of the row
and out of the node's GPU count.

The state is immutable by convention: :func:`with_node` returns a new state
with one node changed, which is what a placement engine trying candidates
needs, and copying the columns of a few thousand nodes costs microseconds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from exporter.snapshot import FleetSnapshot

# Shares are compared with this slack: 1 - 3/7 - 4/7 must read as a free GPU of 0, not -1e-16.
EPS = 1e-9


@dataclass(frozen=True, eq=False)
class FleetState:
    names: tuple[str, ...]
    model_names: tuple[str, ...]  # model id -> catalogue name
    pool_names: tuple[str, ...]  # pool id -> pool name
    model: np.ndarray  # [N] int model id
    pool: np.ndarray  # [N] int pool id
    cpu_total: np.ndarray  # [N] cores; inf where unknown, so CPU never limits there
    cpu_free: np.ndarray  # [N] cores
    gpu_free: np.ndarray  # [N, G] free share per GPU, 1.0 = whole GPU; 0-padded; any order
    gpu_count: np.ndarray  # [N] usable GPUs
    # [N, G] the GPU index on the node of each gpu_free slot (-1 for padding); None when
    # slot i is GPU i. Placement reports real GPU indices through it, down GPUs skipped.
    gpu_index: np.ndarray | None = None

    @property
    def idle(self) -> np.ndarray:
        """Free GPU shares per node, in GPUs."""
        return self.gpu_free.sum(axis=1)

    def __len__(self) -> int:
        return len(self.names)

    def index_of(self, node: str) -> int:
        return self.names.index(node)


def build(
    names: Sequence[str],
    models: Sequence[str],
    pools: Sequence[str],
    cpu_total: Sequence[float],
    cpu_free: Sequence[float],
    gpu_free: Sequence[Sequence[float]],
) -> FleetState:
    """A state from plain per-node lists; each ``gpu_free`` row lists that node's usable GPUs."""
    model_names = tuple(dict.fromkeys(models))
    pool_names = tuple(dict.fromkeys(pools))
    width = max((len(row) for row in gpu_free), default=0)
    free = np.zeros((len(names), max(width, 1)))
    for i, row in enumerate(gpu_free):
        # round away float noise (1 - 3/7 - 4/7 is -1e-16, not 0)
        free[i, : len(row)] = np.clip(np.round(np.asarray(row, dtype=float), 9), 0.0, 1.0)
    model_id = {m: i for i, m in enumerate(model_names)}
    pool_id = {p: i for i, p in enumerate(pool_names)}
    return FleetState(
        names=tuple(names),
        model_names=model_names,
        pool_names=pool_names,
        model=np.array([model_id[m] for m in models], dtype=np.intp),
        pool=np.array([pool_id[p] for p in pools], dtype=np.intp),
        cpu_total=np.asarray(cpu_total, dtype=float),
        cpu_free=np.maximum(np.asarray(cpu_free, dtype=float), 0.0),
        gpu_free=free,
        gpu_count=np.array([len(row) for row in gpu_free], dtype=np.intp),
    )


def from_snapshot(snapshot: FleetSnapshot) -> FleetState:
    """Free CPU and GPU shares per node: capacity minus what the allocations hold.

    A GPU the snapshot lists but no node record covers still counts: its node
    gets the GPU's model and pool, and unknown CPU (never limiting). Shares
    held past 1 (an over-committed GPU) read as nothing free.
    """
    node_info = {n.name: n for n in snapshot.nodes}
    order: list[str] = [n.name for n in snapshot.nodes]
    gpus_of: dict[str, dict[int, bool]] = {}  # node -> gpu index -> up
    gpu_model: dict[str, tuple[str, str]] = {}
    for gpu in snapshot.gpus:
        if gpu.node not in gpus_of:
            gpus_of[gpu.node] = {}
            if gpu.node not in node_info:
                order.append(gpu.node)
        gpus_of[gpu.node][gpu.index] = gpu.up
        gpu_model.setdefault(gpu.node, (gpu.model, gpu.pool))
    held, cpu_used = snapshot.held()

    models, pools, cpu_total, cpu_free, gpu_free = [], [], [], [], []
    gpu_indices: list[list[int]] = []
    for name in order:
        node = node_info.get(name)
        listed = gpus_of.get(name, {})
        if node is not None:
            model, pool, cores = node.model, node.pool, float(node.cpu_cores)
            # a node whose GPUs the sources did not list still has gpu_count GPUs
            indices = set(range(node.gpu_count)) | set(listed)
        else:
            model, pool = gpu_model[name]
            cores = math.inf
            indices = set(listed)
        usable = [i for i in sorted(indices) if listed.get(i, True)]  # a GPU that is down offers nothing
        row = [max(0.0, 1.0 - held.get((name, i), 0.0)) for i in usable]
        gpu_indices.append(usable)
        models.append(model)
        pools.append(pool)
        cpu_total.append(cores)
        cpu_free.append(cores - cpu_used.get(name, 0.0))
        gpu_free.append(row)
    state = build(order, models, pools, cpu_total, cpu_free, gpu_free)
    index = np.full(state.gpu_free.shape, -1, dtype=np.intp)
    for i, usable in enumerate(gpu_indices):
        index[i, : len(usable)] = usable
    return dataclasses.replace(state, gpu_index=index)


def with_node(state: FleetState, node: int, cpu_free: float,
              gpu_free: Sequence[float] | np.ndarray) -> FleetState:
    """The same fleet with one node's free CPU and GPU shares replaced (a placement or a release)."""
    values = np.asarray(gpu_free, dtype=float)
    width = state.gpu_free.shape[1]
    if len(values) > width:
        raise ValueError(f"node {state.names[node]} has {width} GPU slots, got {len(values)}")
    free = state.gpu_free.copy()
    row = free[node]  # a view: the row is written in place in the new copy
    row[: len(values)] = values  # the measure needs no order, so no sort
    row[len(values):] = 0.0
    # no rounding: every comparison allows EPS, and this runs for every placement tried
    np.minimum(row, 1.0, out=row)
    np.maximum(row, 0.0, out=row)
    cpus = state.cpu_free.copy()
    cpus[node] = max(0.0, cpu_free)
    counts = state.gpu_count
    if len(values) != counts[node]:
        counts = counts.copy()
        counts[node] = len(values)
    return FleetState(state.names, state.model_names, state.pool_names, state.model, state.pool,
                      state.cpu_total, cpus, free, counts, state.gpu_index)
