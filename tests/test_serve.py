"""``gpufleet serve`` as a real process: URL printed, signals, logs."""

from __future__ import annotations

import json
import signal

import pytest

from tests.helpers import http_get


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(exporter_factory, sig):
    exporter = exporter_factory("--seed", "3")
    assert http_get(f"{exporter.url}/-/healthy") == b"gpufleet is healthy.\n"
    exporter.proc.send_signal(sig)
    assert exporter.proc.wait(timeout=15) == 0
    log = exporter.log.read_text()
    assert f"gpufleet serving the simulated fleet at http://127.0.0.1:{exporter.port}/metrics" in log
    assert "msg=stopped" in log
    assert "Traceback" not in log


def test_json_logs_are_one_object_per_line(exporter_factory):
    exporter = exporter_factory("--log-format", "json", "--log-level", "debug")
    http_get(f"{exporter.url}/metrics")
    exporter.proc.terminate()
    exporter.proc.wait(timeout=15)
    lines = [line for line in exporter.log.read_text().splitlines()
             if line.startswith("{")]
    assert lines
    events = [json.loads(line) for line in lines]
    assert {"ts", "level", "logger", "msg"} <= set(events[0])
    assert any(e["msg"] == "collected" and e["gpus"] == 128 for e in events)  # the small fleet


def test_sim_source_config_file_and_seed_flag(exporter_factory):
    config = ("sources:\n  sim:\n    seed: 1\n    scenarios:\n"
              "      - {kind: gpu_lost, node: gpu-002, gpu: 5}\n")
    exporter = exporter_factory("--seed", "9", config=config)
    text = http_get(f"{exporter.url}/metrics").decode()
    assert 'gpufleet_gpu_up{gpu="5",model="H200",node="gpu-002",pool="gpu-h200"' in text
    line = next(ln for ln in text.splitlines()
                if ln.startswith('gpufleet_gpu_up{gpu="5",model="H200",node="gpu-002"'))
    assert line.endswith(" 0.0")


def test_the_start_line_names_the_address_bound_not_a_guess():
    from exporter.cli.serve import metrics_url

    assert metrics_url(("127.0.0.1", 9874)) == "http://127.0.0.1:9874/metrics"
    assert metrics_url(("0.0.0.0", 9874)) == "http://0.0.0.0:9874/metrics (every IPv4 interface)"
    assert metrics_url(("::", 9874, 0, 0)) == "http://[::]:9874/metrics (every interface)"
    assert metrics_url(("::1", 9999, 0, 0)) == "http://[::1]:9999/metrics"
