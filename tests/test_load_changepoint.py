"""exporter/pool_load/changepoint.py: the rolling-std and CUSUM detectors, alarm by alarm."""

from __future__ import annotations

import numpy as np

from exporter.pool_load.changepoint import Cusum, RollingStd, detect


def test_rolling_std_flags_each_crossing_once():
    values = np.array([0.5, 0.5, 0.5, 0.9, 0.9, 0.9, 0.4, 0.4])
    # window 2: std of (0.5, 0.9) is 0.2 > 0.07 at index 3; (0.9, 0.4) at index 6
    assert detect(RollingStd(), values) == [(3, "up"), (6, "down")]
    # a 6-sample window stays above its threshold from the jump until the window is past it
    assert detect(RollingStd(window=6, threshold=0.1), values) == [(5, "up")]


def test_cusum_learns_a_regime_then_alarms_on_a_shift():
    values = np.array([0.5, 0.5, 0.5, 0.55, 0.5, 1.0, 1.0, 1.0, 1.0, 0.2])
    # learns 0.5 (sigma floored at 0.15) from 3 samples; 0.55 is 0.33 sigma (under the 0.5 drift);
    # 1.0 is 3.33 sigmas: 2.83 > 1 alarms at 5; it then learns 1.0 from 5-7 and 0.2 alarms down at 9
    assert detect(Cusum(), values) == [(5, "up"), (9, "down")]


def test_cusum_accumulates_a_small_persistent_shift():
    values = np.array([0.5, 0.5, 0.5] + [0.64] * 4)
    # each 0.64 is 0.93 sigma: 0.43 per sample above the drift, so the sum passes 1 at the third
    assert detect(Cusum(), values) == [(5, "up")]


def test_nan_samples_are_skipped():
    assert detect(Cusum(), np.array([0.5, np.nan, 0.5, 0.5, 1.0])) == [(4, "up")]
