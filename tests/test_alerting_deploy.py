"""deploy/alertmanager.yml and deploy/prometheus.yml: amtool, promtool and a real Alertmanager."""

from __future__ import annotations

import re
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from tests.helpers import REPO, require_binary, stop
from tests.helpers.alerting import DEPLOY_ALERTMANAGER, routed_config, start_alertmanager

GPU = {"node": "gpu-001", "gpu": "3", "uuid": "GPU-0001-3", "model": "H200", "pool": "gpu-h200",
       "job": "gpufleet", "instance": "gpufleet-0:9874"}


def _amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("amtool"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_amtool_check_config_passes():
    result = _amtool("check-config", str(DEPLOY_ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "4 inhibit rules" in result.stdout


def test_the_inhibit_rules_the_table_implies_are_the_committed_ones():
    """GpuNodeDrained's `mutes_pages` is an inhibit rule in deploy/alertmanager.yml, made from
    the table (exporter/alerting/inhibit.py): the example cannot drift from the table."""
    from exporter.alerting.inhibit import inhibit_rules
    from exporter.thresholds import load_thresholds

    generated = inhibit_rules(load_thresholds(REPO / "rules" / "thresholds.yaml"))
    assert generated == [{"source_matchers": ['alertname="GpuNodeDrained"'],
                          "target_matchers": ['page="true"'], "equal": ["cluster", "node"]}]
    committed = yaml.safe_load(DEPLOY_ALERTMANAGER.read_text())["inhibit_rules"]
    table_made = [r for r in committed
                  if any(m.startswith("alertname=") for m in r["source_matchers"])
                  and r["target_matchers"] == ['page="true"']]
    assert table_made == generated


# (what, labels of the alert, receivers it must reach in routing-tree order)
ROUTES = [
    ("a paging critical pages", {"alertname": "GpuTemperatureHigh", "severity": "critical",
                                 "page": "true", **GPU}, "pager"),
    ("a warning is a ticket", {"alertname": "GpuTemperatureHigh", "severity": "warning",
                               "page": "false", **GPU}, "tickets"),
    ("a critical that does not page is a ticket",
     {"alertname": "GpuRowRemapFailed", "severity": "critical", "page": "false", **GPU},
     "tickets"),
    ("a job's ticket", {"alertname": "GpuJobUtilizationLow", "severity": "critical",
                        "page": "false", "exported_job": "train-7", "account": "ml"}, "tickets"),
    ("compaction goes to the advisor and on to tickets",
     {"alertname": "GpuClusterFragmentationHigh", "severity": "warning", "page": "false",
      "action": "compact", "pool": "gpu-h100", "model": "H100"}, "gpufleet-advisor,tickets"),
    ("a gpufleet job with no target pages", {"alertname": "GpufleetJobDown",
                                             "severity": "critical", "page": "true",
                                             "job": "gpufleet-nodes"}, "pager"),
    ("an alert without labels still reaches people",
     {"alertname": "SomethingElse", "pool": "gpu-a100"}, "tickets"),
]


@pytest.mark.parametrize(("what", "labels", "receivers"), ROUTES, ids=[r[0] for r in ROUTES])
def test_amtool_routes_each_alert_to_its_receivers(what, labels, receivers):
    pairs = [f"{k}={v}" for k, v in labels.items()]
    result = _amtool("config", "routes", "test", f"--config.file={DEPLOY_ALERTMANAGER}",
                     f"--verify.receivers={receivers}", *pairs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receivers


def test_amtool_route_test_fails_on_a_wrong_receiver():
    result = _amtool("config", "routes", "test", f"--config.file={DEPLOY_ALERTMANAGER}",
                     "--verify.receivers=tickets", "alertname=GpuTemperatureHigh",
                     "severity=critical", "page=true")
    assert result.returncode != 0
    assert "pager" in result.stdout + result.stderr


def test_grouping_and_timers_are_the_documented_ones():
    config = yaml.safe_load(DEPLOY_ALERTMANAGER.read_text())
    route = config["route"]
    assert route["receiver"] == "tickets"
    assert route["group_by"] == ["alertname", "cluster", "pool", "account"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == (
        "5m", "1h", "24h")
    advisor = next(r for r in route["routes"] if r["receiver"] == "gpufleet-advisor")
    assert advisor["matchers"] == ['action="compact"'] and advisor["continue"] is True
    pager = next(r for r in route["routes"] if r["receiver"] == "pager")
    assert pager["matchers"] == ['page="true"']  # the table's page column, not the severity
    assert (pager["group_wait"], pager["repeat_interval"]) == ("10s", "1h")
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in config["receivers"]}
    assert urls["gpufleet-advisor"].endswith("/v1/alerts")
    # the routing matches what the generator labels: every page="true" rule reaches the pager
    rules = [r for g in yaml.safe_load((REPO / "rules" / "gpufleet-alerts.yaml").read_text())
             ["groups"] for r in g["rules"]]
    assert {r["labels"]["page"] for r in rules} == {"true", "false"}


def test_promtool_check_config_passes_on_the_example_prometheus_config():
    result = subprocess.run([require_binary("promtool"), "check", "config",
                             str(REPO / "deploy" / "prometheus.yml")],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rule files found" in result.stdout
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    from exporter.thresholds import load_thresholds

    jobs = load_thresholds(REPO / "rules" / "thresholds.yaml").exporter_jobs
    # the gpufleet jobs, then node_exporter's, whose series the node pressure rules read
    assert [c["job_name"] for c in config["scrape_configs"]] == [*jobs, "node"]


def test_gpufleet_job_names_agree_in_the_table_the_example_config_and_the_guide():
    """issue 15: GpufleetTargetDown watched up{job="gpufleet"} while docs/deploy.md names the
    jobs gpufleet-nodes and gpufleet-cluster, so its absent() branch always matched."""
    from exporter.thresholds import load_thresholds

    jobs = load_thresholds(REPO / "rules" / "thresholds.yaml").exporter_jobs
    assert jobs == ("gpufleet-nodes", "gpufleet-cluster")
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    assert tuple(c["job_name"] for c in config["scrape_configs"]
                 if c["job_name"].startswith("gpufleet")) == jobs
    guide = (REPO / "docs" / "deploy.md").read_text()
    named = re.findall(r"job_name: (gpufleet\S*)", guide)
    assert named and set(named) == set(jobs)
    alerts = (REPO / "rules" / "gpufleet-alerts.yaml").read_text()
    for job in jobs:
        assert f'absent(up{{job="{job}"}})' in alerts


def _alert(severity: str, **labels: str) -> dict:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": "GpuTemperatureHigh", "severity": severity, **labels},
        "annotations": {"summary": "A GPU is running hot."},
        "startsAt": (now - timedelta(minutes=1)).isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


@pytest.mark.slow
def test_a_critical_inhibits_its_warning_twin_on_the_same_gpu_only(tmp_path):
    """The committed inhibit rule, on a real Alertmanager: same GPU muted, next GPU not."""
    manager = start_alertmanager(tmp_path / "am", routed_config("http://127.0.0.1:9"))
    try:
        other_gpu = {**GPU, "gpu": "4", "uuid": "GPU-0001-4"}
        manager.post([_alert("critical", **GPU), _alert("warning", **GPU),
                      _alert("warning", **other_gpu)])
        # Alertmanager's inhibitor learns of the critical asynchronously: all three alerts can
        # be listed before it mutes the warning. So wait for the settled state (the warning on
        # GPU 3 muted), not for the count, then check every alert against it.
        deadline = time.monotonic() + 30
        states: dict = {}
        while time.monotonic() < deadline:
            states = {(a["labels"]["severity"], a["labels"]["gpu"]): a["status"]
                      for a in manager.alerts(alertname="GpuTemperatureHigh")}
            if len(states) == 3 and states[("warning", "3")]["state"] == "suppressed":
                break
            time.sleep(0.2)
        assert len(states) == 3, states
        assert states[("warning", "3")]["state"] == "suppressed"
        assert len(states[("warning", "3")]["inhibitedBy"]) == 1
        assert states[("critical", "3")]["state"] == "active"
        assert states[("warning", "4")]["state"] == "active"
        assert states[("warning", "4")]["inhibitedBy"] == []
    finally:
        stop(manager.proc)
