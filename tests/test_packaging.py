"""The two commands, CI and the Dockerfile stay what the README promises."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


def test_readme_quick_start_is_exactly_make_run_and_make_test():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]


def test_ci_runs_make_test():
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci


def test_hadolint_passes_on_the_dockerfile():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(REPO / "Dockerfile")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_like_the_makefile():
    dockerfile = (REPO / "Dockerfile").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"RUN pip install --no-cache-dir \.(\s|$)", dockerfile)
    assert re.search(r"pip install .*-q \.$", makefile, re.M)
    assert 'ENTRYPOINT ["gpufleet", "serve"]' in dockerfile
    assert "HEALTHCHECK" in dockerfile and "/-/healthy" in dockerfile
    assert re.search(r"^USER (?!root|0\b)", dockerfile, re.M)


def test_the_image_carries_the_generated_rules_and_dashboards():
    """issue 15: the image had no rules/; they sit in /usr/share/gpufleet for copying out."""
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY rules/gpufleet-*.yaml /usr/share/gpufleet/rules/" in dockerfile
    assert "COPY dashboards/*.json /usr/share/gpufleet/dashboards/" in dockerfile
    assert list((REPO / "rules").glob("gpufleet-*.yaml"))
    assert list((REPO / "dashboards").glob("*.json"))


def test_default_port_is_not_dcgm_or_nvidia_gpu_exporter():
    from exporter.config import DEFAULT_PORT

    assert DEFAULT_PORT not in (9400, 9835, 9090, 9093, 9100)
    assert f"EXPOSE {DEFAULT_PORT}" in (REPO / "Dockerfile").read_text()


@pytest.mark.slow
def test_installed_package_replays_and_analyzes_the_built_in_trace(tmp_path):
    """`pip install .` carries the default openb trace: no file, no checkout, no GPUFLEET_DATA."""
    site, work = tmp_path / "site", tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                    "--no-deps", "--target", str(site), str(REPO)], check=True, timeout=300,
                   capture_output=True)
    assert sorted(p.name for p in (site / "exporter" / "traces").iterdir()) == [
        "hourly_summary.csv", "openb_node_list_gpu_node.csv.gz", "openb_pod_list_default.csv.gz"]
    # simulate's arrival series, shipped: the same bytes as data/'s
    assert (site / "exporter" / "traces" / "hourly_summary.csv").read_bytes() == (
        REPO / "data" / "alibaba-spot-gpu-v2026" / "hourly_summary.csv").read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_DATA"}
    env["PYTHONPATH"] = str(site)  # the installed copy, not this checkout

    def run(*argv: str) -> str:
        done = subprocess.run([sys.executable, *argv], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run("-c", "import exporter; print(exporter.__file__)").startswith(str(site))
    # the threshold table is package data (a copy of rules/thresholds.yaml, which it links to
    # in the checkout), so the defaults it gives work outside a checkout
    table = site / "exporter" / "thresholds.yaml"
    assert not table.is_symlink() and table.read_text() == (REPO / "rules" / "thresholds.yaml").read_text()
    # and the runbooks serve shows at /runbooks (issue 29), copied the same way
    runbooks = site / "exporter" / "runbooks.md"
    assert not runbooks.is_symlink() and runbooks.read_text() == (REPO / "docs" / "runbooks.md").read_text()
    from exporter.thresholds import load_thresholds

    level = load_thresholds(REPO / "rules" / "thresholds.yaml").compaction_threshold()
    assert run("-c", "from exporter.config import Config; print(Config().advisor.trigger)") == f"{level}\n"
    replayed = run("-m", "exporter", "replay", "--out", "out", "--policy", "fgd", "--arrive", "0.05",
                   "--jobs", "1", "--no-progress")
    assert "openb_pod_list_default.csv.gz on openb_node_list_gpu_node.csv.gz: 1,213 nodes" in replayed
    assert (work / "out" / "replay.csv").is_file() and (work / "out" / "replay.png").is_file()
    analyzed = json.loads(run("-m", "exporter", "analyze", "--trace", "openb-default", "--json"))
    assert analyzed["nodes"] == 1213
    # issue 15: rules and dashboards from the installed table, outside a checkout
    run("-m", "exporter", "rules", "--out", "rules")
    run("-m", "exporter", "rules", "--out", "rules", "--format", "prometheusrule")
    for name in ("gpufleet-alerts.yaml", "gpufleet-recording.yaml", "gpufleet-prometheusrule.yaml"):
        assert (work / "rules" / name).read_text() == (REPO / "rules" / name).read_text(), name
    run("-m", "exporter", "dashboards", "--out", "dashboards")
    committed = sorted(p.name for p in (REPO / "dashboards").glob("*.json"))
    assert sorted(p.name for p in (work / "dashboards").iterdir()) == committed
    for name in committed:
        assert (work / "dashboards" / name).read_text() == (REPO / "dashboards" / name).read_text()


def test_data_folder_is_whole_and_small():
    """data/ holds what tests and default commands read: under 6 MB, each folder with its README."""
    data = REPO / "data"
    files = [p for p in data.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 6_000_000
    for folder in ("alibaba-gpu-v2023", "alibaba-spot-gpu-v2026", "dcgm-samples", "slurm-samples"):
        assert (data / folder / "README.md").is_file(), folder
    assert (data / "README.md").is_file()
    # the default trace is one copy: package data, linked from data/
    for name in ("openb_node_list_gpu_node.csv.gz", "openb_pod_list_default.csv.gz"):
        link = data / "alibaba-gpu-v2023" / "csv" / name
        assert link.is_symlink() and link.resolve() == REPO / "exporter" / "traces" / name


def test_no_test_or_bench_reaches_outside_the_repository():
    """Only GPUFLEET_DATA may point elsewhere: no sibling data folder, no path above the checkout."""
    offenders = []
    for path in [*(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py")]:
        text = path.read_text()
        # the needles are assembled so that this file does not match them itself
        needles = ("/".join(("..", "shared")), " / ".join(('"shared"', '"data"')),
                   ".".join(("REPO", "parent")), ".".join(("parent",) * 3))
        for needle in needles:
            if needle in text:
                offenders.append(f"{path.relative_to(REPO)}: {needle}")
    assert offenders == []


def test_node_mode_installs_no_optional_package():
    """issue 30, a lean node: the heavy parts only node mode does not need are extras."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for package in ("numpy", "kubernetes_asyncio", "grpcio", "protobuf", "matplotlib", "grafanalib"):
        assert not any(d.startswith(package) for d in project["dependencies"]), package
    assert extras["analysis"] == ["numpy>=1.26"]
    assert extras["cluster"] == ["kubernetes_asyncio>=36.1"]
    assert extras["podresources"] == ["grpcio>=1.85.1", "protobuf>=7.35.1"]
    assert extras["replay"] == ["matplotlib>=3.8"] and extras["dashboards"] == ["grafanalib>=0.7"]
    assert extras["all"] == ["gpufleet[analysis,cluster,podresources,replay,dashboards]"]
    from exporter.extras import EXTRA_OF

    assert set(EXTRA_OF.values()) == set(extras) - {"all", "test", "bench"}


def _one_line_naming(text: str, extra: str) -> None:
    assert "\n" not in text.strip() and f"pip install 'gpufleet[{extra}]'" in text, text


def test_a_missing_extra_is_one_line_naming_it(monkeypatch, tmp_path, capsys):
    from exporter.cli import main
    from exporter.extras import MissingExtra
    from exporter.placement import plot as replay_plot
    from exporter.pool_load import output
    from exporter.sources import SourceStartupError
    from exporter.sources.kubernetes.options import KubernetesSource
    from exporter.sources.kubernetes.source import build

    for module in ("grafanalib", "matplotlib", "kubernetes_asyncio"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    assert main(["dashboards", "--out", str(tmp_path / "d")]) == 2
    _one_line_naming(capsys.readouterr().err, "dashboards")
    assert not (tmp_path / "d").exists()
    for plot in (lambda: output.plot([], [], tmp_path / "p.png"),
                 lambda: replay_plot.plot([], tmp_path / "p.png")):
        with pytest.raises(MissingExtra) as caught:
            plot()
        _one_line_naming(str(caught.value), "replay")
    with pytest.raises(SourceStartupError) as started:
        build(KubernetesSource(enabled=True), lambda: 0.0, environ={})
    _one_line_naming(str(started.value), "cluster")
    assert str(started.value).startswith("sources.kubernetes needs kubernetes_asyncio")


def test_pod_resources_without_grpc_is_one_line_naming_the_extra(monkeypatch):
    import exporter.sources.nvml as package
    from exporter.sources import SourceStartupError
    from exporter.sources.nvml import source as nvml

    # a test before this one may have imported the module: `from package import pods` then
    # finds the package's attribute without looking at sys.modules, so both go
    monkeypatch.delattr(package, "pods", raising=False)
    monkeypatch.setitem(sys.modules, "exporter.sources.nvml.pods", None)
    monkeypatch.setitem(sys.modules, "grpc", None)
    with pytest.raises(SourceStartupError) as caught:
        nvml.build(nvml.NvmlConfig(enabled=True, pod_resources=True), lambda: 0.0)
    _one_line_naming(str(caught.value), "podresources")
