"""Issue 42 Build 3 in the loop: steer-pod+lookahead steers small jobs away from the
reserved nodes, never keeps one waiting for them, and reports its forecast's error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exporter.advisor.lookahead import LookaheadSettings
from exporter.outcome_sim.lookahead import Lookahead, figures, lookahead_strategy
from exporter.outcome_sim.run import make_strategy, simulate
from exporter.outcome_sim.sim import RunSettings
from tests.test_simulate import SERIES, SHORT, job, sim_of, tiny_fleet

LONG = 10 * 86400.0


def primed(nodes: int = 3) -> tuple[Lookahead, object]:
    """A lookahead strategy on ``nodes`` 8-GPU nodes that keeps one node free, after its first tick."""
    sim = sim_of(tiny_fleet(nodes=nodes))
    strategy = lookahead_strategy("steer-pod+lookahead", None)
    strategy.keep = {0: 1}
    strategy.tick(sim, 1.0)
    return strategy, sim


def test_a_small_job_goes_past_the_reserved_node_and_a_whole_node_job_takes_it():
    strategy, sim = primed()
    cluster, scheduler = sim.cluster, sim.scheduler
    big = job(1, 7, LONG)
    cluster.start(big, cluster.find(big), 0.0)  # node 0 holds 7 of 8: too full to reserve
    strategy.tick(sim, 100.0)
    assert strategy.reserved == (1,)  # nodes 1 and 2 are empty: the lower index
    small = job(2, 2, LONG, submit=100.0)
    scheduler.submit(small)
    scheduler.run_pass(100.0)
    assert [p.node for p in small.placements] == [2]  # node 1 is free, but reserved
    whole = job(3, 8, LONG, submit=100.0)
    scheduler.submit(whole)
    scheduler.run_pass(100.0)
    assert [p.node for p in whole.placements] == [1]


def test_a_small_job_takes_a_reserved_node_where_it_fits_nowhere_else():
    strategy, sim = primed(nodes=2)
    cluster, scheduler = sim.cluster, sim.scheduler
    big = job(1, 7, LONG)
    cluster.start(big, cluster.find(big), 0.0)
    strategy.tick(sim, 100.0)
    assert strategy.reserved == (1,)
    small = job(2, 2, LONG, submit=100.0)
    scheduler.submit(small)
    scheduler.run_pass(100.0)
    assert [p.node for p in small.placements] == [1]  # no job waits for a reservation


def test_without_a_forecast_rise_nothing_is_reserved_and_the_rank_is_steer_pods():
    sim = sim_of(tiny_fleet(nodes=3))
    strategy = lookahead_strategy("steer-pod+lookahead", None)
    strategy.tick(sim, 1.0)
    small = job(2, 2, LONG, submit=1.0)
    assert strategy.reserved == ()
    rank, pods = strategy.rank(small), strategy.pod.rank(small)
    assert rank is pods


def test_the_forecast_error_is_checked_against_the_hours_that_came():
    strategy = lookahead_strategy("steer-pod+lookahead", None)
    strategy.settings = LookaheadSettings(horizon_hours=2)
    strategy._capacity = np.array([80.0, 80.0])
    strategy.hourly = {0: [0.0, 8.0, 24.0, 24.0, 0.0], 1: [0.0, 0.0, 0.0, 0.0, 0.0]}
    # made at the end of hours 1 and 2 (pool 0) and 1 (pool 1); hour 3's has no 2 hours after it
    strategy.log = [(1, 0, 8.0, 8), (2, 0, 24.0, 8), (3, 0, 0.0, 8), (1, 1, 0.0, 8)]
    strategy.reserved_seconds = 3600.0 * 3
    out = figures(strategy, 3600.0, 4 * 3600.0)
    assert out.reserved_nodes == pytest.approx(1.0)
    # hour 1: pool 0's peak of hours 2-3 is 24 against 8 (16), pool 1's 0 against 0; hour 2: 24 against 24
    assert out.mae_pct == pytest.approx(100.0 * (16 + 0) / 2 / 160)
    assert out.breach_pct == pytest.approx(100.0 * 1 / 3)  # 16 above is more than a node


def test_the_strategies_are_registered_and_run_with_their_columns_filled():
    # 16 hours: forecasts made in the window whose 6 hours ended before the horizon
    settings = RunSettings(timeline=dataclasses.replace(SHORT.timeline, days=0.6))
    assert isinstance(make_strategy("steer-pod+lookahead", settings), Lookahead)
    with_advisor = make_strategy("steer-pod+lookahead+advisor", settings)
    assert isinstance(with_advisor, Lookahead) and with_advisor.pod.advisor is not None
    control = make_strategy("steer-pod+reserve", settings)
    assert isinstance(control, Lookahead) and control.fixed == 1
    fleet = tiny_fleet(nodes=6)
    out = simulate(fleet, SERIES, "steer-pod+lookahead", 3, settings)
    assert out.jobs_started > 0
    assert out.lookahead_reserved_nodes is not None and out.lookahead_reserved_nodes >= 0.0
    assert out.whole_forecast_mae_pct is not None and out.whole_forecast_mae_pct >= 0.0
    other = simulate(fleet, SERIES, "steer-pod", 3, settings)
    assert other.lookahead_reserved_nodes is None and other.whole_forecast_mae_pct is None


def test_the_control_keeps_a_node_free_per_pool_whatever_the_forecast():
    sim = sim_of(tiny_fleet(nodes=4, models=("H100", "A100")))
    control = make_strategy("steer-pod+reserve", RunSettings())
    forecast = make_strategy("steer-pod+lookahead", RunSettings())
    for strategy in (control, forecast):
        assert isinstance(strategy, Lookahead)
        strategy.tick(sim, 1.0)
        strategy.tick(sim, 3601.0)  # hour 0 closed: a flat (empty) history, no rise
        strategy.tick(sim, 3661.0)  # the next sample chooses the nodes
    assert isinstance(control, Lookahead) and isinstance(forecast, Lookahead)
    assert control.keep == {0: 1, 1: 1} and len(control.reserved) == 2
    assert forecast.keep == {0: 0, 1: 0} and forecast.reserved == ()


def test_the_hourly_whole_node_demand_is_what_whole_node_jobs_hold_and_ask_per_pool():
    # nodes 0 and 2 are H100, 1 and 3 A100: 16 GPUs a pool
    sim = sim_of(tiny_fleet(nodes=4, models=("H100", "A100")))
    strategy = lookahead_strategy("steer-pod+lookahead", None)
    cluster, scheduler = sim.cluster, sim.scheduler
    running = job(1, 8, LONG)
    cluster.start(running, cluster.find(running), 0.0)
    h100 = sim.cluster.placer.model_names.index("H100")
    assert sim.cluster.placer.model[running.placements[0].node] == h100  # bestfit: the first node
    small = job(2, 2, LONG)
    cluster.start(small, cluster.find(small), 0.0)  # a small job: not whole-node demand
    gang = job(3, 8, LONG, parts=2)  # two whole nodes of one model: none has two free, so it waits
    scheduler.submit(gang)
    scheduler.run_pass(0.0)
    assert gang.start is None and scheduler.queue.size == 1
    strategy.tick(sim, 1.0)
    strategy.tick(sim, 3601.0)  # hour 0 closed from its one sample
    held = {h100: 8.0, 1 - h100: 0.0}
    # the queued gang's 16 GPUs split over both pools by capacity (8 and 8)
    assert strategy.hourly == {m: [held[m] + 8.0] for m in (0, 1)}
    assert strategy.log == [(0, 0, pytest.approx(held[0] + 8.0), 8), (0, 1, pytest.approx(held[1] + 8.0), 8)]
