"""Issue 32, Build 1: the watchdog. GpufleetSnapshotStale fires in a real Prometheus on a
target whose served snapshot stopped aging (a collection that stalled, /metrics still
answering with the last snapshot), and not on one that keeps up."""

from __future__ import annotations

import sys
import time

import pytest
import yaml

from tests.helpers import REPO, free_port, start_server, stop


@pytest.mark.slow
def test_a_snapshot_that_stopped_aging_fires_gpufleet_snapshot_stale_in_a_real_prometheus(
        tmp_path, prometheus_factory, capsys):
    from exporter.cli import main

    rules = tmp_path / "rules"
    assert main(["rules", "--out", str(rules), "--for-scale", "0.01",
                 "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    capsys.readouterr()
    # two targets' /metrics as files: one snapshot taken 5 min ago and never again (the
    # stalled exporter keeps serving it), one renewed by the test as a live one's would be
    stalled, live = tmp_path / "stalled", tmp_path / "live"
    for folder in (stalled, live):
        folder.mkdir()
    line = "gpufleet_snapshot_timestamp_seconds {:.3f}\n"
    (stalled / "metrics").write_text(line.format(time.time() - 300))
    (live / "metrics").write_text(line.format(time.time()))
    ports = {"stalled": free_port(), "live": free_port()}
    servers = [start_server(name, folder, ports[name],
                            [sys.executable, "-m", "http.server", str(ports[name]),
                             "--bind", "127.0.0.1"], ready_path="/metrics")
               for name, folder in (("stalled", stalled), ("live", live))]
    try:
        prom = prometheus_factory(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules / "gpufleet-alerts.yaml")],
            "scrape_configs": [{"job_name": "gpufleet-nodes", "scrape_interval": "1s",
                                "scrape_timeout": "1s", "static_configs": [{"targets": [
                                    f"127.0.0.1:{ports['stalled']}",
                                    f"127.0.0.1:{ports['live']}"]}]}]}))
        deadline = time.monotonic() + 60
        firing: list[dict] = []
        while time.monotonic() < deadline and not firing:
            (live / "metrics").write_text(line.format(time.time()))
            firing = prom.query('ALERTS{alertname="GpufleetSnapshotStale",alertstate="firing"}')
            time.sleep(0.5)
        assert [r["metric"]["instance"] for r in firing] == [f"127.0.0.1:{ports['stalled']}"]
        assert firing[0]["metric"]["severity"] == "warning"
    finally:
        for proc in servers:
            stop(proc)
