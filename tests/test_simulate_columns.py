"""Issue 44: docs/simulate.md defines every column of outcomes.csv, the size classes too
(``small``, ``mid``, ``node``, ``multi_node`` were defined only in the code)."""

from __future__ import annotations

import re

from exporter.outcome_sim.outcomes import CLASSES, COLUMNS
from tests.helpers import REPO


def test_docs_simulate_defines_every_outcomes_column_once():
    text = (REPO / "docs" / "simulate.md").read_text()
    section = text.split("## outcomes.csv: the columns\n", 1)[1].split("\n## ", 1)[0]
    defined = [name for line in section.splitlines() if line.startswith("| `")
               for name in re.findall(r"`(\w+)`", line.split(" | ")[0])]
    assert sorted(defined) == sorted(COLUMNS)
    for size in CLASSES:
        row = next(line for line in section.splitlines() if f"`wait_p95_s_{size}`" in line)
        assert f"`{size}` jobs" in row
