"""Issue 42 Build 3, look ahead: how many whole nodes a pool keeps free before a forecast
rise in its whole-node demand, which ones, and how far the forecast missed."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.advisor.lookahead import (
    LookaheadSettings,
    away_from,
    forecast_error,
    look_ahead,
    nodes_to_keep,
    reserve,
)

EIGHT = np.full(6, 8.0)


def bursty(days: int, end_hour: int) -> np.ndarray:
    """32 whole-node GPUs from hour 10 to 13 of each day, 0 otherwise, up to ``end_hour`` of the last day."""
    day = np.zeros(24)
    day[10:14] = 32.0
    return np.concatenate([np.tile(day, days), day[: end_hour + 1]])


def test_the_rise_in_whole_nodes_is_rounded_up_and_no_rise_keeps_none():
    assert nodes_to_keep(16.0, 26.0, 8) == 2
    assert nodes_to_keep(16.0, 24.0, 8) == 1
    assert nodes_to_keep(16.0, 24.0 + 1e-12, 8) == 1  # float noise is no extra node
    assert nodes_to_keep(24.0, 16.0, 8) == 0
    assert nodes_to_keep(0.0, 40.0, 0) == 0


def test_reserved_nodes_are_the_emptiest_whole_size_nodes_up_to_nearly_empty():
    count = np.array([8.0, 8.0, 8.0, 8.0, 4.0, 8.0])
    held = np.array([3.0, 0.0, 6.0, 1.0, 0.0, 0.0])
    assert reserve(count, held, 2) == (1, 5)  # both empty: the lower index first
    assert reserve(count, held, 4) == (1, 5, 3, 0)  # then by GPUs held; node 4 is not whole-size
    assert reserve(count, held, 9) == (1, 5, 3, 0)  # node 2 holds 6 of 8: over half, never reserved
    assert reserve(count, held, 9, nearly_empty=1.0) == (1, 5, 3, 0, 2)
    assert reserve(count, held, 0) == ()


def test_a_daily_burst_ahead_reserves_its_nodes_and_a_flat_demand_reserves_none():
    settings = LookaheadSettings(horizon_hours=6)
    held = np.array([0.0, 2.0, 0.0, 8.0, 1.0, 5.0])
    # the end of hour 6 on day 4: the burst of hours 10-13 is within the next 6 hours
    plan = look_ahead("H100", bursty(3, 6), EIGHT, held, settings)
    assert plan.whole_now_gpus == 0.0
    assert plan.whole_forecast_gpus == pytest.approx(32.0)
    assert plan.keep_free == 4
    assert plan.reserved == (0, 2, 4, 1)  # the free ones, then by GPUs held; 3 and 5 are over half full
    assert plan.free_now == 2
    assert plan.rise_gpus == pytest.approx(32.0)
    # in the burst: no further rise, nothing kept
    assert look_ahead("H100", bursty(3, 11), EIGHT, held, settings).keep_free == 0
    flat = look_ahead("H100", np.full(80, 16.0), EIGHT, held, settings)
    assert (flat.keep_free, flat.reserved) == (0, ())
    assert (flat.error.mae_gpus, flat.error.bias_gpus, flat.error.breach_share) == (0.0, 0.0, 0.0)
    assert flat.error.checked == 80 - 6


def test_the_keep_is_capped_at_the_pools_whole_size_nodes():
    plan = look_ahead("H100", bursty(3, 6), np.array([8.0, 8.0, 4.0]), np.zeros(3))
    assert plan.keep_free == 2
    assert plan.reserved == (0, 1)


def test_the_forecast_error_is_the_quotas_measure_with_a_breach_above_the_tolerance():
    settings = LookaheadSettings(horizon_hours=2)
    # no day of history: the forecast is the last hour, so each miss is the next two hours' rise
    series = np.array([0.0, 8.0, 8.0, 24.0, 0.0])
    err = forecast_error(series, settings, tolerance=8.0)
    # t=0: peak 8 vs 0; t=1: 24 vs 8; t=2: 24 vs 8 (trend 0, profile 0 before a day)
    assert err.checked == 3
    assert err.mae_gpus == pytest.approx((8 + 16 + 16) / 3)
    assert err.bias_gpus == pytest.approx((8 + 16 + 16) / 3)
    assert err.breach_share == pytest.approx(2 / 3)  # 16 above is more than a node, 8 is not
    assert forecast_error(np.array([1.0]), settings).checked == 0
    assert forecast_error(np.array([]), settings).mae_gpus is None


def test_a_small_jobs_rank_puts_reserved_nodes_after_all_others_and_keeps_its_order():
    rank = np.array([2, 0, 1, 2, 1], dtype=np.int8)
    out = away_from(rank, (1, 3), 5)
    assert out is not None
    assert list(out) == [2, 3, 1, 5, 1]
    assert max(out[[0, 2, 4]]) < min(out[[1, 3]])
    assert list(rank) == [2, 0, 1, 2, 1]  # the pod's own rank is not changed
    assert list(away_from(None, (2,), 4)) == [0, 0, 1, 0]
    assert away_from(rank, (), 5) is rank


@pytest.mark.parametrize("series, held, message", [
    ([1.0, -1.0], [0.0], "finite numbers >= 0"),
    ([1.0, float("nan")], [0.0], "finite numbers >= 0"),
    ([1.0], [9.0], "between 0 and each node's GPUs"),
])
def test_bad_input_is_a_one_line_error(series, held, message):
    with pytest.raises(ValueError, match=message):
        look_ahead("p", series, np.array([8.0]), np.array(held))
    with pytest.raises(ValueError, match="horizon_hours"):
        LookaheadSettings(horizon_hours=0)
