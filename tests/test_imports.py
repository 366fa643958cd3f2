"""Import structure: no module of exporter/ imports, through any chain, one that imports it.

Read from the source with ``ast`` rather than by importing, so that every import
counts: top-level ones, those inside functions, and those under
``if TYPE_CHECKING:``, which never run but still tie two modules together.
"""

from __future__ import annotations

import ast
import re
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
    assert len(graph) > 60 and "exporter.fleet_sim.fleet" in graph["exporter.sources.sim.source"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or ())}"


def package_of(module: str) -> str:
    """The package a module belongs to, one level below ``exporter``: ``exporter.pool_load.tracker``
    and ``exporter.sources.sim.source`` collapse to ``exporter.pool_load`` and ``exporter.sources``;
    a top-level module (``exporter.config``) is its own node."""
    return ".".join(module.split(".")[:2])


def packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with every module collapsed to its package (imports inside one
    package dropped: a package's modules may use each other, the module test checks them)."""
    out: dict[str, set[str]] = {}
    for module, imported in graph.items():
        package = package_of(module)
        out.setdefault(package, set()).update(package_of(m) for m in imported)
        out[package].discard(package)
    return out


def test_packages_collapse_modules_and_a_cycle_through_two_packages_is_found():
    """A cycle only between packages (pool_load.tracker -> alerting.a, alerting.b -> pool_load.table)
    is no cycle of modules, and exactly what the package check must catch."""
    graph = {"exporter.pool_load.tracker": {"exporter.alerting.a"}, "exporter.alerting.a": set(),
             "exporter.alerting.b": {"exporter.pool_load.table"}, "exporter.pool_load.table": set(),
             "exporter.config": {"exporter.pool_load.tracker"}}
    assert find_cycle(graph) is None
    assert packages(graph) == {"exporter.pool_load": {"exporter.alerting"},
                               "exporter.alerting": {"exporter.pool_load"},
                               "exporter.config": {"exporter.pool_load"}}
    assert find_cycle(packages(graph)) == ["exporter.alerting", "exporter.pool_load",
                                           "exporter.alerting"]


def test_no_import_cycle_between_packages():
    """The threshold table is its own leaf package (exporter.thresholds), read by alerting
    and pool_load alike, so neither imports the other back; the fleet simulator types what it
    reads of the sim source's options with protocols (exporter.fleet_sim.config), so sources ->
    fleet_sim is the only direction; the analysis declares its own options
    (exporter.analysis.options), which the config assembles."""
    graph = packages(package_graph(REPO / "exporter"))
    # analysis reads its options from exporter/analysis/options.py, never the config module:
    # config -> sources (the registry) -> fleet_sim -> placement -> analysis would close
    # a cycle through it
    assert "exporter.config" not in graph["exporter.analysis"]
    assert "exporter.analysis" in graph["exporter.config"]
    # the graph was read: the real edges are there
    assert {"exporter.thresholds", "exporter.metrics"} <= graph["exporter.alerting"]
    assert "exporter.thresholds" in graph["exporter.pool_load"]
    assert "exporter.fleet_sim" in graph["exporter.sources"]
    assert not graph["exporter.thresholds"] & {"exporter.alerting", "exporter.pool_load"}
    assert find_cycle(graph) is None, f"package import cycle: {' -> '.join(find_cycle(graph) or ())}"


# A string that can serve as the threshold table's path: "thresholds.yaml",
# "rules/thresholds.yaml", the "/thresholds.yaml" piece of an f-string. Prose that mentions
# the file (a --help line, a docstring) is not a path and does not open it.
TABLE_PATH = re.compile(r"[\w./\\-]*thresholds\.yaml")
LOADER = "exporter/thresholds/table.py"


def string_literals(source: str) -> list[ast.Constant]:
    """Every string literal of ``source`` (f-strings' literal parts too), docstrings aside:
    they explain, they neither open a file nor build a query."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]


def table_paths(source: str) -> list[int]:
    """Lines of ``source`` where a string literal, docstrings aside, is a path to the table."""
    return [node.lineno for node in string_literals(source)
            if TABLE_PATH.fullmatch(str(node.value).strip())]


def test_the_table_path_check_sees_opens_and_skips_prose():
    source = ('"""Reads rules/thresholds.yaml."""\n'
              'import yaml\n'
              'def f(folder):\n'
              '    """Opens thresholds.yaml."""\n'
              '    yaml.safe_load(open("rules/thresholds.yaml"))\n'
              '    HELP = "default: rules/thresholds.yaml here"\n'
              '    return Path(folder) / "thresholds.yaml", f"{folder}/thresholds.yaml"\n')
    assert table_paths(source) == [5, 7, 7]


def test_only_the_table_loader_names_the_threshold_table_file():
    """Issue 27: one loader. Any other module of exporter/ that spells the table's path
    (to open it, to build it, to hand it to yaml) reads the table behind the loader's back."""
    named = {str(path.relative_to(REPO)): lines for path in sorted((REPO / "exporter").rglob("*.py"))
             if (lines := table_paths(path.read_text()))}
    assert set(named) == {LOADER}, f"only {LOADER} may name the threshold table's file: {named}"
