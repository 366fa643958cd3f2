"""The two commands, CI and the Dockerfile stay what the README promises."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


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


def test_default_port_is_not_dcgm_or_nvidia_gpu_exporter():
    from exporter.config import DEFAULT_PORT

    assert DEFAULT_PORT not in (9400, 9835, 9090, 9093, 9100)
    assert f"EXPOSE {DEFAULT_PORT}" in (REPO / "Dockerfile").read_text()
