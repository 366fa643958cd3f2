"""Node mode and cluster mode side by side under one real Prometheus (issue 15, Build 3).

docs/deploy.md runs both: gpufleet in node mode serves each node's GPUs, and one
gpufleet in cluster mode reads them back from Prometheus (the ``prometheus``
source) to export the fleet-level view. Before ``exposition.per_gpu`` the
cluster-mode process re-exported every per-GPU series it read, so the one
Prometheus that scrapes both held two copies: 2,176 GPUs for 1,088, ``GpuLost``
twice, and fleet panels failing with "found duplicate series".

Here the simulated fleet stands for the node exporters (one process, node
mode: ``per_gpu`` auto is on), a second process reads it from Prometheus
(``per_gpu`` auto is off), and one Prometheus scrapes both under the job names
docs/deploy.md uses, with the rules ``gpufleet rules`` generates (every ``for``
scaled by 0.01) and a lost GPU in the fleet.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import yaml

from exporter import metrics
from exporter.cli import main
from exporter.sources.sim.options import SimSource
from tests.helpers import REPO
from tests.test_dashboards_prometheus import _boards, _content, _reload, _run, _variables

# run alone, after the rest (make test): two exporters and every dashboard query
pytestmark = [pytest.mark.slow, pytest.mark.alone]

FOR_SCALE = "0.01"  # GpuLost's 5m -> 3 s
LOST = {"node": "gpu-004", "gpu": "1"}
CLUSTER = "test"
# The simulator's pools (each model, and MIG on 2 of the 3 A100 nodes) with 2-3 nodes each, not
# its 136: a copy of a series is a copy at any size, and the 1,088 GPUs' scrapes and rule
# evaluations were most of this test's CPU.
POOLS = tuple(dataclasses.replace(pool, nodes=3 if pool.model.startswith("A100") else 2)
              for pool in SimSource().pools)
FLEET_GPUS = sum(pool.nodes * pool.gpus_per_node for pool in POOLS)
POOL_LINES = "\n".join(
    f"      - {{name: {p.name}, model: {p.model}, nodes: {p.nodes}, "
    f"gpus_per_node: {p.gpus_per_node}, cpu_cores: {p.cpu_cores}}}" for p in POOLS)

NODE_CONFIG = f"""
cluster: {CLUSTER}
collect_interval: 1s
analysis: {{enabled: false}}   # node mode: the fleet-level analysis is cluster mode's (docs/deploy.md)
advisor: {{enabled: false}}
sources:
  sim:
    seed: 7
    pools:
{POOL_LINES}
    scenarios:
      - {{kind: gpu_lost, node: {LOST['node']}, gpu: {LOST['gpu']}}}
"""


def _cluster_config(prometheus_url: str) -> str:
    return f"""
cluster: {CLUSTER}
collect_interval: 1s
advisor: {{enabled: false}}
sources:
  sim: {{enabled: false}}
  prometheus:
    enabled: true
    url: {prometheus_url}
    selector: 'job="gpufleet-nodes",cluster="{CLUSTER}"'
    max_sample_age: 30s
"""


def _prometheus_config(rules: list[str], nodes_port: int, cluster_port: int | None) -> str:
    """deploy/prometheus.yml with 1 s intervals, this test's targets and rule files."""
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = rules
    del config["alerting"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {"gpufleet-nodes": nodes_port, "gpufleet-cluster": cluster_port}
    config["scrape_configs"] = []
    for name, port in targets.items():
        if port is not None:
            jobs[name].update(scrape_interval="1s", scrape_timeout="1s",
                              static_configs=[{"targets": [f"127.0.0.1:{port}"]}])
            config["scrape_configs"].append(jobs[name])
    return yaml.safe_dump(config, sort_keys=False)


def _value(prom, expr: str) -> float:
    result = prom.query(expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_node_and_cluster_mode_under_one_prometheus_give_one_copy_of_each_series(
        tmp_path, exporter_factory, prometheus_factory, capsys):
    rules = tmp_path / "rules"
    assert main(["rules", "--out", str(rules), "--for-scale", FOR_SCALE,
                 "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    capsys.readouterr()
    rule_files = [str(rules / "gpufleet-recording.yaml"), str(rules / "gpufleet-alerts.yaml")]

    nodes = exporter_factory(config=NODE_CONFIG)
    prom = prometheus_factory(_prometheus_config(rule_files, nodes.port, None))
    prom.wait_for("count(gpufleet_gpu_info)", lambda r: bool(r), timeout=60)
    # cluster mode reads the node exporters from this Prometheus, then is scraped by it too
    cluster = exporter_factory(config=_cluster_config(prom.url))
    (prom.workdir / "prometheus.yml").write_text(
        _prometheus_config(rule_files, nodes.port, cluster.port))
    _reload(prom)
    # the cluster-mode process is scraped and has read the fleet: its analysis sees every GPU
    prom.wait_for('gpufleet_cluster_idle_gpus{job="gpufleet-cluster"}', lambda r: bool(r),
                  timeout=60)
    prom.wait_for('ALERTS{alertname="GpuLost",alertstate="firing"}', lambda r: bool(r),
                  timeout=60)
    # the cluster-mode process's first reads can come before the reloaded Prometheus answers the
    # node series ("prometheus lists no GPU"), and a scrape of that down state may be the last one
    prom.wait_for('gpufleet_source_up{job="gpufleet-cluster",source="prometheus",target=""} == 1',
                  lambda r: bool(r), timeout=60)
    time.sleep(5)  # both targets scraped several times over, the rules evaluated after them

    # the cluster-mode process is up and reads the whole fleet from Prometheus
    assert _value(prom, 'gpufleet_source_up{job="gpufleet-cluster",source="prometheus",'
                        'target=""}') == 1
    # the GPU count is the fleet's, once
    assert _value(prom, "count(gpufleet_gpu_info)") == FLEET_GPUS
    assert _value(prom, "count(gpufleet_gpu_up)") == FLEET_GPUS
    assert _value(prom, f'count(gpufleet_gpu_info{{cluster="{CLUSTER}"}})') == FLEET_GPUS
    # every series carries the cluster label, from both processes
    assert prom.query('count by (job) ({__name__=~"gpufleet_.+",cluster=""})') == []
    jobs = {r["metric"]["job"] for r in prom.query('count by (job) ({__name__=~"gpufleet_.+"})')}
    assert jobs == {"gpufleet-nodes", "gpufleet-cluster"}
    # and the fleet-level families come from cluster mode alone (node mode runs no analysis)
    assert {r["metric"]["job"] for r in prom.query("gpufleet_cluster_fragmentation_index")} == {
        "gpufleet-cluster"}

    # no series of any per-GPU or per-node family has a twin that differs only in the target
    # labels (job, instance): each family's own labels identify one series
    doubled = []
    for spec in metrics.CATALOGUE.values():
        if spec.producer == "fleet":
            continue
        by = ", ".join("exported_job" if label == "job" else label
                       for label in ("cluster", *spec.labels))
        found = prom.query(f"count by ({by}) ({spec.name}) > 1")
        if found:
            doubled.append((spec.name, len(found), found[0]["metric"]))
    assert doubled == []

    # GpuLost fires exactly once, for the lost GPU
    lost = prom.query('ALERTS{alertname="GpuLost",alertstate="firing"}')
    assert [{k: r["metric"][k] for k in ("node", "gpu", "cluster", "job")} for r in lost] == [
        {**LOST, "cluster": CLUSTER, "job": "gpufleet-nodes"}]

    # every dashboard query runs on both processes' series without an error (the fleet
    # panels failed with "found duplicate series for the match group")
    now = time.time()
    errors = []
    ran = 0
    for module, board in _boards():
        values = _variables(prom, board, now)
        assert values["cluster"] == [CLUSTER]
        for panel in _content(board):
            for target in panel["targets"]:
                expr, _, error = _run(prom, target, values, now)
                ran += 1
                if error:
                    errors.append(f"{module.FILE} / {panel['title']}: {error}\n    {expr}")
    assert ran >= 50
    assert errors == []
