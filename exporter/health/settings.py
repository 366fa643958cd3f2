"""Bounds of the health settings: a wrong value is one error naming its key.

The settings are dataclasses with defaults today; when they become rows of
rules/thresholds.yaml the table reader reports the same keys.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def check_settings(section: str, settings: Any, minimum: dict[str, float] | None = None,
                   maximum: dict[str, float] | None = None) -> None:
    """Every number of ``settings`` finite and at least 0 (or its ``minimum``), at most its
    ``maximum``; ValueError ``<section>.<field>: ...`` otherwise."""
    minimum, maximum = minimum or {}, maximum or {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        low, high = minimum.get(f.name, 0), maximum.get(f.name, math.inf)
        if not (math.isfinite(value) and low <= value <= high):
            bound = f"from {low:g} to {high:g}" if math.isfinite(high) else f"at least {low:g}"
            raise ValueError(f"{section}.{f.name}: must be {bound}, got {value!r}")
