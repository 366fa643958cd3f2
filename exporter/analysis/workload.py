"""Target workloads: the task shapes fragmentation is measured against.

FGD (Weng et al., "Beware of Fragmentation", USENIX ATC 2023) asks of every
idle GPU share whether the tasks the cluster actually runs could use it. Those
tasks are the *target workload*: a set of shapes, each with the weight of how
often it occurs. A workload is built in one of three ways:

- from a trace (:func:`from_tasks`): count each distinct shape, keep the most
  common until they cover ``coverage`` of all tasks (95% by default, as the
  reference simulator does), then renormalise the weights to sum to 1;
- from live snapshots (:class:`ShapeWindow`): the shapes of the allocations
  seen over the last N snapshots, weighted by how often they were seen, then
  the same cut;
- from shapes given in the config (:func:`from_weighted`).

CPU-only shapes can be left out (``include_cpu_only``); the choice is carried
on the workload so reports and metrics can say which was used.
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from exporter.snapshot import Allocation, FleetSnapshot

DEFAULT_COVERAGE = 0.95


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """What one task asks of one node.

    ``gpu_share`` is the share of each of its GPUs (1.0 a whole GPU, 0.465 a
    time-sliced part); ``models`` the catalogue models it may run on, empty
    for any. A shape with no GPU, or a zero share, is CPU-only.
    """

    cpus: float
    gpu_share: float
    gpus: int
    models: tuple[str, ...] = ()

    @property
    def cpu_only(self) -> bool:
        return self.gpus <= 0 or self.gpu_share <= 0

    def canonical(self) -> Shape:
        """Rounded so float noise (1/7 shares, summed millicores) can't split one shape in two."""
        if self.cpu_only:
            return Shape(round(self.cpus, 3), 0.0, 0, ())
        return Shape(round(self.cpus, 3), round(self.gpu_share, 6), int(self.gpus),
                     tuple(sorted(set(self.models))))

    def describe(self) -> str:
        models = "|".join(self.models) if self.models else "any"
        if self.cpu_only:
            return f"{self.cpus:g} CPU, no GPU"
        return f"{self.cpus:g} CPU, {self.gpus} x {self.gpu_share:g} GPU, {models}"


@dataclass(frozen=True, slots=True)
class Workload:
    """Shapes and their weights. Builders make the weights sum to 1.

    The measure uses the weights as given, so check values published with
    unnormalised weights (the reference simulator's tests) reproduce exactly.
    """

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]
    coverage: float = 1.0  # share of the observed tasks the kept shapes cover
    include_cpu_only: bool = True
    source: str = "shapes"  # trace | window | shapes
    observed: float = 0.0  # tasks (or task-snapshots) the counts came from

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError("a workload needs one weight per shape")
        if any(w < 0 for w in self.weights):
            raise ValueError("workload weights must not be negative")

    @property
    def cpu_only_share(self) -> float:
        return sum(w for s, w in zip(self.shapes, self.weights, strict=True) if s.cpu_only)

    def __len__(self) -> int:
        return len(self.shapes)


def typical(counts: Mapping[Shape, float], *, coverage: float = DEFAULT_COVERAGE,
            include_cpu_only: bool = True, source: str = "trace") -> Workload:
    """The most common shapes covering ``coverage`` of the counted tasks, renormalised.

    Ties keep the order the shapes were first counted in, so a trace always
    gives the same workload.
    """
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    kept_counts = [(s, float(c)) for s, c in counts.items()
                   if c > 0 and (include_cpu_only or not s.cpu_only)]
    total = sum(c for _, c in kept_counts)
    if total <= 0:
        return Workload((), (), 0.0, include_cpu_only, source, 0.0)
    ranked = sorted(kept_counts, key=lambda item: -item[1])  # stable: ties keep first-seen order
    chosen: list[tuple[Shape, float]] = []
    covered = 0.0
    for shape, count in ranked:
        if covered >= coverage * total - 1e-9:
            break
        chosen.append((shape, count))
        covered += count
    return Workload(
        shapes=tuple(s for s, _ in chosen),
        weights=tuple(c / covered for _, c in chosen),
        coverage=covered / total,
        include_cpu_only=include_cpu_only,
        source=source,
        observed=total,
    )


def from_tasks(tasks: Iterable[Shape], *, coverage: float = DEFAULT_COVERAGE,
               include_cpu_only: bool = True, source: str = "trace") -> Workload:
    """The typical workload of a list of tasks (one shape per task, e.g. a trace)."""
    counts: Counter[Shape] = Counter(t.canonical() for t in tasks)
    return typical(counts, coverage=coverage, include_cpu_only=include_cpu_only, source=source)


def from_weighted(shapes: Iterable[tuple[Shape, float]], *, include_cpu_only: bool = True,
                  source: str = "shapes") -> Workload:
    """A workload from explicit (shape, weight) pairs; weights are renormalised, nothing cut."""
    merged: dict[Shape, float] = {}
    for shape, weight in shapes:
        if weight < 0:
            raise ValueError(f"shape {shape.describe()}: weight must not be negative")
        if shape.cpu_only and not include_cpu_only:
            continue
        key = shape.canonical()
        merged[key] = merged.get(key, 0.0) + weight
    total = sum(merged.values())
    if total <= 0:
        return Workload((), (), 0.0, include_cpu_only, source, 0.0)
    return Workload(tuple(merged), tuple(w / total for w in merged.values()), 1.0,
                    include_cpu_only, source, total)


PartKey = tuple[float, float, int, tuple[str, ...]]  # cpus, GPU share (0: none), GPUs, models


def _keys(allocations: Iterable[Allocation]) -> Iterator[PartKey]:
    """Each part of each allocation as :func:`snapshot_shapes` counts it, before
    :func:`shapes_of` makes it a canonical shape (one generator: no call per part on the
    collection's path)."""
    return ((part.cpus, part.gpu_share if part.gpus else 0.0, len(part.gpus), tuple(alloc.allowed_models))
            for alloc in allocations for part in alloc.placements)


def part_keys(alloc: Allocation) -> tuple[PartKey, ...]:
    """One allocation's parts as :func:`snapshot_shapes` counts them."""
    return tuple(_keys((alloc,)))


def shapes_of(raw: Counter[PartKey]) -> Counter[Shape]:
    """Counted part keys as canonical shapes, in the order first counted (``typical`` breaks
    ties by that order)."""
    # a fleet of a thousand jobs has a few dozen distinct parts: each made canonical once
    counts: Counter[Shape] = Counter()
    for key, n in raw.items():
        counts[_canonical(*key)] += n
    return counts


def snapshot_shapes(snapshot: FleetSnapshot) -> Counter[Shape]:
    """The shape of every allocation's part on each node (FGD measures per node).

    A caller that keeps each allocation's :func:`part_keys` (the simulated advisor, whose
    jobs mostly stay put) gets the same counts, in the same order, from
    ``shapes_of(Counter(keys))``, the keys listed in the allocations' order."""
    # counted by Counter's C loop: this runs over every job at every collection
    return shapes_of(Counter(_keys(snapshot.allocations)))


@functools.lru_cache(maxsize=4096)
def _canonical(cpus: float, gpu_share: float, gpus: int, models: tuple[str, ...]) -> Shape:
    return Shape(cpus, gpu_share, gpus, models).canonical()


@dataclass
class ShapeWindow:
    """The live workload: shapes of the allocations seen over the last ``snapshots`` snapshots.

    A job running through the whole window is counted once per snapshot, so
    shapes are weighted by how much of the window they were seen for.
    """

    snapshots: int = 60
    coverage: float = DEFAULT_COVERAGE
    include_cpu_only: bool = True
    _seen: deque[Counter[Shape]] = field(default_factory=deque)
    _total: Counter[Shape] = field(default_factory=Counter)

    def observe(self, snapshot: FleetSnapshot) -> None:
        self.observe_shapes(snapshot_shapes(snapshot))

    def observe_shapes(self, counts: Counter[Shape]) -> None:
        """:meth:`observe` of a snapshot whose :func:`snapshot_shapes` are ``counts``."""
        self._seen.append(counts)
        self._total.update(counts)
        while len(self._seen) > self.snapshots:
            self._total.subtract(self._seen.popleft())
        # subtract leaves zero counts behind; drop them so the dict stays the window's size
        for shape in [s for s, c in self._total.items() if c <= 0]:
            del self._total[shape]

    def workload(self) -> Workload:
        return typical(self._total, coverage=self.coverage,
                       include_cpu_only=self.include_cpu_only, source="window")
