"""Sources: where fleet data comes from. One module per source, one small protocol.

A source is any object with a ``name`` and ``async read() -> FleetSnapshot``
returning the part of the fleet it sees, and ``async close()``. The framework
(:mod:`exporter.collect`), not the source, times every read, applies the
timeout, reports ``gpufleet_source_up`` and keeps the last good reading when a
read fails. Sources never import analysis, exposition or the server.

Adding a source means adding ``exporter/sources/<name>.py`` with a
``build(config, clock) -> Source`` function and one line in ``FACTORIES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from exporter.snapshot import FleetSnapshot


class NoData(Exception):
    """Nothing to read here (no GPU, no target configured): not a failure of the source."""


class SourceStartupError(Exception):
    """The source cannot start at all (missing library, bad option). Message names the fix."""


class Source(Protocol):
    name: str

    async def read(self) -> FleetSnapshot: ...

    async def close(self) -> None: ...


Clock = Callable[[], float]

# name -> module path; modules are imported only when their source is enabled,
# so a missing optional dependency of one source cannot break the others.
FACTORIES: dict[str, str] = {
    "sim": "exporter.sources.sim",
    "nvml": "exporter.sources.nvml",
    "dcgm": "exporter.sources.dcgm",
    "slurm": "exporter.sources.slurm",
    "prometheus": "exporter.sources.prometheus",
}


def build_source(name: str, config: Any, clock: Clock) -> Source:
    module = importlib.import_module(FACTORIES[name])
    return module.build(config, clock)
