"""One record per table metric, and a gauge that turns a colour means the alert would fire.

Each metric a row of rules/thresholds.yaml compares is one record
(exporter/thresholds/table_metrics.py): its PromQL feeds the rules, and a dashboard panel
coloured at a row's levels plots that same expression. Checked here against the committed
files, read as a reviewer reads them: every panel of dashboards/*.json that carries a row's
levels plots, once its dashboard variables are taken out, exactly the value that row's alert
compares in rules/gpufleet-alerts.yaml (a panel may only pick series of it: max, min, topk,
bottomk), and its steps are that alert's thresholds in that alert's colours.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from exporter.dashboards.levels import CRITICAL, OK, WARNING
from exporter.durations import parse_duration
from exporter.thresholds import METRICS, load_thresholds
from exporter.thresholds.table_metrics import promql_number, regex_alternatives, with_matchers
from tests.helpers import REPO

TABLE = REPO / "rules" / "thresholds.yaml"
ALERTS = REPO / "rules" / "gpufleet-alerts.yaml"
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
COLOUR = {"warning": WARNING, "critical": CRITICAL}
# a dashboard variable's matcher: cluster=~"$cluster", and cluster=~"$cluster|" where a
# series may lack the label (node_exporter's)
_VARIABLE = re.compile(r'\w+=~"\$\w+\|?"')
_PICK = re.compile(r"^(?:(?:max|min)(?: by \([\w, ]*\))? ?\(|(?:topk|bottomk)\(\d+, )")


def _threshold(value) -> float:
    """A threshold as the table writes it: 30%, 85, or a duration (30m) for seconds."""
    if isinstance(value, str) and value.endswith("%"):
        return float(value[:-1]) / 100
    return parse_duration(value) if isinstance(value, str) else float(value)


def without_variables(expr: str) -> str:
    """``expr`` with every dashboard variable's matcher taken out (and selectors left empty)."""
    out = _VARIABLE.sub("", expr)
    out = re.sub(r"\{,+", "{", out)
    out = re.sub(r",+\}", "}", out)
    out = re.sub(r",{2,}", ",", out)
    return out.replace("{}", "")


def _closing(expr: str, opening: int) -> int:
    depth = 0
    for i in range(opening, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    return -1


def picked(expr: str) -> str:
    """``expr`` without the aggregations that only pick series (each value shown is then one
    series' value): max, min (by labels or not), topk, bottomk."""
    while match := _PICK.match(expr):
        opening = expr.index("(", match.end() - 1 if expr.startswith(("max", "min")) else 0)
        if _closing(expr, opening) != len(expr) - 1:
            break
        expr = expr[match.end():-1]
    return expr


def alerts_compared() -> dict[str, tuple[str, str, dict[str, float]]]:
    """Alert -> (the value its rules compare, op, threshold per severity), read from the
    committed rules and the table's raw rows: each rule's expr less its `op threshold`."""
    rows = {row["alert"]: row for row in yaml.safe_load(TABLE.read_text())["alerts"]}
    out: dict[str, tuple[str, str, dict[str, float]]] = {}
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            row = rows[rule["alert"]]
            if "models" in row:  # power: one comparison per model, checked on its own below
                continue
            severity = rule["labels"]["severity"]
            threshold = _threshold(row[severity]["threshold"])
            # the rule is `value op threshold`, then the scope's `\nand ...` lines or the
            # absent() terms' `\nor\n`: the first `op threshold` so followed is the comparison
            comparison = re.escape(f" {row['op']} {promql_number(threshold)}")
            found = re.search(rf"{comparison}(?=$|\nand |\nor\n|\n\)\nand )", rule["expr"])
            assert found, (rule["alert"], comparison)
            value = rule["expr"][:found.start()] + rule["expr"][found.end():]
            each = METRICS[row["metric"]].each
            if each is not None:  # one rule per value of a label, each with its exact matcher:
                label, values = each  # together they compare what the alternation selects
                one = f'{label}="{rule["labels"][label]}"'
                assert one in value and rule["labels"][label] in values, (rule["alert"], one)
                value = value.replace(one, f'{label}=~"{regex_alternatives(values)}"')
            before = out.setdefault(rule["alert"], (value, row["op"], {}))
            assert before[0] == value, f"{rule['alert']}: its severities compare different values"
            before[2][severity] = threshold
    return out


def _steps(panel: dict) -> list[dict]:
    return panel["fieldConfig"]["defaults"]["thresholds"]["steps"]


def _colour_at(steps: list[dict], value: float) -> str | None:
    return next((s["color"] for s in steps[1:] if s["value"] == value), None)


def _colour_below(steps: list[dict], value: float) -> str:
    colour = steps[0]["color"]
    for step in steps[1:]:
        if step["value"] < value:
            colour = step["color"]
    return colour


def _is_count(panel: dict) -> bool:
    """A count of things in a condition (lost GPUs, GPUs with an XID): any is the alert's
    severity, one step at 1; it shows no value of a row, so it carries none of its levels."""
    return all(re.match(r"^(count|sum) ?\(", t["expr"]) for t in panel["targets"]) and \
        [s["value"] for s in _steps(panel)[1:]] == [1]


def drift(board: dict, compared: dict[str, tuple[str, str, dict[str, float]]]
          ) -> tuple[list[str], set[str]]:
    """Every panel of ``board`` carrying a row's levels: (what is wrong, the alerts matched)."""
    wrong: list[str] = []
    matched: set[str] = set()
    for panel in board["panels"]:
        steps = _steps(panel) if "fieldConfig" in panel else []
        if panel["type"] == "row" or len(steps) < 2 or _is_count(panel):
            continue
        values = {s["value"] for s in steps[1:]}
        for target in panel["targets"]:
            shown = picked(without_variables(target["expr"]))
            alert = next((name for name, (value, _, levels) in compared.items()
                          if value == shown and set(levels.values()) == values), None)
            if alert is None:
                wrong.append(f"{panel['title']}: {target['expr']} is no alert's value at "
                             f"levels {sorted(values)}")
                continue
            matched.add(alert)
            _, op, levels = compared[alert]
            for severity, threshold in levels.items():
                colour = (_colour_below(steps, threshold) if op == "<"
                          else _colour_at(steps, threshold))
                if colour != COLOUR[severity]:
                    wrong.append(f"{panel['title']}: {colour} at {alert}'s {severity} level")
    return wrong, matched


def _boards() -> list[tuple[str, dict]]:
    return [(path.name, json.loads(path.read_text())) for path in DASHBOARDS]


def test_every_panel_carrying_a_rows_levels_plots_the_value_its_alert_compares():
    compared = alerts_compared()
    matched: set[str] = set()
    for name, board in _boards():
        wrong, found = drift(board, compared)
        assert wrong == [], f"{name}: {wrong}"
        matched |= found
    # the walk saw the panels: every levelled concept the dashboards draw
    assert matched == {"GpuTemperatureHigh", "GpuMemoryHigh", "GpuJobUtilizationLow",
                       "GpuClusterFragmentationHigh", "GpuFleetFragmentationHigh",
                       "NodePressureHigh", "GpuPoolPreemptionOverheadHigh"}


def test_the_walk_finds_the_old_drift_of_the_under_used_gpus_panel():
    """Before issue 40 the jobs panel coloured per-GPU utilization with the levels of
    GpuJobUtilizationLow, which compares the job's average: the check must fail on it."""
    board = next(board for name, board in _boards() if name == "gpufleet-fleet.json")
    drifted = copy.deepcopy(board)
    (panel,) = [p for p in drifted["panels"] if p["title"] == "Top 10 least busy jobs"]
    panel["targets"][0]["expr"] = (
        'bottomk(10, gpufleet_gpu_utilization_ratio{cluster=~"$cluster"} * on (cluster, node, '
        'gpu) group_right() gpufleet_gpu_allocation_info{cluster=~"$cluster"})')
    wrong, matched = drift(drifted, alerts_compared())
    assert len(wrong) == 1 and wrong[0].startswith("Top 10 least busy jobs: ")
    assert "GpuJobUtilizationLow" not in matched
    # a mean is no series' value either: the old pool mean under the temperature lines
    (hot,) = [p for p in drifted["panels"] if p["title"] == "Temperature, hottest GPU per pool"]
    hot["targets"][0]["expr"] = 'avg by (pool, model) (gpufleet_gpu_temperature_celsius)'
    assert len(drift(drifted, alerts_compared())[0]) == 2


def test_power_panels_plot_the_watts_the_power_alert_compares_per_model():
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]
             if r["alert"] == "GpuPowerHigh"]
    own = yaml.safe_load(TABLE.read_text())["alerts"]
    (power,) = [row for row in own if row["metric"] == "gpu_power"]
    seen = 0
    for _, board in _boards():
        for panel in board["panels"]:
            if not any(o["properties"][0]["id"] == "thresholds"
                       for o in panel.get("fieldConfig", {}).get("overrides", [])):
                continue
            seen += 1
            for target in panel["targets"]:
                shown = picked(without_variables(target["expr"]))
                for rule in rules:
                    watts = power["models"]["H200"][rule["labels"]["severity"]]
                    assert f'{shown}{{model="H200"}} >= {watts}' in rule["expr"], panel["title"]
    assert seen == 2  # the fleet's highest draw by model, the node's draw now


def test_unfiltered_a_rows_panel_query_is_what_its_alert_compares():
    """The generator's side: Thresholds.panel_query without a selector is each rule's value."""
    table = load_thresholds(TABLE)
    compared = alerts_compared()
    for row in table.alerts:
        if row.alert in compared and not row.metric.absent_too:
            assert table.panel_query(row.metric) == compared[row.alert][0], row.alert
    assert len(compared) >= 25


@pytest.mark.parametrize("key", list(METRICS))
def test_a_selector_reaches_every_series_and_taking_it_out_gives_the_expression_back(key):
    table = load_thresholds(TABLE)
    plain = table.value(METRICS[key])
    selected = with_matchers(plain, '{cluster=~"$cluster",pool=~"$pool"}')
    assert without_variables(selected) == plain
    names = re.findall(r"(?<![\w:\"])((?:[a-z_]+:)?gpufleet_[a-z0-9_:]+|up)(?=[{\[ )\n]|$)",
                       selected)
    assert names, key
    for name in names:
        assert f'{name}{{cluster=~"$cluster",pool=~"$pool"' in selected, (key, name)
    assert with_matchers(plain, "") == plain


def test_the_record_holds_every_fact_of_a_metric_once():
    """The vocabulary the loader checks rows against and the PromQL the rules compare are one
    record: a key names one concept from the table to the panel."""
    temperature = METRICS["gpu_temperature"]
    assert (temperature.unit, temperature.subject, temperature.ops, temperature.expr) == (
        "celsius", "gpu", (">", ">="), "gpufleet_gpu_temperature_celsius")
    assert "<THRESHOLD>" in temperature.describe
    assert [key for key, metric in METRICS.items() if metric.relative_to_tdp] == ["gpu_power"]
    assert [key for key, metric in METRICS.items() if metric.absent_too] == ["exporter_job_up"]
    table = load_thresholds(TABLE)
    assert {row.metric.key for row in table.alerts} <= set(METRICS)
    assert all(row.metric is METRICS[row.metric.key] for row in table.alerts)
    assert OK == "green"
