"""docs/metrics.md is the catalogue of metric names: it and the code must agree."""

from __future__ import annotations

import re

from tests.conftest import REPO, http_get

DOC = REPO / "docs" / "metrics.md"


def documented() -> set[str]:
    names = set()
    for line in DOC.read_text().splitlines():
        match = re.match(r"\|\s*`(gpufleet_[a-z0-9_]+)`", line)
        if match:
            names.add(match.group(1))
    return names


def test_every_exported_family_is_documented(exporter_factory):
    exporter = exporter_factory("--seed", "2")
    text = http_get(f"{exporter.url}/metrics").decode()
    exported = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert exported, "nothing exported"
    missing = exported - documented()
    assert not missing, f"exported but not in docs/metrics.md: {sorted(missing)}"


def test_every_documented_name_is_in_the_code():
    code = "\n".join(p.read_text() for p in (REPO / "exporter").rglob("*.py"))
    orphans = {name for name in documented() if f'"{name}' not in code}
    assert not orphans, f"in docs/metrics.md but exported nowhere: {sorted(orphans)}"
