"""Fixtures: the exporter and a real Prometheus, each stopped when its test ends.

The helpers they use (free ports, starting and stopping servers, the data
folder) live in ``tests/helpers/``; tests import them from there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers.servers import Prometheus, Server, start_exporter, start_prometheus, stop

# Property tests draw the same examples on every run (derandomize), so a run can't pass
# or fail by luck: the suite never flakes. GPUFLEET_HYPOTHESIS=explore draws fresh
# examples each run, to hunt for new counterexamples (then pin what it finds in a test).
# No timing checks either (no deadline, no too_slow health check): under make test-stress
# drawing one example took 2.9 s, and hypothesis failed the test for it.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("repeatable", derandomize=True, **_UNTIMED)
settings.register_profile("explore", derandomize=False, **_UNTIMED)
settings.load_profile(os.environ.get("GPUFLEET_HYPOTHESIS", "repeatable"))



@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test``'s two xdist workers (``--dist loadgroup``), the tests that start
    real servers (marked slow) run one at a time on one worker, in one group, while the
    other worker takes the CPU-bound tests: no two Prometheus-and-exporter tests share
    the machine's two cores, whose timing waits were written for one at a time."""
    grouping = bool(config.getoption("loadgroup", False))  # xdist sets it on its workers
    for item in items:
        nodeid = item.nodeid
        # schemathesis gives each API operation's test one node id (the function's), and
        # xdist schedules a group's tests by node id: it ran one operation of five. Their
        # names ("test[POST /v1/plan]") tell them apart.
        base, _, last = nodeid.rpartition("::")
        if last != item.name:
            nodeid = f"{base}::{item.name}"
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group("servers"))
            if grouping and _STRUCTURED_IDS:
                nodeid += "@servers"
        if nodeid != item.nodeid:
            _set_node_id(item, nodeid)


# pytest 9 keeps a node's id as a structured NodeId: xdist 3.8 still writes the old string
# field (``item._nodeid += "@group"``), which pytest no longer reads, so ``loadgroup``
# silently stopped grouping (pytest-dev/pytest-xdist#1386, fix open in #1388). Until it
# lands, the suffix is written where pytest 9 reads it, as that fix does; on an older
# pytest, xdist's own hook adds it.
_STRUCTURED_IDS = hasattr(pytest.Item, "id")


def _set_node_id(item: pytest.Item, nodeid: str) -> None:
    if _STRUCTURED_IDS:
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)  # type: ignore[attr-defined]
    else:
        item._nodeid = nodeid

@pytest.fixture
def exporter_factory(tmp_path: Path) -> Iterator:
    started: list[Server] = []

    def factory(*args: str, **kwargs) -> Server:
        exporter = start_exporter(tmp_path, *args, **kwargs)
        started.append(exporter)
        return exporter

    yield factory
    for exporter in started:
        stop(exporter.proc)


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator:
    started: list[Prometheus] = []

    def factory(config: str, name: str = "prometheus", extra_args: tuple[str, ...] = ()) -> Prometheus:
        prom = start_prometheus(tmp_path / name, config, extra_args)
        started.append(prom)
        return prom

    yield factory
    for prom in started:
        stop(prom.proc)
