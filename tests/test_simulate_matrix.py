"""The pre-registered matrix: its seeds, the jittered none that gives the noise band, the summary
against none (median, worst, band, share of the oracle's saving), the command and its picture."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from exporter.outcome_sim.fleets import SimFleet
from exporter.outcome_sim.matrix import (
    JITTER_SECONDS,
    MATRIX,
    MATRIX_STRATEGIES,
    ORACLE,
    PERTURBED,
    Matrix,
    Run,
    jittered,
    run_matrix,
    runs,
    summarise,
)
from exporter.outcome_sim.outcomes import Outcome
from exporter.outcome_sim.run import seed_jobs
from exporter.outcome_sim.sim import RunSettings
from exporter.outcome_sim.timeline import HourlyArrivals, TimelineSettings

SERIES = HourlyArrivals(np.array([3600.0 * 20, 3600.0 * 60, 3600.0 * 10, 3600.0 * 40] * 30),
                        np.array([20.0, 30.0, 10.0, 20.0] * 30))


def tiny_fleet() -> SimFleet:
    from exporter.analysis.workload import Shape
    from exporter.snapshot import Gpu, Node

    nodes = tuple(Node(f"n{i}", "H100", 64.0, "pool-H100", "hopper", 8) for i in range(4))
    shapes = (Shape(4, 1.0, 1), Shape(2, 0.5, 1), Shape(16, 1.0, 4), Shape(32, 1.0, 8), Shape(32, 1.0, 8))
    return SimFleet("tiny", nodes, tuple(Gpu(n.name, i, f"u-{n.name}-{i}", n.model, n.pool)
                                         for n in nodes for i in range(n.gpu_count)), shapes)


def outcome(strategy: str, seed: int, whole: float, load: float = 1.0) -> Outcome:
    out = Outcome(strategy, seed, load)
    out.gpu_hours_waited_whole_node = whole
    return out


def test_the_matrix_is_the_stated_one_never_the_tuned_seeds():
    assert MATRIX.seeds == tuple(range(101, 111))
    assert MATRIX.loads == (0.8, 1.0, 1.2)
    assert (MATRIX.days, MATRIX.warmup_days) == (7.0, 1.0)
    assert not set(MATRIX.seeds) & {1, 2, 3, 4, 5, 31, 32}
    planned = runs(MATRIX, ["none", "advisor"])
    assert len(planned) == 3 * 10 * 3
    assert planned[:3] == [Run("none", 101, 0.8), Run("advisor", 101, 0.8), Run(PERTURBED, 101, 0.8)]


def test_the_matrix_flags_default_to_the_stated_matrix_and_each_overrides_it():
    import argparse

    from exporter.cli.simulate import add_arguments, with_defaults

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--matrix", "--out", "x"])
    with_defaults(args)
    assert (args.seeds, args.load, args.days, args.warmup_days) == ("101-110", "0.8,1,1.2", 7.0, 1.0)
    assert args.strategies == "none,descheduler,consolidate,oracle-heads,advisor"
    args = parser.parse_args(["--matrix", "--seeds", "5", "--days", "0.5", "--strategies", "advisor",
                              "--out", "x"])
    with_defaults(args)
    assert (args.seeds, args.load, args.days, args.warmup_days, args.strategies) == (
        "5", "0.8,1,1.2", 0.5, 1.0, "advisor")
    args = parser.parse_args(["--out", "x"])  # a single run keeps its own defaults
    with_defaults(args)
    assert (args.seeds, args.load, args.days, args.strategies) == (
        "1", "1.1", 14.0, "none,descheduler,consolidate,advisor")


def test_jitter_moves_each_submit_a_few_seconds_and_keeps_the_jobs():
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.25, load=1.2))
    fleet = tiny_fleet()
    before = seed_jobs(fleet, SERIES, settings, 7)
    after = jittered(seed_jobs(fleet, SERIES, settings, 7), 7)
    by_id = {j.id: j for j in before}
    assert sorted(j.id for j in after) == sorted(by_id)
    shifts = [j.submit - by_id[j.id].submit for j in after]
    assert max(abs(s) for s in shifts) <= JITTER_SECONDS
    assert sum(1 for s in shifts if s != 0) > 0.9 * len(shifts)
    assert [j.submit for j in after] == sorted(j.submit for j in after)
    for j in after:  # what each asks for is unchanged
        assert (j.work, j.shape_key, j.high) == (by_id[j.id].work, by_id[j.id].shape_key, by_id[j.id].high)
    again = jittered(seed_jobs(fleet, SERIES, settings, 7), 7)
    assert [(j.id, j.submit) for j in again] == [(j.id, j.submit) for j in after]  # drawn from the seed


def test_the_summary_is_per_seed_against_none_with_the_band_and_the_oracle_share():
    outcomes = [
        outcome("none", 1, 100.0), outcome("advisor", 1, 80.0), outcome("oracle-heads", 1, 60.0),
        outcome("descheduler", 1, 94.0), outcome(PERTURBED, 1, 95.0),
        outcome("none", 2, 200.0), outcome("advisor", 2, 210.0), outcome("oracle-heads", 2, 100.0),
        outcome("descheduler", 2, 180.0), outcome(PERTURBED, 2, 216.0),
        outcome("none", 3, 50.0), outcome("advisor", 3, 40.0), outcome("oracle-heads", 3, 40.0),
        outcome("descheduler", 3, 50.0), outcome(PERTURBED, 3, 50.0),
    ]
    rows = {r.strategy: r for r in summarise(outcomes)}
    advisor = rows["advisor"]
    # cuts per seed: -20%, +5%, -20%
    assert advisor.seeds == 3
    assert advisor.cut_median_pct == pytest.approx(-20.0)
    assert advisor.cut_worst_pct == pytest.approx(5.0)
    assert advisor.cut_best_pct == pytest.approx(-20.0)
    assert advisor.whole_node_gpu_hours_median == pytest.approx(80.0)
    # the band: none jittered against none, -5%, +8%, 0%
    assert (advisor.noise_low_pct, advisor.noise_high_pct) == (pytest.approx(-5.0), pytest.approx(8.0))
    assert advisor.seeds_beyond_noise == 2
    # read both ways: -6% is inside the band's +8%, -10% beyond it
    assert rows["descheduler"].seeds_beyond_noise == 1
    assert rows["oracle-heads"].seeds_beyond_noise == 3
    # shares of the oracle's saving: 20/40, -10/100, 10/10
    assert advisor.oracle_share_median_pct == pytest.approx(50.0)
    assert advisor.oracle_share_worst_pct == pytest.approx(-10.0)
    assert rows["oracle-heads"].oracle_share_median_pct == pytest.approx(100.0)
    assert rows["none"].cut_worst_pct == 0.0
    assert math.isnan(rows[PERTURBED].oracle_share_median_pct)
    assert rows[PERTURBED].cut_median_pct == pytest.approx(0.0)


def test_the_matrix_runs_the_every_head_oracle_and_its_shares_are_against_it():
    """The first-head ``oracle`` is a strategy like any other: its saving is a share of the
    every-head oracle's, and a matrix with the first-head one alone has no share."""
    assert ORACLE == "oracle-heads" and ORACLE in MATRIX_STRATEGIES and "oracle" not in MATRIX_STRATEGIES
    both = [outcome("none", 1, 100.0), outcome("oracle", 1, 100.0), outcome("oracle-heads", 1, 60.0),
            outcome("advisor", 1, 90.0)]
    rows = {r.strategy: r for r in summarise(both)}
    assert rows["advisor"].oracle_share_median_pct == pytest.approx(25.0)  # 10 of 40, not 10 of 0
    assert rows["oracle"].oracle_share_median_pct == pytest.approx(0.0)
    first_only = [o for o in both if o.strategy != "oracle-heads"]
    first_only[1].gpu_hours_waited_whole_node = 50.0
    rows = {r.strategy: r for r in summarise(first_only)}
    assert math.isnan(rows["advisor"].oracle_share_median_pct)


def test_a_seed_where_none_waited_nothing_has_no_cut_and_no_oracle_no_share():
    rows = {r.strategy: r for r in summarise([outcome("none", 1, 0.0), outcome("advisor", 1, 5.0),
                                              outcome(PERTURBED, 1, 0.0)])}
    assert rows["advisor"].seeds == 0
    assert math.isnan(rows["advisor"].cut_median_pct)
    assert math.isnan(rows["advisor"].noise_low_pct)
    rows = {r.strategy: r for r in summarise([outcome("none", 1, 10.0), outcome("advisor", 1, 5.0)])}
    assert rows["advisor"].cut_median_pct == pytest.approx(-50.0)
    assert math.isnan(rows["advisor"].oracle_share_median_pct)


def test_the_jittered_none_runs_the_same_jobs_and_differs_only_by_the_trajectory():
    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.25, load=1.5))
    matrix = Matrix((3,), (1.5,), 0.5, 0.25)
    outcomes = run_matrix(tiny_fleet(), SERIES, settings, runs(matrix, ["none"]))
    none, perturbed = outcomes
    assert (none.strategy, perturbed.strategy) == ("none", PERTURBED)
    assert none.gpu_hours_waited_whole_node > 0
    # the same offered work: within a few seconds' worth of the jobs at the window's edges
    assert abs(perturbed.jobs - none.jobs) <= 3
    row = {r.strategy: r for r in summarise(outcomes)}[PERTURBED]
    cut = 100 * (perturbed.gpu_hours_waited_whole_node - none.gpu_hours_waited_whole_node) \
        / none.gpu_hours_waited_whole_node
    assert row.noise_low_pct == pytest.approx(cut) and row.noise_high_pct == pytest.approx(cut)


def test_the_command_runs_a_small_matrix_and_writes_the_summary_and_the_picture(tmp_path, capsys):
    from exporter.cli import main

    argv = ["simulate", "--matrix", "--seeds", "5", "--load", "1.2", "--days", "0.25", "--warmup-days",
            "0.5", "--strategies", "consolidate", "--out", str(tmp_path)]
    assert main(argv) == 0
    with open(tmp_path / "outcomes.csv") as f:
        rows = list(csv.DictReader(f))
    # none is added: every cut is against it
    assert [(r["strategy"], r["seed"]) for r in rows] == [("none", "5"), ("consolidate", "5"),
                                                         (PERTURBED, "5")]
    with open(tmp_path / "summary.csv") as f:
        summary = {r["strategy"]: r for r in csv.DictReader(f)}
    assert set(summary) == {"none", "consolidate", PERTURBED}
    whole = {r["strategy"]: float(r["gpu_hours_waited_whole_node"]) for r in rows}
    if whole["none"] > 0:
        cut = 100 * (whole[PERTURBED] - whole["none"]) / whole["none"]
        assert float(summary["consolidate"]["noise_low_pct"]) == pytest.approx(cut, abs=0.01)
        assert float(summary["consolidate"]["cut_median_pct"]) == pytest.approx(
            100 * (whole["consolidate"] - whole["none"]) / whole["none"], abs=0.01)
    else:
        assert summary["consolidate"]["noise_low_pct"] == "nan"
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "noise band" in capsys.readouterr().out


def test_each_sample_carries_the_whole_node_waiting_so_far_split_by_why():
    from exporter.outcome_sim.picture import curves
    from exporter.outcome_sim.run import simulate

    settings = RunSettings(timeline=TimelineSettings(days=0.5, warmup_days=0.25, load=1.5))
    out = simulate(tiny_fleet(), SERIES, "none", 3, settings)
    frag = [s.whole_node_waited_fragmentation for s in out.samples]
    cap = [s.whole_node_waited_capacity for s in out.samples]
    assert frag == sorted(frag) and cap == sorted(cap)  # cumulative
    assert frag[0] == cap[0] == 0.0
    assert frag[-1] <= out.gpu_hours_waited_whole_node_fragmentation + 1e-9
    assert cap[-1] <= out.gpu_hours_waited_whole_node_capacity + 1e-9
    assert frag[-1] + cap[-1] > 0
    days, values = curves([out, out], "total")
    assert days[-1] == pytest.approx(out.samples[-1].at / 86400)
    assert list(values[0]) == pytest.approx([f + c for f, c in zip(frag, cap, strict=True)])


def test_bad_matrix_flags_are_one_line(tmp_path, capsys):
    from exporter.cli import main

    assert main(["simulate", "--matrix", "--load", "0", "--out", str(tmp_path)]) == 2
    assert "--load" in capsys.readouterr().err
    assert main(["simulate", "--matrix", "--days", "0", "--out", str(tmp_path)]) == 2
    assert "--days" in capsys.readouterr().err
