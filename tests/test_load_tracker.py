"""exporter/pool_load/tracker.py: per-pool demand, statistics, change points and the hint,
snapshot by snapshot."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from exporter.advisor.wire import scaling_json
from exporter.collect import Collector
from exporter.config import AnalysisConfig
from exporter.pool_load.stats import window_stats
from exporter.pool_load.tracker import LoadTracker, pool_samples
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, Node, Placement
from exporter.sources.sim.options import SimSource
from exporter.sources.sim.source import build as sim_source
from exporter.thresholds import ScalingSettings, ScalingTable
from tests.test_advisor_api import START
from tests.test_advisor_api import advisor_client as advisor_client  # the fixture, reused
from tests.test_openapi import _check

SETTINGS = ScalingSettings(min_nodes=1, max_nodes=8, hysteresis=2, cooldown_up_s=0, cooldown_down_s=0,
                           min_samples=1, dwell_s=0)


def hints(tracker: LoadTracker) -> list[dict]:
    """The tracker's hints as /v1/advice's ``scaling`` lists them."""
    return [scaling_json(a) for a in tracker.advice()]


def snapshot(t: float, busy: int, pending: int = 0, util: float = 0.5, nodes: int = 2) -> FleetSnapshot:
    """``nodes`` 8-GPU nodes in pool a; jobs hold the first ``busy`` GPUs; ``pending`` GPUs wait."""
    node_list = tuple(Node(f"n{i}", "H100", 64, "a", "hopper", 8) for i in range(nodes))
    gpus = tuple(Gpu(f"n{i}", g, f"u{i}-{g}", "H100", "a", utilization_ratio=util)
                 for i in range(nodes) for g in range(8))
    allocs = tuple(Allocation(f"j{k}", (Placement(f"n{k // 8}", (k % 8,), 1.0, 1.0),)) for k in range(busy))
    waiting = (JobRequest("w", pending, pool="a"),) if pending else ()
    return FleetSnapshot(t, node_list, gpus, allocs, waiting)


def test_pool_sample():
    s = pool_samples(snapshot(0, busy=12, pending=4, util=0.25))["a"]
    assert (s.capacity_gpus, s.allocated_gpus, s.pending_gpus, s.utilization, s.nodes, s.node_gpus) == \
        (16.0, 12.0, 4.0, 0.25, 2, 8)
    assert s.demand_ratio == 1.0


def test_statistics_change_and_hint_over_a_jump():
    tracker = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    ratios = []
    for t, busy in enumerate([4, 4, 4, 4, 16, 16]):
        snap = snapshot(60.0 * t, busy=busy, pending=8 if busy == 16 else 0)
        tracker.observe(snap)
        tracker.observe(snap)  # the analyzer may hand the same snapshot twice: counted once
        ratios.append((busy + (8 if busy == 16 else 0)) / 16)
    [advice] = tracker.advice()
    assert advice.demand == window_stats(ratios[-4:])
    assert advice.demand == window_stats([0.25, 0.25, 1.5, 1.5])
    assert advice.utilization == window_stats([0.5] * 4)
    # CUSUM learns 0.25 from 3 samples, then 1.5 is (1.5 - 0.25) / 0.15 sigmas above: up at t = 240
    assert advice.changes == {"up": 1, "down": 0}
    assert advice.last_change == 240.0
    # demand 24 GPUs twice above 0.8 of 16: ceil(24 / 6.4) = 4 nodes
    assert (advice.nodes, advice.recommended_nodes, advice.reason) == (2, 4, "up")
    families = {f.name: sorted(f.samples) for f in tracker.families()}
    assert families["gpufleet_pool_load_change_total"] == [
        ((("direction", "down"), ("pool", "a")), 0.0), ((("direction", "up"), ("pool", "a")), 1.0)]
    assert families["gpufleet_pool_load_last_change_timestamp_seconds"] == [((("pool", "a"),), 240.0)]
    assert families["gpufleet_pool_recommended_nodes"] == [((("pool", "a"),), 4.0)]
    assert [labels for labels, v in families["gpufleet_pool_scaling_reason"] if v == 1.0] == \
        [(("pool", "a"), ("reason", "up"))]


def test_the_hint_follows_a_fleet_that_changed_size():
    tracker = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    for t in range(2):
        tracker.observe(snapshot(t, busy=16, pending=8))
    assert tracker.advice()[0].recommended_nodes == 4
    tracker.observe(snapshot(2, busy=16, pending=8))  # nobody acted: the hint stays
    assert tracker.advice()[0].recommended_nodes == 4
    assert tracker.advice()[0].reason == "up"  # and so does its reason, beside scale_up
    tracker.observe(snapshot(3, busy=16, pending=0, nodes=3))  # someone added a node
    advice = tracker.advice()[0]
    assert (advice.nodes, advice.recommended_nodes) == (3, 3)


def test_no_last_change_before_one():
    tracker = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    tracker.observe(snapshot(0, busy=4))
    families = {f.name: list(f.samples) for f in tracker.families()}
    assert families["gpufleet_pool_load_last_change_timestamp_seconds"] == []


@pytest.mark.parametrize("window", [1, 60])
def test_window_bounds_the_samples(window):
    tracker = LoadTracker(window=window, table=ScalingTable(SETTINGS))
    for t in range(100):
        tracker.observe(snapshot(t, busy=t % 16))
    assert len(tracker.pools["a"].ratio) == window


def test_advice_json():
    tracker = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    for t in range(2):
        tracker.observe(snapshot(60.0 * t, busy=16, pending=8, util=0.75))
    assert hints(tracker) == [{
        "pool": "a", "nodes": 2, "recommended_nodes": 4, "action": "scale_up", "reason": "up",
        "demand_ratio": 1.5, "demand_ratio_stats": {"mean": 1.5, "stddev": 0.0, "p95": 1.5},
        "utilization_stats": {"mean": 0.75, "stddev": 0.0, "p95": 0.75}, "window_samples": 2,
        "changes": {"up": 0, "down": 0}, "last_change": None, "mode": "reactive",
        "forecast_peak_gpus": None, "utilization": 0.75, "memory_used_ratio": None, "idle": False}]


async def test_the_advice_of_a_served_exporter_has_the_hints(advisor_client):
    advice = json.loads(await _check(advisor_client, "GET", "/v1/advice", 200))
    by_pool = {entry["pool"]: entry for entry in advice["scaling"]}
    assert sorted(by_pool) == ["gpu-a100", "gpu-b200", "gpu-h100", "gpu-h200"]
    # issue 30: every pool holds at its size; the table names no autoscaled pool, so the
    # reference profile's 4-32 nodes bounds none of them (h100 has 64 nodes)
    assert {p: (e["nodes"], e["recommended_nodes"], e["reason"], e["action"])
            for p, e in by_pool.items()} == {
        "gpu-a100": (32, 32, "hold", "hold"), "gpu-b200": (8, 8, "hold", "hold"),
        "gpu-h100": (64, 64, "hold", "hold"), "gpu-h200": (32, 32, "hold", "hold")}


def daily(tracker: LoadTracker, days: int, until_hour: int = 24) -> None:
    """A snapshot every 30 min: 16 GPUs busy at 10:00-11:59 each day, 4 otherwise."""
    for day in range(days):
        for half in range(2 * (until_hour if day == days - 1 else 24)):
            hour = half // 2
            busy = 16 if hour in (10, 11) else 4
            tracker.observe(snapshot(86400.0 * day + 1800.0 * half, busy=busy))


def test_predictive_mode_pre_warms_before_the_daily_peak():
    settings = ScalingSettings(min_nodes=1, max_nodes=8, hysteresis=1, cooldown_up_s=0,
                               cooldown_down_s=0, startup_s=3600, min_samples=1, dwell_s=0)
    reactive = LoadTracker(window=4, table=ScalingTable(settings))
    predictive = LoadTracker(window=4, table=ScalingTable(settings, mode="predictive"))
    for tracker in (reactive, predictive):
        daily(tracker, days=3, until_hour=10)  # the third day up to 09:30
    [r], [p] = reactive.advice(), predictive.advice()
    # 4 GPUs on 2 nodes is below the band: down to 1 node, which the fleet never did
    assert (r.recommended_nodes, r.reason, r.forecast_peak) == (1, "down", None)
    # from 09:00 the last complete hour (08:00) read 4 GPUs, and the forecast covers 09:00 and
    # 10:00 (startup 1 h): the same hours moved +12 GPUs from 08:00 to 10:00 on both past days
    # (no trend: the daily means are equal), so the rule reads 4 + 12 = 16 GPUs and at 09:00
    # asks for ceil(16 / (8 * 0.8)) = 3 nodes, ready by 10:00; at 09:30 it holds them, and as
    # the fleet still has 2 nodes the reason stays the scale-up's (issue 30)
    assert (p.forecast_peak, p.recommended_nodes, p.reason) == (16.0, 3, "up")
    assert hints(predictive)[0]["forecast_peak_gpus"] == 16.0


def test_predictive_mode_is_reactive_before_a_day_of_history():
    predictive = LoadTracker(window=4, table=ScalingTable(SETTINGS, mode="predictive"))
    daily(predictive, days=1, until_hour=20)
    assert predictive.advice()[0].forecast_peak is None


def test_a_pool_the_fleet_no_longer_has_is_forgotten():
    tracker = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    tracker.observe(snapshot(0, busy=4))
    assert [a.pool for a in tracker.advice()] == ["a"]
    gone = dataclasses.replace(snapshot(1, busy=0), nodes=(), gpus=(), allocations=())
    tracker.observe(gone)
    assert tracker.advice() == [] and tracker.pools == {}
    tracker.observe(snapshot(2, busy=4))  # back: starts again
    assert [(a.pool, a.changes) for a in tracker.advice()] == [("a", {"up": 0, "down": 0})]


def test_the_default_fleet_inside_the_band_is_never_told_to_change_size():
    """Issue 30: an hour of the default simulated fleet, a snapshot a minute, through the
    load tracker ``serve`` wires (LoadTracker.from_table, the packaged table): a pool whose
    demand ratio is inside the band is recommended its current size at every snapshot."""
    clock = [START]
    collector = Collector([sim_source(SimSource(), lambda: clock[0])], 10, clock=lambda: clock[0])
    tracker = LoadTracker.from_table(AnalysisConfig().window_snapshots)
    assert tracker is not None
    settings = tracker.table.default
    inside = 0
    for minute in range(60):
        clock[0] = START + 60.0 * minute
        tracker.observe(asyncio.run(collector.collect()))
        for entry in hints(tracker):
            ratio = entry["demand_ratio"]
            if ratio is not None and settings.down <= ratio <= settings.up:
                inside += 1
                assert (entry["recommended_nodes"], entry["action"], entry["reason"]) == \
                    (entry["nodes"], "hold", "hold"), (minute, entry)
    assert inside >= 60 * 2  # the check saw in-band pools (h100 sits at 0.6-0.85)
    h100 = {e["pool"]: e for e in hints(tracker)}["gpu-h100"]
    assert h100["nodes"] == 64 and h100["recommended_nodes"] >= 64


def test_an_allocated_yet_idle_pool_is_not_scaled_up():
    tracker = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    for t in range(3):
        tracker.observe(snapshot(60.0 * t, busy=16, pending=8, util=0.05))
    [advice] = hints(tracker)
    assert (advice["nodes"], advice["recommended_nodes"], advice["reason"], advice["idle"]) == \
        (2, 2, "hold", True)
    assert advice["utilization"] == 0.05
    busy = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    for t in range(3):
        busy.observe(snapshot(60.0 * t, busy=16, pending=8, util=0.9))
    assert hints(busy)[0]["recommended_nodes"] == 4


def test_memory_pressure_scales_an_idle_looking_pool_up():
    tracker = LoadTracker(window=4, table=ScalingTable(SETTINGS))
    for t in range(2):
        snap = snapshot(60.0 * t, busy=16, pending=8, util=0.05)
        full = tuple(dataclasses.replace(g, memory_total_bytes=80, memory_used_bytes=76) for g in snap.gpus)
        tracker.observe(dataclasses.replace(snap, gpus=full))
    [advice] = hints(tracker)
    assert (advice["recommended_nodes"], advice["reason"], advice["idle"], advice["memory_used_ratio"]) == \
        (4, "up", False, 0.95)


def test_bounds_are_per_pool():
    bounded = ScalingSettings(min_nodes=1, max_nodes=3, hysteresis=1, cooldown_up_s=0, cooldown_down_s=0,
                              min_samples=1)
    table = ScalingTable(bounded, pools=(("a", bounded, False),))
    named, unnamed = LoadTracker(window=4, table=table), LoadTracker(window=4, table=ScalingTable(bounded))
    for tracker in (named, unnamed):
        tracker.observe(snapshot(0, busy=16, pending=16))  # 32 GPUs: ceil(32 / 6.4) = 5 nodes
    assert (named.advice()[0].recommended_nodes, named.advice()[0].reason) == (3, "max_nodes")
    assert (unnamed.advice()[0].recommended_nodes, unnamed.advice()[0].reason) == (5, "up")
