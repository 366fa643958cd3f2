"""The spot quota (issue 43, Build 3): from the forecast of high-priority demand per pool, how many
GPUs spot jobs may hold, with the forecast's error beside it; and ``gpufleet simulate
--spot-quota advisor`` holding spot jobs beyond it out of the queue."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.outcome_sim.outcomes import COLUMNS
from exporter.outcome_sim.preemption import SpotGate, quota_figures
from exporter.outcome_sim.run import RunSettings, simulate
from exporter.outcome_sim.timeline import TimelineSettings
from exporter.preemption.quota import QuotaSettings, peaks_ahead, spot_quota
from tests.test_simulate_preemption import SERIES, TINY, cluster_of, fleet_of, job

HOUR = 3600.0


def test_a_flat_demand_leaves_spot_jobs_the_rest_of_the_pool():
    q = spot_quota("H100", 64.0, [40.0] * 30)
    assert q.high_forecast_gpus == 40.0 and q.margin_gpus == 0.0
    assert q.quota_gpus == 24.0
    assert q.forecasts_checked == 30 - 6 and q.error_mae_gpus == 0.0
    assert q.error_mae_pct == 0.0


def test_the_daily_profile_keeps_the_quota_low_before_the_daily_peak():
    # three days: 10 GPUs, but 50 from 10:00 to 13:00; the quota is set at 07:00 on day 4
    day = [50.0 if 10 <= h < 13 else 10.0 for h in range(24)]
    history = day * 3 + day[:8]  # the last complete hour is 07:00
    q = spot_quota("H100", 64.0, history)
    # the peak at 10:00 is 3 hours ahead, inside the 6-hour horizon: the forecast sees it
    assert q.high_now_gpus == 10.0
    assert q.high_forecast_gpus == pytest.approx(50.0)
    assert q.quota_gpus == pytest.approx(14.0 - q.margin_gpus)
    assert q.quota_gpus < 64.0 - 10.0 - 30.0


def test_the_margin_is_the_forecasts_past_miss_at_the_quantile():
    # a level that steps up by 10 every 5 hours: the forecast (under a day of history: no
    # profile, no trend) misses each step it does not see coming, 4 forecasts of 5
    history = np.repeat(np.arange(4) * 10.0, 5)
    q = spot_quota("H100", 100.0, history, QuotaSettings(horizon_hours=4, quantile=0.9))
    came = peaks_ahead(history, 4)
    assert len(came) == len(history) - 4 == q.forecasts_checked
    assert q.margin_gpus == pytest.approx(10.0)
    assert q.quota_gpus == pytest.approx(100.0 - 30.0 - 10.0)
    assert q.error_bias_gpus is not None and q.error_bias_gpus > 0  # the forecast ran low


def test_a_pool_over_subscribed_by_high_priority_jobs_has_no_quota_and_hostile_input_is_refused():
    assert spot_quota("H800", 16.0, [30.0] * 10).quota_gpus == 0.0
    assert spot_quota("H800", 16.0, []).quota_gpus == 16.0
    with pytest.raises(ValueError, match="finite"):
        spot_quota("H800", 16.0, [1.0, float("nan")])
    with pytest.raises(ValueError, match="capacity"):
        spot_quota("H800", -1.0, [1.0])
    with pytest.raises(ValueError, match="horizon"):
        QuotaSettings(horizon_hours=0)


def test_demand_beyond_the_pool_is_capped_so_a_drained_queue_gives_spot_jobs_the_room_back():
    # 20 hours of a high-priority queue growing past the pool's 100 GPUs, then 10 hours at 50
    history = [100.0 + 10.0 * h for h in range(20)] + [50.0] * 10
    q = spot_quota("A10", 100.0, history)
    # capped, the queue's hours read as a full pool: no forecast missed a rise, so no margin
    assert q.high_now_gpus == 50.0 and q.high_forecast_gpus == pytest.approx(50.0)
    assert q.margin_gpus == 0.0 and q.quota_gpus == pytest.approx(50.0)
    # counted whole, the same history forecasts 110 GPUs with a 60-GPU margin: no quota at all
    whole = spot_quota("A10", 1e6, history)
    assert whole.high_forecast_gpus == pytest.approx(110.0) and whole.margin_gpus == pytest.approx(60.0)
    assert max(0.0, 100.0 - whole.high_forecast_gpus - whole.margin_gpus) == 0.0
    # a pool whose high-priority demand stays over its GPUs still has none
    assert spot_quota("A10", 100.0, [150.0] * 30).quota_gpus == 0.0


def test_a_queued_high_priority_gang_is_not_demand_the_quota_protects():
    cluster, scheduler = cluster_of([("H100", 8), ("H100", 8)])  # 16 GPUs
    gate = SpotGate()
    scheduler.submit(job(1, 8, True, submit=0.0))
    scheduler.run_pass(0.0)
    gang = job(2, 8, True, submit=0.0, parts=2)  # two whole nodes: one is free, so it waits
    scheduler.submit(gang)
    assert gang not in scheduler.run_pass(0.0) and scheduler.queue.size == 1
    for t in range(0, 3600, 300):
        gate.release(cluster, scheduler, float(t))
    gate.release(cluster, scheduler, HOUR)
    # the running 8 GPUs are the demand; counted, the gang's 16 would fill the pool: quota 0
    assert gate.hourly[0] == [pytest.approx(8.0)]
    assert gate.quota_of(0) == pytest.approx(8.0)


def test_the_gate_holds_spot_jobs_beyond_the_quota_and_admits_them_as_room_comes_back():
    cluster, scheduler = cluster_of([("H100", 8), ("H100", 8)])  # 16 GPUs
    gate = SpotGate()
    high = job(1, 8, True, submit=0.0)
    run = scheduler.submit
    run(high)
    scheduler.run_pass(0.0)
    assert gate.release(cluster, scheduler, 0.0) == []
    assert not gate.hold(job(9, 1))  # no quota before the first complete hour: admitted
    # an hour of 8 high-priority GPUs: the quota is 16 - 8 = 8
    for t in range(0, 3600, 300):
        gate.release(cluster, scheduler, float(t))
    gate.release(cluster, scheduler, HOUR)
    assert gate.quota_of(0) == pytest.approx(8.0)
    spot = [job(10 + i, 4, submit=HOUR, work=600.0 if i == 0 else 1e7) for i in range(3)]
    assert all(gate.hold(j) for j in spot)
    assert not gate.hold(job(20, 8, True, submit=HOUR))  # a high-priority job never waits here
    admitted = gate.release(cluster, scheduler, HOUR + 1)
    assert admitted == spot[:2] and gate.held == [spot[2]]
    started = scheduler.run_pass(HOUR + 1)
    assert spot[0] in started and spot[1] in started
    # the first spot job ends: its 4 GPUs are the quota's again, the third is admitted
    for j in cluster.due(HOUR + 1 + 600):
        cluster.stop(j)
    assert gate.release(cluster, scheduler, HOUR + 700) == [spot[2]]
    assert gate.held == []


def test_a_run_with_the_quota_reports_it_and_its_forecast_error():
    settings = RunSettings(TimelineSettings(days=1.0, warmup_days=0.25, load=1.2), demand="openb",
                           preemption="kube", spot_quota="advisor")
    row = simulate(fleet_of(TINY), SERIES, "none", 1, settings).row()
    plain = simulate(fleet_of(TINY), SERIES, "none", 1,
                     RunSettings(TimelineSettings(days=1.0, warmup_days=0.25, load=1.2), demand="openb",
                                 preemption="kube")).row()
    assert set(COLUMNS) >= {"spot_quota", "spot_quota_pct", "high_forecast_mae_pct",
                            "high_forecast_breach_pct"}
    assert row["spot_quota"] == "advisor" and plain["spot_quota"] == "none"
    assert 0.0 <= row["spot_quota_pct"] < 100.0 and plain["spot_quota_pct"] == 100.0
    assert row["high_forecast_mae_pct"] is not None and row["high_forecast_mae_pct"] >= 0
    assert plain["high_forecast_mae_pct"] is None
    # the quota keeps spot jobs out: fewer of them are preempted, and they wait longer to start
    assert row["preemptions"] < plain["preemptions"]
    assert row["wait_p50_s_spot"] >= plain["wait_p50_s_spot"]


def test_no_gate_no_figures():
    figures = quota_figures(None, 0.0)
    assert (figures.quota_pct, figures.forecast_mae_pct, figures.breach_pct) == (100.0, None, None)


def test_the_cli_refuses_an_unknown_quota(tmp_path):
    from exporter.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["simulate", "--out", str(tmp_path / "x"), "--spot-quota", "sometimes"])
    assert refused.value.code == 2
