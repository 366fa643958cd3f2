"""Every number a command takes is finite and within its stated bounds, or the command says
so on one line and exits 2: ``simulate --days 1e9`` was a MemoryError, ``nan`` a ValueError,
``inf`` an OverflowError, ``--seeds 1-1000000000`` a billion seeds built in memory, and an
``--advisor-interval`` of 1e-9 s ran on for minutes. Each case runs the real command.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exporter.cli.replay import MAX_SEEDS, parse_seeds
from exporter.errors import UsageError
from exporter.validate import flag_number
from tests.helpers.servers import REPO

CASES = [
    (["simulate", "--days", "1e9"], "--days: must be in (0, 366], got 1e+09"),
    (["simulate", "--days", "nan"], "--days: must be in (0, 366], got nan"),
    (["simulate", "--days", "inf"], "--days: must be in (0, 366], got inf"),
    (["simulate", "--warmup-days", "1e9"], "--warmup-days: must be in [0, 366], got 1e+09"),
    (["simulate", "--seeds", "1-1000000000"],
     "--seeds: at most 10,000 seeds, got '1-1000000000'"),
    (["simulate", "--advisor-interval", "1e-9"],
     "--advisor-interval: must be in [1, 86400] seconds, got 1e-09"),
    (["simulate", "--restore", "inf"], "--restore: must be in [0, 86400] seconds, got inf"),
    (["simulate", "--jobs", "100000"], "--jobs: must be in [1, 1024], got 100000"),
    (["replay", "--seeds", "0-99999999999"], "--seeds: at most 10,000 seeds, got '0-99999999999'"),
    (["analyze", "--trace", "openb-default", "--placed-by", "random", "--seed", "-1"],
     "--seed: must be in [0, 9223372036854775807], got -1"),
    (["rules", "--for-scale", "1e308", "--out", "{out}"],
     "--for-scale: must be in (0, 1000], got 1e+308"),
]


@pytest.mark.parametrize(("argv", "line"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_number_out_of_bounds_is_one_line_and_exit_2(tmp_path, argv, line):
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in argv]
    if argv[0] in ("simulate", "replay"):
        argv += ["--out", str(tmp_path / "out")]
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "exporter", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == [f"gpufleet: {line}"]
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_flag_number_bounds_and_wording():
    assert flag_number(1.0, "--x", 0, 1) == 1.0
    assert flag_number(0, "--x", 0, 1) == 0
    for value in (0.0, -1.0, 1.5, float("nan"), float("inf"), float("-inf")):
        with pytest.raises(UsageError, match=r"^--x: must be in \(0, 1\], got "):
            flag_number(value, "--x", 0, 1, above=True)


def test_seeds_are_counted_before_a_range_is_expanded():
    assert len(parse_seeds(f"1-{MAX_SEEDS}")) == MAX_SEEDS
    for text in (f"1-{MAX_SEEDS + 1}", f"0,1-{MAX_SEEDS}", "5-" + "9" * 4000):
        with pytest.raises(UsageError, match=f"^--seeds: at most {MAX_SEEDS:,} seeds"):
            parse_seeds(text)
    with pytest.raises(UsageError, match=r"^--seeds: expected seeds from 0"):
        parse_seeds(str(2**63))
