"""Issue 44, the first week again: rules that hold on both engines and fit the deployment, and
an alert on a failed reload.

- Templates: a description's query reads its labels with ``(index $labels "x")``: vmalert
  passes a label the alert lacks (``cluster`` without a ``cluster:`` in the config) as nil,
  which ``printf "%q"`` wrote as ``%!q(<nil>)`` into the query, and vmalert dropped the whole
  alert (GpuJobUtilizationLow, GpuClocksThrottled). The real engines are in
  tests/test_victoriametrics_parity.py.
- ``gpufleet rules --deployment node`` (or cluster): the rules watch that mode's scrape job
  only, so a deployment that runs one mode is not paged for the other's absent job
  (GpufleetJobDown). The real Prometheus and Alertmanager are in tests/test_alert_noise.py.
- GpufleetConfigReloadFailed: a ticket on ``gpufleet_config_last_reload_successful == 0``,
  which the web config file now sets too.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from exporter.alerting.rules import PROMETHEUSRULE_FILE, generate
from exporter.cli import main
from exporter.cli.rules import fix_command
from exporter.cli.serve import reloaders
from exporter.thresholds import ThresholdError, load_thresholds, parse_thresholds
from exporter.thresholds.reloading import LiveThresholds
from exporter.web.server import Protection
from exporter.web.webconfig import LiveWebConfig
from tests.helpers import REPO

TABLE = REPO / "rules" / "thresholds.yaml"
# labels an alert may lack: the exporter's `cluster:` unset, a scheduler without accounts or
# namespaces, a source without a target
OPTIONAL_LABELS = ("cluster", "account", "namespace", "target")
_ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
_LABEL = re.compile(r"\$labels\.(\w+)")


def template_faults(text: str) -> list[str]:
    """The template actions of ``text`` that fail or print ``<no value>`` on vmalert when a
    label is absent: ``$labels.x`` anywhere but alone (``{{ $labels.x }}``) or as the
    subject of ``with``, and an optional label printed unguarded."""
    faults = []
    for action in (a.strip() for a in _ACTION.findall(text)):
        used = _LABEL.findall(action)
        if not used:
            continue
        alone = re.fullmatch(r"\$labels\.(\w+)", action)
        guarded = re.fullmatch(r"with \$labels\.(\w+)", action)
        if not (alone or guarded):
            faults.append(f"{{{{ {action} }}}}: $labels.{used[0]} as an argument")
        elif alone and alone.group(1) in OPTIONAL_LABELS:
            faults.append(f"{{{{ {action} }}}}: {alone.group(1)} may be absent")
    return faults


def _annotations(files) -> list[tuple[str, str]]:
    out = []
    for f in files:
        doc = yaml.safe_load(f.text)
        groups = doc["spec"]["groups"] if "spec" in doc else doc["groups"]
        for group in groups:
            for rule in group["rules"]:
                out.extend((rule.get("alert", rule.get("record")), text)
                           for text in rule.get("annotations", {}).values())
    return out


# -- templates that hold on both engines ----------------------------------------------


def test_the_checker_finds_what_vmalert_dropped():
    old = ("{{ with printf `x{cluster=%q,exported_job=%q}` $labels.cluster $labels.exported_job "
           "| query }}{{ . | first | value }}{{ end }} (account {{ $labels.account }}) "
           '{{ if eq $labels.model "H200" }}650 W{{ end }}')
    assert template_faults(old) == [
        "{{ with printf `x{cluster=%q,exported_job=%q}` $labels.cluster $labels.exported_job "
        "| query }}: $labels.cluster as an argument",
        "{{ $labels.account }}: account may be absent",
        '{{ if eq $labels.model "H200" }}: $labels.model as an argument']
    assert template_faults('{{ with printf `x{cluster=%q}` (index $labels "cluster") | query }}'
                           "{{ . }}{{ end }}{{ with $labels.account }} ({{ . }}){{ end }}"
                           "{{ $labels.pool }}") == []


@pytest.mark.parametrize("fmt", ["prometheus", "prometheusrule"])
def test_no_generated_annotation_fails_on_an_absent_label(fmt):
    files = generate(load_thresholds(TABLE), fmt)
    annotations = _annotations(files)
    assert len(annotations) > 90
    faults = [(name, fault) for name, text in annotations for fault in template_faults(text)]
    assert faults == []
    queries = [(name, text) for name, text in annotations if "| query" in text]
    assert {name for name, _ in queries} == {"GpuJobUtilizationLow", "GpuClocksThrottled"}
    assert all('(index $labels "cluster")' in text for _, text in queries)


# -- rules that fit the deployment ----------------------------------------------------


def _alerts(thresholds) -> dict[tuple[str, str], str]:
    text = next(f.text for f in generate(thresholds) if f.name == "gpufleet-alerts.yaml")
    return {(r["alert"], r["labels"]["severity"]): r["expr"]
            for g in yaml.safe_load(text)["groups"] for r in g["rules"]}


def test_deployment_node_watches_the_node_job_only_and_changes_nothing_else():
    table = load_thresholds(TABLE)
    both, node, cluster = (_alerts(table), _alerts(table.for_deployment("node")),
                           _alerts(table.for_deployment("cluster")))
    watching = {("GpufleetTargetDown", "warning"), ("GpufleetJobDown", "critical")}
    assert {k for k in both if both[k] != node[k]} == watching
    assert {k for k in both if both[k] != cluster[k]} == watching
    assert node[("GpufleetJobDown", "critical")].splitlines() == [
        'max by (job) (up{job=~"gpufleet-nodes"}) == 0', "or", 'absent(up{job="gpufleet-nodes"})']
    assert node[("GpufleetTargetDown", "warning")] == 'up{job=~"gpufleet-nodes"} == 0'
    assert cluster[("GpufleetJobDown", "critical")].splitlines() == [
        'max by (job) (up{job=~"gpufleet-cluster"}) == 0', "or",
        'absent(up{job="gpufleet-cluster"})']
    assert 'absent(up{job="gpufleet-cluster"})' in both[("GpufleetJobDown", "critical")]
    # the recording rules do not depend on the jobs
    recording = [f.text for f in generate(table) if f.name == "gpufleet-recording.yaml"]
    assert recording == [f.text for f in generate(table.for_deployment("node"))
                         if f.name == "gpufleet-recording.yaml"]


def test_rules_deployment_node_writes_no_rule_about_the_cluster_job(tmp_path, capsys):
    out = tmp_path / "rules"
    assert main(["rules", "--thresholds", str(TABLE), "--out", str(out),
                 "--deployment", "node"]) == 0
    alerts = (out / "gpufleet-alerts.yaml").read_text()
    cluster_job = re.compile(r'job=~?"[^"]*gpufleet-cluster')
    assert not cluster_job.search(alerts) and 'absent(up{job="gpufleet-nodes"})' in alerts
    assert cluster_job.search((REPO / "rules" / "gpufleet-alerts.yaml").read_text())
    capsys.readouterr()
    # --check with the same flag is up to date; without it, the file differs
    assert main(["rules", "--thresholds", str(TABLE), "--out", str(out), "--deployment", "node",
                 "--check"]) == 0
    assert main(["rules", "--thresholds", str(TABLE), "--out", str(out), "--check"]) == 1
    assert "--deployment" not in capsys.readouterr().err
    args = argparse.Namespace(thresholds=None, out="/etc/prometheus/rules", format="prometheus",
                              deployment="node", for_scale=1.0, time_scale=1.0, label=[],
                              check=True)
    assert fix_command(args) == "gpufleet rules --out /etc/prometheus/rules --deployment node"


def test_deployment_with_a_plain_list_of_jobs_is_one_line_and_exit_2(tmp_path, capsys):
    table = tmp_path / "thresholds.yaml"
    table.write_text(TABLE.read_text().replace(
        "exporter_jobs: {node: gpufleet-nodes, cluster: gpufleet-cluster}",
        "exporter_jobs: [gpufleet-nodes]"))
    capsys.readouterr()
    assert main(["rules", "--thresholds", str(table), "--out", str(tmp_path / "out"),
                 "--deployment", "node"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert ("--deployment node: thresholds.yaml: exporter_jobs is a plain list, which says no "
            "job's mode") in err
    assert not (tmp_path / "out").exists()
    # the plain list still watches exactly the jobs it names
    assert load_thresholds(table).exporter_jobs == ("gpufleet-nodes",)
    only_node = parse_thresholds(TABLE.read_text().replace(
        "{node: gpufleet-nodes, cluster: gpufleet-cluster}", "{node: gpufleet-nodes}"))
    with pytest.raises(ThresholdError, match="exporter_jobs names no cluster job"):
        only_node.for_deployment("cluster")
    with pytest.raises(SystemExit):
        main(["rules", "--deployment", "both"])


def test_the_gpu_operator_overlay_carries_the_cluster_deployments_rules():
    """The overlay that runs cluster mode alone holds what `--deployment cluster` generates."""
    rule = generate(load_thresholds(TABLE).for_deployment("cluster"), "prometheusrule",
                    labels={"release": "kube-prometheus-stack"})[0].text
    committed = REPO / "deploy" / "kubernetes" / "overlays" / "gpu-operator" / PROMETHEUSRULE_FILE
    assert committed.read_text() == rule


# -- an alert on a failed reload ------------------------------------------------------


def test_a_failed_reload_is_a_ticket_after_10_minutes():
    row = load_thresholds(TABLE).alert("GpufleetConfigReloadFailed")
    assert (row.metric.expr, row.op, row.severities, row.threshold("warning"), row.page,
            row.owner) == ("gpufleet_config_last_reload_successful", "==", ("warning",), 0,
                           False, "platform team")
    assert row.level("warning").for_seconds == 600
    rules = _alerts(load_thresholds(TABLE))
    assert rules[("GpufleetConfigReloadFailed", "warning")] == (
        "gpufleet_config_last_reload_successful == 0")


HASH = "$2b$04$gpufleetTestSaltOnly1.wfqSax00a4PPolBXtwq/aFn5TJjvaum"


def _reload_successful(table: LiveThresholds) -> float:
    family = next(f for f in table.families(None)
                  if f.name == "gpufleet_config_last_reload_successful")
    return family.samples[0][1]


def test_a_web_config_that_fails_to_reload_sets_the_reload_gauge_to_0(tmp_path: Path):
    """The reload alert's input covers the web config file too, as it covers the table,
    the advisor's token and the receivers' secrets (serve's reloaders)."""
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  alice: {HASH}\n")
    live = LiveWebConfig(web)
    reloads: dict = {}
    sighup = dict(reloaders(Protection(web=live), reloads=reloads))
    table = LiveThresholds(None)
    table.other_files = reloads
    assert set(reloads) == {"web_config"}
    assert _reload_successful(table) == 1.0
    web.write_text("basic_auth_users:\n  alice: plaintext\n")
    assert sighup["web_config"]() == "unchanged"  # refused: the last good one stays
    assert live.current.users == {b"alice": HASH.encode()}
    assert _reload_successful(table) == 0.0
    assert not live.poll()  # looked at again, unchanged on disk: still failed
    assert _reload_successful(table) == 0.0
    web.write_text(f"basic_auth_users:\n  alice: {HASH}\n  bob: {HASH}\n")
    assert live.poll()
    assert _reload_successful(table) == 1.0
