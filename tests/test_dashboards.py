"""The generated Grafana dashboards: drift, structure, and levels equal to the threshold table.

The PromQL of every panel is run against a real Prometheus in
tests/test_dashboards_prometheus.py.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.dashboards import DASHBOARDS, render
from exporter.dashboards.levels import CRITICAL, OK, WARNING, Steps, load_levels, steps_for
from exporter.gpu_catalogue import default_catalogue
from tests.helpers import REPO

OUT = REPO / "dashboards"
THRESHOLDS = REPO / "rules" / "thresholds.yaml"
FILES = [module.FILE for module in DASHBOARDS]
MODERN_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "row"}
# Grafana's own variables, filled by Grafana rather than defined by the dashboard
BUILTIN = re.compile(r"^__")


def load(name: str) -> dict:
    return json.loads((OUT / name).read_text())


def panels_of(board: dict) -> list[dict]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return out


def content_panels(board: dict) -> list[dict]:
    return [panel for panel in panels_of(board) if panel["type"] != "row"]


def all_targets(board: dict) -> list[tuple[dict, dict]]:
    return [(panel, t) for panel in content_panels(board) for t in panel["targets"]]


# -- drift ----------------------------------------------------------------------


def test_committed_json_is_byte_identical_to_a_fresh_generation():
    fresh = render(load_levels(THRESHOLDS))
    assert sorted(fresh) == sorted(FILES)
    for name, text in fresh.items():
        committed = (OUT / name).read_text()
        assert committed == text, f"dashboards/{name} is out of date: run `gpufleet dashboards`"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "dashboards", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_check_passes_on_the_committed_folder():
    result = _cli("--check")
    assert result.returncode == 0, result.stderr
    assert "3 dashboards in dashboards are up to date" in result.stdout


def test_check_exits_1_naming_a_changed_or_missing_file(tmp_path: Path):
    written = _cli("--out", str(tmp_path))
    assert written.returncode == 0, written.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    for name in FILES:  # the command writes what the tests compare with
        assert (tmp_path / name).read_bytes() == (OUT / name).read_bytes()
    assert _cli("--out", str(tmp_path), "--check").returncode == 0

    node = tmp_path / "gpufleet-node.json"
    node.write_text(node.read_text().replace('"Temperature"', '"Temp"', 1))
    (tmp_path / "gpufleet-fragmentation.json").unlink()
    result = _cli("--out", str(tmp_path), "--check")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert "gpufleet-node.json" in result.stderr
    assert "gpufleet-fragmentation.json" in result.stderr
    assert "gpufleet-fleet.json" not in result.stderr
    assert not (tmp_path / "gpufleet-fragmentation.json").exists()  # --check writes nothing


def test_outside_a_checkout_the_installed_table_gives_the_same_dashboards(tmp_path: Path,
                                                                          monkeypatch):
    """issue 15: `gpufleet dashboards` failed outside a checkout (no rules/thresholds.yaml)."""
    from exporter.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["dashboards", "--out", "out"]) == 0
    for name in FILES:
        assert (tmp_path / "out" / name).read_bytes() == (OUT / name).read_bytes(), name


def test_a_bad_threshold_table_exits_2_and_writes_nothing(tmp_path: Path):
    table = tmp_path / "thresholds.yaml"
    table.write_text(THRESHOLDS.read_text().replace("threshold: 80,", "threshold: hot,", 1))
    out = tmp_path / "out"
    result = _cli("--thresholds", str(table), "--out", str(out))
    assert result.returncode == 2
    assert result.stderr.startswith("gpufleet: ") and result.stderr.count("\n") == 1, result.stderr
    assert "GpuTemperatureHigh" in result.stderr
    assert not out.exists()
    missing = _cli("--thresholds", str(tmp_path / "nope.yaml"), "--out", str(out))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr


# -- structure ------------------------------------------------------------------


@pytest.mark.parametrize("name", FILES)
def test_uids_are_stable_and_panel_ids_unique(name):
    board = load(name)
    assert board["uid"] == name.removesuffix(".json")
    ids = [panel["id"] for panel in panels_of(board)]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {name}"


def _cells(panel: dict) -> set[tuple[int, int]]:
    pos = panel["gridPos"]
    return {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])}


@pytest.mark.parametrize("name", FILES)
def test_grid_positions_fit_24_columns_and_never_overlap(name):
    board = load(name)
    placed = panels_of(board)
    for panel in placed:
        pos = panel["gridPos"]
        assert pos["w"] > 0 and pos["h"] > 0, panel["title"]
        assert pos["x"] >= 0 and pos["y"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, f"{panel['title']} ends past column 24: {pos}"
    for a, b in itertools.combinations(placed, 2):
        overlap = _cells(a) & _cells(b)
        assert not overlap, f"{a['title']!r} and {b['title']!r} overlap at {sorted(overlap)[:3]}"


@pytest.mark.parametrize("name", FILES)
def test_every_target_has_expr_and_a_unique_ref_id(name):
    board = load(name)
    for panel in content_panels(board):
        assert panel["targets"], f"{panel['title']} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert all(refs) and len(refs) == len(set(refs)), panel["title"]
        for t in panel["targets"]:
            assert t["expr"].strip(), f"{panel['title']} has an empty expr"


def _used_variables(text: str) -> set[str]:
    names = set()
    for match in re.finditer(r"\$\{(\w+)(?:[:.][^}]*)?\}|\[\[(\w+)(?::\w+)?\]\]|\$(\w+)", text):
        name = next(g for g in match.groups() if g)
        if name.isdigit() or BUILTIN.match(name):  # $1 in label_replace; $__rate_interval...
            continue
        names.add(name)
    return names


@pytest.mark.parametrize("name", FILES)
def test_every_variable_is_used_and_every_used_variable_defined(name):
    board = load(name)
    defined = [v["name"] for v in board["templating"]["list"]]
    assert len(defined) == len(set(defined))
    panels_text = json.dumps(board["panels"])
    variables_text = json.dumps(board["templating"]["list"])
    used = _used_variables(panels_text) | _used_variables(variables_text)
    assert used <= set(defined), f"used but not defined in {name}: {sorted(used - set(defined))}"
    # a variable counts as used when a query or a datasource reference needs it
    for variable in defined:
        assert variable in _used_variables(panels_text), f"${variable} is defined but no panel uses it"
    assert "datasource" in defined


def test_variables_follow_the_conventions():
    expected = {
        "gpufleet-fleet.json": ["datasource", "cluster", "pool", "model"],
        "gpufleet-node.json": ["datasource", "cluster", "pool", "model", "node", "gpu"],
        "gpufleet-fragmentation.json": ["datasource", "cluster", "pool", "model"],
    }
    for name, names in expected.items():
        variables = {v["name"]: v for v in load(name)["templating"]["list"]}
        assert list(variables) == names
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for var in names[1:]:
            assert variables[var]["type"] == "query"
            assert variables[var]["multi"] is True, (name, var)
            assert variables[var]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert variables[var]["query"].startswith("label_values(")
        for var in ("cluster", "pool", "model", "gpu"):
            if var in variables:
                assert variables[var]["includeAll"] is True and variables[var]["allValue"] == ".*"
    # a node is a drill-down: one or a few, never all 136 at once
    assert {v["name"]: v for v in load("gpufleet-node.json")["templating"]["list"]}["node"][
        "includeAll"] is False


_METRIC = re.compile(r"\b((?:gpufleet_|[a-z_]+:gpufleet_)[a-z0-9_:]+|ALERTS)\b(\{[^}]*\})?")


@pytest.mark.parametrize("name", FILES)
def test_every_series_a_query_reads_is_filtered_by_cluster(name):
    """issue 15: one Prometheus may hold several clusters (and node mode beside cluster
    mode): every metric a panel or a variable reads names the `cluster` variable, and
    every join matches on the cluster too."""
    board = load(name)
    exprs = [t["expr"] for panel in content_panels(board) for t in panel["targets"]]
    exprs += [v["query"] for v in board["templating"]["list"][2:]]  # after datasource, cluster
    unfiltered = [(expr, m.group(0)) for expr in exprs for m in _METRIC.finditer(expr)
                  if not re.search(r'cluster=~"\$cluster\|?"', m.group(2) or "")]
    assert unfiltered == []
    joins = [expr for expr in exprs for m in re.finditer(r"\bon \(([^)]*)\)", expr)
             if not m.group(1).startswith("cluster, ")]
    assert joins == []


@pytest.mark.parametrize("name", FILES)
def test_datasource_references_are_type_uid_objects(name):
    board = load(name)
    ref = {"type": "prometheus", "uid": "${datasource}"}
    for panel in content_panels(board):
        assert panel["datasource"] == ref, panel["title"]
        for t in panel["targets"]:
            assert t["datasource"] == ref, panel["title"]
    for variable in board["templating"]["list"][1:]:
        assert variable["datasource"] == ref


@pytest.mark.parametrize("name", FILES)
def test_modern_panel_types_only_and_a_unit_on_every_panel(name):
    board = load(name)
    for panel in panels_of(board):
        assert panel["type"] in MODERN_TYPES, f"{panel['title']}: {panel['type']}"
    for panel in content_panels(board):
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert isinstance(unit, str) and unit, f"{panel['title']} has no unit"
        # today's option shapes: no Grafana 6 fieldOptions, and a pluginVersion so that
        # Grafana runs no old-format migration over them on load
        assert "fieldOptions" not in panel.get("options", {}), panel["title"]
        assert int(panel["pluginVersion"].split(".")[0]) >= 10, panel["title"]


@pytest.mark.parametrize("name", FILES)
def test_threshold_steps_are_grafana_10_shaped(name):
    for panel in content_panels(load(name)):
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[0]["value"] is None, panel["title"]  # JSON null, not grafanalib's "null"
        values = [s["value"] for s in steps[1:]]
        assert values == sorted(values) and all(isinstance(v, int | float) for v in values)


# -- levels come from rules/thresholds.yaml --------------------------------------


def _percent(value) -> float:
    if isinstance(value, str) and value.endswith("%"):
        return float(value[:-1]) / 100
    return float(value)


def _table_rows() -> dict[str, dict]:
    """The raw YAML rows by metric, read independently of the loader the dashboards use."""
    raw = yaml.safe_load(THRESHOLDS.read_text())
    return {row["metric"]: row for row in raw["alerts"]}


def _levels(row: dict) -> dict[str, float]:
    return {sev: _percent(row[sev]["threshold"]) for sev in ("warning", "critical") if sev in row}


def _colours(steps: list[dict]) -> dict[float, str]:
    return {s["value"]: s["color"] for s in steps[1:]}


def _panels_querying(metric_re: str) -> list[tuple[str, dict]]:
    found = []
    for name in FILES:
        for panel in content_panels(load(name)):
            if any(re.search(metric_re, t["expr"]) for t in panel["targets"]):
                found.append((name, panel))
    return found


@pytest.mark.parametrize(("metric", "expr_re", "unit"), [
    ("gpu_temperature", r"gpufleet_gpu_temperature_celsius", "celsius"),
    ("gpu_memory_used", r"gpufleet_gpu_memory_used_bytes\S* / |gpufleet_gpu_memory_used_ratio",
     "percentunit"),
])
def test_temperature_and_memory_levels_equal_the_table(metric, expr_re, unit):
    expected = _levels(_table_rows()[metric])
    assert set(expected) == {"warning", "critical"}
    shown = [(name, panel) for name, panel in _panels_querying(expr_re)
             if panel["fieldConfig"]["defaults"]["unit"] == unit
             and len(panel["fieldConfig"]["defaults"]["thresholds"]["steps"]) > 1]
    assert {name for name, _ in shown} >= {"gpufleet-fleet.json", "gpufleet-node.json"}, \
        f"no panel shows the {metric} levels"
    for name, panel in shown:
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps[0]["color"] == OK
        assert _colours(steps) == {expected["warning"]: WARNING, expected["critical"]: CRITICAL}, \
            f"{name} {panel['title']}"
        if panel["type"] == "timeseries":  # drawn as lines, not only used for colour
            assert panel["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"


def test_power_levels_equal_the_table_for_every_model():
    row = _table_rows()["gpu_power"]
    fractions = _levels(row)
    own = row.get("models", {})
    expected = {}
    for spec in default_catalogue().models:
        if spec.name in own:
            expected[spec.name] = {sev: float(v) for sev, v in own[spec.name].items()}
        elif spec.tdp_watts:
            expected[spec.name] = {sev: f * spec.tdp_watts for sev, f in fractions.items()}
    assert expected["H200"] == {"warning": 650.0, "critical": 700.0}  # the table's own watts
    shown = [(name, panel) for name, panel in _panels_querying(r"gpufleet_gpu_power_watts")
             if panel["fieldConfig"]["overrides"]]
    assert {name for name, _ in shown} == {"gpufleet-fleet.json", "gpufleet-node.json"}
    for name, panel in shown:
        assert panel["fieldConfig"]["defaults"]["unit"] == "watt"
        by_model = {}
        for override in panel["fieldConfig"]["overrides"]:
            matcher = override["matcher"]["options"]
            model = matcher if override["matcher"]["id"] == "byName" else \
                re.match(r"\^(.+) $", matcher).group(1).replace("\\", "")
            props = {prop["id"]: prop["value"] for prop in override["properties"]}
            by_model[model] = _colours(props["thresholds"]["steps"])
            assert props["max"] == max(by_model[model])  # a full bar is the critical level
        assert set(by_model) == set(expected), name
        for model, levels in expected.items():
            got = sorted(by_model[model].items())
            assert [colour for _, colour in got] == [WARNING, CRITICAL], f"{name} {model}"
            assert [value for value, _ in got] == pytest.approx(
                [levels["warning"], levels["critical"]]), f"{name} {model}"


def test_the_compaction_line_is_the_fragmentation_alert_level():
    expected = _levels(_table_rows()["pool_fragmentation_index"])
    shown = [panel for name, panel in _panels_querying(r"fragmentation_index")
             if name == "gpufleet-fragmentation.json"]
    assert len(shown) == 2
    for panel in shown:
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert set(_colours(steps)) == set(expected.values()), panel["title"]


def test_the_firing_panel_lists_exactly_the_tables_alerts():
    names = {row["alert"] for row in yaml.safe_load(THRESHOLDS.read_text())["alerts"]}
    (panel,) = [p for p in content_panels(load("gpufleet-fleet.json"))
                if p["title"] == "Firing gpufleet alerts"]
    match = re.search(r'alertname=~"([^"]+)"', panel["targets"][0]["expr"])
    assert set(match.group(1).split("|")) == names


def test_steps_for_below_conditions_go_red_orange_green():
    assert steps_for("<", {"warning": 0.3, "critical": 0.1}) == \
        Steps(CRITICAL, ((0.1, WARNING), (0.3, OK)))
    assert steps_for("<", {"warning": 0.5}) == Steps(WARNING, ((0.5, OK),))
    assert steps_for(">", {"critical": 85.0, "warning": 80.0}) == \
        Steps(OK, ((80.0, WARNING), (85.0, CRITICAL)))
    with pytest.raises(ValueError):
        steps_for("==", {"critical": 0.0})


def test_a_table_without_a_row_the_dashboards_draw_is_a_one_line_error():
    from exporter.config import ConfigError
    from exporter.dashboards.levels import levels_from_table
    from exporter.thresholds import parse_thresholds

    text = THRESHOLDS.read_text()
    start = text.index("  - alert: GpuTemperatureHigh")
    end = text.index("  - alert:", start + 1)
    table = parse_thresholds(text[:start] + text[end:], "thresholds.yaml")
    with pytest.raises(ConfigError, match=r"^thresholds.yaml: no alert row compares "
                                          r"gpu_temperature; the dashboards draw"):
        levels_from_table(table)


# -- names ----------------------------------------------------------------------


def test_every_metric_a_dashboard_queries_is_documented_and_every_recorded_series_recorded():
    documented = set(re.findall(r"^\|\s*`((?:[a-z]+:)?gpufleet_[a-z0-9_:]+)`",
                                (REPO / "docs" / "metrics.md").read_text(), re.M))
    recorded = {rule["record"]
                for group in yaml.safe_load((REPO / "rules" / "gpufleet-recording.yaml")
                                            .read_text())["groups"]
                for rule in group["rules"] if "record" in rule}
    queried = set()
    for name in FILES:
        for _, t in all_targets(load(name)):
            queried |= set(re.findall(r"(?<![\w:])((?:[a-z]+:)?gpufleet_[a-z0-9_:]+)", t["expr"]))
    assert queried, "no metric found in the dashboards"
    assert queried <= documented, f"not in docs/metrics.md: {sorted(queried - documented)}"
    uses = {name for name in queried if ":" in name}
    assert uses, "the dashboards read no recorded series"
    assert uses <= recorded, f"not in rules/gpufleet-recording.yaml: {sorted(uses - recorded)}"


# -- provisioning examples ----------------------------------------------------------


def test_provisioning_examples_name_a_prometheus_datasource_and_a_file_provider():
    deploy = REPO / "deploy" / "grafana"
    sources = yaml.safe_load((deploy / "datasource.yaml").read_text())
    assert sources["apiVersion"] == 1
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["uid"] and source["url"].startswith("http")
    assert re.fullmatch(r"\d+[smh]", source["jsonData"]["timeInterval"])
    providers = yaml.safe_load((deploy / "dashboards.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert provider["allowUiUpdates"] is False  # generated files: UI edits would be lost
    for name in FILES:  # a provisioned dashboard must not carry a database id
        assert load(name)["id"] is None
