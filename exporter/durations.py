"""Durations, written the way Prometheus writes them: the one parser and its inverse.

The config file and the threshold table both read durations here, so ``1h30m``
means the same in either. Prometheus' grammar (``model.ParseDuration``) is
whole counts of ``y w d h m s ms`` in that order: ``90s``, ``5m``, ``1h30m``,
``250ms``. The threshold table takes exactly that, as the rules it generates
hand the ``for`` to Prometheus. The config file also takes what it always has:
a YAML number is seconds, and a count may have decimals (``0.5s``, ``1.5h``).
"""

from __future__ import annotations

import math
import re
from typing import Any

HINT = "a duration such as 30s, 5m or 1h30m"  # for "must be ..." messages

# (suffix, seconds) in the order Prometheus requires; a year is 365 days, as there
_UNITS = (("y", 365 * 86400), ("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1),
          ("ms", 0.001))
_COUNT = r"(\d+(?:\.\d+)?)"
_GRAMMAR = re.compile("^(-?)" + "".join(f"(?:{_COUNT}{suffix})?" for suffix, _ in _UNITS) + "$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def parse_duration(value: Any, *, config: bool = False) -> float:
    """Seconds of ``value``; ValueError (with :data:`HINT` as its message) if it is not one.

    Without ``config``: exactly Prometheus' grammar, a non-empty string of whole
    counts. With ``config`` (the config file), also a number of seconds (``7``,
    ``"7"``), decimal counts (``1.5h``) and a minus sign, which is parsed rather
    than rejected so that the field's range check names the problem ("must be > 0").
    Never NaN or infinite: YAML's ``.nan`` and ``.inf`` are numbers, and a count of
    400 digits is infinite as a float (a NaN interval spun at 93% CPU; an infinite
    one served frozen data while ready).
    """
    seconds = _parse(value, config)
    if not math.isfinite(seconds):
        raise ValueError(HINT)
    return seconds


def _parse(value: Any, config: bool) -> float:
    if isinstance(value, bool):
        raise ValueError(HINT)
    if isinstance(value, int | float):
        if config:
            return float(value)
        raise ValueError(HINT)
    if not isinstance(value, str):
        raise ValueError(HINT)
    text = value.strip() if config else value
    if config and _NUMBER.match(text):
        return float(text)
    match = _GRAMMAR.match(text)
    if match is None or not any(match.groups()[1:]):
        raise ValueError(HINT)
    sign, *counts = match.groups()
    if not config and (sign or any(c and "." in c for c in counts)):
        raise ValueError(HINT)
    seconds = sum(float(c) * unit for c, (_, unit) in zip(counts, _UNITS, strict=True) if c)
    return -seconds if sign else seconds


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration for ``seconds``, in whole milliseconds."""
    millis = round(seconds * 1000)
    if millis <= 0:
        return "0s"
    out = []
    for suffix, unit in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000),
                         ("ms", 1)):
        count, millis = divmod(millis, unit)
        if count:
            out.append(f"{count}{suffix}")
    return "".join(out)


__all__ = ["HINT", "format_duration", "parse_duration"]
