"""Fixtures: the exporter and a real Prometheus, each stopped when its test ends.

The helpers they use (free ports, starting and stopping servers, the data
folder) live in ``tests/helpers/``; tests import them from there.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from exporter import logs
from tests.helpers.make_parts import longest_first, unlisted
from tests.helpers.servers import (
    Prometheus,
    Server,
    discard,
    start_exporter,
    start_prometheus,
    stop,
)

# Property tests draw the same examples on every run (derandomize), so a run can't pass
# or fail by luck: the suite never flakes. GPUFLEET_HYPOTHESIS=explore draws fresh
# examples each run, to hunt for new counterexamples (then pin what it finds in a test).
# No timing checks either (no deadline, no too_slow health check): under make test-stress
# drawing one example took 2.9 s, and hypothesis failed the test for it.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("repeatable", derandomize=True, **_UNTIMED)
settings.register_profile("explore", derandomize=False, **_UNTIMED)
settings.load_profile(os.environ.get("GPUFLEET_HYPOTHESIS", "repeatable"))


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C raises KeyboardInterrupt, as Python's own handler does, from a handler of ours.

    ``asyncio.run`` swaps Python's handler for its own and back around every run, and on
    Python 3.11 putting it back formats the repr of asyncio's handler, whose task's repr
    holds the full repr of the run's result: 34 ms for a run that returns the default fleet's
    snapshot (2 MB of repr, twice), against 0.1 ms. The tests that read a source in a loop
    spent most of their time there. With any other handler in place, asyncio leaves SIGINT
    alone."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _interrupted)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: every collected test is looked at
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """make test's `serial` and `alone` parts collect only the files that name their mark
    (tests/helpers/make_parts.py): a marked test elsewhere fails the run instead of never
    running. The longest files come first (make_parts.LONGEST_FIRST)."""
    missed = unlisted(items)
    if missed:
        raise pytest.UsageError("tests the Makefile would not run (marked serial or alone in a "
                                "file that does not name the mark, or unmarked in a file whose "
                                "pytestmark names one): " + ", ".join(missed))
    longest_first(items)




@pytest.fixture(autouse=True)
def _no_log_writer_left() -> Iterator[None]:
    """A test that runs ``serve`` in this process (``main(["serve", ...])``) installs its queued
    log writer, and one that stops early leaves it: the next test in the same xdist worker
    then served its rate-limited count (the golden exposition read 99, not 0). Stopped after
    each test, as serve's exit does."""
    yield
    logs._stop_writer()


@pytest.fixture
def exporter_factory(tmp_path: Path) -> Iterator:
    """start_exporter in the test's folder, stopped when the test ends; the small simulated
    fleet unless the call asks for another (fleet="medium" or "reference")."""
    started: list[Server] = []

    def factory(*args: str, **kwargs) -> Server:
        kwargs.setdefault("fleet", "small")
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
        discard(prom.proc)
