"""make test's `serial` and `alone` parts collect only the files that name their mark."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import REPO
from tests.helpers.make_parts import MARKS, unlisted


@dataclass
class _Item:
    path: Path
    nodeid: str
    marks: tuple[str, ...] = field(default_factory=tuple)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def test_a_marked_test_in_a_file_that_does_not_name_its_mark_is_found(tmp_path):
    named = tmp_path / "test_named.py"
    named.write_text("pytestmark = [pytest.mark.slow, pytest.mark.alone]\n")
    hooked = tmp_path / "test_hooked.py"  # marked by a hook or an alias: grep cannot see it
    hooked.write_text("pytestmark = [ALONE]\n# pytest.mark.alone_ish is another name\n")
    items = [_Item(named, "test_named.py::a", ("alone",)), _Item(hooked, "test_hooked.py::b"),
             _Item(hooked, "test_hooked.py::c", ("alone",)),
             _Item(named, "test_named.py::d", ("serial",))]
    assert unlisted(items) == ["test_hooked.py::c (alone)", "test_named.py::d (serial)"]


def test_the_makefile_lists_the_files_the_way_the_check_reads_them():
    """The Makefile's grep and the check's pattern agree on this checkout's files."""
    makefile = (REPO / "Makefile").read_text()
    assert "grep -l 'mark\\.$(1)\\b' tests/test_*.py" in makefile
    for mark in MARKS:
        assert f"-m {mark} $(PYTEST_ARGS) $(call MARKED,{mark})" in makefile, mark
        listed = subprocess.run(["grep", "-l", rf"mark\.{mark}\b", *sorted(
            str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py"))],
            cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
        assert listed, mark  # the files make test passes to that part


def test_make_test_writes_bytecode_and_runs_three_workers():
    """Every pytest process of make test reads the suite's compiled (and assertion-rewritten)
    modules from __pycache__ instead of compiling them again: the environment's
    PYTHONDONTWRITEBYTECODE is emptied for the recipe. The first part runs on three workers."""
    makefile = (REPO / "Makefile").read_text()
    assert "\ntest test-fast: export PYTHONDONTWRITEBYTECODE :=\n" in makefile
    assert "\nTEST_WORKERS ?= 3\n" in makefile
    assert '-n $(TEST_WORKERS) --dist loadfile -m "not alone and not serial"' in makefile
