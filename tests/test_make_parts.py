"""make test's `serial` and `alone` parts collect only the files that name their mark."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import REPO
from tests.helpers.make_parts import MARKS, WHOLLY_MARKED, unlisted


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


def test_an_unmarked_test_in_a_file_whose_module_mark_names_one_is_found(tmp_path):
    """make test's first part does not collect a file whose pytestmark names `alone` or
    `serial`: a test there without either mark (its own pytestmark overridden, say) would never
    run, so the parts that do collect the file fail."""
    whole = tmp_path / "test_whole.py"
    whole.write_text("pytestmark = [pytest.mark.slow, pytest.mark.serial]\n")
    mixed = tmp_path / "test_mixed.py"  # marks on some tests only: the first part collects it
    mixed.write_text("pytestmark = pytest.mark.slow\n\n@pytest.mark.alone\ndef test_a(): ...\n")
    items = [_Item(whole, "test_whole.py::a", ("serial",)), _Item(whole, "test_whole.py::b"),
             _Item(mixed, "test_mixed.py::a", ("alone",)), _Item(mixed, "test_mixed.py::b")]
    assert unlisted(items) == [
        "test_whole.py::b (unmarked, in a file whose pytestmark names a mark)"]


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
    # the first part leaves out the files whose module mark names one: the check's pattern
    assert ("WHOLLY_MARKED = $(if $(filter tests/%,$(PYTEST_ARGS)),,$(shell grep -l "
            "'^pytestmark = .*mark\\.\\(alone\\|serial\\)\\b' tests/test_*.py))") in makefile
    assert '-m "not alone and not serial" $(addprefix --ignore=,$(WHOLLY_MARKED))' in makefile
    files = sorted((REPO / "tests").glob("test_*.py"))
    left_out = subprocess.run(
        ["grep", "-l", r"^pytestmark = .*mark\.\(alone\|serial\)\b",
         *(str(p.relative_to(REPO)) for p in files)],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert left_out == [str(p.relative_to(REPO)) for p in files
                        if WHOLLY_MARKED.search(p.read_text(encoding="utf-8"))]
    assert "tests/test_schemathesis.py" in left_out


def test_make_test_writes_bytecode_and_runs_three_workers():
    """Every pytest process of make test reads the suite's compiled (and assertion-rewritten)
    modules from __pycache__ instead of compiling them again: the environment's
    PYTHONDONTWRITEBYTECODE is emptied for the recipe. The first part runs on three workers."""
    makefile = (REPO / "Makefile").read_text()
    assert "\ntest test-fast: export PYTHONDONTWRITEBYTECODE :=\n" in makefile
    assert "\nTEST_WORKERS ?= 3\n" in makefile
    assert ('-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \\\n'
            '\t  -m "not alone and not serial"') in makefile


def test_the_longest_files_come_first_each_in_its_own_order():
    """The first part's workers get the longest files first (make_parts.LONGEST_FIRST, each a
    file of the suite); every file's tests and every other file keep collection order."""
    from tests.helpers.make_parts import LONGEST_FIRST, longest_first

    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert all((REPO / "tests" / name).is_file() for name in LONGEST_FIRST)

    class Item:
        def __init__(self, name: str, test: int) -> None:
            self.path = REPO / "tests" / name
            self.nodeid = f"tests/{name}::test_{test}"

    names = ["test_a.py", LONGEST_FIRST[2], "test_b.py", LONGEST_FIRST[0]]
    items = [Item(name, t) for t in range(3) for name in names]
    longest_first(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        *(f"tests/{LONGEST_FIRST[0]}::test_{t}" for t in range(3)),
        *(f"tests/{LONGEST_FIRST[2]}::test_{t}" for t in range(3)),
        *(f"tests/{n}::test_{t}" for t in range(3) for n in ("test_a.py", "test_b.py"))]
