"""The load statistics' recording rules on a real Prometheus equal the in-process statistics.

A real exporter serves a small simulated fleet that changes every second (speed 60, one
collection a second); Prometheus 2.42 scrapes it every second and runs the rules generated
from the committed table with 10 s and 20 s windows instead of 1 h and 24 h. At one
evaluation timestamp, each recorded mean, standard deviation and p95 must equal
:func:`exporter.pool_load.stats.window_stats` of the samples of the series it reads, fetched
from the same Prometheus over the same range: the definitions agree, not just the shapes.
"""

from __future__ import annotations

import pytest
import yaml

from exporter.alerting import pool_load_rules
from exporter.cli import main
from exporter.pool_load.stats import window_stats
from exporter.thresholds import LoadStatistics
from exporter.thresholds import recorded as recorded_series
from tests.helpers import REPO
from tests.helpers.servers import wait_until

pytestmark = pytest.mark.slow  # a real exporter and Prometheus

WINDOWS = (10, 20)  # seconds; 1 s evaluations: 11 and 21 samples
FLEET = """
collect_interval: 1
sources:
  sim:
    seed: 7
    speed: 60
    mig_nodes: 0
    pools:
      - {name: gpu-h100, model: H100, nodes: 4, cpu_cores: 128}
      - {name: gpu-a100, model: A100-80GB, nodes: 2, cpu_cores: 128}
"""


def _rules(tmp) -> str:
    text = (REPO / "rules" / "thresholds.yaml").read_text()
    assert text.count("windows: [1h, 24h]") == 1
    table = tmp / "thresholds.yaml"
    table.write_text(text.replace("windows: [1h, 24h]",
                                  f"windows: [{', '.join(f'{w}s' for w in WINDOWS)}]"))
    out = tmp / "rules"
    assert main(["rules", "--thresholds", str(table), "--out", str(out)]) == 0
    return str(out / "gpufleet-recording.yaml")


def _key(metric: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))


def test_recorded_statistics_equal_window_stats_of_the_same_samples(
        tmp_path, exporter_factory, prometheus_factory, capsys):
    recording = _rules(tmp_path)
    capsys.readouterr()
    exporter = exporter_factory(config=FLEET)
    prom = prometheus_factory(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [recording],
        "scrape_configs": [{"job_name": "gpufleet-nodes", "static_configs": [
            {"targets": [f"127.0.0.1:{exporter.port}"]}]}],
    }))
    longest = f"{max(WINDOWS)}s"
    last = pool_load_rules.statistic_names(
        LoadStatistics(tuple(float(w) for w in WINDOWS), 0.95),
        recorded_series.CLUSTER_DEMAND, float(max(WINDOWS)))["quantile"]

    def full_windows():
        # the longest window full of the input's samples, one a second (the first ones
        # came later); at a time between evaluations the window holds one fewer
        result = prom.query(f"count_over_time({recorded_series.POOL_UTILIZATION}[{longest}])")
        return result if result and min(float(r["value"][1]) for r in result) >= max(WINDOWS) \
            else None
    wait_until(f"{longest} of recorded pool series", full_windows, timeout=60, interval=1)
    [series] = wait_until("the statistics", lambda: prom.query(f"{last}[3s]"), timeout=10)
    at = float(series["values"][-1][0])  # one evaluation: every statistic below is of it

    statistics = LoadStatistics(tuple(float(w) for w in WINDOWS), 0.95)
    compared = varied = 0
    gap = 0.0
    for window in WINDOWS:
        for source in pool_load_rules.STATISTIC_SOURCES:
            samples = {_key(s["metric"]): [float(v) for _, v in s["values"]]
                       for s in prom.query(f"{source}[{window}s]", at)}
            assert samples, source
            names = pool_load_rules.statistic_names(statistics, source, float(window))
            recorded = {}
            for stat, name in names.items():
                for s in prom.query(name, at):
                    recorded[(_key(s["metric"]), stat)] = float(s["value"][1])
            assert {key for key, _ in recorded} == set(samples), (names, recorded.keys())
            for key, values in samples.items():
                # one sample per evaluation, both ends included (Prometheus 2); fewer if a
                # loaded machine skipped an evaluation
                assert window // 2 <= len(values) <= window + 1, (source, key, len(values))
                expected = window_stats(values)
                for stat, value in (("mean", expected.mean), ("stddev", expected.stddev),
                                    ("quantile", expected.p95)):
                    got = recorded[(key, stat)]
                    assert got == pytest.approx(value, rel=1e-9, abs=1e-12), (
                        source, window, key, stat, got, values)
                    compared += 1
                    gap = max(gap, abs(got - value))
                varied += expected.stddev > 0
    # 2 windows x (2 pools x 2 series + 1 cluster x 2 series) x 3 statistics
    assert compared == 2 * (2 * 2 + 2) * 3
    assert varied > 0  # the fleet moved: the statistics were not of constant series
    with capsys.disabled():  # the figures docs/alerting.md quotes (pytest -s)
        print(f"compared {compared} statistics at {at}; {varied} series varied; largest gap "
              f"{gap:.3g}")
