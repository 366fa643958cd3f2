"""Data flows one way: importing a source loads nothing downstream of it.

Each module is imported in a fresh interpreter, so what another test imported
first cannot hide a dependency. ruff's banned-api (pyproject.toml) stops a
source from naming these packages; this test also catches them arriving
indirectly, through a module a source imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.helpers import REPO

SOURCE_MODULES = (
    "exporter.sources",
    "exporter.sources.lastgood",
    "exporter.sources.sim.source",
    "exporter.sources.nvml.source",
    "exporter.sources.dcgm.source",
    "exporter.sources.slurm.source",
    "exporter.sources.prometheus.source",
    "exporter.sources.dcgm.fields",
    "exporter.sources.dcgm.exposition_parser",
    "exporter.sources.gpu_models",
    "exporter.sources.slurm.parse",
    "exporter.sources.nvml.options",
    "exporter.sources.dcgm.options",
    "exporter.sources.slurm.options",
    "exporter.sources.sim.options",
    "exporter.sources.prometheus.options",
    "exporter.options",
)

# downstream of the snapshot; and the simulator, which the sim source is handed by its
# build() rather than importing it (the simulator places jobs with exporter.placement)
FORBIDDEN = ("exporter.analysis", "exporter.placement", "exporter.exposition", "exporter.web.server",
             "exporter.advisor", "exporter.fleet_sim")

PROBE = """
import importlib, sys
importlib.import_module({module!r})
print(sorted(m for m in sys.modules for p in {forbidden!r} if m == p or m.startswith(p + ".")))
"""


def loaded(module: str, forbidden: tuple[str, ...]) -> list[str]:
    """Which of ``forbidden`` (packages count with their submodules) a fresh import loads."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module, forbidden=forbidden)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return ast.literal_eval(done.stdout.strip())


@pytest.mark.parametrize("module", SOURCE_MODULES)
def test_importing_a_source_module_loads_nothing_downstream(module):
    assert loaded(module, FORBIDDEN) == []


def test_reading_the_config_imports_no_source_machinery():
    """config.py assembles ``sources`` from the options modules only: no aiohttp, pynvml,
    numpy or asyncio just to read a YAML file."""
    heavy = ("aiohttp", "pynvml", "numpy", "asyncio", "exporter.fleet_sim", "exporter.placement")
    assert loaded("exporter.config", heavy) == []


def test_building_the_sim_source_hands_it_the_simulator():
    """The other half of the bargain: the factory wires the simulator in."""
    from exporter.fleet_sim.fleet import Simulation
    from exporter.sources.sim.options import SimSource
    from exporter.sources.sim.source import build

    source = build(SimSource(), lambda: 0.0)
    assert source.simulate is Simulation
