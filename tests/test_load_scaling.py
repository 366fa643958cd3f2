"""exporter/pool_load/scaling.py: the 0.8/0.3 rule with hysteresis, cooldown and bounds."""

from __future__ import annotations

import pytest

from exporter.pool_load.scaling import Hint, Scaler
from exporter.thresholds import ScalingSettings

H = 3600.0


def settings(**kw) -> ScalingSettings:
    base = dict(min_nodes=4, max_nodes=32, node_gpus=8, hysteresis=2, cooldown_up_s=H,
                cooldown_down_s=3 * H, min_samples=1, dwell_s=0)
    base.update(kw)
    return ScalingSettings(**base)


def test_scales_up_after_two_samples_above_and_sizes_to_the_target():
    s = Scaler(settings(), 10)  # 80 GPUs
    assert s.step(0, 70) == Hint(10, "hold", 0.875, False)  # one sample above 0.8: wait
    # 90 GPUs / (8 * 0.8) = 14.06 -> 15 nodes
    assert s.step(H, 90) == Hint(15, "up", 1.125, True)
    assert s.step(2 * H, 90) == Hint(15, "hold", 0.75, False)


def test_hysteresis_resets_inside_the_band():
    s = Scaler(settings(), 10)
    s.step(0, 70)
    s.step(H, 50)  # back in the band
    assert s.step(2 * H, 70).nodes == 10


def test_scale_down_waits_for_the_cooldown_and_stops_at_min_nodes():
    s = Scaler(settings(), 10)
    s.step(0, 70)
    assert s.step(H, 70).reason == "up"  # 70 / 6.4 -> 11 nodes, at 1 h
    s.step(2 * H, 1)
    assert s.step(3 * H, 1).nodes == 11  # two samples below 0.3, but 2 h since the scale-up
    assert s.step(4 * H, 1) == Hint(4, "min_nodes", 1 / 88, True)
    assert s.step(5 * H, 0) == Hint(4, "min_nodes", 0.0, False)


def test_max_nodes_caps_and_says_so():
    s = Scaler(settings(), 30)
    s.step(0, 1000)
    assert s.step(H, 1000) == Hint(32, "max_nodes", 1000 / 240, True)
    assert s.step(2 * H, 1000).reason == "max_nodes"
    assert s.step(3 * H, 200).reason == "hold"


def test_up_cooldown():
    """cooldown_up holds back a scale-up after a scale-down (issue 44: not after a scale-up)."""
    s = Scaler(settings(hysteresis=1, cooldown_down_s=0), 10)
    assert s.step(0, 10).nodes == 4  # 10 / 80 < 0.3: down to ceil(10 / 6.4) = 2, min_nodes 4
    assert s.step(0.5 * H, 200).nodes == 4  # 30 min after the last scale-down
    assert s.step(H, 200).nodes == 32


def test_a_size_outside_the_bounds_holds_inside_the_band():
    """Issue 30: the bounds clamp only a size the rule chose, never the current one."""
    s = Scaler(settings(), 64)  # 512 GPUs, above max_nodes 32
    assert s.nodes == 64
    assert s.step(0, 400) == Hint(64, "hold", 400 / 512, False)
    assert s.step(H, 400) == Hint(64, "hold", 400 / 512, False)
    above = Scaler(settings(), 64)
    above.step(0, 500)
    assert above.step(H, 500) == Hint(64, "max_nodes", 500 / 512, False)  # no halving
    below = Scaler(settings(), 2)  # under min_nodes 4, in the band
    assert below.step(0, 8) == Hint(2, "hold", 0.5, False)
    below.step(H, 1)
    assert below.step(4 * H, 1) == Hint(2, "min_nodes", 1 / 16, False)


def test_the_rule_chose_down_then_the_bound_clamps_it():
    s = Scaler(settings(cooldown_down_s=0), 64)
    s.step(0, 100)  # 100 / 512 < 0.3: the rule wants ceil(100 / 6.4) = 16 nodes
    assert s.step(H, 100) == Hint(16, "down", 100 / 512, True)
    big = Scaler(settings(cooldown_down_s=0), 128)
    big.step(0, 300)  # 300 / 1024: the rule wants 47 nodes, the bound caps it at 32
    assert big.step(H, 300) == Hint(32, "max_nodes", 300 / 1024, True)


def test_an_idle_pool_above_the_band_holds():
    s = Scaler(settings(hysteresis=1, cooldown_up_s=0), 10)
    assert s.step(0, 90, utilization=0.1, memory_used=0.2) == Hint(10, "hold", 1.125, False, True)
    assert s.step(1, 90, utilization=0.1, memory_used=0.9).reason == "up"  # memory-bound: busy
    t = Scaler(settings(hysteresis=1, cooldown_up_s=0), 10)
    assert t.step(0, 90, utilization=None).reason == "up"  # not read: demand decides
    u = Scaler(settings(hysteresis=1, cooldown_up_s=0), 10)
    assert u.step(0, 90, utilization=0.5).reason == "up"


def test_no_max_nodes():
    s = Scaler(settings(max_nodes=None, hysteresis=1), 30)
    assert s.step(0, 1000) == Hint(157, "up", 1000 / 240, True)


@pytest.mark.parametrize("kw, message", [
    (dict(up=0.3, down=0.8), "down < up"),
    (dict(target=0.0), "target"),
    (dict(min_nodes=5, max_nodes=4), "min_nodes <= max_nodes"),
    (dict(node_gpus=0), "at least 1"),
])
def test_bad_settings(kw, message):
    with pytest.raises(ValueError, match=message):
        settings(**kw)


def test_nodes_for_ignores_float_noise():
    assert settings(node_gpus=10).nodes_for(8.0) == 1  # 8 / (10 * 0.8) is 1.0000000000000002
