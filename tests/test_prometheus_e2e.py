"""A real Prometheus (Debian's package) scrapes a real exporter process."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # a real Prometheus


def test_prometheus_counts_every_simulated_gpu(exporter_factory, prometheus_factory):
    exporter = exporter_factory("--seed", "7")
    prom = prometheus_factory(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpufleet
    static_configs:
      - targets: ["127.0.0.1:{exporter.port}"]
""")
    result = prom.wait_for(
        "count(gpufleet_gpu_utilization_ratio)", lambda r: bool(r), timeout=60
    )
    assert float(result[0]["value"][1]) == 128  # the tests' small simulated fleet
    up = prom.query('up{job="gpufleet"}')
    assert [float(r["value"][1]) for r in up] == [1.0]
    # every pool of the reference cluster is there, with its GPU count (4 nodes of 8 each)
    pools = {
        r["metric"]["pool"]: float(r["value"][1])
        for r in prom.query("count by (pool) (gpufleet_gpu_info)")
    }
    assert pools == {"gpu-h200": 32, "gpu-h100": 32, "gpu-a100": 32, "gpu-b200": 32}
