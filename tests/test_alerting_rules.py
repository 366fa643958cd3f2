"""Generated rules: drift, promtool check and unit tests, coverage, and the command's contract."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from exporter.alerting.rules import RECORDING_GROUPS, generate, recording_groups
from exporter.cli import main
from exporter.durations import parse_duration
from exporter.thresholds import SEVERITIES, load_thresholds
from tests.helpers import REPO, require_binary
from tests.helpers.promtool import (
    RULE_FILES,
    Group,
    groups_seen,
    rule_groups,
    spelled,
    unit_tests_on_groups_seen,
)
from tests.test_imports import string_literals

RULES = REPO / "rules"
TABLE = RULES / "thresholds.yaml"
COMMITTED = ("gpufleet-alerts.yaml", "gpufleet-recording.yaml", "gpufleet-prometheusrule.yaml")


def _generate_all(out: Path, *extra: str) -> None:
    for fmt in ("prometheus", "prometheusrule"):
        assert main(["rules", "--thresholds", str(TABLE), "--out", str(out), "--format", fmt,
                     *extra]) == 0


def _alert_rules(text: str) -> list[dict]:
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def _promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    # one pipe for both streams keeps promtool's "Unit Testing: FILE" next to its FAILED
    return subprocess.run([require_binary("promtool"), *args], cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)


# -- drift --------------------------------------------------------------------


def test_regenerated_files_are_byte_identical_to_the_committed_ones(tmp_path, capsys):
    _generate_all(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(COMMITTED)
    for name in COMMITTED:
        assert (tmp_path / name).read_bytes() == (RULES / name).read_bytes(), (
            f"rules/{name} is out of date: run `gpufleet rules` (and --format prometheusrule)"
        )


def test_check_passes_on_the_committed_output(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["rules", "--check"]) == 0
    assert main(["rules", "--check", "--format", "prometheusrule"]) == 0
    out = capsys.readouterr().out
    assert "up to date" in out and "gpufleet-prometheusrule.yaml" in out


def test_check_names_the_stale_files_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "rules"
    _generate_all(out)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    changed = tmp_path / "thresholds.yaml"
    changed.write_text(TABLE.read_text().replace("{threshold: 80, for: 5m}",
                                                 "{threshold: 78, for: 5m}"))
    capsys.readouterr()
    assert main(["rules", "--thresholds", str(changed), "--out", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{out / 'gpufleet-alerts.yaml'}" in err
    assert "gpufleet-recording.yaml" not in err  # the recording rules did not change
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    # a missing file is out of date too, and --check does not create it
    (out / "gpufleet-recording.yaml").unlink()
    assert main(["rules", "--thresholds", str(TABLE), "--out", str(out), "--check"]) == 1
    assert "gpufleet-recording.yaml" in capsys.readouterr().err
    assert not (out / "gpufleet-recording.yaml").exists()


def test_check_on_drift_names_the_command_that_fixes_it_with_the_same_flags(tmp_path, capsys):
    """issue 29: a stale PrometheusRule was answered "run `gpufleet rules`", which writes the
    plain rule files and leaves the PrometheusRule stale."""
    out = tmp_path / "out dir"
    flags = ["--thresholds", str(TABLE), "--out", str(out), "--format", "prometheusrule",
             "--time-scale", "0.05", "--label", "release=kps"]
    capsys.readouterr()
    assert main(["rules", *flags, "--check"]) == 1
    err = capsys.readouterr().err
    fix = shlex.join(["gpufleet", "rules", *flags])
    assert f"(run `{fix}` and commit the result)" in err
    # the named command, run, makes the check pass
    assert main(["rules", *shlex.split(fix)[2:]]) == 0
    assert main(["rules", *flags, "--check"]) == 0


def test_default_output_is_beside_the_table(tmp_path, capsys):
    table = tmp_path / "thresholds.yaml"
    shutil.copy(TABLE, table)
    assert main(["rules", "--thresholds", str(table)]) == 0
    assert (tmp_path / "gpufleet-alerts.yaml").read_bytes() == (
        RULES / "gpufleet-alerts.yaml").read_bytes()
    assert "wrote" in capsys.readouterr().out


def test_outside_a_checkout_the_installed_table_is_used_and_out_is_required(tmp_path, capsys,
                                                                             monkeypatch):
    """issue 15: `gpufleet rules` failed outside a checkout (no rules/thresholds.yaml there)."""
    monkeypatch.chdir(tmp_path)
    assert main(["rules"]) == 2  # no table here and no --out: never write into the package
    assert "--out" in capsys.readouterr().err
    assert main(["rules", "--out", "out"]) == 0
    assert main(["rules", "--out", "out", "--format", "prometheusrule"]) == 0
    for name in ("gpufleet-alerts.yaml", "gpufleet-recording.yaml",
                 "gpufleet-prometheusrule.yaml"):
        assert (tmp_path / "out" / name).read_bytes() == (RULES / name).read_bytes(), name


def test_prometheusrule_labels_are_set_with_label(tmp_path):
    """issue 15: kube-prometheus-stack's default ruleSelector needs `release: <its release>`."""
    assert main(["rules", "--format", "prometheusrule", "--out", str(tmp_path),
                 "--label", "release=kube-prometheus-stack", "--label", "team=gpu"]) == 0
    rule = yaml.safe_load((tmp_path / "gpufleet-prometheusrule.yaml").read_text())
    assert rule["metadata"]["labels"] == {
        "app.kubernetes.io/name": "gpufleet", "app.kubernetes.io/component": "alerting",
        "release": "kube-prometheus-stack", "team": "gpu"}
    committed = yaml.safe_load((RULES / "gpufleet-prometheusrule.yaml").read_text())
    assert rule["spec"] == committed["spec"]
    assert "--label release=kube-prometheus-stack" in (REPO / "docs" / "deploy.md").read_text()


@pytest.mark.parametrize(("argv", "message"), [
    (["--format", "prometheusrule", "--label", "release"], "must be KEY=VALUE"),
    (["--format", "prometheusrule", "--label", "bad key=x"], "not a Kubernetes label key"),
    (["--format", "prometheusrule", "--label", "k=bad value"], "not a Kubernetes label value"),
    (["--label", "release=x"], "only with --format prometheusrule"),
])
def test_a_bad_label_is_a_usage_error(tmp_path, capsys, argv, message):
    try:
        code = main(["rules", "--out", str(tmp_path), *argv])
    except SystemExit as exc:  # argparse's own usage error
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option", ["--for-scale", "--time-scale"])
@pytest.mark.parametrize("scale", ["0", "-1", "nan", "inf", "fast"])
def test_for_scale_must_be_a_positive_number(option, scale, capsys):
    with pytest.raises(SystemExit) as info:
        main(["rules", option, scale, "--check"])
    assert info.value.code == 2
    assert f"{option}: must be a positive number" in capsys.readouterr().err


# -- --for-scale --------------------------------------------------------------


def test_for_scale_scales_every_for_and_nothing_else(tmp_path):
    _generate_all(tmp_path, "--for-scale", "0.01")
    scaled = (tmp_path / "gpufleet-alerts.yaml").read_text()
    assert scaled.splitlines()[1] == "# Every `for` is scaled by 0.01 (--for-scale): for tests only."
    original = _alert_rules((RULES / "gpufleet-alerts.yaml").read_text())
    fast = _alert_rules(scaled)
    assert len(fast) == len(original)
    for slow_rule, fast_rule in zip(original, fast, strict=True):
        assert parse_duration(fast_rule["for"]) == pytest.approx(
            parse_duration(slow_rule["for"]) * 0.01, abs=0.001)
        assert fast_rule["expr"] == slow_rule["expr"]
        assert fast_rule["labels"] == slow_rule["labels"]
    by_name = {(r["alert"], r["labels"]["severity"]): r["for"] for r in fast}
    assert by_name[("GpuJobUtilizationLow", "warning")] == "36s"
    assert by_name[("GpuJobUtilizationLow", "critical")] == "1m12s"
    assert by_name[("GpuTemperatureHigh", "critical")] == "1s200ms"
    # the recording rules have no `for`, so they come out the same apart from the header
    recording = (tmp_path / "gpufleet-recording.yaml").read_text().split("\n", 2)[2]
    assert recording == (RULES / "gpufleet-recording.yaml").read_text().split("\n", 1)[1]


# -- promtool -----------------------------------------------------------------


def test_promtool_check_rules_passes_on_every_generated_file(tmp_path):
    files = [str(RULES / "gpufleet-alerts.yaml"), str(RULES / "gpufleet-recording.yaml")]
    # the PrometheusRule object's spec is a rule file
    spec = yaml.safe_load((RULES / "gpufleet-prometheusrule.yaml").read_text())["spec"]
    (tmp_path / "prometheusrule-spec.yaml").write_text(yaml.safe_dump(spec))
    files.append(str(tmp_path / "prometheusrule-spec.yaml"))
    scaled = tmp_path / "scaled"
    _generate_all(scaled, "--for-scale", "0.01")
    files += [str(scaled / "gpufleet-alerts.yaml"), str(scaled / "gpufleet-recording.yaml")]
    result = _promtool("check", "rules", "--lint=all", "--lint-fatal", *files)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("SUCCESS") == len(files)


@pytest.mark.slow  # Prometheus' own rule engine (promtool test rules) over every rule file
def test_promtool_unit_tests_pass(tmp_path):
    tests = sorted((RULES / "tests").glob("*.yaml"))
    assert len(tests) >= 9
    for path in tests:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == [f"../{name}" for name in RULE_FILES], path.name
        assert "group_eval_order" not in doc, path.name  # the groups' order is promtool's
    # each file over the groups it can see (tests/helpers/promtool.py): 4 CPU s, not 30
    copies = unit_tests_on_groups_seen(RULES, tests, tmp_path)
    result = _promtool("test", "rules", *map(str, copies))
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("SUCCESS") == len(tests)
    assert sorted(re.findall(r"Unit Testing:\s+\S+/(\S+)", result.stdout)) == [
        path.name for path in tests]


def test_each_unit_test_file_sees_the_groups_that_write_what_it_reads():
    groups = rule_groups(RULES)
    for path in sorted((RULES / "tests").glob("*.yaml")):
        seen = groups_seen(path.read_text(), groups)
        names = {g.name for g in seen}
        written = set().union(*(g.writes for g in seen))
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                assert case["alertname"] in written, (path.name, case["alertname"])
        # closed: what a kept group reads from another group, that group is kept too
        for group in seen:
            for other in groups:
                if other.name not in names:
                    assert not other.writes & spelled(group.text), (path.name, group.name, other.name)
    # the alert on a job's utilisation reads the job recording; the 24-hour load statistics
    # are evaluated only for the file about them
    job = groups_seen((RULES / "tests" / "gpu_job_utilization_low.yaml").read_text(), groups)
    assert {"GpuJobUtilizationLow", "job:gpufleet_gpu_utilization:avg"} <= set().union(
        *(g.writes for g in job))
    assert "GpuTemperatureHigh" not in set().union(*(g.writes for g in job))
    daily = [g.name for g in groups if "pool:gpufleet_demand:ratio_p95_24h" in g.writes]
    assert [path.name for path in sorted((RULES / "tests").glob("*.yaml"))
            if daily[0] in {g.name for g in groups_seen(path.read_text(), groups)}
            ] == ["load_statistics.yaml"]


def test_a_file_that_reads_alerts_sees_every_group_and_a_read_recording_is_kept():
    groups = [
        Group("gpufleet-recording.yaml", "a-rec", frozenset({"job:x:sum"}), "expr: sum(x)", {}),
        Group("gpufleet-recording.yaml", "b-rec", frozenset({"job:y:sum"}), "expr: sum(y)", {}),
        Group("gpufleet-alerts.yaml", "a", frozenset({"XHigh"}), "expr: job:x:sum > 1", {}),
        Group("gpufleet-alerts.yaml", "b", frozenset({"YHigh"}), "expr: job:y:sum_mean1h > 1", {}),
    ]
    assert [g.name for g in groups_seen("alertname: XHigh", groups)] == ["a-rec", "a"]
    # job:y:sum_mean1h is another name than job:y:sum
    assert [g.name for g in groups_seen("alertname: YHigh", groups)] == ["b"]
    assert [g.name for g in groups_seen("expr: job:y:sum", groups)] == ["b-rec"]
    assert groups_seen("expr: count(ALERTS)", groups) == groups
    assert groups_seen("expr: ALERTS_FOR_STATE", groups) == groups
    assert groups_seen('expr: count({__name__=~"job:.*"})', groups) == groups
    assert groups_seen("alertname: XHighish", groups) == []
    reads_alerts = [*groups[:3], Group("gpufleet-alerts.yaml", "c", frozenset({"Z"}),
                                       "expr: ALERTS{alertname='XHigh'}", {})]
    assert groups_seen("alertname: Z", reads_alerts) == reads_alerts


def _changed_rules(before: Path, after: Path) -> set[str]:
    """The names (alert or record) of the rules that differ between two rule files of the same
    groups, each group's rules in the same order."""
    old, new = (yaml.safe_load(path.read_text())["groups"] for path in (before, after))
    assert [g["name"] for g in old] == [g["name"] for g in new]
    changed = set()
    for old_group, new_group in zip(old, new, strict=True):
        assert len(old_group["rules"]) == len(new_group["rules"]), old_group["name"]
        for old_rule, new_rule in zip(old_group["rules"], new_group["rules"], strict=True):
            name = old_rule.get("alert", old_rule.get("record"))
            assert name == new_rule.get("alert", new_rule.get("record"))
            if old_rule != new_rule:
                changed.add(name)
    return changed


@pytest.mark.slow  # promtool test rules over the unit tests that name a drifted alert
def test_promtool_unit_tests_fail_when_a_threshold_or_for_drifts(tmp_path):
    """The unit tests pin the table's values: generated from a changed table, they fail."""
    shutil.copytree(RULES / "tests", tmp_path / "tests")
    table = tmp_path / "thresholds.yaml"
    table.write_text(TABLE.read_text()
                     .replace("{threshold: 80, for: 5m}", "{threshold: 80, for: 3m}")
                     .replace("H200: {warning: 650, critical: 700}",
                              "H200: {warning: 660, critical: 700}"))
    assert main(["rules", "--thresholds", str(table)]) == 0
    changed = set()
    for name in ("gpufleet-alerts.yaml", "gpufleet-recording.yaml"):
        changed |= _changed_rules(RULES / name, tmp_path / name)
    assert changed == {"GpuTemperatureHigh", "GpuPowerHigh"}
    # A unit test sees an alert's rule only through its alertname or the ALERTS series, and
    # test_promtool_unit_tests_pass runs every file on the unchanged rules: so the files that
    # name neither drifted alert nor ALERTS pass here too, and promtool (about 30 CPU s over all
    # of them) runs the rest.
    texts = {path: path.read_text() for path in sorted((tmp_path / "tests").glob("*.yaml"))}
    for path in (tmp_path / "gpufleet-alerts.yaml", tmp_path / "gpufleet-recording.yaml"):
        texts[path] = path.read_text()
    assert not [path.name for path, text in texts.items() if "ALERTS" in text]
    naming = [str(path) for path, text in texts.items()
              if path.parent.name == "tests" and any(name in text for name in changed)]
    assert len(naming) >= 3
    # each over the drifted groups it sees, as the pass case runs them: the cut keeps the drift
    copies = unit_tests_on_groups_seen(tmp_path, [Path(path) for path in naming], tmp_path / "seen")
    result = _promtool("test", "rules", *map(str, copies))
    assert result.returncode != 0
    failed = re.findall(r"Unit Testing:\s+\S+/(\S+)\s+FAILED", result.stdout)
    assert sorted(failed) == ["gpu_power_high.yaml", "gpu_temperature_high.yaml"], result.stdout
    assert result.stdout.count("SUCCESS") == len(naming) - 2, result.stdout


def _unit_test_evaluations() -> list[tuple[str, str, list[tuple[float, str, set[str]]]]]:
    """(file, test name, [(eval seconds, alertname, severities expected firing)])."""
    out = []
    for path in sorted((RULES / "tests").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../gpufleet-recording.yaml", "../gpufleet-alerts.yaml"]
        for test in doc["tests"]:
            evals = [
                (parse_duration(e["eval_time"]), e["alertname"],
                 {a["exp_labels"]["severity"] for a in e.get("exp_alerts") or []})
                for e in test.get("alert_rule_test", [])
            ]
            out.append((path.name, test["name"], evals))
    return out


def test_every_alert_and_severity_has_cases_just_before_and_just_after_its_for():
    """Fires within 2 min after `for`, and the same case shows it silent within 2 min before."""
    margin = 120
    evaluations = _unit_test_evaluations()
    for rule in _alert_rules((RULES / "gpufleet-alerts.yaml").read_text()):
        name, severity = rule["alert"], rule["labels"]["severity"]
        assert severity in SEVERITIES
        wait = parse_duration(rule["for"])
        covered = False
        for _, _, evals in evaluations:
            fired = [t for t, alert, sev in evals if alert == name and severity in sev
                     and wait <= t <= wait + margin]
            silent = [t for t, alert, sev in evals if alert == name and severity not in sev
                      and wait - margin <= t < wait]
            if fired and silent and min(silent) < min(fired):
                covered = True
        assert covered, f"{name} {severity} (for {rule['for']}) lacks a before/after-for case"
        cases = [test for _, test, evals in evaluations if any(a == name for _, a, _ in evals)]
        assert len(cases) >= 2, f"{name} has {len(cases)} promtool case(s); at least 2 needed"
        negatives = [test for _, test, evals in evaluations
                     if any(a == name for _, a, _ in evals)
                     and all(not sev for _, a, sev in evals if a == name)]
        assert negatives, f"{name} has no case where it must not fire"


# -- what the rules say -------------------------------------------------------


def test_alerts_share_one_name_per_condition_and_carry_the_mixin_annotations():
    thresholds = load_thresholds(TABLE)
    rules = _alert_rules((RULES / "gpufleet-alerts.yaml").read_text())
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    assert {r["alert"] for r in rules} == {row.alert for row in thresholds.alerts}
    for rule in rules:
        row = thresholds.alert(rule["alert"])
        assert rule["labels"]["severity"] in row.severities
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
        assert rule["annotations"]["summary"] == row.summary  # static: no template in it
        assert "{{" not in rule["annotations"]["summary"]
        assert "{{ $value" in rule["annotations"]["description"] or row.metric.unit == "state"
        page, anchor = rule["annotations"]["runbook_url"].split("#")
        assert page == thresholds.runbook_base_url == "docs/runbooks.md"  # relative by default
        assert re.search(rf"^## {re.escape(rule['alert'])}$", runbooks, re.M)
        assert anchor == rule["alert"].lower()  # GitHub's anchor of that heading
        if row.metric.subject == "gpu":
            for label in ("node", "gpu", "model", "pool"):
                assert f"$labels.{label}" in rule["annotations"]["description"]
        if row.metric.subject == "job":
            # a ticket for the job's owner is routed by account; the per-job utilization
            # series also carries the job's GPU count
            labels = ["exported_job", *(["account"] if row.owner == "job owner" else []),
                      *(["job_gpus"] if row.metric.key == "job_utilization" else [])]
            for label in labels:
                assert f"$labels.{label}" in rule["annotations"]["description"]
        # the page label is the routing key: only a paging row's critical level pages
        assert rule["labels"]["page"] == (
            "true" if row.page and rule["labels"]["severity"] == "critical" else "false")
    frag = [r for r in rules if r["alert"] == "GpuClusterFragmentationHigh"]
    assert [r["labels"] for r in frag] == [
        {"severity": "warning", "page": "false", "action": "compact"}]
    # less the pool's tier-inversion penalty, counted 0 on a target that does not export it
    assert all(r["expr"] == "gpufleet_pool_fragmentation_index - (gpufleet_pool_tier_inversion_penalty"
               " or gpufleet_pool_fragmentation_index * 0) > 50" for r in frag)


def test_rules_that_need_care_are_written_with_it():
    rules = {(r["alert"], r["labels"]["severity"], r["labels"].get("model")): r["expr"]
             for r in _alert_rules((RULES / "gpufleet-alerts.yaml").read_text())}
    # power at the cap: >=, never >, one rule per severity: the table's watts for H200, a
    # fraction of the recorded limit (enforced, else the TDP) elsewhere; and only with the
    # evidence of a fault, the power brake, never a busy GPU held by its own cap
    brake = ["and on (cluster, node, gpu)",
             '  max_over_time(gpufleet_gpu_clock_event_active{reason="hw_power_brake"}[5m]) == 1']
    assert rules[("GpuPowerHigh", "critical", None)].splitlines() == [
        "(", 'gpufleet_gpu_power_watts{model="H200"} >= 700', "or",
        'gpufleet_gpu_power_watts{model!="H200"} >= on (cluster, node, gpu) group_left () '
        "gpufleet_gpu_power_limit_effective_watts", ")", *brake]
    # one join: the draw against an exact fraction of the limit (700 * 93 / 100 is 651)
    assert rules[("GpuPowerHigh", "warning", None)].splitlines() == [
        "(", 'gpufleet_gpu_power_watts{model="H200"} >= 650', "or",
        'gpufleet_gpu_power_watts{model!="H200"} >= on (cluster, node, gpu) group_left ()',
        "  (gpufleet_gpu_power_limit_effective_watts * 93 / 100)", ")", *brake]
    # utilization per job, from the recorded average over the job's GPUs
    assert rules[("GpuJobUtilizationLow", "warning", None)] == "job:gpufleet_gpu_utilization:avg < 0.3"
    # held back by the power cap: its own alert, only on busy GPUs with clock events
    assert rules[("GpuPowerCapped", "warning", None)].splitlines() == [
        'avg_over_time(gpufleet_gpu_clock_event_active{reason="sw_power_cap"}[5m]) >= 0.5',
        "and on (cluster, node, gpu)", "  gpufleet_gpu_utilization_ratio > 0.5"]
    # a driver lifetime counter alerts on growth, never on its first appearance (both engines)
    # one rule per type, an exact matcher each (no regex where an exact match serves)
    nvlink_errors = [r["expr"] for r in _alert_rules((RULES / "gpufleet-alerts.yaml").read_text())
                     if r["alert"] == "GpuNvlinkErrors"]
    assert [e.splitlines() for e in nvlink_errors] == [[
        "(", f'  gpufleet_gpu_nvlink_errors_total{{type="{kind}"}}',
        f'  - min_over_time(gpufleet_gpu_nvlink_errors_total{{type="{kind}"}}[10m])',
        ") > 0"] for kind in ("replay", "recovery")]
    crc = [r["expr"] for r in _alert_rules((RULES / "gpufleet-alerts.yaml").read_text())
           if r["alert"] == "GpuNvlinkCrcErrors"]
    assert [re.findall(r'type[=!~]+"[^"]*"', e) for e in crc] == [
        ['type="crc_flit"'] * 2, ['type="crc_data"'] * 2]
    for name in ("GpuEccUncorrectable", "GpuNvlinkErrors", "GpuNvlinkCrcErrors"):
        expr = next(e for (alert, _, _), e in rules.items() if alert == name)
        assert "increase(" not in expr and "min_over_time(" in expr, name
    # NVLink only on busy GPUs of multi-GPU jobs, from the exporter's gauge (issue 45)
    nvlink = rules[("GpuNvlinkBandwidthLow", "warning", None)]
    assert nvlink.startswith("gpufleet_gpu_nvlink_utilization_ratio < 0.5\n")
    assert "gpufleet_gpu_utilization_ratio > 0.5" in nvlink
    # memory from the exporter's own ratio gauge, no recording over every GPU (issue 45)
    assert rules[("GpuMemoryHigh", "critical", None)] == "gpufleet_gpu_memory_used_ratio > 0.95"
    assert rules[("GpufleetTargetDown", "warning", None)] == (
        'up{job=~"gpufleet-nodes|gpufleet-cluster"} == 0')
    assert rules[("GpufleetJobDown", "critical", None)].splitlines() == [
        'max by (job) (up{job=~"gpufleet-nodes|gpufleet-cluster"}) == 0',
        "or", 'absent(up{job="gpufleet-nodes"})', "or", 'absent(up{job="gpufleet-cluster"})']
    assert rules[("GpuLost", "critical", None)] == "gpufleet_gpu_up == 0"
    assert rules[("GpufleetSourceDown", "warning", None)] == "gpufleet_source_up == 0"
    assert rules[("GpufleetSourceDownEverywhere", "critical", None)] == (
        'max by (cluster, source) (gpufleet_source_up{target=""}) == 0')
    xids = '{xid=~"48|63|64|74|79|92|94|95"}'
    assert rules[("GpuXidError", "critical", None)].splitlines() == [
        "(", f"  increase(gpufleet_gpu_xid_errors_total{xids}[10m]) > 0", "  or",
        f"  (gpufleet_gpu_xid_errors_total{xids}",
        f"    unless gpufleet_gpu_xid_errors_total{xids} offset 10m)",
        "  and on (cluster, node, gpu)",
        "    time() - gpufleet_gpu_last_xid_timestamp_seconds < 600", "  or",
        # held while gpufleet's own verdict holds the GPU failing for an XID (issue 44)
        f"  gpufleet_gpu_xid_errors_total{xids}", "  and on (cluster, node, gpu)",
        '    gpufleet_gpu_health_verdict{verdict="failing",signal="xid"}', ") > 0"]
    # a drained failing node: joined on its place, one series per node whatever exported it
    assert rules[("GpuNodeDrained", "warning", None)].splitlines() == [
        "max by (cluster, node, pool) (gpufleet_node_drained)", "and on (cluster, node)",
        '  max by (cluster, node) (gpufleet_node_health_verdict{verdict="failing"}) == 1']


def test_job_metadata_never_reaches_an_alerts_labels():
    """A pod label change must not restart a `for` clock: metadata is aggregated away, and
    a per-job alert reads only the recorded per-job series, whose labels are constant for a
    job (its name, account and GPU count; no pod)."""
    for rule in _alert_rules((RULES / "gpufleet-alerts.yaml").read_text()):
        expr = rule["expr"]
        # no label is copied from the right (`group_left ()` copies none: a join on the GPU's
        # place that keeps the left's labels)
        assert not re.search(r"group_left(?! \(\))", expr) and "group_right" not in expr
        for use in re.finditer(r"gpufleet_gpu_allocation_info", expr):
            before = expr[:use.start()]
            assert before.endswith("count by (cluster, node, gpu) ("), expr
    by_job = {r.record: r.expr for _, group in RECORDING_GROUPS for r in group
              if r.record.startswith("job:")}
    assert by_job["job:gpufleet_gpu_utilization:avg"].startswith(
        "avg by (cluster, exported_job, account, job_gpus) (")
    assert all("pod" not in expr.split("(")[0] for expr in by_job.values())


def test_recording_rules_follow_level_metric_operations():
    recorded = [r["record"] for g in yaml.safe_load(
        (RULES / "gpufleet-recording.yaml").read_text())["groups"] for r in g["rules"]]
    # the fixed rules, then what the table's load_statistics and pressure sections generate
    generated = [r["record"] for g in recording_groups(load_thresholds(TABLE))
                 for r in g["rules"]]
    assert recorded == generated
    assert set(recorded) > {r.record for _, group in RECORDING_GROUPS for r in group}
    for name in recorded:
        level, metric, operations = name.split(":")
        assert level in ("gpu", "job_gpu", "job", "pool", "cluster", "instance", "node")
        assert metric.startswith("gpufleet_")
        assert operations
    assert set(recorded) >= {
        "pool:gpufleet_gpu_utilization:avg",
        "pool:gpufleet_gpu_memory_used:ratio", "pool:gpufleet_gpu_allocated:sum",
        "pool:gpufleet_gpu_idle:count"}


def test_every_series_a_rule_reads_is_documented_or_recorded():
    recorded = {r["record"] for g in recording_groups(load_thresholds(TABLE)) for r in g["rules"]}
    documented = set(re.findall(r"`((?:gpufleet_|[a-z_]+:gpufleet_)[a-z0-9_:]+)`",
                                (REPO / "docs" / "metrics.md").read_text()))
    for name in ("gpufleet-alerts.yaml", "gpufleet-recording.yaml"):
        for group in yaml.safe_load((RULES / name).read_text())["groups"]:
            for rule in group["rules"]:
                used = set(re.findall(r"\b[a-z_]+:gpufleet_[a-z0-9_]+:[a-z0-9_]+", rule["expr"]))
                rest = re.sub(r"\b[a-z_]+:gpufleet_[a-z0-9_]+:[a-z0-9_]+", "", rule["expr"])
                used |= set(re.findall(r"\bgpufleet_[a-z0-9_]+", rest))
                unknown = used - recorded - documented
                assert not unknown, f"{rule.get('alert') or rule['record']} reads {unknown}, " \
                                    "which docs/metrics.md does not list"


def test_prometheusrule_holds_the_same_groups_as_the_rule_files():
    obj = yaml.safe_load((RULES / "gpufleet-prometheusrule.yaml").read_text())
    assert (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == (
        "monitoring.coreos.com/v1", "PrometheusRule", "gpufleet")
    plain = (yaml.safe_load((RULES / "gpufleet-recording.yaml").read_text())["groups"]
             + yaml.safe_load((RULES / "gpufleet-alerts.yaml").read_text())["groups"])
    assert obj["spec"]["groups"] == plain


def test_generation_is_in_memory_and_names_two_files():
    assert [f.name for f in generate(load_thresholds(TABLE))] == ["gpufleet-alerts.yaml",
                                                                  "gpufleet-recording.yaml"]


# -- metric names come from the catalogue ---------------------------------------

_FAMILY = re.compile(r"(?<![\w:])gpufleet_[a-z0-9_]+")  # a family: gpufleet_gpu_up
_RECORDED = re.compile(r"\b[a-z_]+:gpufleet_[a-z0-9_]+:[a-z0-9_]+")  # pool:gpufleet_...:avg
_NAMES_HOME = "exporter/thresholds/recorded.py"
_CATALOGUE = "exporter/metrics.py"
_GENERATED = "exporter/sources/nvml/podresources_v1/"  # protoc's output names no family


def _named_in_literals(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every metric or recorded-series name a string literal of ``path``
    spells, docstrings aside (they explain, they build no query)."""
    return [(node.lineno, name) for node in string_literals(path.read_text())
            for name in _FAMILY.findall(str(node.value)) + _RECORDED.findall(str(node.value))]


def test_no_module_but_the_catalogue_spells_a_metric_name():
    """Issue 27: no string literal outside exporter/metrics.py names a metric: the alert and
    dashboard generators build PromQL from the catalogue (``metrics.GPU_TEMPERATURE_CELSIUS.name``),
    help texts and log lines take the name from it too; the recorded series' names are
    constants in one module, exporter/thresholds/recorded.py."""
    spelled = {relative: found
               for path in sorted((REPO / "exporter").rglob("*.py"))
               if (relative := str(path.relative_to(REPO))) != _CATALOGUE
               and not relative.startswith(_GENERATED)
               if (found := _named_in_literals(path))}
    home = spelled.pop(_NAMES_HOME)
    assert spelled == {}, f"metric names spelled outside the catalogue and {_NAMES_HOME}: {spelled}"
    assert home and all(_RECORDED.fullmatch(name) for _, name in home), home


def test_every_name_the_generated_files_query_is_a_family_or_a_recorded_series():
    """A typo in a name (or a family dropped from the catalogue) would leave a query that
    matches nothing and an alert that never fires: every name in the generated rules and
    dashboards is a catalogue family, a recorded series or one of its load statistics."""
    from exporter import metrics
    from exporter.thresholds import recorded

    families = {spec.name for spec in vars(metrics).values() if isinstance(spec, metrics.FamilySpec)}
    series = {value for name, value in vars(recorded).items() if name.isupper()}
    texts = [(RULES / name).read_text() for name in COMMITTED]
    texts += [path.read_text() for path in sorted((REPO / "dashboards").glob("*.json"))]
    used_families = {name for text in texts for name in _FAMILY.findall(text)}
    used_series = {name for text in texts for name in _RECORDED.findall(text)}
    assert {"gpufleet_gpu_temperature_celsius", "gpufleet_gpu_up"} <= used_families
    assert used_families - families == set()
    statistic = re.compile(r"_(mean|stddev|p\d+_)\d+[smh]$")  # pool:...:avg_mean1h
    assert {name for name in used_series
            if name not in series and statistic.sub("", name) not in series} == set()
    assert recorded.POOL_IDLE in used_series and recorded.NODE_PRESSURE_SCORE in used_series


# -- issue 29 -------------------------------------------------------------------


def test_power_high_is_one_rule_per_severity_and_needs_the_power_brake_not_the_cap():
    """Issue 44: on power alone it ticketed every busy GPU at its cap. Its evidence is the
    power brake (the supply's), never sw_power_cap (the GPU's own cap: GpuPowerCapped's)."""
    rules = [r for r in _alert_rules((RULES / "gpufleet-alerts.yaml").read_text())
             if r["alert"] == "GpuPowerHigh"]
    assert [r["labels"]["severity"] for r in rules] == ["warning", "critical"]
    assert all('reason="hw_power_brake"' in r["expr"] and "sw_power_cap" not in r["expr"]
               and "utilization" not in r["expr"] for r in rules)
    assert all("model" not in r["labels"] and r["labels"]["page"] == "false" for r in rules)


def test_no_rule_recomputes_what_the_exporter_serves_or_matches_a_regex_for_one_value():
    """Issue 45: at 10,880 GPUs the memory-used recording cost 0.79 s and the power-limit one,
    ten model regexes in an 11-way `or`, 0.58 s: the exporter serves both as gauges. Joins name
    their labels; a matcher of one value is exact."""
    from exporter import metrics
    groups = recording_groups(load_thresholds(TABLE))
    exprs = {r["record"]: r["expr"] for g in groups for r in g["rules"]}
    # nothing recorded per GPU: the NVLink utilisation is the exporter's gauge too
    assert not [record for record in exprs if record.startswith("gpu:")]
    alerts = [r["expr"] for g in yaml.safe_load((RULES / "gpufleet-alerts.yaml").read_text())["groups"]
              for r in g["rules"]]
    every = [*alerts, *exprs.values()]
    # the rules over every GPU: the per-GPU alert groups
    per_gpu = [r["expr"] for g in yaml.safe_load((RULES / "gpufleet-alerts.yaml").read_text())["groups"]
               if g["name"].startswith("gpufleet-gpu") for r in g["rules"]]
    per_gpu_ratio = f"{metrics.GPU_MEMORY_USED_BYTES.name} / {metrics.GPU_MEMORY_TOTAL_BYTES.name}"
    assert not [e for e in every if per_gpu_ratio in e]
    for expr in per_gpu:
        # every binary join between two per-GPU series names the GPU's place
        for line in expr.splitlines():
            if re.search(r"^\s*(and|unless|[*/+-]|[<>]=?)\s*$", line):
                raise AssertionError(f"a join on every label: {expr}")
    for expr in every:
        # a regex matcher holds an alternation (or a pattern), never a single literal value
        for value in re.findall(r'=~"([^"]*)"', expr) + re.findall(r'!~"([^"]*)"', expr):
            assert "|" in value or re.search(r"[.*+?()\[\]$]", value), (value, expr)


def test_each_per_gpu_row_is_a_group_of_its_own():
    """Issue 45: at 10,880 GPUs a row that reads a window or joins costs 0.2-1.0 s of one
    core, a comparison of one family's latest sample 0.05-0.2 s; two or three windowed rows
    in one group took 2 s, seven comparisons 0.6 CPU s, against 1 s per group. Each per-GPU
    row is a group; a windowed or joined one is cut further, one rule per group: one
    severity, one value of a label the row would otherwise match with a regex."""
    groups = {g["name"]: g["rules"]
              for g in yaml.safe_load((RULES / "gpufleet-alerts.yaml").read_text())["groups"]}
    per_gpu = {name: rules for name, rules in groups.items() if name.startswith("gpufleet-gpu")}
    assert {name: sorted({r["alert"] for r in rules}) for name, rules in per_gpu.items()} == {
        "gpufleet-gpu-memory-used": ["GpuMemoryHigh"],
        "gpufleet-gpu-temperature": ["GpuTemperatureHigh"],
        "gpufleet-gpu-up": ["GpuLost"],
        "gpufleet-gpu-remapped-rows-failure": ["GpuRowRemapFailed"],
        "gpufleet-gpu-remapped-rows-pending": ["GpuRowRemapPending"],
        "gpufleet-gpu-power-warning": ["GpuPowerHigh"],
        "gpufleet-gpu-power-critical": ["GpuPowerHigh"],
        "gpufleet-gpu-nvlink-utilization": ["GpuNvlinkBandwidthLow"],
        "gpufleet-gpu-xid-critical": ["GpuXidError"],
        "gpufleet-gpu-ecc-double-bit": ["GpuEccUncorrectable"],
        "gpufleet-gpu-clock-slowdown": ["GpuClocksThrottled"],
        "gpufleet-gpu-power-capped": ["GpuPowerCapped"],
        "gpufleet-gpu-nvlink-link-errors-replay": ["GpuNvlinkErrors"],
        "gpufleet-gpu-nvlink-link-errors-recovery": ["GpuNvlinkErrors"],
        "gpufleet-gpu-nvlink-crc-errors-crc-flit": ["GpuNvlinkCrcErrors"],
        "gpufleet-gpu-nvlink-crc-errors-crc-data": ["GpuNvlinkCrcErrors"],
        "gpufleet-gpu-sm-active": ["GpuSmActivityLow"],
    }
    windowed = {name for name, rules in per_gpu.items()
                if any("[" in r["expr"] or " on (" in r["expr"] for r in rules)}
    # the latest-sample rows keep both severities; a windowed or joined group is one rule
    assert [len(per_gpu[name]) for name in ("gpufleet-gpu-memory-used", "gpufleet-gpu-temperature")] == [2, 2]
    assert all(len(per_gpu[name]) == 1 for name in windowed)
    assert [r["labels"]["severity"] for r in per_gpu["gpufleet-gpu-power-critical"]] == ["critical"]


def test_time_scale_scales_for_windows_offsets_and_the_xid_window_together(tmp_path):
    _generate_all(tmp_path, "--time-scale", "0.05")
    scaled = (tmp_path / "gpufleet-alerts.yaml").read_text()
    assert "(--time-scale)" in scaled.splitlines()[1]
    fast = {(r["alert"], r["labels"]["severity"]): r for r in _alert_rules(scaled)}
    slow = {(r["alert"], r["labels"]["severity"]): r
            for r in _alert_rules((RULES / "gpufleet-alerts.yaml").read_text())}
    assert fast.keys() == slow.keys()
    for key, rule in fast.items():
        assert parse_duration(rule["for"]) == pytest.approx(
            parse_duration(slow[key]["for"]) * 0.05, abs=0.001)
    xid = fast[("GpuXidError", "critical")]["expr"]
    assert "[30s]" in xid and "offset 30s" in xid and "< 30\n" in xid and "10m" not in xid
    assert "[15s]" in fast[("GpuPowerCapped", "warning")]["expr"]  # [5m]
    assert "[30s]" in fast[("GpuNvlinkErrors", "warning")]["expr"]  # [10m]
    # the description's query template reads the same scaled window
    assert "[3m]" in fast[("GpuJobUtilizationLow", "warning")]["annotations"]["description"]
    recording = (tmp_path / "gpufleet-recording.yaml").read_text()
    assert "[5m]" not in recording  # (the NVLink rate is the exporter's gauge, in its own time)
    assert "[1h12m]" in recording  # the 24h load statistics
    rule_files = [str(tmp_path / "gpufleet-alerts.yaml"), str(tmp_path / "gpufleet-recording.yaml")]
    result = _promtool("check", "rules", *rule_files)
    assert result.returncode == 0, result.stdout


def test_runbook_url_is_absolute_once_the_site_sets_external_url_or_an_absolute_base():
    text = TABLE.read_text()
    assert "\nexternal_url:" not in text  # the shipped table leaves it to the site
    served = load_thresholds(TABLE)
    assert served.runbook_page == "docs/runbooks.md"
    from exporter.thresholds import parse_thresholds
    site = parse_thresholds(text + "\nexternal_url: http://gpufleet.example:9874/\n")
    assert site.runbook_page == "http://gpufleet.example:9874/runbooks"
    rules = _alert_rules(generate(site)[0].text)
    assert {r["annotations"]["runbook_url"].split("#")[0] for r in rules} == {
        "http://gpufleet.example:9874/runbooks"}
    wiki = parse_thresholds(text.replace(
        "runbook_base_url: docs/runbooks.md", "runbook_base_url: https://wiki.example.com/rb.md")
        + "\nexternal_url: http://gpufleet.example:9874\n")
    assert wiki.runbook_page == "https://wiki.example.com/rb.md"  # the site's own page wins
    from exporter.thresholds import ThresholdError
    with pytest.raises(ThresholdError, match=r"external_url: must be gpufleet's absolute http"):
        parse_thresholds(text + "\nexternal_url: gpufleet.example:9874\n")


def test_every_drain_reset_or_resume_runbook_gives_the_slurm_and_kubernetes_commands():
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    sections = re.split(r"^## ", runbooks, flags=re.M)[1:]
    acting = [s for s in sections if re.search(r"\b(drain|reset|resume)", s, re.I)]
    assert len(acting) >= 8
    for section in acting:
        name = section.split("\n", 1)[0]
        for command in (f'scontrol update NodeName=<node> State=DRAIN Reason="{name}',
                        "scontrol update NodeName=<node> State=RESUME", "kubectl cordon <node>",
                        "kubectl drain <node>", "kubectl taint nodes <node> gpufleet.io/gpu-fault=",
                        "kubectl uncordon <node>"):
            assert command in section, f"{name}: no `{command}`"
