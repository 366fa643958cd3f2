"""A lean node (issue 45, Build 5): node mode (``gpufleet serve`` on NVML, analysis and
advisor off) serves /metrics, its health endpoints and its snapshot without loading numpy
or any of the advisor's modules: numpy is 73 MB of a node's install and 17 MB of its memory
(docs/performance.md, "A lean node")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, free_port, http_get, stop, wait_http
from tests.helpers.fake_pynvml import node_launcher

# the fake pynvml loaded from its file (the tests package imports pytest, and pytest numpy
# where it is installed); the modules the process loaded are written at its exit
LAUNCHER = node_launcher(
    prelude='import atexit\nout = sys.argv[2]\n'
            'atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))',
    first_arg=3)

NODE_CONFIG = """\
collect_interval: 0.2s
analysis: {enabled: false}
advisor: {enabled: false}
sources: {sim: {enabled: false}, nvml: {enabled: true}}
"""


def test_node_mode_loads_no_numpy_and_nothing_of_the_advisor(tmp_path: Path):
    config = tmp_path / "node.yaml"
    config.write_text(NODE_CONFIG)
    modules = tmp_path / "modules.txt"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(REPO / "tests" / "helpers" / "fake_pynvml.py"),
         str(modules), "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("w"))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/-/ready", timeout=60, proc=proc)
        for _ in range(3):  # several cycles, each rendered
            metrics = http_get(f"{url}/metrics").decode()
        assert metrics.count("\ngpufleet_gpu_up{") == 8
        assert 'gpufleet_gpu_utilization_ratio{' in metrics
        http_get(f"{url}/-/healthy")
        assert b'"gpus"' in http_get(f"{url}/v1/snapshot")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        stop(proc)
    loaded = modules.read_text().split()
    assert "exporter.web.server" in loaded and "exporter.sources.nvml.source" in loaded
    assert "numpy" not in maps  # no numpy library mapped, whoever would have imported it
    assert [m for m in loaded if m == "numpy" or m.startswith("numpy.")] == []
    assert [m for m in loaded if m.startswith(("exporter.advisor.", "exporter.analysis.index",
                                               "exporter.placement", "exporter.pool_load"))
            and m not in ("exporter.advisor.token_file",)] == []
