"""The last good reading of something, served stale while a fresh one is missing.

One helper for every level at which gpufleet does this: per source in
:mod:`exporter.collect`, per target in the dcgm source, per node in the
prometheus source and per GPU in the nvml source. Each remembers what it read
last time it worked, and while the thing does not answer serves that, marked
stale, until ``max_age`` has passed since it was remembered; then the reading
is forgotten and nothing is served, so a series cannot outlive its source
forever. ``max_age=None`` keeps it until the next good reading (or
:meth:`LastGood.forget`).

>>> from dataclasses import dataclass, replace
>>> @dataclass(frozen=True)
... class Gpu:
...     temperature: float
...     stale: bool = False
>>> last = LastGood(lambda gpu: replace(gpu, stale=True), max_age=60)
>>> last.remember("gpu0", Gpu(64.0), now=100.0)
>>> last.recall("gpu0", now=130.0)
Gpu(temperature=64.0, stale=True)
>>> last.recall("gpu0", now=161.0) is None  # past max_age: forgotten
True
>>> "gpu0" in last
False
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LastGood(Generic[K, V]):
    """Per key, the last good value and when it was read.

    ``stale`` turns a remembered value into what is served in its place (its GPUs
    marked stale); it runs on every :meth:`recall`, so the remembered value
    itself stays as it was read.
    """

    def __init__(self, stale: Callable[[V], V], max_age: float | None = None) -> None:
        self._stale = stale
        self.max_age = max_age
        self._entries: dict[K, tuple[V, float]] = {}

    def remember(self, key: K, value: V, now: float) -> None:
        """``value`` is the latest good reading of ``key``, taken at ``now``."""
        self._entries[key] = (value, now)

    def recall(self, key: K, now: float) -> V | None:
        """The last good value of ``key`` marked stale, or None: never read, or read more
        than ``max_age`` before ``now`` (then it is forgotten)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, at = entry
        if self.max_age is not None and now - at > self.max_age:
            del self._entries[key]
            return None
        return self._stale(value)

    def forget(self, key: K) -> None:
        """Drop ``key`` at once: it is gone for good (left the targets file, no data here)."""
        self._entries.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        """The remembered keys (a copy: recalling or forgetting while iterating is fine)."""
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)
