"""Reads an hourly demand series and a capacity table, bounded, for ``gpufleet load``.

The series is any CSV with an ``hour`` column (consecutive whole hours) and one
column per pool of demanded GPUs; the capacity table has a row per pool:
``gpu_model`` (or ``pool``), ``total_gpus`` and, optionally, ``nodes`` and
``max_gpus`` (GPUs of the largest node, which is what a scale-up adds; 8 when
absent). Both are hostile input: size, rows and columns are bounded before the
work, every number must be finite and not negative, and an error is one line
naming the file and line.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporter.bounded_file import Wording, read_bounded
from exporter.errors import UsageError

MAX_BYTES = 64 * 2**20  # the 184-day table is 0.3 MB
MAX_ROWS = 200_000  # 22 years of hours
MAX_POOLS = 256
# rows x columns: the rows are held as strings before they are numbers (about 60 bytes a
# cell), so this bounds memory (~120 MB) and the replay's time (~1 min) for any shape;
# the 184-day table is 30,940 cells
MAX_CELLS = 2_000_000
MAX_GPUS = 10_000_000.0  # per pool and hour: far above any cluster, below float trouble
DEFAULT_NODE_GPUS = 8
NOISE = 1e-6  # GPUs: a negative this small is float rounding in the producer's sums


@dataclass(frozen=True)
class Series:
    hours: np.ndarray  # [T] int
    pools: tuple[str, ...]
    demand: np.ndarray  # [T, P] GPUs


@dataclass(frozen=True)
class Capacity:
    pool: str
    gpus: float
    nodes: int | None  # today's node count, when the table says
    node_gpus: int  # GPUs one added node brings


_WORDING = Wording(UsageError, over_limit="{path}: {size} bytes, more than the {limit} allowed",
                   grew_over_limit="{path}: more than the {limit} bytes allowed")


def _read(path: Path) -> str:
    data = read_bounded(path, MAX_BYTES, _WORDING)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 (byte {exc.start})") from None


def _number(text: str, where: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{where}: {what} is not a number: {text[:40]!r}") from None
    if -NOISE <= value < 0:
        return 0.0  # the 184-day table's last A10 hour is -3.2e-12: a sum's rounding, not a demand
    if not math.isfinite(value) or value < 0 or value > MAX_GPUS:
        raise UsageError(f"{where}: {what} must be a finite number from 0 to {MAX_GPUS:g}, got {text[:40]!r}")
    return value


def _rows(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    reader = csv.reader(io.StringIO(_read(path), newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise UsageError(f"{path}: empty") from None
    except csv.Error as exc:
        raise UsageError(f"{path}:1: {exc}") from None
    if len(header) > MAX_POOLS + 1:
        raise UsageError(f"{path}:1: {len(header)} columns, more than the {MAX_POOLS + 1} allowed")
    header = [h.strip() for h in header]
    rows: list[tuple[int, list[str]]] = []
    try:
        for row in reader:
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(rows) >= MAX_ROWS:
                raise UsageError(f"{path}:{reader.line_num}: more than {MAX_ROWS} rows")
            if (len(rows) + 1) * len(header) > MAX_CELLS:
                raise UsageError(f"{path}:{reader.line_num}: more than {MAX_CELLS:,} cells "
                                 f"({len(header)} columns)")
            if len(row) != len(header):
                raise UsageError(f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(header)}")
            rows.append((reader.line_num, row))
    except csv.Error as exc:
        raise UsageError(f"{path}:{reader.line_num}: {exc}") from None
    return header, rows


def read_series(path: str | Path, pools: tuple[str, ...] | None = None) -> Series:
    """The demand table; ``pools`` keeps only those columns (each must exist)."""
    path = Path(path)
    header, rows = _rows(path)
    if "hour" not in header:
        raise UsageError(f"{path}:1: no 'hour' column (the header is {','.join(header)[:80]})")
    if len(set(header)) != len(header):
        raise UsageError(f"{path}:1: a column name appears twice")
    names = [h for h in header if h != "hour"]
    if pools is not None:
        missing = [p for p in pools if p not in names]
        if missing:
            raise UsageError(f"{path}:1: no column for pool {missing[0]!r}")
        names = list(pools)
    if not names:
        raise UsageError(f"{path}:1: no pool columns besides 'hour'")
    if not rows:
        raise UsageError(f"{path}: no rows")
    hour_at = header.index("hour")
    cols = [header.index(n) for n in names]
    hours = np.empty(len(rows), dtype=np.int64)
    demand = np.empty((len(rows), len(names)))
    for i, (line, row) in enumerate(rows):
        where = f"{path}:{line}"
        hour = _number(row[hour_at].strip(), where, "hour")
        if hour != int(hour):
            raise UsageError(f"{where}: hour must be a whole number, got {row[hour_at][:40]!r}")
        if i and int(hour) != hours[i - 1] + 1:
            raise UsageError(f"{where}: hour {int(hour)} does not follow {hours[i - 1]} (one row per hour)")
        hours[i] = int(hour)
        for j, c in enumerate(cols):
            demand[i, j] = _number(row[c].strip(), where, names[j])
    return Series(hours, tuple(names), demand)


def read_capacity(path: str | Path) -> dict[str, Capacity]:
    path = Path(path)
    header, rows = _rows(path)
    key = "gpu_model" if "gpu_model" in header else "pool" if "pool" in header else None
    if key is None or "total_gpus" not in header:
        raise UsageError(f"{path}:1: need columns gpu_model (or pool) and total_gpus")
    at = {h: i for i, h in enumerate(header)}
    out: dict[str, Capacity] = {}
    for line, row in rows:
        where = f"{path}:{line}"
        pool = row[at[key]].strip()
        if not pool:
            raise UsageError(f"{where}: empty {key}")
        if pool in out:
            raise UsageError(f"{where}: pool {pool!r} listed twice")
        gpus = _number(row[at["total_gpus"]].strip(), where, "total_gpus")
        nodes = None
        if "nodes" in at and row[at["nodes"]].strip():
            value = _number(row[at["nodes"]].strip(), where, "nodes")
            if value != int(value):
                raise UsageError(f"{where}: nodes must be a whole number")
            nodes = int(value)
        node_gpus = DEFAULT_NODE_GPUS
        if "max_gpus" in at and row[at["max_gpus"]].strip():
            value = _number(row[at["max_gpus"]].strip(), where, "max_gpus")
            if value != int(value) or not 1 <= value <= 1024:
                raise UsageError(f"{where}: max_gpus must be a whole number from 1 to 1024")
            node_gpus = int(value)
        out[pool] = Capacity(pool, gpus, nodes, node_gpus)
    if not out:
        raise UsageError(f"{path}: no rows")
    return out
