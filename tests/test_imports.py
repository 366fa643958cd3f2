"""Import structure: no module of exporter/ imports, through any chain, one that imports it.

Read from the source with ``ast`` rather than by importing, so that every import
counts: top-level ones, those inside functions, and those under
``if TYPE_CHECKING:``, which never run but still tie two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

PACKAGE = "exporter.placement"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` (of ``module``) imports, wherever the import sits.

    ``from pkg import name`` counts as importing the submodule ``pkg.name`` when there is one
    (``from exporter.placement import policies``), else ``pkg`` itself (a re-exported name
    lives in the package's ``__init__``). The parent package a submodule import runs first is
    not counted: it is already importing when its own modules are.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".")
                package = package[: len(package) - node.level + (1 if is_package else 0)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            else:
                assert node.module is not None
                base = node.module
            for alias in node.names:
                found.add(sub if (sub := f"{base}.{alias.name}") in modules else base)
    return found & modules - {module}


def package_graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package tree it imports."""
    paths = sorted(folder.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p.read_text(), module_name(p), p.name == "__init__.py", modules)
            for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that returns to its start, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if (cycle := visit(start)) is not None:
            return cycle
    return None


def test_placement_imports_count_function_level_type_checking_and_relative_ones():
    modules = {"exporter.placement.a", "exporter.placement.b", "exporter.placement.c",
               "exporter.placement.d", "exporter.placement"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from exporter.placement.b import B\n"
        "def f():\n"
        "    import exporter.placement.c\n"
        "from . import d\n"
        "from exporter.placement import POLICIES\n"
    )
    assert imports(source, "exporter.placement.a", False, modules) == modules - {"exporter.placement.a"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_placement_modules_import_each_other_without_a_cycle():
    graph = package_graph(REPO / "exporter" / "placement")
    # the graph was read: the engine calls the policies, and both take tasks from task.py
    assert {f"{PACKAGE}.policies", f"{PACKAGE}.task"} <= graph[f"{PACKAGE}.engine"]
    assert f"{PACKAGE}.task" in graph[f"{PACKAGE}.policies"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or ())}"


def test_no_import_cycle_anywhere_in_exporter():
    """Counting imports inside functions and under TYPE_CHECKING: the sim source builds the
    simulator inside build(), and the simulator reads the source's options from their own
    module, not from the source."""
    graph = package_graph(REPO / "exporter")
    assert len(graph) > 60 and "exporter.simulation.fleet" in graph["exporter.sources.sim.source"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or ())}"
