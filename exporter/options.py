"""How an option is declared: :func:`opt` and :class:`Duration`, for the config and every source.

Each source declares its options beside its code (a frozen dataclass whose fields
are ``opt(...)``) and :mod:`exporter.config` assembles ``sources`` from the
registry (:data:`exporter.sources.SOURCES`); the rest of the config is declared
in config.py the same way. This module is a leaf, importing nothing of gpufleet,
so an options module stays cheap to import and there is no import cycle.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class ConstantSource:
...     enabled: bool = opt(False, help="Serve a constant fleet.")
...     gpus: int = opt(8, help="GPUs in it.", min=1)
...     interval: Duration = opt(Duration(30), help="How often it changes.", exclusive_min=0)
>>> from exporter.config import build
>>> build(ConstantSource, {"gpus": 4, "interval": "1m"}).interval
60.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def opt(default: Any = dataclasses.MISSING, *, help: str, factory: Any = None, **rules: Any) -> Any:
    """A config field: its default (or ``factory``), the ``help`` of ``gpufleet serve --help``,
    and the rules :func:`exporter.config.build` checks (``choices``, ``min``, ``max``,
    ``exclusive_min``; ``url=True``, an http(s) URL with a host, or ``url="host:port"``, which
    also takes a bare ``host:port``, on a string or each string of a list), naming the dotted
    key of a value that breaks one. Every number and duration must be finite, and a duration
    is never negative, whatever the rules."""
    meta = {"help": help, **rules}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


class Duration(float):
    """Seconds; the YAML may say ``30``, ``30s``, ``5m``, ``1h30m``, ``1.5h`` or ``250ms``
    (:func:`exporter.durations.parse_duration` with ``config=True``)."""
