"""The ``gpufleet`` command line: only the command that runs is imported."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.helpers import REPO

HEAVY = ("numpy", "aiohttp", "grafanalib", "matplotlib", "prometheus_client", "exporter.analysis")

PROBE = """
import contextlib, io, sys
from exporter.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
    main({argv!r})
print(sorted(m for m in {heavy!r} if m in sys.modules))
print(out.getvalue())
"""


def probe(argv: list[str]) -> tuple[list[str], str]:
    """Heavy modules loaded after ``main(argv)`` in a fresh interpreter, and what it printed."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    loaded, printed = done.stdout.split("\n", 1)
    return ast.literal_eval(loaded), printed


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_version_and_help_import_no_command_module(argv):
    loaded, printed = probe(argv)
    assert loaded == []
    if argv == ["--version"]:
        assert printed.startswith("gpufleet 0.")
    else:
        for command in ("serve", "analyze", "rules", "dashboards", "replay"):
            assert command in printed


def test_a_command_imports_its_own_module_only():
    loaded, printed = probe(["rules", "--help"])
    assert "numpy" not in loaded and "aiohttp" not in loaded and "matplotlib" not in loaded
    assert "usage: gpufleet rules" in printed
    loaded, printed = probe(["analyze", "--help"])
    assert "--trace NAME" in printed and "numpy" in loaded


def test_serve_help_imports_neither_the_server_nor_numpy():
    """issue 30: ``serve --help`` imported the server, aiohttp and numpy to build its parser
    (0.9 s of CPU); it needs only the option declarations."""
    loaded, printed = probe(["serve", "--help"])
    assert "numpy" not in loaded and "aiohttp" not in loaded, loaded
    assert "usage: gpufleet serve" in printed and "sources.prometheus.selector" in printed


def test_unknown_command_is_a_usage_error(capsys):
    from exporter.cli import main

    with pytest.raises(SystemExit) as raised:
        main(["bogus"])
    assert raised.value.code == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err


def test_no_module_imports_the_cli():
    """cli.py imports the command modules, so they (and what they import) take UsageError
    from exporter.errors: importing exporter.cli back would be an import cycle."""
    for path in sorted((REPO / "exporter").rglob("*.py")):
        if path.name == "__main__.py" or path.name == "cli.py":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        assert "exporter.cli" not in imported, path
    from exporter import cli, errors

    assert cli.UsageError is errors.UsageError and cli.ConfigError is errors.ConfigError


@pytest.mark.parametrize("command", ["serve", "rules", "dashboards"])
def test_a_bad_flag_shows_its_own_commands_usage(command, capsys):
    """issue 15: ``gpufleet serve --bogus`` printed the top-level usage, not serve's."""
    from exporter.cli import main

    with pytest.raises(SystemExit) as raised:
        main([command, "--bogus"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gpufleet {command} ")
    assert f"gpufleet {command}: error: unrecognized arguments: --bogus" in err


def test_a_bad_flag_before_the_command_is_the_top_levels(capsys):
    from exporter.cli import main

    with pytest.raises(SystemExit) as raised:
        main(["--bogus"])
    assert raised.value.code == 2
    assert capsys.readouterr().err.startswith("usage: gpufleet [-h]")
