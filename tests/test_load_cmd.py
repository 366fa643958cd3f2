"""``gpufleet load``: the 184-day Alibaba series end to end, and hostile CSVs refused in one line."""

from __future__ import annotations

import csv

import pytest

from exporter.cli import main
from tests.helpers import REPO

DATA = REPO / "data" / "alibaba-spot-gpu-v2026"
SERIES = DATA / "hourly_concurrency_top_models.csv"
CAPACITY = DATA / "fleet_by_model.csv"


def load(tmp_path, *extra, series=SERIES, capacity=CAPACITY) -> int:
    return main(["load", "--series", str(series), "--capacity", str(capacity), "--out",
                 str(tmp_path / "out"), "--no-progress", *extra])


def test_the_real_series(tmp_path, capsys):
    assert load(tmp_path, "--startup", "1h") == 0
    out = capsys.readouterr().out
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in out.splitlines()[2:-2]}
    # the figures docs/load.md reports
    assert rows[("H800", "static")][:4] == ["232,408", "2,390,277", "7,742,088", "0"]
    assert rows[("H800", "reactive")][:4] == ["206,454", "4,320,611", "9,844,632", "329"]
    # issue 44: a scale-down no longer waits cooldown_down after another scale-down (was
    # 147,900 / 3,873,089 / 9,597,376 / 1058); reactive's hourly rule never met that case
    assert rows[("H800", "predictive")][:4] == ["150,364", "3,857,929", "9,581,616", "1085"]
    assert "than reactive on 4 of 6 pools" in out
    with open(tmp_path / "out" / "load.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6 * 4419
    first = table[0]
    assert (first["pool"], first["hour"], first["demand_gpus"], first["static_gpus"]) == \
        ("A10", "0", "2249.14", "2494")
    assert (tmp_path / "out" / "load.png").stat().st_size > 10_000


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ("hour,a\n0,1\n1,nan\n", "series.csv:3: a must be a finite number"),
    ("hour,a\n0,1\n1,-2\n", "series.csv:3: a must be a finite number from 0"),
    ("hour,a\n0,1\n2,1\n", "series.csv:3: hour 2 does not follow 0"),
    ("hour,a\n0,1\n1,x\n", "series.csv:3: a is not a number: 'x'"),
    ("hour,a\n0,1,5\n", "series.csv:2: 3 fields, the header has 2"),
    ("h,a\n0,1\n", "series.csv:1: no 'hour' column"),
    ("hour,a\n", "series.csv: no rows"),
    ("hour,b\n0,1\n", "capacity.csv: no row for pool 'b'"),
])
def test_bad_series(tmp_path, capsys, text, message):
    series = write(tmp_path / "series.csv", text)
    capacity = write(tmp_path / "capacity.csv", "gpu_model,total_gpus\na,8\n")
    assert load(tmp_path, series=series, capacity=capacity) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_too_many_columns(tmp_path, capsys):
    series = write(tmp_path / "series.csv", "hour," + ",".join(f"p{i}" for i in range(300)) + "\n")
    assert load(tmp_path, series=series) == 2
    assert "series.csv:1: 301 columns, more than the 257 allowed" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, message", [
    ("--startup", "90m", "--startup: must be whole hours from 0h to 23h"),
    ("--startup", "1day", "--startup: expected a duration"),
    ("--window", "0h", "--window: must be whole hours from 1h"),
])
def test_bad_flags(tmp_path, capsys, flag, value, message):
    assert load(tmp_path, flag, value) == 2
    assert message in capsys.readouterr().err


def test_a_small_series_with_bounds(tmp_path, capsys):
    series = write(tmp_path / "series.csv", "hour,a\n" + "".join(f"{h},{40 if h > 2 else 4}\n"
                                                                 for h in range(6)))
    capacity = write(tmp_path / "capacity.csv", "pool,total_gpus,max_gpus\na,8,2\n")
    assert load(tmp_path, "--startup", "0h", "--max-nodes", "10", series=series, capacity=capacity) == 0
    out = capsys.readouterr().out
    reactive = next(line for line in out.splitlines() if line.startswith("a ") and "reactive" in line)
    # 4 nodes of 2 GPUs; demand 40 from hour 3: two samples above 0.8, then 25 nodes wanted, 10 allowed
    # from hour 5: unmet 32 + 32 + 20, idle 3 x 4, provisioned 5 x 8 + 20; at the bound in hours 4 and 5
    assert reactive.split()[2:7] == ["84", "12", "60", "1", "2"]
    assert reactive.endswith("4-10 x 2 GPUs")


def test_the_threshold_tables_rule_is_used(tmp_path, capsys):
    import yaml

    raw = yaml.safe_load((REPO / "rules" / "thresholds.yaml").read_text())
    raw["scaling"] = {"up": 0.5, "down": 0.1, "hysteresis": 1, "pools": {"a": {"cooldown_up": "0s"}}}
    table = write(tmp_path / "t.yaml", yaml.safe_dump(raw))
    series = write(tmp_path / "series.csv", "hour,a\n0,4\n1,5\n2,5\n")
    capacity = write(tmp_path / "capacity.csv", "pool,total_gpus,max_gpus\na,8,1\n")
    assert load(tmp_path, "--startup", "0h", "--thresholds", str(table), series=series,
                capacity=capacity) == 0
    reactive = next(line for line in capsys.readouterr().out.splitlines() if " reactive " in line)
    # 5 of 8 GPUs is above 0.5 after one sample: ceil(5 / 0.5) = 10 nodes of 1 GPU from hour 2;
    # idle 4 + 3 + 5, provisioned 8 + 8 + 10
    assert reactive.split()[2:6] == ["0", "12", "26", "1"]


def test_a_bad_threshold_table_is_one_line(tmp_path, capsys):
    table = write(tmp_path / "t.yaml", "scaling: {up: 2}\n")
    assert load(tmp_path, "--thresholds", str(table)) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpufleet: ") and err.count("\n") == 1


def test_size_and_row_bounds(tmp_path, capsys):
    from exporter.pool_load.series import MAX_BYTES, MAX_ROWS

    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: nothing is written, the size alone is refused
    assert load(tmp_path, series=big) == 2
    assert f"big.csv: {MAX_BYTES + 1} bytes, more than the {MAX_BYTES} allowed" in capsys.readouterr().err
    rows = write(tmp_path / "rows.csv", "hour,a\n" + "".join(f"{h},1\n" for h in range(MAX_ROWS + 1)))
    assert load(tmp_path, series=rows) == 2
    assert f"rows.csv:{MAX_ROWS + 2}: more than {MAX_ROWS} rows" in capsys.readouterr().err


def test_pools_selects_columns(tmp_path, capsys):
    assert load(tmp_path, "--pools", "A800-SXM4-80GB,H800") == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[2:-2]] == ["A800-SXM4-80GB"] * 3 + ["H800"] * 3
    assert "on 2 of 2 pools" in out
    assert load(tmp_path, "--pools", "B200") == 2
    assert "no column for pool 'B200'" in capsys.readouterr().err


def test_progress_goes_to_stderr(tmp_path, capsys):
    series = write(tmp_path / "series.csv", "hour,a,b\n0,1,2\n1,1,2\n")
    capacity = write(tmp_path / "capacity.csv", "pool,total_gpus\na,8\nb,8\n")
    assert main(["load", "--series", str(series), "--capacity", str(capacity), "--out",
                 str(tmp_path / "out")]) == 0
    assert capsys.readouterr().err == "load: a (1/2), 2 hours\nload: b (2/2), 2 hours\n"


def test_cell_bound(tmp_path, capsys):
    from exporter.pool_load.series import MAX_CELLS

    columns = 201
    rows = MAX_CELLS // columns + 1
    series = write(tmp_path / "wide.csv", "hour," + ",".join(f"p{i}" for i in range(columns - 1)) + "\n"
                   + ("0," + ",".join(["1"] * (columns - 1)) + "\n") * rows)
    assert load(tmp_path, series=series) == 2
    assert f"wide.csv:{rows + 1}: more than 2,000,000 cells (201 columns)" in capsys.readouterr().err
