"""End to end on real servers: exporter -> Prometheus (generated rules) -> Alertmanager -> webhooks.

The exporter simulates one overheating H200 and a fragmented H100 pool. A real
Prometheus scrapes it every second and evaluates the rules `gpufleet rules`
generates with every `for` scaled by 0.01 (no YAML edited by hand). A real
Alertmanager runs the committed routing tree (deploy/alertmanager.yml, only
its webhook URLs changed and its timers scaled by the same 0.01, so a page waits
100 ms and a ticket 3 s, as 10 s and 5 min relate to the rules' `for`) and
notifies an aiohttp receiver.
"""

from __future__ import annotations

import time

import pytest

from exporter.cli import main
from tests.helpers import REPO, stop
from tests.helpers.alerting import (
    ADVISOR_TOKEN,
    WebhookReceiver,
    prometheus_config,
    routed_config,
    start_alertmanager,
)

# run alone, after the rest (make test): Prometheus' and Alertmanager's timing
# (inhibition, every `for` scaled to seconds)
pytestmark = pytest.mark.alone

FOR_SCALE = "0.01"  # 2 min -> 1.2 s, 5 min -> 3 s, 15 min -> 9 s
DEADLINE = 60.0
HOT = {"node": "gpu-001", "gpu": "3", "model": "H200", "pool": "gpu-h200"}

EXPORTER_CONFIG = f"""
collect_interval: 1s
sources:
  sim:
    seed: 7
    scenarios:
      - {{kind: overheat, node: {HOT['node']}, gpu: {HOT['gpu']}}}
      - {{kind: fragmented_pool, pool: gpu-h100}}
"""


def _is_hot_gpu(alert: dict, severity: str) -> bool:
    labels = alert["labels"]
    return (labels.get("alertname") == "GpuTemperatureHigh" and labels.get("severity") == severity
            and all(labels.get(k) == v for k, v in HOT.items()))


@pytest.mark.slow
def test_overheat_pages_inhibits_its_warning_and_fragmentation_reaches_the_advisor(
        tmp_path, exporter_factory, prometheus_factory, capsys):
    rules = tmp_path / "rules"
    assert main(["rules", "--out", str(rules), "--for-scale", FOR_SCALE,
                 "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    capsys.readouterr()
    receiver = WebhookReceiver().start()
    manager = None
    try:
        started = time.monotonic()
        # GpuClusterFragmentationHigh needs the scattered H100 pool's index above 50: 32 nodes
        exporter = exporter_factory(config=EXPORTER_CONFIG, fleet="medium")
        manager = start_alertmanager(tmp_path / "alertmanager",
                                     routed_config(receiver.url, time_scale=float(FOR_SCALE)))
        prom = prometheus_factory(prometheus_config(
            exporter.port, manager.port,
            [str(rules / "gpufleet-recording.yaml"), str(rules / "gpufleet-alerts.yaml")]))
        deadline = started + DEADLINE

        # 1. the critical GpuTemperatureHigh pages, with the GPU's labels
        paged = _wait(lambda: [a for _, a in receiver.alerts("pager") if _is_hot_gpu(a, "critical")],
                      deadline, "critical GpuTemperatureHigh at the pager receiver", prom, manager)
        alert = paged[0]
        assert alert["status"] == "firing"
        assert {k: alert["labels"][k] for k in ("alertname", "severity", *HOT)} == {
            "alertname": "GpuTemperatureHigh", "severity": "critical", **HOT}
        assert alert["labels"]["uuid"].startswith("GPU-")
        assert alert["labels"]["job"] == "gpufleet-nodes"
        assert alert["labels"]["page"] == "true"  # the table's page column, routed to the pager
        assert alert["annotations"]["runbook_url"].endswith("docs/runbooks.md#gputemperaturehigh")
        assert alert["annotations"]["description"].startswith(
            "GPU 3 on gpu-001 (H200, pool gpu-h200) is at ")
        assert "above 85 °C for 1s200ms" in alert["annotations"]["description"]
        critical_at = time.monotonic() - started
        print(f"\ncritical GpuTemperatureHigh paged after {critical_at:.1f}s")

        # 2. its warning twin reached Alertmanager, which holds it inhibited by the critical
        def warning_inhibited() -> list[dict]:
            return [a for a in manager.alerts(alertname="GpuTemperatureHigh", severity="warning",
                                              node=HOT["node"], gpu=HOT["gpu"])
                    if a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"]]

        _wait(warning_inhibited, deadline, "the warning twin inhibited in Alertmanager", prom,
              manager)
        # ... and so never reached the tickets receiver
        tickets = [a for _, a in receiver.alerts("tickets")]
        assert not [a for a in tickets if _is_hot_gpu(a, "warning")], tickets

        # 3. GpuClusterFragmentationHigh reaches the compaction receiver (the advisor)
        compaction = _wait(
            lambda: [a for _, a in receiver.alerts("gpufleet-advisor")
                     if a["labels"].get("alertname") == "GpuClusterFragmentationHigh"
                     and a["labels"].get("pool") == "gpu-h100"],
            deadline, "GpuClusterFragmentationHigh at the gpufleet-advisor receiver", prom, manager)
        assert compaction[0]["labels"]["action"] == "compact"
        assert compaction[0]["labels"]["model"] == "H100"
        assert compaction[0]["labels"]["severity"] == "warning"
        # Alertmanager authenticates to the advisor with its bearer token
        advisor_posts = [n for n in receiver.received if n.receiver == "gpufleet-advisor"]
        assert {n.authorization for n in advisor_posts} == {f"Bearer {ADVISOR_TOKEN}"}
        fragmentation_at = time.monotonic() - started

        # the hot GPU's warning stays out of the tickets after everything has arrived
        assert not [a for _, a in receiver.alerts("tickets") if _is_hot_gpu(a, "warning")]
        print(f"GpuClusterFragmentationHigh at the advisor after {fragmentation_at:.1f}s "
              f"(from exporter start; limit {DEADLINE:.0f}s)")
    finally:
        receiver.stop()
        if manager is not None:
            stop(manager.proc)


def _wait(found, deadline: float, what: str, prom, manager) -> list:
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result
        time.sleep(0.25)
    if not prom.query("gpufleet_pool_fragmentation_index"):
        what += " (the exporter serves no gpufleet_pool_fragmentation_index: is the analyzer in?)"
    firing = prom.query('ALERTS{alertstate="firing"}')
    names = sorted({(r["metric"]["alertname"], r["metric"].get("pool", "")) for r in firing})
    held = sorted({(a["labels"]["alertname"], a["status"]["state"]) for a in manager.alerts()})
    raise AssertionError(
        f"no {what} within {DEADLINE:.0f}s. Prometheus fires {names}; Alertmanager holds {held}"
    )
