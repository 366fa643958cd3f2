"""The threshold table's reader: walks the YAML with the dotted key of each value and fails
with one line naming the file and the key: the one validator of every section (table.py's
rows, sections.py's load statistics and pressure, scaling.py's ``scaling:``), so each
error has the same shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.durations import HINT as DURATION_HINT
from exporter.durations import parse_duration
from exporter.errors import ConfigError, one_line


class ThresholdError(ConfigError):
    """The threshold table is wrong; the message names the file, the row and the key."""


class Reader:
    """Walks the YAML with the dotted key of each value, for one-line errors."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, message: str) -> ThresholdError:
        return ThresholdError(one_line(f"{self.source}: {where}: {message}"))  # keys come from the file

    def mapping(self, value: Any, where: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a mapping, got {type(value).__name__}")
        for key in value:
            if key not in allowed:
                raise self.fail(f"{where}.{key}", f"unknown key (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in value:
                raise self.fail(f"{where}.{key}", "required")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"must be a non-empty string, got {value!r}")
        return " ".join(value.split())

    def number(self, value: Any, where: str, unit: str, percent_ok: bool,
               bounds: tuple[float, float]) -> float:
        if isinstance(value, str) and value.strip().endswith("%") and percent_ok:
            try:
                number = float(value.strip()[:-1]) / 100
            except ValueError:
                raise self.fail(where, f"must be a number or a percentage, got {value!r}") from None
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        else:
            shape = "a number or a percentage such as 30%" if percent_ok else "a number"
            raise self.fail(where, f"must be {shape} ({unit}), got {value!r}")
        low, high = bounds
        if not low <= number <= high:
            raise self.fail(where, f"must be between {low:g} and {high:g} ({unit}), got {value!r}")
        return number

    def duration(self, value: Any, where: str) -> float:
        try:
            return parse_duration(value)  # Prometheus' grammar: the rules hand it to Prometheus
        except ValueError:
            raise self.fail(where, f"must be {DURATION_HINT}, got {value!r}") from None

    def share(self, value: Any, where: str) -> float:
        """A ratio above 0 and at most 1 (a scaling band, a target)."""
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise self.fail(where, f"must be a ratio in (0, 1], got {value!r}")
        return float(value)

    def whole(self, value: Any, where: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(where, f"must be a whole number from {low} to {high:,}, got {value!r}")
        return value
