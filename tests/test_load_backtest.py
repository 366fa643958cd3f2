"""exporter/pool_load/backtest.py and forecast.py: the policies hour by hour, and the forecast's
past-only reads."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.pool_load.backtest import run_scaler, static
from exporter.pool_load.forecast import forecast_matrix
from exporter.thresholds import ScalingSettings


def test_static_counts_unmet_idle_and_provisioned():
    run = static(np.array([5.0, 12.0, 10.0]), 10)
    assert (run.unmet_gpu_hours, run.idle_gpu_hours, run.provisioned_gpu_hours) == (2.0, 5.0, 30.0)


def test_added_nodes_serve_after_the_startup_and_removals_at_once():
    s = ScalingSettings(min_nodes=1, max_nodes=10, node_gpus=1, hysteresis=1, target=0.8,
                        cooldown_up_s=0, cooldown_down_s=0, startup_s=3600)
    demand = np.array([4.0, 8.0, 8.0, 8.0, 1.0, 1.0])
    run = run_scaler("reactive", demand, demand, s, 5)
    # end of hour 1: 8 > 0.8 * 5 -> 10 nodes, committed from hour 2, ready from hour 3 (1 h startup)
    # end of hour 4: 1 < 0.3 * 10 -> ceil(1 / 0.8) = 2 nodes from hour 5
    assert run.committed.tolist() == [5, 5, 10, 10, 10, 2]
    assert run.ready.tolist() == [5, 5, 5, 10, 10, 2]
    assert run.unmet_gpu_hours == 3 + 3
    assert run.idle_gpu_hours == 1 + 2 + 9 + 1
    assert run.actions == 2


def test_a_scale_down_cancels_boots_first():
    s = ScalingSettings(min_nodes=1, max_nodes=100, node_gpus=1, hysteresis=1, target=0.8,
                        cooldown_up_s=0, cooldown_down_s=0, startup_s=3 * 3600)
    demand = np.array([40.0, 0.0, 0.0, 0.0, 0.0])
    run = run_scaler("reactive", demand, demand, s, 10)
    # 50 nodes ordered at the end of hour 0 (ready at 4), cancelled at the end of hour 1
    assert run.committed.tolist() == [10, 50, 1, 1, 1]
    assert run.ready.tolist() == [10, 10, 1, 1, 1]


def test_forecast_reads_the_daily_profile_and_only_the_past():
    hours = np.arange(24 * 4)
    demand = np.where(hours % 24 == 10, 100.0, 10.0)  # a peak at 10:00 every day
    f = forecast_matrix(demand, horizon=2, days=7, trend_weight=0.0)
    # at 09:00 on day 2 the profile says +90 in one hour, +0 in two
    assert f[24 + 9].tolist() == [100.0, 10.0]
    assert f[9].tolist() == [10.0, 10.0]  # no day of history yet: the level only
    # changing the future does not change a forecast
    changed = demand.copy()
    changed[24 * 3:] = 999.0
    assert np.array_equal(forecast_matrix(changed, 2, 7, 0.0)[: 24 * 3], f[: 24 * 3])


def test_forecast_horizon_bounds():
    with pytest.raises(ValueError, match="horizon"):
        forecast_matrix(np.zeros(5), 25)


def test_hourly_history_keeps_means_and_fills_gaps():
    from exporter.pool_load.forecast import HourlyHistory

    h = HourlyHistory(days=1)
    h.add(0, 2.0)
    h.add(1800, 4.0)  # hour 0: mean 3
    h.add(3 * 3600, 10.0)  # hours 1 and 2 missing: 3 repeated
    assert list(h.hours) == [3.0, 3.0, 3.0]
    assert h.rise(1) is None  # less than a day
    h.add(2 * 3600, 1.0)  # the clock went back
    assert list(h.hours) == []
    for hour in range(3, 60):
        h.add(hour * 3600.0, float(hour % 24))
    assert len(h.hours) == 25  # one day and the hour before it kept
    # at the end of hour 58 (10:00), a day ago 10:00 -> 11:00 rose by 1
    assert h.rise(1, trend_weight=0.0) == 1.0
