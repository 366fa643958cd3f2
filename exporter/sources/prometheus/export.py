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
from typing import Any

# the columns asked for: the rows decode to the query path's (node, gpu, value text, instance,
# job) tuples
VALUE_FORMAT = "__timestamp__:unix_ms,__value__,node,gpu,instance,job"
_FIELDS = 6


@dataclass(frozen=True, slots=True)
class ValueRows:
    """The newest row of each GPU's series, as (node, gpu, value text, instance, job); the
    oldest of those rows' timestamps (ms; None without rows); and the widest gap between a
    series' newest row and the one before it (ms; None where no series has two rows in the
    window): the scrape interval, as far as the window shows it."""

    rows: list[tuple[str, str, str, str, str]]
    oldest_ms: int | None
    spacing_ms: int | None = None


def values_from_csv(body: bytes) -> ValueRows:
    """The rows of an export answer in :data:`VALUE_FORMAT`. ValueError when it is not that
    CSV (a proxy's page, another format)."""
    text = body.decode()
    # each series' labels as the key of its newest row (its time, value, and the time of the
    # row before it): the line's text after the value where no label is quoted (split once, a
    # row or two a GPU at 108,800 GPUs), the CSV reader's fields where one is (a comma in it)
    newest: dict[Any, tuple[int, str, int | None]] = {}
    if '"' in text:
        for fields in csv.reader(io.StringIO(text)):
            if len(fields) != _FIELDS:
                raise ValueError(f"a row of {len(fields)} fields, expected {_FIELDS}")
            _keep(newest, tuple(fields[2:]), int(fields[0]), fields[1])
    else:
        for line in text.split("\n"):
            if line:
                stamp, value, labels = line.split(",", 2)
                _keep(newest, labels, int(stamp), value)
    rows = []
    oldest = spacing = None
    intern = sys.intern
    for labels, (at, value, before) in newest.items():
        fields = labels.split(",") if type(labels) is str else labels
        if len(fields) != _FIELDS - 2:
            raise ValueError(f"a row of {len(fields) + 2} fields, expected {_FIELDS}")
        if before is not None and (spacing is None or at - before > spacing):
            spacing = at - before
        if value == "NaN":  # a staleness marker (as Go writes it): the series ended
            continue
        node, gpu, instance, job = fields
        rows.append((intern(node), intern(gpu or "0"), value, intern(instance), intern(job)))
        oldest = at if oldest is None or at < oldest else oldest
    return ValueRows(rows, oldest, spacing)


def _keep(newest: dict[Any, tuple[int, str, int | None]], labels: Any, at: int,
          value: str) -> None:
    held = newest.get(labels)
    if held is None:
        newest[labels] = (at, value, None)
    elif at >= held[0]:
        newest[labels] = (at, value, held[0])
    elif held[2] is None or at > held[2]:
        newest[labels] = (held[0], held[1], at)


def next_window(reaches: list[tuple[float, float | None]], current: float, whole: float
                ) -> float:
    """The window of the next export of the value families, after a read whose exports held
    every GPU expected in ``current``, from their reach (per family: the age of its oldest
    newest row and its spacing, s): the scrape interval (or the oldest age, where larger) and a
    quarter more, so that every series has a row in it, one or two, whatever the interval; at
    most ``whole`` (``max_sample_age``, past which a GPU is stale anyway). ``current`` where no
    family showed an interval (no series with two rows: one target's series are all scraped at
    once, so a window a little wider than the interval holds two rows of each or of none)."""
    if not any(spacing is not None for _, spacing in reaches):
        return current
    need = max(max(age, spacing or 0.0) for age, spacing in reaches)
    return min(whole, 1.25 * need + 1.0)


__all__ = ["VALUE_FORMAT", "ValueRows", "next_window", "values_from_csv"]
