"""End to end: `gpufleet serve --source dcgm` as a real process reads three dcgm-exporter
endpoints (real samples served by `python -m http.server`), one of them down, and its
/metrics passes `promtool check metrics`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import data_dir, free_port, http_get, require_binary, stop, wait_http
from tests.helpers.exported import Exported

SAMPLES = data_dir() / "dcgm-samples"


def _serve_file(directory: Path, sample: str) -> tuple[subprocess.Popen, str]:
    directory.mkdir(parents=True)
    shutil.copy(SAMPLES / sample, directory / "metrics")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1", "--directory", str(directory)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_http(url, proc=proc)
    except Exception:
        stop(proc)
        raise
    return proc, url


def test_serve_dcgm_with_one_target_down(tmp_path: Path, exporter_factory):
    promtool = require_binary("promtool")
    servers = []
    try:
        for sample in ("h100-8gpu-k8s-pod-labels.prom", "a100-mig-docs.prom"):
            proc, url = _serve_file(tmp_path / sample, sample)
            servers.append((proc, url))
        down = f"http://127.0.0.1:{free_port()}/metrics"
        urls = [servers[0][1], down, servers[1][1]]
        exporter = exporter_factory("--source", "dcgm", config=(
            "collect_interval: 1s\n"
            "sources:\n"
            "  dcgm:\n"
            f"    targets: [{', '.join(urls)}]\n"
            "    timeout: 1s\n"
            "    pool: gpu-h100\n"))
        body = http_get(f"{exporter.url}/metrics").decode()
        for _ in range(50):  # the first collection may still be on its way
            if "gpufleet_gpu_up" in body:
                break
            time.sleep(0.2)
            body = http_get(f"{exporter.url}/metrics").decode()
        out = Exported(body)
        assert out.value("gpufleet_source_up", source="dcgm", target=down) == 0
        assert out.value("gpufleet_source_up", source="dcgm", target=urls[0]) == 1
        assert out.value("gpufleet_source_up", source="dcgm", target=urls[2]) == 1
        assert len(out.all("gpufleet_gpu_up", pool="gpu-h100")) == 9
        assert out.value("gpufleet_gpu_allocation_info", gpu="0", node="gpu-node-1",
                         pod="vllm-agg-0-vllmdecodeworker-s65j5") == 1
        assert out.value("gpufleet_gpu_mig_instance_info", node="ub20-a100-k8s",
                         profile="1g.5gb", gpu_instance="13") == 1
        check = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                               capture_output=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        for proc, _ in servers:
            stop(proc)
