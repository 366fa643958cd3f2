"""The threshold table: what the loader reads from it, and one clear error for a bad one."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.cli import main
from exporter.config import AdvisorConfig
from exporter.thresholds import METRICS, ThresholdError, load_thresholds, parse_thresholds
from tests.helpers import REPO
from tests.helpers.table_yaml import dump, table_mapping

TABLE = REPO / "rules" / "thresholds.yaml"


def test_the_reference_table_loads_with_the_operators_thresholds():
    t = load_thresholds(TABLE)
    util = t.alert("GpuJobUtilizationLow")
    assert (util.op, util.scope, util.metric.subject, util.page, util.owner) == (
        "<", "all", "job", False, "job owner")
    assert [(lv.severity, lv.threshold, lv.for_seconds) for lv in util.levels] == [
        ("warning", 0.30, 3600), ("critical", 0.10, 7200)]
    assert t.alert("GpuMemoryHigh").threshold("warning") == 0.85
    assert t.alert("GpuMemoryHigh").threshold("critical") == 0.95
    assert t.alert("GpuTemperatureHigh").threshold("warning") == 80
    assert t.alert("GpuTemperatureHigh").threshold("critical") == 85
    nvlink = t.alert("GpuNvlinkBandwidthLow")
    assert (nvlink.severities, nvlink.threshold("warning"), nvlink.level("warning").for_seconds,
            nvlink.scope) == (("warning",), 0.5, 1800, "busy_multi_gpu")
    frag = t.alert("GpuClusterFragmentationHigh")
    assert (frag.severities, frag.threshold("warning"), dict(frag.labels)) == (
        ("warning",), 50, {"action": "compact"})
    fleet = t.alert("GpuFleetFragmentationHigh")  # the cluster index, at the pools' level
    assert (fleet.metric.key, fleet.severities, fleet.threshold("warning"), fleet.owner,
            fleet.page, dict(fleet.labels)) == (
        "cluster_fragmentation_index", ("warning",), 50, "capacity planner", False,
        {"action": "compact"})
    assert t.busy_utilization == 0.5
    assert t.exporter_jobs == ("gpufleet-nodes", "gpufleet-cluster")
    assert t.exporter_job_modes == (("node", "gpufleet-nodes"), ("cluster", "gpufleet-cluster"))
    assert [code for code, _ in t.critical_xids] == [48, 63, 64, 74, 79, 92, 94, 95]
    assert [row.alert for row in t.alerts] == [
        "GpuJobUtilizationLow", "GpuMemoryHigh", "GpuTemperatureHigh", "GpuPowerHigh",
        "GpuNvlinkBandwidthLow", "GpuClusterFragmentationHigh", "GpuFleetFragmentationHigh",
        "GpuJobCheckpointStale", "GpuPoolPreemptionOverheadHigh", "GpuJobNvlinkGenerationsMixed",
        "GpuJobStraggler", "GpuLost",
        "GpuNodeDrained", "GpuXidError",
        "GpuEccUncorrectable", "GpuRowRemapFailed", "GpuRowRemapPending", "GpuClocksThrottled",
        "GpuPowerCapped", "GpuNvlinkErrors", "GpuNvlinkCrcErrors", "GpuSmActivityLow", "GpufleetSourceDown",
        "GpufleetSourceDownEverywhere", "GpufleetTargetDown", "GpufleetSnapshotStale", "GpufleetJobDown",
        "GpufleetAdvisorOutboxErrors", "GpufleetConfigReloadFailed", "NodeCpuPressure",
        "NodeMemoryPressure",
        "NodeDiskIoPressure", "NodePressureHigh"]


def test_checkpoint_and_nvlink_rows_are_tickets_and_the_interval_is_half_the_threshold():
    """Issue 17: "a training job's checkpoint is older than 2 x the interval"; the interval
    advisor.checkpoint_interval defaults to is read from the row, not written twice."""
    t = load_thresholds(TABLE)
    stale = t.alert("GpuJobCheckpointStale")
    assert (stale.metric.key, stale.op, stale.owner, stale.page, stale.metric.unit) == (
        "job_checkpoint_age", ">", "job owner", False, "seconds")
    assert [(lv.severity, lv.threshold, lv.for_seconds) for lv in stale.levels] == [
        ("warning", 1800, 300)]
    assert 'source="stated"' in stale.metric.expr  # an assumed age is never stale
    assert t.checkpoint_interval() == 900
    assert AdvisorConfig().checkpoint_interval == 900
    mixed = t.alert("GpuJobNvlinkGenerationsMixed")
    assert (mixed.metric.key, mixed.op, mixed.owner, mixed.page) == (
        "job_nvlink_generations", ">", "platform team", False)
    assert [(lv.severity, lv.threshold, lv.for_seconds) for lv in mixed.levels] == [
        ("warning", 1, 600)]
    # the interval follows the row; a table without it gives the reference cluster's 15 min
    text = TABLE.read_text()
    assert parse_thresholds(text.replace("{threshold: 30m, for: 5m}",
                                         "{threshold: 20m, for: 5m}")).checkpoint_interval() == 600
    assert parse_thresholds(text.replace("{threshold: 30m, for: 5m}",
                                         "{threshold: 2400, for: 5m}")).checkpoint_interval() == 1200
    start = text.index("  - alert: GpuJobCheckpointStale")
    without = text[:start] + text[text.index("  - alert: GpuJobNvlinkGenerationsMixed"):]
    assert parse_thresholds(without).checkpoint_interval() == 900
    with pytest.raises(ThresholdError, match=r"GpuJobCheckpointStale\)\.warning\.threshold: must be"):
        parse_thresholds(text.replace("{threshold: 30m, for: 5m}", "{threshold: 30 min, for: 5m}"))


def test_the_paging_policy_pages_only_for_what_is_urgent_actionable_and_hurting_now():
    """docs/alerting.md's list: everything else is a ticket, whatever its severity."""
    t = load_thresholds(TABLE)
    assert {row.alert for row in t.alerts if row.page} == {
        "GpuLost", "GpuXidError", "GpuEccUncorrectable", "GpuTemperatureHigh",
        "GpufleetSourceDownEverywhere", "GpufleetJobDown"}
    assert all(row.owner == "on-call" for row in t.alerts if row.page)
    assert all(row.owner != "on-call" for row in t.alerts if not row.page)
    # a critical that does not page: the GPU runs on, it needs replacing, not waking someone
    assert t.alert("GpuRowRemapFailed").severities == ("critical",)
    assert not t.alert("GpuRowRemapFailed").page
    # power alone, on every GPU; being held back by the cap is its own alert, on busy GPUs
    assert t.alert("GpuPowerHigh").scope == "all"
    assert (t.alert("GpuPowerCapped").scope, t.alert("GpuPowerCapped").severities) == (
        "busy", ("warning",))


def test_page_needs_a_critical_level_and_owner_one_of_the_known():
    def row(extra: str) -> str:
        return _table(**{"    owner: job owner\n    summary: A job barely uses":
                         f"    owner: job owner\n{extra}    summary: A job barely uses"})
    parse_thresholds(row("    page: true\n"))  # the row has a critical level
    with pytest.raises(ThresholdError, match=r"alerts\[0\] \(GpuJobUtilizationLow\)\.page: must be"):
        parse_thresholds(row("    page: yes please\n"))
    no_critical = _table(**{"    owner: platform team\n    summary: A GPU has memory row remaps":
                            "    page: true\n    owner: platform team\n"
                            "    summary: A GPU has memory row remaps"})
    with pytest.raises(ThresholdError, match=r"\(GpuRowRemapPending\)\.page: only a critical level"):
        parse_thresholds(no_critical)
    with pytest.raises(ThresholdError, match=r"\.owner: must say who acts"):
        parse_thresholds(_table(**{"owner: job owner": "owner: somebody"}))


def test_power_is_per_model_h200_from_the_table_others_from_the_catalogue_tdp():
    power = load_thresholds(TABLE).alert("GpuPowerHigh")
    assert power.op == ">="  # the cap stops the draw at the limit: > would never fire
    assert power.threshold("warning", "H200") == 650
    assert power.threshold("critical", "H200") == 700
    # 93% and 100% of the catalogue TDP
    assert power.threshold("warning", "H100") == 651
    assert power.threshold("critical", "H100") == 700
    assert power.threshold("warning", "B200") == 930
    assert power.threshold("critical", "B200") == 1000
    assert power.threshold("warning", "L4") == pytest.approx(66.96)
    assert power.level("critical").for_seconds == 300
    # a model the catalogue lacks: the fraction, applied to its enforced limit
    assert power.threshold("warning", "G2") == 0.93
    from_table = {m.model for m in power.models if m.from_table}
    assert from_table == {"H200"}
    assert len(power.models) == 19  # every catalogue model with a TDP


def _table(**replacements: str) -> str:
    text = TABLE.read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


# (what is wrong, edit of the reference table, words the one-line error must contain)
BAD_TABLES = [
    ("unknown metric", {"metric: gpu_temperature": "metric: gpu_temprature"},
     ["alerts[2] (GpuTemperatureHigh).metric", "unknown metric 'gpu_temprature'", "gpu_temperature"]),
    ("warning and critical in the wrong order",
     {"critical: {threshold: 85, for: 2m}": "critical: {threshold: 75, for: 2m}"},
     ["alerts[2] (GpuTemperatureHigh)", "critical threshold (75) must be above warning threshold (80)",
      "wrong order"]),
    ("wrong order for a below-threshold alert",
     {"critical: {threshold: 10%, for: 2h}": "critical: {threshold: 40%, for: 2h}"},
     ["alerts[0] (GpuJobUtilizationLow)", "must be below warning", "wrong order"]),
    ("wrong order in a per-model override",
     {"H200: {warning: 650, critical: 700}": "H200: {warning: 700, critical: 650}"},
     ["alerts[3] (GpuPowerHigh).models.H200", "wrong order"]),
    ("malformed duration", {"warning: {threshold: 30%, for: 1h}": "warning: {threshold: 30%, for: 1 hour}"},
     ["alerts[0] (GpuJobUtilizationLow).warning.for", "must be a duration", "'1 hour'"]),
    ("missing model", {"H200: {warning: 650, critical: 700}": "H201: {warning: 650, critical: 700}"},
     ["alerts[3] (GpuPowerHigh).models.H201", "not in the GPU catalogue", "H200"]),
    ("model without one of its levels", {"H200: {warning: 650, critical: 700}": "H200: {warning: 650}"},
     ["alerts[3] (GpuPowerHigh).models.H200.critical", "required"]),
    ("unknown key", {"    owner: job owner\n    summary: A job":
                     "    owner: job owner\n    severity: page\n    summary: A job"},
     ["alerts[0] (GpuJobUtilizationLow).severity", "unknown key"]),
    ("unknown scope", {"scope: busy_multi_gpu": "scope: busiest"},
     ["alerts[4] (GpuNvlinkBandwidthLow).scope", "allocated"]),
    ("ratio out of range", {"threshold: 85%": "threshold: 85"},
     ["alerts[1] (GpuMemoryHigh).warning.threshold", "between 0 and 1"]),
    ("op the metric cannot take",
     {'metric: gpu_temperature\n    op: ">"': 'metric: gpu_temperature\n    op: "<"'},
     ["alerts[2] (GpuTemperatureHigh).op"]),
    ("duplicate alert name", {"alert: GpuMemoryHigh": "alert: GpuJobUtilizationLow"},
     ["alerts[1] (GpuJobUtilizationLow).alert", "appears twice"]),
    ("missing action", {"    action: Check cooling, reduce load.\n": ""},
     ["alerts[2] (GpuTemperatureHigh).action", "required"]),
    ("not YAML", {"alerts:\n": "alerts: [\n"}, ["not valid YAML at line ", "(in alerts)"]),
    ("key given twice", {"    owner: job owner\n    summary: A job":
                         "    owner: job owner\n    owner: on-call\n    summary: A job"},
     ["alerts[0].owner: given twice, at lines"]),
]


@pytest.mark.parametrize(("what", "edits", "words"), BAD_TABLES, ids=[b[0] for b in BAD_TABLES])
def test_a_bad_table_gets_one_clear_error_and_no_generated_files(tmp_path, capsys, what, edits,
                                                                 words):
    table = tmp_path / "thresholds.yaml"
    table.write_text(_table(**edits))
    out = tmp_path / "out"
    code = main(["rules", "--thresholds", str(table), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"gpufleet: {table}: ")
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not out.exists()


def test_a_bad_table_leaves_existing_output_untouched(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["rules", "--out", str(out), "--thresholds", str(TABLE)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    table = tmp_path / "thresholds.yaml"
    table.write_text(_table(**{"for: 5m}": "for: 5 minutes}"}))
    capsys.readouterr()
    assert main(["rules", "--out", str(out), "--thresholds", str(table)]) == 2
    assert "must be a duration" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_missing_table_is_one_line_exit_2(tmp_path, capsys):
    assert main(["rules", "--thresholds", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read the threshold table" in err


def test_the_real_command_prints_no_traceback_for_a_bad_table(tmp_path):
    table = tmp_path / "thresholds.yaml"
    table.write_text(_table(**{"metric: gpu_temperature": "metric: gpu_temp"}))
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "rules", "--thresholds", str(table), "--out",
         str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "unknown metric 'gpu_temp'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_loader_error_type_is_a_config_error():
    from exporter.config import ConfigError

    with pytest.raises(ThresholdError) as info:
        parse_thresholds("busy_utilization: 50%\n", "t.yaml")
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == "t.yaml: top level.exporter_jobs: required"


def test_runbook_base_url_is_relative_by_default_and_a_site_sets_its_own():
    text = TABLE.read_text()
    assert load_thresholds(TABLE).runbook_base_url == "docs/runbooks.md"
    without = "\n".join(line for line in text.splitlines()
                        if not line.startswith("runbook_base_url:"))
    assert parse_thresholds(without).runbook_base_url == "docs/runbooks.md"  # optional
    site = text.replace("runbook_base_url: docs/runbooks.md",
                        "runbook_base_url: https://wiki.example.com/gpu/runbooks.md")
    assert parse_thresholds(site).runbook_base_url == "https://wiki.example.com/gpu/runbooks.md"
    for value, message in [
            ("https://wiki.example.com/runbooks.md#top", "without an #anchor"),
            ("'docs/run books.md'", "one URL or path"), ("''", "non-empty string")]:
        bad = text.replace("runbook_base_url: docs/runbooks.md", f"runbook_base_url: {value}")
        with pytest.raises(ThresholdError, match=f"runbook_base_url: .*{message}"):
            parse_thresholds(bad, "t.yaml")
    # the old key is named with its new one, not "unknown key"
    old = text.replace("runbook_base_url: docs/runbooks.md",
                       "runbook_url: https://github.com/gpufleet/gpufleet/blob/main/docs/runbooks.md")
    with pytest.raises(ThresholdError) as info:
        parse_thresholds(old, "t.yaml")
    assert str(info.value) == ("t.yaml: runbook_url: renamed runbook_base_url: the runbooks page "
                               "your operators reach, without an #anchor (default docs/runbooks.md)")


def test_runbooks_have_a_section_per_alert_with_the_tables_action():
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    sections = {}
    for block in runbooks.split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        sections[title.strip().lower()] = " ".join(body.split())
    for row in load_thresholds(TABLE).alerts:
        assert row.runbook in sections, f"docs/runbooks.md lacks a section for {row.alert}"
        assert f"**Action:** {row.action}" in sections[row.runbook], row.alert
        paging = "pages" if row.page else "never pages"
        assert f"**Who acts:** {row.owner} (" in sections[row.runbook], row.alert
        assert paging in sections[row.runbook].split("**Who acts:**")[1].split(")")[0], row.alert


def test_mutes_pages_is_a_flag_of_a_per_node_row():
    text = TABLE.read_text()
    assert load_thresholds(TABLE).alert("GpuNodeDrained").mutes_pages
    assert not any(row.mutes_pages for row in load_thresholds(TABLE).alerts
                   if row.alert != "GpuNodeDrained")
    bad = text.replace("    mutes_pages: true\n", "    mutes_pages: yes please\n")
    with pytest.raises(ThresholdError, match=r"\(GpuNodeDrained\)\.mutes_pages: must be true or false"):
        parse_thresholds(bad, "t.yaml")
    # a per-GPU row has no node to mute on its own
    gpu = text.replace("    page: true\n    owner: on-call\n    summary: A GPU stopped answering.",
                       "    page: true\n    mutes_pages: true\n    owner: on-call\n"
                       "    summary: A GPU stopped answering.")
    assert gpu != text
    with pytest.raises(ThresholdError, match=r"\(GpuLost\)\.mutes_pages: only a per-node alert"):
        parse_thresholds(gpu, "t.yaml")


def _runbook_sections() -> dict[str, str]:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    return {title.strip().lower(): " ".join(body.split()) for title, _, body in
            (block.partition("\n") for block in runbooks.split("\n## ")[1:])}


def test_compaction_runbooks_say_who_carries_out_the_moves():
    """The advisor plans; only a scheduler in advisor.receivers moves jobs, and by default
    there is none: no compaction row or its runbook may say the advisor carries moves out."""
    assert AdvisorConfig().receivers == ()  # the default has no receiver
    sections = _runbook_sections()
    compact = [row for row in load_thresholds(TABLE).alerts
               if dict(row.labels).get("action") == "compact"]
    assert {row.alert for row in compact} == {"GpuClusterFragmentationHigh",
                                              "GpuFleetFragmentationHigh"}
    for row in compact:
        for text in (row.action, sections[row.runbook]):
            assert "carries out the moves" not in text and "the advisor acts" not in text
            assert "advisor.receivers" in text and "no receiver (the default)" in text, row.alert


def test_runbooks_never_call_best_fit_fragmentation_aware():
    """`gpufleet serve --help` says bestfit is blind to fragmentation; the runbooks agree."""
    from exporter.sources.sim.options import SimSource

    help_text = " ".join(str(f.metadata) for f in dataclasses.fields(SimSource)
                         if f.name == "policy")
    assert "blind to fragmentation" in help_text
    runbooks = " ".join((REPO / "docs" / "runbooks.md").read_text().split())
    for sentence in re.split(r"(?<=[.;:])\s", runbooks):
        if "fragmentation-aware" in sentence or "aware of fragmentation" in sentence:
            assert not re.search(r"best-?fit", sentence, re.IGNORECASE), sentence


def test_the_runbook_lists_every_critical_xid_with_the_tables_meaning():
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    for code, meaning in load_thresholds(TABLE).critical_xids:
        assert f"| {code} | {meaning} |" in runbooks


def test_paths_in_messages_are_the_ones_given(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    relative = Path("rules") / "thresholds.yaml"
    assert main(["rules", "--thresholds", str(relative), "--check"]) == 0
    assert "rules/gpufleet-alerts.yaml" in capsys.readouterr().out


_ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10_000), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["5m", "1h", "30%", "gpu_power", ">=", "H200", "all"]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=5), st.integers(),
                                                         max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(row=st.integers(0, 8), key=st.sampled_from(
    ["alert", "metric", "op", "scope", "warning", "critical", "models", "labels", "summary",
     "action", "runbook", "threshold", "for"]), value=_ANY_VALUE)
def test_any_bad_value_anywhere_is_a_threshold_error_never_a_crash(row, key, value):
    raw = table_mapping(TABLE)
    target = raw["alerts"][row]
    if key in ("threshold", "for"):
        level = target.get("warning") or target["critical"]
        level[key] = value
    else:
        target[key] = value
    try:
        parse_thresholds(dump(raw), "t.yaml")
    except ThresholdError as exc:
        assert str(exc).startswith("t.yaml: ") and "\n" not in str(exc)


_NAMES_OR_MODES = ("must be a non-empty list of job names or a mapping of modes (node, cluster) "
                   "to job names")


@pytest.mark.parametrize(("value", "message"), [
    ([], f"exporter_jobs: {_NAMES_OR_MODES}, got []"),
    ("gpufleet", f"exporter_jobs: {_NAMES_OR_MODES}, got 'gpufleet'"),
    (["gpufleet", 'a"b'], "exporter_jobs[1]: must be a plain job name, got 'a\"b'"),
    (["gpufleet", "gpufleet"], "exporter_jobs[1]: gpufleet appears twice"),
    ({}, "exporter_jobs: must name the job of at least one mode (node, cluster)"),
    ({"nodes": "gpufleet-nodes"}, "exporter_jobs.nodes: unknown key (allowed: node, cluster)"),
    ({"node": "a b"}, "exporter_jobs.node: must be a plain job name, got 'a b'"),
    ({"node": "gpufleet", "cluster": "gpufleet"},
     "exporter_jobs.cluster: gpufleet is the node job too; each mode has its own scrape job"),
])
def test_exporter_jobs_is_a_list_of_plain_distinct_names(value, message):
    raw = yaml.safe_load(TABLE.read_text())
    raw["exporter_jobs"] = value
    with pytest.raises(ThresholdError) as info:
        parse_thresholds(yaml.safe_dump(raw), "t.yaml")
    assert str(info.value) == f"t.yaml: {message}"


def test_every_table_metric_has_its_promql_under_the_same_name():
    """One name per concept: one record per table metric holds its vocabulary and its PromQL
    under its key, and a per-model metric (power) has the enforced limit it falls back to."""
    assert all(key == metric.key and metric.expr and metric.describe
               for key, metric in METRICS.items())
    assert METRICS["gpu_temperature"].expr == "gpufleet_gpu_temperature_celsius"
    assert [key for key, metric in METRICS.items() if metric.cap] == ["gpu_power"]
    assert all(bool(metric.cap) == metric.relative_to_tdp for metric in METRICS.values())


def test_the_packaged_table_is_read_once_and_a_named_one_every_time(tmp_path):
    """No path: the packaged table, cached for the process. A path is read on every call,
    so a reload (issue 29's SIGHUP) sees the file as it is now."""
    assert load_thresholds() is load_thresholds()
    table = tmp_path / "thresholds.yaml"
    table.write_text(TABLE.read_text())
    first = load_thresholds(table)
    table.write_text(TABLE.read_text().replace("busy_utilization: 50%", "busy_utilization: 25%", 1))
    assert (first.busy_utilization, load_thresholds(table).busy_utilization) == (0.5, 0.25)
