"""Issue 31, Build 6: every duration, count and budget of health is a row of the threshold
table (``health:`` in rules/thresholds.yaml), validated like the table's other rows, the
settings' defaults, and followed by ``gpufleet serve`` when the table is reloaded."""

from __future__ import annotations

import dataclasses

import pytest

from exporter.config import AdvisorConfig
from exporter.health.remediation import RemediationSettings
from exporter.health.stragglers import StragglerSettings
from exporter.health.verdict import HealthSettings
from exporter.thresholds import ThresholdError, load_thresholds, parse_thresholds
from exporter.thresholds.health import SECTIONS
from tests.helpers import REPO
from tests.helpers.table_yaml import dump, table_mapping

TABLE = REPO / "rules" / "thresholds.yaml"


def with_health(**parts: dict) -> str:
    """The shipped table with its health section's parts replaced (None: the part left out)."""
    raw = table_mapping()
    for part, values in parts.items():
        if values is None:
            raw["health"].pop(part)
        else:
            raw["health"][part] = values
    return dump(raw)


def test_the_shipped_rows_are_the_settings_defaults_each_with_its_documented_value():
    table = load_thresholds(TABLE).health
    assert table is not None
    assert table == load_thresholds().health  # the installed table is the checkout's
    assert (table.verdicts, table.remediation, table.stragglers) == (
        HealthSettings(), RemediationSettings(), StragglerSettings())
    v, r, s = table.verdicts, table.remediation, table.stragglers
    assert (v.xid_recent_seconds, v.lost_for_seconds, v.stale_for_seconds, v.thermal_for_seconds,
            v.pending_for_seconds, v.clean_window_seconds) == (600, 300, 300, 300, 900, 900)
    assert (v.nvlink_link_errors_per_second, v.nvlink_crc_errors_per_second,
            v.pcie_replays_per_second) == (0, 100, 8 / 60)
    assert v.critical_xids == tuple(code for code, _ in load_thresholds(TABLE).critical_xids)
    assert (r.max_drained_nodes, r.max_drained_pool_ratio, r.min_healthy_nodes,
            r.max_drains_per_window, r.drain_window_seconds, r.min_drain_seconds,
            r.replace_after_faults, r.replace_window_seconds, r.service_xids) == (
        4, 0.25, 1, 6, 3600, 3600, 3, 7 * 86400, (64, 92))
    assert (s.min_job_gpus, s.straggler_for_seconds, s.mad_threshold, s.min_relative_deviation,
            s.metrics) == (4, 600, 3.5, 0.2, ("sm_active", "utilization", "power", "sm_clock"))
    # the installed table names every key: it is where the defaults come from
    raw = table_mapping()["health"]
    assert {part: set(raw[part]) for part in SECTIONS} == {
        part: set(specs) for part, specs in SECTIONS.items()}


def test_the_durations_follow_the_alerts_they_mirror():
    """Each `for`-like row is its alert's `for`: a verdict turns when the alert fires."""
    t = load_thresholds(TABLE)
    assert t.health is not None
    v = t.health.verdicts

    def for_of(alert: str) -> float:
        return t.alert(alert).levels[0].for_seconds

    assert (v.lost_for_seconds, v.stale_for_seconds, v.thermal_for_seconds,
            v.pending_for_seconds) == (for_of("GpuLost"), for_of("GpufleetSourceDown"),
                                       for_of("GpuClocksThrottled"), for_of("GpuRowRemapPending"))
    assert v.nvlink_crc_errors_per_second * 600 == t.alert("GpuNvlinkCrcErrors").threshold("warning")


def test_a_table_without_the_section_or_with_part_of_it_keeps_the_installed_values():
    installed = load_thresholds().health
    assert installed is not None
    raw = table_mapping()
    raw.pop("health")
    assert parse_thresholds(dump(raw)).health == installed
    edited = parse_thresholds(with_health(verdicts={"clean_window": "30m"}, stragglers=None))
    assert edited.health is not None
    assert edited.health.verdicts == dataclasses.replace(installed.verdicts, clean_window_seconds=1800)
    assert (edited.health.remediation, edited.health.stragglers) == (
        installed.remediation, installed.stragglers)


def test_the_verdicts_critical_xids_are_the_tables_own():
    raw = table_mapping()
    raw["critical_xids"] = {79: "fallen off the bus"}
    health = parse_thresholds(dump(raw)).health
    assert health is not None and health.verdicts.critical_xids == (79,)


BAD = [
    ("verdicts", "lost_for", "soon", "health.verdicts.lost_for: must be a duration"),
    ("verdicts", "clean_window", "-5m", "health.verdicts.clean_window: must be a duration"),
    ("verdicts", "stale_for", "90d", "health.verdicts.stale_for: must be a duration from 0s to 31d, "
                                     "got '90d'"),
    ("verdicts", "pcie_replays_per_minute", -1, "health.verdicts.pcie_replays_per_minute: must be "
                                                "between 0 and 1e+09 (per minute), got -1"),
    ("verdicts", "nvlink_crc_errors_per_second", "lots",
     "health.verdicts.nvlink_crc_errors_per_second: must be a number (per second), got 'lots'"),
    ("verdicts", "xid_window", "10m", "health.verdicts.xid_window: unknown key (allowed: xid_recent, "),
    ("remediation", "max_drained_pool_ratio", "150%",
     "health.remediation.max_drained_pool_ratio: must be between 0 and 1 (ratio), got '150%'"),
    ("remediation", "max_drained_nodes", 2.5,
     "health.remediation.max_drained_nodes: must be a whole number from 0 to 1,000,000, got 2.5"),
    ("remediation", "replace_after_faults", 0,
     "health.remediation.replace_after_faults: must be a whole number from 1 to 1,000, got 0"),
    ("remediation", "service_xids", [64, 64], "health.remediation.service_xids: lists an XID twice"),
    ("remediation", "service_xids", 64, "health.remediation.service_xids: must be a list of XID numbers"),
    ("stragglers", "min_job_gpus", 2,
     "health.stragglers.min_job_gpus: must be a whole number from 3 to 1,000,000, got 2"),
    ("stragglers", "metrics", ["sm_active", "temperature"],
     "health.stragglers.metrics[1]: unknown metric 'temperature' (known: sm_active, utilization, "
     "power, sm_clock)"),
    ("stragglers", "metrics", [], "health.stragglers.metrics: must be a non-empty list"),
    ("stragglers", "mad_threshold", True, "health.stragglers.mad_threshold: must be a number"),
]


@pytest.mark.parametrize(("part", "key", "value", "message"), BAD,
                         ids=[f"{b[0]}.{b[1]}={b[2]!r}" for b in BAD])
def test_a_bad_value_is_refused_with_one_line_naming_its_key(part, key, value, message):
    raw = table_mapping()
    raw["health"][part][key] = value
    with pytest.raises(ThresholdError) as caught:
        parse_thresholds(dump(raw), "site.yaml")
    text = str(caught.value)
    assert text.startswith(f"site.yaml: {message}"), text
    assert "\n" not in text


def test_a_bad_section_shape_is_refused():
    raw = table_mapping()
    raw["health"] = {"verdicts": {}, "budgets": {}}
    with pytest.raises(ThresholdError, match=r"^t.yaml: health.budgets: unknown key \(allowed: "
                                             r"verdicts, remediation, stragglers\)$"):
        parse_thresholds(dump(raw), "t.yaml")
    raw["health"] = {"remediation": [1]}
    with pytest.raises(ThresholdError, match=r"^t.yaml: health.remediation: must be a mapping, "
                                             r"got \[1\]$"):
        parse_thresholds(dump(raw), "t.yaml")


def test_the_installed_table_must_name_every_key():
    raw = table_mapping()
    del raw["health"]["remediation"]["min_drain"]
    with pytest.raises(ThresholdError, match=r"^thresholds.yaml: health.remediation.min_drain: "
                                             r"required in the table installed with gpufleet"):
        parse_thresholds(dump(raw), installed=True)


def test_the_config_overrides_two_rows_and_follows_the_table_for_the_rest():
    from exporter.advisor.advise import health_settings
    from exporter.config import Config, build

    table = parse_thresholds(with_health(verdicts={"clean_window": "20m", "lost_for": "2m"},
                                         remediation={"min_drain": "2h", "max_drained_nodes": 2}))
    defaults = build(Config, {}).advisor
    followed = health_settings(defaults, table)
    assert (followed.verdicts.clean_window_seconds, followed.verdicts.lost_for_seconds,
            followed.remediation.min_drain_seconds, followed.remediation.max_drained_nodes) == (
        1200, 120, 7200, 2)
    assert health_settings(defaults) == load_thresholds().health  # no table: the installed one
    given = build(Config, {"advisor": {"health": {"clean_window": "2s", "min_drain": "8s"}}}).advisor
    assert isinstance(given, AdvisorConfig)
    overridden = health_settings(given, table)
    assert (overridden.verdicts.clean_window_seconds, overridden.verdicts.lost_for_seconds,
            overridden.remediation.min_drain_seconds, overridden.remediation.max_drained_nodes) == (
        2, 120, 8, 2)


def test_a_reloaded_table_changes_the_monitors_settings_and_keeps_its_state(tmp_path):
    """`gpufleet serve --thresholds FILE`: an edit of the health rows reaches the running
    monitor on reload (SIGHUP), the config's override stays, and what it drained stays."""
    from exporter.cli import serve
    from exporter.health.remediation import DrainRecord
    from exporter.web.server import Reload
    from tests.test_thresholds_reload import SHIPPED, serve_config

    table = tmp_path / "thresholds.yaml"
    table.write_text(TABLE.read_text())
    config = serve_config(SHIPPED["cluster"], table, tmp_path)
    config = dataclasses.replace(config, advisor=dataclasses.replace(
        config.advisor, health=dataclasses.replace(config.advisor.health, min_drain=30.0)))
    _, state, service = serve.assemble(config, ["sim"])
    assert service is not None and service.health is not None
    monitor = service.health
    try:
        assert (monitor.tracker.settings.clean_window_seconds,
                monitor.remediator.settings.min_drain_seconds,
                monitor.remediator.settings.max_drained_nodes,
                monitor.stragglers.settings.straggler_for_seconds) == (900, 30, 4, 600)
        monitor.remediator.state.drained["gpu-001"] = DrainRecord("gpu-h100", "XID 79 on GPU 3", 1.0)
        text = table.read_text()
        for old, new in (("    clean_window: 15m\n", "    clean_window: 20m\n"),
                         ("    min_drain: 1h  #", "    min_drain: 2h  #"),
                         ("    max_drained_nodes: 4 ", "    max_drained_nodes: 2 "),
                         ("    for: 10m  #", "    for: 15m  #")):
            assert old in text
            text = text.replace(old, new, 1)
        table.write_text(text)
        assert Reload(state).run_once()["thresholds"] == "changed"
        assert (monitor.tracker.settings.clean_window_seconds,
                monitor.remediator.settings.min_drain_seconds,
                monitor.remediator.settings.max_drained_nodes,
                monitor.stragglers.settings.straggler_for_seconds) == (1200, 30, 2, 900)
        assert service.health is monitor and "gpu-001" in monitor.remediator.state.drained
        table.write_text(text.replace("    lost_for: 5m", "    lost_for: never"))
        assert Reload(state).run_once()["thresholds"] == "failed"  # the last good table stays
        assert monitor.tracker.settings.lost_for_seconds == 300
    finally:
        service.deliverer.store.close()
