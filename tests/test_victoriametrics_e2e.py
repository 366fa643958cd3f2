"""The generated rules on VictoriaMetrics (issue 29, Build 3): a real victoria-metrics fed by
a real vmagent scraping a static exposition, the rules evaluated by a real vmalert.

VictoriaMetrics' ``increase()`` counts a new series' first value as growth from 0, so an
``increase()`` alert on a driver lifetime counter opens a ticket (or pages) for every GPU
first seen with an old NVLink or ECC count; Prometheus sees none. The rules alert on growth
(now less the window's lowest value) instead, which both engines read the same way. These
tests run the rules as ``gpufleet rules`` writes them, with ``--time-scale`` so that every
``for`` and window fits a test, and check vmalert loads them as they are, raises nothing
for such GPUs, and still raises GpuPowerHigh (so "nothing" is not a dead pipeline).

Debian's ``victoria-metrics`` package (1.79) provides the three servers; ``make test``
installs it (the Makefile's vm-deps).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from exporter.cli import main
from tests.helpers import REPO, require_binary
from tests.helpers.servers import (
    free_port,
    http_get,
    start_server,
    stop,
    wait_http,
    wait_until,
)

pytestmark = pytest.mark.slow

TIME_SCALE = 0.01  # for: 5m -> 3s, 15m -> 9s; windows: [10m] -> [6s], [5m] -> [3s]
_GPU = 'cluster="lab",node="gpu-{node}",gpu="{gpu}",uuid="GPU-{node}-{gpu}",model="{model}",pool="p"'

# GPUs first seen with old lifetime counters (small values: VictoriaMetrics' increase()
# counts a first value below 10 x the next delta + 1 as growth), and two GPUs over their
# power levels with the power brake on, the pipeline's live check: an H200 (the table's 700 W)
# and an H100 with no reported limit (the exporter serves its catalogue TDP, 700 W, as its limit).
EXPOSITION = "\n".join([
    *(f"gpufleet_gpu_nvlink_errors_total{{{_GPU.format(node='001', gpu=g, model='H100')},"
      f'type="{t}"}} {v}' for g in (0, 1) for t, v in (("replay", 5), ("recovery", 3),
                                                         ("crc_flit", 7))),
    *(f"gpufleet_gpu_ecc_errors_total{{{_GPU.format(node='001', gpu=g, model='H100')},"
      f'type="double_bit",counter="{c}"}} 2' for g in (0, 1) for c in ("volatile", "aggregate")),
    f"gpufleet_gpu_power_watts{{{_GPU.format(node='002', gpu=0, model='H200')}}} 710",
    f"gpufleet_gpu_power_watts{{{_GPU.format(node='002', gpu=1, model='H100')}}} 700",
    f"gpufleet_gpu_power_watts{{{_GPU.format(node='001', gpu=0, model='H100')}}} 100",
    f"gpufleet_gpu_power_limit_watts{{{_GPU.format(node='001', gpu=0, model='H100')}}} 700",
    # what the exporter serves as the H100's limit where it reports none: its TDP (issue 45)
    f"gpufleet_gpu_power_limit_effective_watts{{{_GPU.format(node='002', gpu=1, model='H100')}}} 700",
    # GpuPowerHigh's evidence of a fault: the power brake on both (issue 44)
    *(f"gpufleet_gpu_clock_event_active{{{_GPU.format(node='002', gpu=g, model=m)},"
      'reason="hw_power_brake"} 1' for g, m in ((0, "H200"), (1, "H100"))),
    "",
])
COUNTER_ALERTS = {"GpuNvlinkErrors", "GpuNvlinkCrcErrors", "GpuEccUncorrectable"}


def _start(name: str, workdir: Path, port: int, args: list[str]) -> subprocess.Popen:
    return start_server(name, workdir, port, [require_binary(name), *args], ready_path="/health")


def _json(url: str) -> dict:
    return json.loads(http_get(url))


def _firing(vmalert: str) -> dict[tuple[str, str], set[str]]:
    """(alertname, severity) -> the GPUs (node/gpu) vmalert has firing or pending."""
    out: dict[tuple[str, str], set[str]] = {}
    for alert in _json(f"{vmalert}/api/v1/alerts")["data"]["alerts"] or []:
        labels = alert["labels"]
        key = (labels["alertname"], labels.get("severity", ""))
        out.setdefault(key, set()).add(f"{labels.get('node')}/{labels.get('gpu')}:{alert['state']}")
    return out


@pytest.fixture
def rule_files(tmp_path: Path) -> list[Path]:
    out = tmp_path / "rules"
    assert main(["rules", "--thresholds", str(REPO / "rules" / "thresholds.yaml"),
                 "--out", str(out), "--time-scale", str(TIME_SCALE)]) == 0
    return [out / "gpufleet-recording.yaml", out / "gpufleet-alerts.yaml"]


def test_vmalert_accepts_the_committed_rules_as_they_are():
    committed = [REPO / "rules" / "gpufleet-recording.yaml", REPO / "rules" / "gpufleet-alerts.yaml"]
    result = subprocess.run([require_binary("vmalert"), "-dryRun",
                             *(f"-rule={path}" for path in committed)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_vmagent_parses_the_shipped_scrape_config_strictly_and_it_matches_prometheus_yml():
    vmagent = REPO / "deploy" / "vmagent.yml"
    result = subprocess.run([require_binary("vmagent"), f"-promscrape.config={vmagent}",
                             "-promscrape.config.strictParse=true", "-dryRun"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    prometheus = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    assert yaml.safe_load(vmagent.read_text())["scrape_configs"] == prometheus["scrape_configs"]
    # the guide's vmagent config is this file's
    guide = (REPO / "docs" / "deploy.md").read_text()
    assert "deploy/vmagent.yml" in guide and "-promscrape.config=" in guide


def test_vmalert_over_victoriametrics_raises_nothing_for_gpus_first_seen_with_old_counters(
        tmp_path: Path, rule_files: list[Path]):
    site = tmp_path / "site"
    site.mkdir()
    (site / "metrics").write_text(EXPOSITION)
    procs: list[subprocess.Popen] = []
    try:
        file_port, vm_port, agent_port, alert_port = (free_port() for _ in range(4))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "http.server", str(file_port), "--bind", "127.0.0.1",
             "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{file_port}/metrics", timeout=30, proc=procs[-1])
        vm = f"http://127.0.0.1:{vm_port}"
        # latencyOffset 0: VictoriaMetrics hides the newest 30 s from queries by default
        procs.append(_start("victoria-metrics", tmp_path, vm_port, [
            f"-storageDataPath={tmp_path / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{vm_port}",
            "-retentionPeriod=1", "-search.latencyOffset=0s"]))
        scrape = tmp_path / "vmagent.yml"
        scrape.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "gpufleet-nodes", "scrape_interval": "1s",
                                "static_configs": [{"targets": [f"127.0.0.1:{file_port}"]}]}]}))
        procs.append(_start("vmagent", tmp_path, agent_port, [
            f"-promscrape.config={scrape}", "-promscrape.config.strictParse=true",
            f"-remoteWrite.url={vm}/api/v1/write", f"-remoteWrite.tmpDataPath={tmp_path / 'q'}",
            "-remoteWrite.flushInterval=500ms", f"-httpListenAddr=127.0.0.1:{agent_port}"]))
        vmalert = f"http://127.0.0.1:{alert_port}"
        procs.append(_start("vmalert", tmp_path, alert_port, [
            *(f"-rule={path}" for path in rule_files), f"-datasource.url={vm}",
            f"-remoteWrite.url={vm}", "-evaluationInterval=1s",
            f"-notifier.url=http://127.0.0.1:{free_port()}",
            f"-httpListenAddr=127.0.0.1:{alert_port}"]))

        # every rule loaded as generated: same groups, same rule count, no evaluation error
        generated = [g for path in rule_files for g in yaml.safe_load(path.read_text())["groups"]]
        loaded = {g["name"]: g for g in _json(f"{vmalert}/api/v1/rules")["data"]["groups"]}
        assert {g["name"]: len(g["rules"]) for g in generated} == {
            name: len(g["rules"]) for name, g in loaded.items()}

        # the old shape would have fired: VictoriaMetrics counts these first values as growth
        def vm_increase() -> list:
            query = urllib.parse.urlencode({"query": 'increase(gpufleet_gpu_nvlink_errors_total'
                                                     '{type="recovery"}[5m])'})
            return [r for r in _json(f"{vm}/api/v1/query?{query}")["data"]["result"]
                    if float(r["value"][1]) > 0]
        assert len(wait_until("the exposition in VictoriaMetrics", vm_increase, timeout=60)) == 2

        # the live check: both power GPUs go critical (for 5m -> 3 s) ...
        def power_critical() -> set[str] | None:
            gpus = _firing(vmalert).get(("GpuPowerHigh", "critical"), set())
            return gpus if {"gpu-002/0:firing", "gpu-002/1:firing"} <= gpus else None
        assert wait_until("GpuPowerHigh critical on both power GPUs", power_critical,
                          timeout=90) == {"gpu-002/0:firing", "gpu-002/1:firing"}
        # ... while no counter alert was ever pending or firing, over more than its window
        for _ in range(15):
            assert not {key for key in _firing(vmalert) if key[0] in COUNTER_ALERTS}
            time.sleep(1)
        errors = {rule["name"]: rule["lastError"]
                  for g in _json(f"{vmalert}/api/v1/rules")["data"]["groups"]
                  for rule in g["rules"] if rule.get("lastError")}
        assert errors == {}
    finally:
        for proc in reversed(procs):
            stop(proc)
