"""The table's load_statistics and pressure sections: what they load, their errors, their rules."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.alerting import pool_load_rules
from exporter.alerting.rules import HEALTH_RECORDING_GROUP, generate
from exporter.pool_load.stats import window_stats
from exporter.thresholds import (
    METRICS,
    LoadStatistics,
    Pressure,
    ThresholdError,
    load_thresholds,
    parse_thresholds,
    recorded,
)
from exporter.thresholds.sections import PRESSURE_METRICS
from tests.helpers import REPO
from tests.helpers.table_yaml import dump, table_mapping

TABLE = REPO / "rules" / "thresholds.yaml"


def _table(old: str, new: str) -> str:
    text = TABLE.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _recording(text: str, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """Every recording rule the table generates, but those of the groups in ``leave_out``."""
    t = parse_thresholds(text)
    files = {f.name: f.text for f in generate(t)}
    return {r["record"]: r["expr"] for g in yaml.safe_load(files["gpufleet-recording.yaml"])["groups"]
            if g["name"] not in leave_out for r in g["rules"]}


def test_the_reference_table_has_the_issues_windows_weights_caps_and_bands():
    t = load_thresholds(TABLE)
    assert t.load_statistics == LoadStatistics((3600.0, 86400.0), 0.95)
    assert t.pressure == Pressure(
        60.0, (("cpu", 0.4), ("memory", 0.35), ("io", 0.25)),
        (("cpu", 0.9), ("memory", 0.85), ("io", 0.7)))
    bands = {row.metric.key: [(lv.severity, lv.threshold) for lv in row.levels]
             for row in t.alerts if row.metric.key in PRESSURE_METRICS}
    assert bands == {
        "node_cpu_busy": [("warning", 0.6), ("critical", 0.8)],
        "node_memory_used": [("warning", 0.5), ("critical", 0.75)],
        "node_disk_io_busy": [("warning", 0.5), ("critical", 0.7)],
        "node_pressure_score": [("warning", 0.8)],
    }
    # tickets, never pages (docs/alerting.md's policy): nothing is broken, a node is slow
    assert all(not row.page and row.owner == "platform team"
               for row in t.alerts if row.metric.key in PRESSURE_METRICS)


def test_the_metric_vocabulary_names_the_series_the_pressure_rules_record():
    assert {key: METRICS[key].expr for key in PRESSURE_METRICS} == {
        "node_cpu_busy": recorded.NODE_CPU_BUSY, "node_memory_used": recorded.NODE_MEMORY_USED,
        "node_disk_io_busy": recorded.NODE_DISK_IO_BUSY,
        "node_pressure_score": recorded.NODE_PRESSURE_SCORE}
    assert all(METRICS[key].subject == "node" for key in PRESSURE_METRICS)


def test_the_score_of_the_table_is_the_issues_formula():
    p = load_thresholds(TABLE).pressure
    assert p is not None
    # 0.4*min(0.9/0.9,1) + 0.35*min(0.68/0.85,1) + 0.25*min(0.42/0.7,1), as in
    # rules/tests/node_pressure_high.yaml
    assert p.score(0.9, 0.68, 0.42) == pytest.approx(0.83, abs=1e-12)
    assert p.score(1.0, 0.95, 0.9) == pytest.approx(1.0, abs=1e-12)  # every term capped
    assert p.score(0.0, 0.0, 0.0) == 0.0


def test_the_generated_recording_rules_read_the_table():
    rules = _recording(TABLE.read_text())
    assert rules["pool:gpufleet_gpu_utilization:avg_mean1h"] == (
        "avg_over_time(pool:gpufleet_gpu_utilization:avg[1h])")
    assert rules["cluster:gpufleet_demand:ratio_stddev24h"] == (
        "stddev_over_time(cluster:gpufleet_demand:ratio[24h])")
    assert rules["pool:gpufleet_demand:ratio_p95_24h"] == (
        "quantile_over_time(0.95, pool:gpufleet_demand:ratio[24h])")
    assert rules[recorded.NODE_PRESSURE_SCORE].splitlines() == [
        "0.4 * clamp_max(instance:gpufleet_node_cpu_busy:ratio / 0.9, 1)",
        "+ 0.35 * clamp_max(instance:gpufleet_node_memory_used:ratio / 0.85, 1)",
        "+ 0.25 * clamp_max(instance:gpufleet_node_disk_io_busy:ratio / 0.7, 1)"]
    assert rules[recorded.NODE_CPU_BUSY] == (
        '1 - avg without (cpu, mode) (rate(node_cpu_seconds_total{mode="idle"}[1m]))')
    stats = [name for name in rules if re.search(r":[a-z]+_(mean|stddev|p95_)\d+h$", name)]
    assert len(stats) == 2 * 2 * 2 * 3  # windows x (pool, cluster) x series x statistics
    # windows, quantile, weights and caps all come from the table
    changed = _recording(_table("windows: [1h, 24h]", "windows: [30s, 6h]")
                         .replace("quantile: 0.95", "quantile: 90%")
                         .replace("rate_window: 1m", "rate_window: 10s")
                         .replace("caps: {cpu: 90%", "caps: {cpu: 95%"))
    assert changed["pool:gpufleet_gpu_utilization:avg_p90_30s"] == (
        "quantile_over_time(0.9, pool:gpufleet_gpu_utilization:avg[30s])")
    assert "cluster:gpufleet_demand:ratio_mean6h" in changed
    assert not [name for name in changed if name.endswith(("1h", "24h"))]
    assert "[10s]" in changed[recorded.NODE_DISK_IO_BUSY]
    assert "instance:gpufleet_node_cpu_busy:ratio / 0.95" in changed[recorded.NODE_PRESSURE_SCORE]


def test_the_statistics_follow_the_series_they_read_in_one_group():
    """Rules of a group run in order, each committed before the next: the statistic at T
    includes the input sample written at T (what the agreement test relies on)."""
    groups = yaml.safe_load((REPO / "rules" / "gpufleet-recording.yaml").read_text())["groups"]
    pool = next(g for g in groups if g["name"] == "gpufleet-pool-recording")
    order = [r["record"] for r in pool["rules"]]
    for source in pool_load_rules.STATISTIC_SOURCES:
        first_use = min(i for i, r in enumerate(pool["rules"]) if f"{source}[" in r["expr"])
        assert order.index(source) < first_use
    pressure = next(g for g in groups if g["name"] == "gpufleet-node-pressure")
    assert [r["record"] for r in pressure["rules"]][-1] == recorded.NODE_PRESSURE_SCORE


def _without(*keys: str, rows: bool) -> str:
    table = yaml.safe_load(TABLE.read_text())
    for key in keys:
        del table[key]
    if rows:
        table["alerts"] = [row for row in table["alerts"]
                           if row["metric"] not in PRESSURE_METRICS]
    return yaml.safe_dump(table, sort_keys=False)


def test_without_the_sections_no_load_or_pressure_rules_are_generated():
    cut = _without("load_statistics", "pressure", rows=True)
    t = parse_thresholds(cut)
    assert (t.load_statistics, t.pressure) == (None, None)
    # the health section's reliability rules (issue 31) are cluster-level too, and stay
    assert HEALTH_RECORDING_GROUP in {g["name"] for g in yaml.safe_load(
        {f.name: f.text for f in generate(t)}["gpufleet-recording.yaml"])["groups"]}
    rules = _recording(cut, leave_out=(HEALTH_RECORDING_GROUP,))
    assert not [name for name in rules if name.startswith(("instance:", "cluster:"))]
    assert "pool:gpufleet_gpu_utilization:avg" in rules


@pytest.mark.parametrize(("old", "new", "message"), [
    ("windows: [1h, 24h]", "windows: []", r"load_statistics\.windows: must be a list of 1 to 4"),
    ("windows: [1h, 24h]", "windows: [1h, 1h, 2h, 3h, 4h]", r"load_statistics\.windows: must"),
    ("windows: [1h, 24h]", "windows: [1h, 60m]", r"load_statistics\.windows\[1\]: 1h appears twice"),
    ("windows: [1h, 24h]", "windows: [1h, 1500ms]",
     r"load_statistics\.windows\[1\]: must be whole seconds between 1s and 744h"),
    ("windows: [1h, 24h]", "windows: [1h, 40d]", r"load_statistics\.windows\[1\]: must be whole"),
    ("windows: [1h, 24h]", "windows: [1h, soon]", r"load_statistics\.windows\[1\]: must be a duration"),
    ("quantile: 0.95", "quantile: 0.955", r"load_statistics\.quantile: must be a whole percentage"),
    ("quantile: 0.95", "quantile: 1", r"load_statistics\.quantile: must be a whole percentage"),
    ("quantile: 0.95", "quantile: high", r"load_statistics\.quantile: must be a number or a perc"),
    ("  quantile: 0.95\n", "", r"load_statistics\.quantile: required"),
    ("  quantile: 0.95\n", "  quantile: 0.95\n  window: 1h\n",
     r"load_statistics\.window: unknown key \(allowed: windows, quantile\)"),
    ("rate_window: 1m", "rate_window: 2h", r"pressure\.rate_window: must be whole seconds"),
    ("weights: {cpu: 0.4,", "weights: {cpu: 0.5,", r"pressure\.weights: must add up to 1 .* 1\.1"),
    ("weights: {cpu: 0.4, memory: 0.35, io: 0.25}", "weights: {cpu: 0.4, memory: 0.6}",
     r"pressure\.weights\.io: required"),
    ("weights: {cpu: 0.4,", "weights: {cpu: -0.4,", r"pressure\.weights\.cpu: must be between 0 and 1"),
    ("caps: {cpu: 90%,", "caps: {cpu: 0%,", r"pressure\.caps\.cpu: must be above 0"),
    ("caps: {cpu: 90%,", "caps: {cpu: 190%,", r"pressure\.caps\.cpu: must be between 0 and 1"),
    ("caps: {cpu: 90%, memory: 85%, io: 70%}", "caps: {cpu: 90%, memory: 85%, io: 70%, gpu: 1}",
     r"pressure\.caps\.gpu: unknown key"),
    ("pressure:\n  # rate() window", "pressure: 3\n_unused:\n  # rate() window",
     r"top level\._unused: unknown key"),
])
def test_a_bad_section_names_its_key(old, new, message):
    with pytest.raises(ThresholdError, match=message) as info:
        parse_thresholds(_table(old, new), "t.yaml")
    assert str(info.value).startswith("t.yaml: ") and "\n" not in str(info.value)


def test_a_pressure_row_without_the_pressure_section_is_refused():
    with pytest.raises(ThresholdError, match=r"alerts\[\d+\] \(NodeCpuPressure\)\.metric: "
                                             r"node_cpu_busy is recorded from the pressure "
                                             r"section; add one"):
        parse_thresholds(_without("pressure", rows=False), "t.yaml")


def test_the_promtool_statistics_equal_window_stats():
    """rules/tests/load_statistics.yaml pins Prometheus' floats; the in-process statistics of
    the same samples agree with them within float rounding (4e-16 measured)."""
    doc = yaml.safe_load((REPO / "rules" / "tests" / "load_statistics.yaml").read_text())
    expected = {}
    for case in doc["tests"][0]["promql_expr_test"]:
        for sample in case["exp_samples"]:
            expected[sample["labels"]] = sample["value"]
    h100_util = [0.25] * 31 + [0.75] * 30  # 0..60 min
    h100_demand = [0.5] * 31 + [2.0] * 30
    cluster_util_24h = [(0.25 + 0.25 + 0.5) / 3] * 31 + [(0.75 + 0.75 + 0.5) / 3] * 120
    cases = {
        "pool:gpufleet_gpu_utilization:avg_{}1h{{model=\"H100\", pool=\"gpu-h100\"}}": h100_util,
        "pool:gpufleet_demand:ratio_{}1h{{pool=\"gpu-h100\"}}": h100_demand,
        "cluster:gpufleet_gpu_utilization:avg_{}24h{{}}": cluster_util_24h,
    }
    for pattern, values in cases.items():
        stats = window_stats(values)
        for name, value in (("mean", stats.mean), ("stddev", stats.stddev), ("p95_", stats.p95)):
            key = pattern.format(name)
            assert expected[key] == pytest.approx(value, rel=1e-14, abs=1e-15), key


_ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10_000), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["5m", "1h", "24h", "30%", "0.95", "1ms", "cpu"]),
    st.lists(st.one_of(st.integers(), st.text(max_size=4), st.sampled_from(["1h", "2h"])),
             max_size=6),
    st.dictionaries(st.sampled_from(["cpu", "memory", "io", "gpu", "x"]),
                    st.one_of(st.floats(allow_nan=True), st.text(max_size=4)), max_size=4),
)


@settings(max_examples=150, deadline=None)  # each example that loads renders the rules
@given(path=st.sampled_from([
    ("load_statistics",), ("load_statistics", "windows"), ("load_statistics", "quantile"),
    ("pressure",), ("pressure", "rate_window"), ("pressure", "weights"), ("pressure", "caps"),
    ("pressure", "weights", "cpu"), ("pressure", "caps", "io")]), value=_ANY_VALUE)
def test_any_bad_value_in_the_sections_is_a_threshold_error_never_a_crash(path, value):
    raw = table_mapping(TABLE)
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        t = parse_thresholds(dump(raw), "t.yaml")
    except ThresholdError as exc:
        assert str(exc).startswith("t.yaml: ") and "\n" not in str(exc)
    else:  # a table that loads also generates its rules
        assert [f.name for f in generate(t)] == ["gpufleet-alerts.yaml",
                                                 "gpufleet-recording.yaml"]
