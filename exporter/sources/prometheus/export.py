"""A value family read through VictoriaMetrics' ``/api/v1/export/csv``, as its instant query
``max by (node, gpu, instance, job) (family{...})`` would answer it.

Why: VictoriaMetrics' instant query costs about 13 µs of its CPU a series selected at 108,800
GPUs, its export of the same series over a window holding a sample or two of each about 6-8
(docs/performance.md), and the CSV rows are half the query's bytes. The export holds every
sample of its window, not the newest alone: of each GPU's series (node, gpu and the scrape
target) only the newest row counts, and none when that one is NaN (a staleness marker: the
series ended), as the query answers.
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass

# the columns asked for: the rows decode to the query path's (node, gpu, value text, instance,
# job) tuples
VALUE_FORMAT = "__timestamp__:unix_ms,__value__,node,gpu,instance,job"
_FIELDS = 6


@dataclass(frozen=True, slots=True)
class ValueRows:
    """The newest row of each GPU's series, as (node, gpu, value text, instance, job), and
    the oldest of those rows' timestamps (ms; None without rows): how far back the window had
    to reach for every GPU it holds."""

    rows: list[tuple[str, str, str, str, str]]
    oldest_ms: int | None


def values_from_csv(body: bytes) -> ValueRows:
    """The rows of an export answer in :data:`VALUE_FORMAT`. ValueError when it is not that
    CSV (a proxy's page, another format)."""
    text = body.decode()
    lines: object
    if '"' in text:  # a label quoted (a comma in it): the CSV reader; else a plain split
        lines = csv.reader(io.StringIO(text))
    else:
        lines = (line.split(",") for line in text.split("\n") if line)
    newest: dict[tuple[str, str, str, str], tuple[int, str]] = {}
    intern = sys.intern
    for fields in lines:  # type: ignore[attr-defined]
        if len(fields) != _FIELDS:
            raise ValueError(f"a row of {len(fields)} fields, expected {_FIELDS}")
        at, value = int(fields[0]), fields[1]
        float(value)  # a number, or no such answer
        key = (intern(fields[2]), intern(fields[3] or "0"), intern(fields[4]),
               intern(fields[5]))
        held = newest.get(key)
        if held is None or at >= held[0]:
            newest[key] = (at, value)
    rows = []
    oldest = None
    for (node, gpu, instance, job), (at, value) in newest.items():
        if value[-1:] in ("N", "n"):  # NaN, the only number whose text ends so
            continue
        rows.append((node, gpu, value, instance, job))
        oldest = at if oldest is None or at < oldest else oldest
    return ValueRows(rows, oldest)


def next_window(ages: list[float], whole: float) -> float:
    """The window of the next export of the value families: the oldest newest row's age of this
    read's exports (``ages``, s) and a quarter more, so that a scrape a little late still has a
    row in it (a row or two a GPU, whatever the scrape interval), at most ``whole``
    (``max_sample_age``, past which a GPU is stale anyway); ``whole`` without an age."""
    if not ages:
        return whole
    return min(whole, 1.25 * max(ages) + 1.0)


__all__ = ["VALUE_FORMAT", "ValueRows", "next_window", "values_from_csv"]
