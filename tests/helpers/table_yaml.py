"""The shipped threshold table as a mapping to edit, and back to text, at libyaml's speed.

The property tests edit one value of the table per example, hundreds of times: PyYAML's
pure-Python loader and dumper were most of their time (a 22 KB table each way per
example). What is under test is ``parse_thresholds`` on the edited text, which still reads
it through gpufleet's own YAML reader.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.data import REPO

TABLE = REPO / "rules" / "thresholds.yaml"
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@functools.lru_cache(maxsize=4)
def _table(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_LOADER)  # a safe loader: C or pure


def table_mapping(path: Path = TABLE) -> Any:
    """A fresh deep copy of the table's mapping: each example edits its own."""
    return copy.deepcopy(_table(path))


def dump(raw: Any, sort_keys: bool = True) -> str:
    """``yaml.safe_dump``, through libyaml where PyYAML has it."""
    return yaml.dump(raw, Dumper=_DUMPER, sort_keys=sort_keys)
