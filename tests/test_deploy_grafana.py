"""Grafana provisioning (deploy/grafana): only Grafana's documented keys, and a datasource
and provider that fit the generated dashboards (their `datasource` variable and folder).

The keys are kept as test data with their origin (tests/data/grafana/provisioning-keys.yaml).
No Grafana runs here (none is packaged for these machines): the files were not loaded by one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import REPO

GRAFANA = REPO / "deploy" / "grafana"
KEYS = yaml.safe_load((REPO / "tests" / "data" / "grafana" / "provisioning-keys.yaml").read_text())


def unknown(obj: dict[str, Any], allowed: list[str], where: str) -> list[str]:
    return [f"{where}.{key}" for key in obj if key not in allowed]


def datasource_problems(doc: dict[str, Any]) -> list[str]:
    out = unknown(doc, KEYS["datasources_file"], "datasources.yaml")
    for i, ds in enumerate(doc.get("datasources", [])):
        where = f"datasources[{i}]"
        out += unknown(ds, KEYS["datasource"], where)
        if ds.get("type") == "prometheus":
            out += unknown(ds.get("jsonData", {}), KEYS["prometheus_json_data"], f"{where}.jsonData")
        if ds.get("access", "proxy") not in KEYS["access"]:
            out.append(f"{where}.access: {ds['access']!r}")
    return out


def provider_problems(doc: dict[str, Any]) -> list[str]:
    out = unknown(doc, KEYS["dashboards_file"], "dashboards.yaml")
    for i, p in enumerate(doc.get("providers", [])):
        out += unknown(p, KEYS["provider"], f"providers[{i}]")
        out += unknown(p.get("options", {}), KEYS["provider_options"], f"providers[{i}].options")
    return out


def test_datasource_uses_documented_keys() -> None:
    doc = yaml.safe_load((GRAFANA / "datasource.yaml").read_text())
    assert doc["apiVersion"] == 1
    assert datasource_problems(doc) == []


def test_provider_uses_documented_keys() -> None:
    doc = yaml.safe_load((GRAFANA / "dashboards.yaml").read_text())
    assert doc["apiVersion"] == 1
    assert provider_problems(doc) == []
    (provider,) = doc["providers"]
    assert (provider["type"], provider["options"]["path"]) == ("file", "/var/lib/grafana/dashboards/gpufleet")
    # the README's mount of dashboards/ is the provider's path
    assert "/var/lib/grafana/dashboards/gpufleet" in (GRAFANA / "README.md").read_text()


def test_key_check_can_fail() -> None:
    doc = yaml.safe_load((GRAFANA / "datasource.yaml").read_text())
    doc["datasources"][0]["isdefault"] = True
    doc["datasources"][0]["jsonData"]["scrapeInterval"] = "15s"
    assert datasource_problems(doc) == ["datasources[0].isdefault", "datasources[0].jsonData.scrapeInterval"]
    provider = yaml.safe_load((GRAFANA / "dashboards.yaml").read_text())
    provider["providers"][0]["options"]["folderFromFilesStructure"] = True
    assert provider_problems(provider) == ["providers[0].options.folderFromFilesStructure"]


def datasource_refs(node: Any) -> list[Any]:
    """Every `datasource` value in a dashboard, at any depth."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                out.append(value)
            out += datasource_refs(value)
    elif isinstance(node, list):
        for value in node:
            out += datasource_refs(value)
    return out


def test_dashboards_pick_the_provisioned_datasource() -> None:
    """Each dashboard's `datasource` variable lists datasources of the provisioned type, and
    every panel and query reads through that variable; so the provisioned default (the only
    Prometheus of a fresh Grafana) is the one they open with, whatever its uid."""
    (ds,) = yaml.safe_load((GRAFANA / "datasource.yaml").read_text())["datasources"]
    assert (ds["type"], ds["isDefault"]) == ("prometheus", True)
    for path in sorted((REPO / "dashboards").glob("gpufleet-*.json")):
        board = json.loads(path.read_text())
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
            "datasource", ds["type"]), path.name
        refs = [r for r in datasource_refs(board) if r is not None]
        assert refs, path.name
        assert {json.dumps(r, sort_keys=True) for r in refs} == {
            json.dumps({"type": "prometheus", "uid": "${datasource}"}, sort_keys=True)}, path.name


def test_interval_matches_the_scrape_interval() -> None:
    """timeInterval is the scrape interval of the ServiceMonitors and the example Prometheus."""
    (ds,) = yaml.safe_load((GRAFANA / "datasource.yaml").read_text())["datasources"]
    prometheus = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    assert ds["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"] == "15s"
    for monitor in (REPO / "deploy" / "kubernetes" / "overlays").glob("*/servicemonitor.yaml"):
        assert yaml.safe_load(monitor.read_text())["spec"]["endpoints"][0]["interval"] == "15s"


def test_files_exist() -> None:
    assert sorted(p.name for p in GRAFANA.iterdir()) == ["README.md", "dashboards.yaml", "datasource.yaml"]
    assert Path(GRAFANA / "datasource.yaml").read_text().startswith("# Grafana datasource provisioning")
