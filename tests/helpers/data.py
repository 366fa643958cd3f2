"""Where the tests find the repository and its real data.

Tests read the repository's own data/ and nothing outside it, unless
GPUFLEET_DATA names another folder of the same layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The real-data folder: $GPUFLEET_DATA when set, else the repository's own data/.

    Tests never read outside the repository unless GPUFLEET_DATA says so.
    """
    env = os.environ.get("GPUFLEET_DATA")
    return Path(env) if env else REPO / "data"


def openb_csv(stem: str) -> Path:
    """An openb trace file by stem (``openb_pod_list_default``): ``.csv`` or ``.csv.gz``."""
    from exporter.analysis.openb import find_csv

    folder = data_dir() / "alibaba-gpu-v2023" / "csv"
    found = find_csv(folder, stem)
    if found is None:
        pytest.fail(f"{folder}: no {stem}.csv[.gz] (data/ is part of the repository; "
                    "GPUFLEET_DATA must hold the same layout)")
    return found
