"""Every query of every committed dashboard, run against a real Prometheus.

A real exporter serves the simulated fleet; a real Prometheus (Debian's),
with the generated recording rules loaded, scrapes it every second for at
least 30 s. Then each variable is resolved
the way Grafana resolves ``label_values(...)`` (the label-values API), each
panel's queries get those real values (multi-value variables as a regex
alternation, as Grafana sends them), and each query runs the way its panel
runs it: instant for tables, a range query otherwise. Every query must
succeed and return data, except the panels a dashboard module lists in
``DATA_ONLY_WHEN_FIRING``; those are then proven by making an alert fire.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import urllib.error
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exporter.dashboards import DASHBOARDS
from exporter.sources.sim.options import SimSource
from tests.helpers import REPO, http_get
from tests.helpers.servers import start_node_exporter, stop

# run alone, after the rest (make test): every dashboard query over 30 s of 1 s scrapes
pytestmark = pytest.mark.alone

DATA_SECONDS = 30
# The simulator's pools (each model, and MIG on 2 of the 4 A100 nodes) with 4 nodes each, not its
# 136: every panel has data at this size too, and the 1,088 GPUs' scrapes, recording rules and
# queries were most of this test's CPU.
POOLS = tuple(dataclasses.replace(pool, nodes=4) for pool in SimSource().pools)
POOL_LINES = "\n".join(
    f"      - {{name: {p.name}, model: {p.model}, nodes: {p.nodes}, "
    f"gpus_per_node: {p.gpus_per_node}, cpu_cores: {p.cpu_cores}}}" for p in POOLS)
# The XID fails GPU 0 of gpu-001: the advisor drains the node; with a 1 s clean window and
# minimum drain it resumes it about two collections later (issue 31): the verdict,
# remediation and reliability panels then show a real fault, drain and resume, the mean
# times from fault to drain and from drain to resume included (no value without them).
XID_CONFIG = f"""
cluster: dashboards
sources:
  sim:
    pools:
{POOL_LINES}
    scenarios:
      - {{kind: xid, node: gpu-001, gpu: 0, value: 79, start_after: 15s}}
advisor:
  health: {{clean_window: 1s, min_drain: 1s}}
"""
DRAIN_TO_RESUME = "cluster:gpufleet_remediation_drain_to_resume_seconds:mean7d"
RECORDING = REPO / "rules" / "gpufleet-recording.yaml"
STEP = "2s"
# queries in flight at once: Prometheus answers each on its own goroutine, and one at a time
# left its cores idle between the test's round trips (the answers are the same in any order)
QUERIES = 4
# What Grafana would put for its own variables on a 30 s range of 1 s scrapes
BUILTINS = {"$__rate_interval": "10s", "$__interval": "2s", "$__range": f"{DATA_SECONDS}s"}
# Prometheus regex metacharacters Grafana escapes in multi-value substitutions
_REGEX_SPECIAL = re.compile(r"([\\^$*+?.()|{}\[\]])")


def _api(prom, path: str, params: dict) -> dict:
    url = f"{prom.url}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        payload = json.loads(http_get(url))
    except urllib.error.HTTPError as exc:  # 400/422: a PromQL error, with the reason in the body
        payload = json.loads(exc.read())
    return payload


def _substitute(text: str, values: dict[str, list[str]]) -> str:
    for name, value in BUILTINS.items():
        text = text.replace(name, value)
    for name, chosen in values.items():
        escaped = [_REGEX_SPECIAL.sub(r"\\\\\1", v) for v in chosen]
        replacement = escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        text = text.replace(f"${{{name}}}", replacement).replace(f"${name}", replacement)
    return text


def _label_values(prom, query: str, values: dict[str, list[str]], now: float) -> list[str]:
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
    assert match, f"not a label_values() query: {query}"
    selector, label = _substitute(match.group(1), values), match.group(2)
    payload = _api(prom, f"label/{label}/values",
                   {"match[]": selector, "start": now - DATA_SECONDS, "end": now})
    assert payload["status"] == "success", payload
    return sorted(payload["data"], key=lambda v: (len(v), v))


def _boards() -> list[tuple[object, dict]]:
    return [(module, json.loads((REPO / "dashboards" / module.FILE).read_text()))
            for module in DASHBOARDS]


def _variables(prom, board: dict, now: float) -> dict[str, list[str]]:
    """Real values for every variable: all pools, models and GPUs; for nodes, the first
    node and a node with MIG instances, so the MIG panels have something to show."""
    values: dict[str, list[str]] = {}
    for variable in board["templating"]["list"]:
        if variable["type"] == "datasource":
            continue
        found = _label_values(prom, variable["query"], values, now)
        assert found, f"variable {variable['name']} has no values: {variable['query']}"
        if variable["name"] == "node":
            mig = {r["metric"]["node"] for r in prom.query("gpufleet_gpu_mig_instance_info")}
            with_mig = sorted(mig & set(found))
            assert with_mig, "the simulated fleet has no MIG node among the node values"
            found = sorted({found[0], with_mig[0]})
        values[variable["name"]] = found
    return values


def _run(prom, target: dict, values: dict[str, list[str]], now: float) -> tuple[str, list, str]:
    expr = _substitute(target["expr"], values)
    if target.get("instant"):
        payload = _api(prom, "query", {"query": expr, "time": now})
    else:
        payload = _api(prom, "query_range", {"query": expr, "start": now - DATA_SECONDS,
                                             "end": now, "step": STEP})
    if payload.get("status") != "success":
        return expr, [], f"{payload.get('errorType')}: {payload.get('error')}"
    return expr, payload["data"]["result"], ""


def _content(board: dict) -> list[dict]:
    out = []
    for panel in board["panels"]:
        out += [panel, *panel.get("panels", [])]
    return [panel for panel in out if panel["type"] != "row"]


def _prometheus_config(exporter_port: int, rule_files: list[Path], node_port: int) -> str:
    rules = "".join(f"\n  - {path}" for path in rule_files)
    return f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:{rules or " []"}
scrape_configs:
  - job_name: gpufleet
    static_configs:
      - targets: ["127.0.0.1:{exporter_port}"]
  - job_name: node  # the real node_exporter the node pressure panel reads (issue 20)
    static_configs:
      - targets: ["127.0.0.1:{node_port}"]
"""


@pytest.mark.slow
def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    exporter_factory, prometheus_factory, tmp_path: Path, request
):
    # a cluster label, as a site with several clusters sets it: the `cluster` variable's values
    # and one XID 15 s in (issue 16's health rows: so that the XID panels show an event,
    # not only their zero, within the 30 s the queries look at)
    exporter = exporter_factory("--seed", "7", config=XID_CONFIG)
    node = start_node_exporter(tmp_path / "node-exporter")
    request.addfinalizer(lambda: stop(node.proc))
    boards = _boards()
    # The documented exceptions are "empty until an alert fires": one of the table's alerts,
    # as a rule that always holds, fires from the first evaluation on, so they are proven
    # below on the same 30 s of data as every other panel
    names = {name for module, _ in boards for name in module.DATA_ONLY_WHEN_FIRING}
    assert names == {"Firing gpufleet alerts", "Firing alerts over time"}
    firing_panels = [(module.FILE, panel) for module, board in boards
                     for panel in _content(board) if panel["title"] in module.DATA_ONLY_WHEN_FIRING]
    alert = re.search(r'alertname=~"(\w+)', firing_panels[0][1]["targets"][0]["expr"]).group(1)
    firing = tmp_path / "firing.yaml"
    firing.write_text(f"""
groups:
  - name: dashboard-test
    rules:
      - alert: {alert}
        expr: max(gpufleet_gpu_temperature_celsius) > 0
        labels: {{severity: warning}}
""")
    # the recording rules the dashboards read, as generated by `gpufleet rules`
    prom = prometheus_factory(_prometheus_config(exporter.port, [RECORDING, firing], node.port))
    prom.wait_for("count(gpufleet_gpu_info)", lambda r: bool(r), timeout=60)
    time.sleep(DATA_SECONDS + 1)  # at least 30 s of 1 s scrapes behind every range query
    # gpu-001 resumed (about 10 s after the XID, at 5 s collections): normally already so
    prom.wait_for(DRAIN_TO_RESUME, lambda r: bool(r), timeout=60)
    now = time.time()

    failures: list[str] = []
    ran = 0
    firing_values: dict[str, dict[str, list[str]]] = {}
    results: dict[tuple[str, str], list] = {}
    pool = ThreadPoolExecutor(QUERIES)
    request.addfinalizer(pool.shutdown)
    for module, board in boards:
        values = _variables(prom, board, now)
        targets = [(panel, target) for panel in _content(board) for target in panel["targets"]]
        answers = pool.map(lambda one, values=values: _run(prom, one[1], values, now), targets)
        firing_values[module.FILE] = values
        for (panel, target), (expr, result, error) in zip(targets, answers, strict=True):
            may_be_empty = panel["title"] in module.DATA_ONLY_WHEN_FIRING
            ran += 1
            results[(panel["title"], target["refId"])] = result
            where = f"{module.FILE} / {panel['title']} / {target['refId']}"
            if error:
                failures.append(f"{where}: {error}\n    {expr}")
            elif not result and not may_be_empty:
                failures.append(f"{where}: no data\n    {expr}")
    # annotation queries (issue 20's load changes) are PromQL too; empty until a pool's
    # load changes regime, which 30 s of the simulated fleet need not show
    annotated = 0
    for module, board in boards:
        values = _variables(prom, board, now)
        for annotation in board["annotations"]["list"]:
            expr, _, error = _run(prom, {"expr": annotation["expr"]}, values, now)
            annotated += 1
            if error:
                failures.append(f"{module.FILE} / annotation {annotation['name']}: {error}\n"
                                f"    {expr}")
    assert annotated >= 1
    assert ran >= 50, f"only {ran} queries ran"
    assert not failures, "\n".join(failures)
    # the XID shows as what it is: one GPU in the fleet count, code 79 on its node's panel
    assert [r["values"][-1][1] for r in results[("GPUs with XID errors", "A")]] == ["1"]
    assert {(r["metric"]["node"], r["metric"]["gpu"]) for r in results[("XID errors", "A")]
            if r["metric"]["xid"] == "79"} == {("gpu-001", "0")}
    assert max(float(v) for r in results[("XID errors", "A")] if r["metric"]["xid"] == "79"
               for _, v in r["values"]) == 1
    # issue 31: the XID as a verdict, a fault, a drain and a resume. The fault counters start
    # at 0, so Prometheus' increase() counts this first XID (a series born at 1 would not)
    assert {r["metric"]["verdict"] for r in results[("GPUs by verdict", "A")]} == {
        "healthy", "unknown", "degraded", "failing"}
    assert {r["metric"]["cause"]: r["value"][1] for r in results[("Interruptions by cause", "B")]
            } == {"xid": "1", "ecc": "0", "remap_failure": "0", "gpu_lost": "0"}
    assert [(r["metric"]["node"], r["value"][1])
            for r in results[("Shortest mean time between faults (10 nodes)", "A")]] == [
        ("gpu-001", "604800")]
    # drained at the collection that saw the XID: 0 s from fault to drain
    assert [r["values"][-1][1] for r in results[("Mean time from fault to drain (7 days)", "A")]
            ] == ["0"]
    [resumed] = results[("Mean time from drain to resume (7 days)", "A")]
    assert 1 <= float(resumed["values"][-1][1]) <= 30  # at least min_drain, about 2 collections
    assert [r["values"][-1][1] for r in results[("Nodes drained by gpufleet", "A")]] == ["0"]

    # The documented exceptions really are "empty until an alert fires": with the alert
    # firing (all 30 s long) they must show it.
    prom.wait_for(f'ALERTS{{alertname="{alert}",alertstate="firing"}}', lambda r: bool(r),
                  timeout=30)
    for file, panel in firing_panels:
        for target in panel["targets"]:
            expr, result, error = _run(prom, target, firing_values[file], now)
            assert not error, f"{file} / {panel['title']}: {error}\n    {expr}"
            assert result, f"{file} / {panel['title']}: no data while {alert} fires\n    {expr}"
            labels = result[0]["metric"]
            assert labels["alertname"] == alert and labels["severity"] == "warning"


def _reload(prom) -> None:
    """POST /-/reload (test_modes_prometheus reloads its Prometheus with a second target)."""
    import urllib.request

    request = urllib.request.Request(f"{prom.url}/-/reload", method="POST")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
