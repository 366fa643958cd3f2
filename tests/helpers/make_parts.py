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


class Item(Protocol):
    path: Path
    nodeid: str

    def get_closest_marker(self, name: str) -> object | None: ...


def unlisted(items: Iterable[Item]) -> list[str]:
    """The node ids of marked tests the Makefile's file lists would miss, with the mark."""
    texts: dict[Path, str] = {}
    missed = []
    for item in items:
        for mark in MARKS:
            if item.get_closest_marker(mark) is None:
                continue
            if item.path not in texts:
                texts[item.path] = item.path.read_text(encoding="utf-8")
            if not re.search(rf"mark\.{mark}\b", texts[item.path]):
                missed.append(f"{item.nodeid} ({mark})")
    return missed
