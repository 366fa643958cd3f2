"""docs/metrics.md's tables of families, generated from the catalogue (exporter/metrics.py).

The prose of docs/metrics.md is written by hand. Each table of families sits
between a start marker naming its group (``FamilySpec.group``) and an end
marker, and is rewritten from the catalogue, one row per family in catalogue
order: name, type, labels, and the exact HELP text followed by the spec's
``doc`` note. ``tests/test_docs.py`` fails when the file differs from what this
writes, or when a group has no table (or two).

    python -m tests.helpers.metrics_doc            # print docs/metrics.md as generated
    python -m tests.helpers.metrics_doc --update   # rewrite docs/metrics.md (make generate-docs)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from exporter.metrics import CATALOGUE, IDENTITY, FamilySpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
START = "<!-- families: {group} (generated from exporter/metrics.py by `make generate-docs`) -->"
END = "<!-- end families -->"
BLOCK = re.compile(r"^<!-- families: (?P<group>[a-z_]+) .*?-->\n(?P<table>.*?)^<!-- end families -->$",
                   re.M | re.S)


def _cell(text: str) -> str:
    # a bare <name> would be read as an HTML tag and vanish; | would end the cell
    return text.replace("|", r"\|").replace("<", "&lt;").replace(">", "&gt;")


def _labels(spec: FamilySpec) -> str:
    if spec.labels[:len(IDENTITY)] == IDENTITY:
        return ", ".join(["identity", *(f"`{name}`" for name in spec.labels[len(IDENTITY):])])
    return ", ".join(f"`{name}`" for name in spec.labels)


def table(group: str) -> str:
    """The markdown table of one group's families, rows in catalogue order."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for spec in CATALOGUE.values():
        if spec.group == group:
            meaning = f"{spec.help} {spec.doc}" if spec.doc else spec.help
            rows.append(f"| `{spec.name}` | {spec.type} | {_labels(spec)} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def generate(text: str) -> str:
    """``text`` (docs/metrics.md) with every table of families rewritten from the catalogue."""
    groups = [m.group("group") for m in BLOCK.finditer(text)]
    wanted = list(dict.fromkeys(spec.group for spec in CATALOGUE.values()))
    if sorted(groups) != sorted(wanted):
        raise ValueError(f"docs/metrics.md needs one table per group {wanted}, has {groups}")
    return BLOCK.sub(lambda m: f"{START.format(group=m.group('group'))}\n{table(m.group('group'))}{END}",
                     text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help=f"rewrite {DOC.name}")
    args = parser.parse_args(argv)
    text = generate(DOC.read_text())
    if args.update:
        DOC.write_text(text)
        print(f"wrote {DOC}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
