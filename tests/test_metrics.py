"""The catalogue itself (exporter/metrics.py), and every name the rules, dashboards and sources use.

A metric name used in a rule, a dashboard or a query but declared nowhere is a
query that silently returns nothing; here it fails instead.
"""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from exporter import metrics
from exporter.metrics import CATALOGUE, FamilySpec
from exporter.snapshot import Gpu, GpuHealth, GpuPerformance, GpuProcesses
from exporter.sources.prometheus.options import PrometheusSource as PrometheusConfig
from exporter.sources.prometheus.source import build_queries
from tests.helpers import REPO

BASE_UNITS = ("bytes_per_second", "bytes", "seconds", "celsius", "watts", "joules", "ratio", "hertz")
# Tokens of PromQL, YAML and JSON text that mention gpufleet: metric names and
# recording-rule outputs (level:metric:operations, the only names with colons).
_TOKEN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def test_metrics_is_a_leaf_module():
    tree = ast.parse((REPO / "exporter" / "metrics.py").read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names]
    assert imported and not [m for m in imported if m.split(".")[0] == "exporter"], imported


def test_each_family_is_a_module_constant_named_after_it():
    for name, spec in CATALOGUE.items():
        assert spec.name == name
        assert getattr(metrics, name.removeprefix("gpufleet_").upper()) is spec, name


@pytest.mark.parametrize("spec", CATALOGUE.values(), ids=list(CATALOGUE))
def test_names_follow_the_conventions(spec: FamilySpec):
    assert re.fullmatch(r"gpufleet_[a-z0-9_]+", spec.name)
    assert spec.type in ("gauge", "counter")
    assert spec.name.endswith("_total") == (spec.type == "counter")
    if spec.name.endswith("_info"):
        assert spec.type == "gauge" and spec.help.endswith("always 1.")
    stem = spec.name.removesuffix("_total")
    named_unit = next((u for u in BASE_UNITS if stem.endswith(f"_{u}")), "")
    assert spec.unit == named_unit, "unit is the base unit the name ends in"
    assert len(set(spec.labels)) == len(spec.labels)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", label) for label in spec.labels)
    assert spec.help and "\n" not in spec.help


def test_family_pairs_a_spec_with_samples():
    samples = [((("version", "1.0"),), 1.0)]
    family = metrics.BUILD_INFO.family(samples)
    assert (family.name, family.type, family.help, family.samples) == (
        "gpufleet_build_info", "gauge", "gpufleet version; always 1.", samples)


def _recorded() -> set[str]:
    text = (REPO / "rules" / "gpufleet-recording.yaml").read_text()
    return set(re.findall(r"^\s*- record: (\S+)$", text, re.M))


def _used(text: str) -> set[str]:
    return {t.rstrip(":") for t in _TOKEN.findall(text) if "gpufleet_" in t}


def _undeclared(names: set[str]) -> list[str]:
    # Colon names are recording-rule outputs, declared by rules/gpufleet-recording.yaml.
    # No family is a histogram or summary yet, so no _bucket/_sum/_count names are allowed.
    recorded = _recorded()
    return sorted(n for n in names if n not in (recorded if ":" in n else CATALOGUE))


USERS = {
    "rules": ["rules/*.yaml", "rules/tests/*.yaml"],
    "dashboards": ["dashboards/*.json"],
}


@pytest.mark.parametrize("user", list(USERS))
def test_every_name_the_rules_and_dashboards_use_is_declared(user: str):
    files = [path for pattern in USERS[user] for path in sorted(REPO.glob(pattern))]
    assert files, USERS[user]
    used = set().union(*(_used(path.read_text()) for path in files))
    assert used & set(CATALOGUE), "the token pattern finds the names"
    assert not _undeclared(used), f"{user}: not in exporter/metrics.py: {_undeclared(used)}"


def test_every_name_the_prometheus_source_queries_is_declared():
    queries = build_queries(PrometheusConfig(selector='job="nodes"'))
    used = set().union(*(_used(q) for q in queries.values())) | {q for q in queries if "gpufleet_" in q}
    assert metrics.GPU_INFO.name in used
    assert not _undeclared(used) and not any(":" in n for n in used), sorted(used)


def test_recording_rule_outputs_are_documented():
    documented = set(re.findall(r"^\| `([a-z_]+:[a-z0-9_:]+)` \|",
                                (REPO / "docs" / "metrics.md").read_text(), re.M))
    assert documented == _recorded()
    assert documented, "the docs table of recording rules is found"


def test_converted_modules_write_no_family_name_themselves():
    """Exposition, analysis, advisor and the prometheus source take every name from the catalogue."""
    renderer = sorted(str(p.relative_to(REPO)) for p in (REPO / "exporter" / "exposition").glob("*.py"))
    assert "exporter/exposition/families.py" in renderer
    for path in (*renderer, "exporter/analysis/analyzer.py",
                 "exporter/advisor/service.py", "exporter/sources/prometheus/source.py"):
        literals = re.findall(r"""["']gpufleet_[a-z0-9_]*""", (REPO / path).read_text())
        assert not literals, (path, literals)


def test_every_per_gpu_family_reads_fields_the_snapshot_has():
    """``read`` paths are checked here, not first by a render that reads None forever."""
    parts = {"": Gpu, "health": GpuHealth, "performance": GpuPerformance,
             "processes": GpuProcesses}
    read = [spec for spec in CATALOGUE.values() if spec.kind in ("gpu", "gpu_labelled")]
    assert metrics.GPU_FAN_SPEED_RATIO in read and metrics.GPU_CLOCK_EVENT_ACTIVE in read
    for spec in read:
        assert spec.read is not None, spec.name
        for path in spec.fields:
            part, _, name = path.rpartition(".")
            assert name in {f.name for f in dataclasses.fields(parts[part])}, (spec.name, path)
        # a bound for every field it reads, but for a record array (bounded in bounds.py)
        assert (spec.bound is None) == isinstance(spec.read, metrics.FromField), spec.name
    assert metrics.GPU_FAN_SPEED_RATIO.part == "performance"
    assert metrics.GPU_CLOCK_HERTZ.fields == (
        "performance.sm_clock_hertz", "performance.memory_clock_hertz", "performance.graphics_clock_hertz")
    assert metrics.GPU_UTILIZATION_RATIO.part is None


def test_selector_writes_a_familys_promql():
    assert metrics.GPU_TEMPERATURE_CELSIUS.selector() == "gpufleet_gpu_temperature_celsius"
    assert metrics.GPU_CLOCK_EVENT_ACTIVE.selector('reason=~"hw_.*"', node="n1") == (
        'gpufleet_gpu_clock_event_active{reason=~"hw_.*",node="n1"}')
