"""The Makefile's test parts find the `serial` and `alone` tests by their files' text.

``make test`` runs the tests marked ``serial`` and ``alone`` in processes of their own, which
collect only the files ``grep -l 'mark\\.<name>\\b' tests/test_*.py`` lists, not the whole
suite (19 s of CPU each time). A test carrying either mark in a file whose text does not
name it (a mark added by a hook, or through an alias) would then never run: tests/conftest.py
fails every run whose collection finds one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

MARKS = ("serial", "alone")

# The files that take longest, by wall time (the xdist part, three workers, 2026-12-07),
# longest first. make test's first part hands whole files to its workers in collection order
# (--no-loadscope-reorder; xdist's own order, most tests first, put these few-test, long
# files last, and the run ended with one worker on one of them while the others idled). A
# file missing here only starts in its usual place.
LONGEST_FIRST = (
    "test_fuzz.py", "test_alert_noise.py", "test_prometheus_source.py", "test_exposition.py",
    "test_advisor_api.py", "test_reliability_slurm_watchdog.py", "test_advisor_sim.py",
    "test_planner_memory.py", "test_victoriametrics_e2e.py", "test_config.py",
    "test_server_limits.py", "test_load_rules_e2e.py", "test_kubernetes_backoff.py",
    "test_docs_blocks.py", "test_gfs_demand.py", "test_alerting_rules.py", "test_landing.py",
    "test_simulate_speed_memory.py", "test_replay.py", "test_prometheus_source_claims.py",
    "test_advisor_slurm.py", "test_simulate_scheduler.py", "test_advisor_e2e.py",
    "test_health_slurm.py", "test_pressure_e2e.py",
)


class Item(Protocol):
    path: Path
    nodeid: str

    def get_closest_marker(self, name: str) -> object | None: ...


def longest_first(items: list[Item]) -> None:
    """``items`` with the tests of :data:`LONGEST_FIRST`'s files first, in its order; each
    file's tests, and the other files, keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# A file whose module mark names `alone` or `serial`: the Makefile's first part does not collect
# it (its WHOLLY_MARKED, the same pattern for grep)
WHOLLY_MARKED = re.compile(r"^pytestmark = .*mark\.(alone|serial)\b", re.MULTILINE)


def unlisted(items: Iterable[Item]) -> list[str]:
    """The node ids of tests the Makefile's file lists would miss, with why: marked in a file
    whose text does not name the mark, or unmarked in a file the first part leaves out."""
    texts: dict[Path, str] = {}
    wholly: dict[Path, bool] = {}  # read once a file: a collection holds 3,000 tests

    def text(path: Path) -> str:
        if path not in texts:
            texts[path] = path.read_text(encoding="utf-8")
        return texts[path]

    missed = []
    for item in items:
        marked = [mark for mark in MARKS if item.get_closest_marker(mark) is not None]
        missed.extend(f"{item.nodeid} ({mark})" for mark in marked
                      if not re.search(rf"mark\.{mark}\b", text(item.path)))
        if item.path not in wholly:
            wholly[item.path] = WHOLLY_MARKED.search(text(item.path)) is not None
        if not marked and wholly[item.path]:
            missed.append(f"{item.nodeid} (unmarked, in a file whose pytestmark names a mark)")
    return missed
