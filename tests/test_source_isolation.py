"""Data flows one way: importing a source loads nothing downstream of it.

Each module is imported in a fresh interpreter, so what another test imported
first cannot hide a dependency. ruff's banned-api (pyproject.toml) stops a
source from naming these packages; this test also catches them arriving
indirectly, through a module a source imports.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

SOURCE_MODULES = (
    "exporter.sources",
    "exporter.sources.lastgood",
    "exporter.sources.sim",
    "exporter.sources.nvml",
    "exporter.sources.dcgm",
    "exporter.sources.slurm",
    "exporter.sources.prometheus",
    "exporter.sources.dcgm_mapping",
    "exporter.sources.exposition_parser",
    "exporter.sources.gpu_models",
    "exporter.sources.slurm_parse",
)

# downstream of the snapshot; and the simulator, which the sim source is handed by its
# build() rather than importing it (the simulator places jobs with exporter.placement)
FORBIDDEN = ("exporter.analysis", "exporter.placement", "exporter.exposition", "exporter.server",
             "exporter.advisor", "exporter.simulation")

PROBE = """
import importlib, sys
importlib.import_module({module!r})
print(sorted(m for m in sys.modules if m.split(".")[:2] in [p.split(".") for p in {forbidden!r}]))
"""


@pytest.mark.parametrize("module", SOURCE_MODULES)
def test_importing_a_source_module_loads_nothing_downstream(module):
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module, forbidden=FORBIDDEN)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", f"{module} loads {done.stdout.strip()}"


def test_building_the_sim_source_hands_it_the_simulator():
    """The other half of the bargain: the factory wires the simulator in."""
    from exporter.config import SimSource
    from exporter.simulation.fleet import Simulation
    from exporter.sources.sim import build

    source = build(SimSource(), lambda: 0.0)
    assert source.simulate is Simulation
