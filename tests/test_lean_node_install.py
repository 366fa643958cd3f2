"""A lean node's install: numpy is the [analysis] extra, not a core dependency (issue 45).

A node's install is ``pip install .`` (docs/deploy.md): its packages must not bring numpy,
node mode must serve everything a node serves in a process where numpy cannot be imported,
and what does need numpy says so in one line naming the extra.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from importlib import metadata
from pathlib import Path

from tests.helpers import REPO, free_port, http_get, stop, wait_http
from tests.helpers.fake_pynvml import node_launcher

# numpy refused at import, as in an install without it; the fake pynvml from its file (the
# tests package imports pytest, and pytest numpy where it is installed)
LAUNCHER = node_launcher(prelude="""
import importlib.abc

class NoNumpy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoNumpy())""")

NODE_CONFIG = """\
collect_interval: 0.2s
analysis: {enabled: false}
advisor: {enabled: false}
api: {require_token_for_reads: true}
sources: {sim: {enabled: false}, nvml: {enabled: true}}
"""


def _requirement_names(distribution: str, extras: tuple[str, ...] = ()) -> set[str]:
    """The names ``distribution`` (installed here) requires, with ``extras``' own."""
    names = set()
    for requirement in metadata.requires(distribution) or []:
        name, _, marker = requirement.partition(";")
        wanted = re.findall(r'extra\s*==\s*"([^"]+)"', marker)
        if wanted and not set(wanted) & set(extras):
            continue
        if not wanted and "extra" in marker:
            continue
        names.add(re.split(r"[\s<>=!~\[(]", name.strip(), maxsplit=1)[0].lower().replace("_", "-"))
    return names


def _closure(names: set[str]) -> set[str]:
    """``names`` and everything their installed distributions require, transitively."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        with contextlib.suppress(metadata.PackageNotFoundError):  # a platform's, not installed here
            todo.extend(_requirement_names(name) - seen)
    return seen


def _names(specs: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[(;]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs}


def test_a_node_install_brings_no_numpy_and_every_install_that_analyses_does():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    core = _closure(_names(project["dependencies"]))
    assert "aiohttp" in core and "multidict" in core  # the closure follows requirements
    assert "numpy" not in core, sorted(core)
    assert _names(extras["analysis"]) == {"numpy"}
    # [all] (the full image, make test, the README) brings numpy, through matplotlib
    everything: set[str] = set()
    for spec in extras["all"]:
        inner = re.fullmatch(r"gpufleet\[(.+)\]", spec)
        assert inner, spec
        for extra in inner.group(1).split(","):
            everything |= _names(extras[extra])
    assert "numpy" in _closure(everything)
    # make run serves the simulated fleet: its install names the extra
    assert "pip install --disable-pip-version-check '.[analysis]' -q .\n" in (REPO / "Makefile").read_text()


def _run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(REPO / "tests" / "helpers" / "fake_pynvml.py"), *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _one_line_naming_analysis(stderr: str, what: str) -> None:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(f"gpufleet: {what} needs numpy, which is not installed: "
                             "pip install 'gpufleet[analysis]'"), stderr


def test_without_numpy_what_needs_it_is_one_line_naming_the_extra(tmp_path: Path):
    for command in ("analyze", "replay", "load", "plan"):
        done = _run([command, "--help"], tmp_path)
        assert done.returncode == 2, (command, done.stderr)
        _one_line_naming_analysis(done.stderr, f"gpufleet {command}")
    # serve on the simulated fleet (the default): before it listens
    done = _run(["serve", "--listen", f"127.0.0.1:{free_port()}"], tmp_path)
    assert done.returncode == 2, done.stderr
    _one_line_naming_analysis(done.stderr.splitlines()[-1] + "\n", "gpufleet serve with analysis, "
                              "the advisor or sources.sim (node mode has none)")


def test_node_mode_without_numpy_serves_its_guarded_reads(tmp_path: Path):
    config = tmp_path / "node.yaml"
    config.write_text(NODE_CONFIG)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUFLEET_ADVISOR_TOKEN": "node-secret"}
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(REPO / "tests" / "helpers" / "fake_pynvml.py"),
         "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("w"))
    url = f"http://127.0.0.1:{port}"

    def status(path: str, token: str | None = None) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers),
                                        timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    try:
        wait_http(f"{url}/-/ready", timeout=60, proc=proc)
        assert http_get(f"{url}/metrics").decode().count("\ngpufleet_gpu_up{") == 8
        assert status("/v1/snapshot")[0] == 401
        assert status("/v1/snapshot", "wrong")[0] == 401
        code, body = status("/v1/snapshot", "node-secret")
        assert code == 200 and b'"gpus"' in body
        code, body = status("/v1/openapi.json")  # the advisor's document needs numpy
        assert code == 501
        assert b"GET /v1/openapi.json needs numpy" in body and b"gpufleet[analysis]" in body
        assert proc.poll() is None
    finally:
        stop(proc)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
