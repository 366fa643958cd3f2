"""Health verdicts (issue 31): each signal, and the hysteresis both ways."""

from __future__ import annotations

import inspect
import re
from dataclasses import replace

from exporter.health import verdict as verdict_module
from exporter.health.verdict import FAILING_SIGNALS, HealthSettings, HealthTracker, Verdict
from exporter.snapshot import Gpu, Node, XidCount
from tests.helpers.health import T0, gpu, snap

SETTINGS = HealthSettings(critical_xids=(48, 79), slowdown_reasons=("hw_thermal",))


def run(readings: list[tuple[float, Gpu]]) -> list[Verdict]:
    tracker = HealthTracker(SETTINGS)
    out = []
    for at, g in readings:
        node = tracker.observe(snap(T0 + at, g)).node(g.node)
        assert node is not None
        out.append(node.verdict)
    return out


def test_critical_xid_fails_at_once_and_clears_only_after_the_clean_window():
    clean = gpu()
    xid = gpu(xid_counts=(XidCount(79, 1),), last_xid=79, last_xid_time=T0 + 30)
    tracker = HealthTracker(SETTINGS)
    assert tracker.observe(snap(T0, clean)).nodes[0].verdict == Verdict.HEALTHY
    failing = tracker.observe(snap(T0 + 30, xid)).nodes[0]
    assert failing.verdict == Verdict.FAILING
    assert [r.text for r in failing.reasons] == ["XID 79 on GPU 0"]
    # the same count again: no new event, but the verdict holds through the clean window
    held = tracker.observe(snap(T0 + 30 + 899, xid)).nodes[0]
    assert held.verdict == Verdict.FAILING
    assert held.gpus[0].clean_since == T0 + 30 + 899
    assert [r.text for r in held.reasons] == ["XID 79 on GPU 0"]
    assert tracker.observe(snap(T0 + 30 + 899 + 899, xid)).nodes[0].verdict == Verdict.FAILING
    assert tracker.observe(snap(T0 + 30 + 899 + 900, xid)).nodes[0].verdict == Verdict.HEALTHY


def test_a_new_xid_during_the_clean_window_restarts_it():
    one = gpu(xid_counts=(XidCount(79, 1),), last_xid=79, last_xid_time=T0)
    two = gpu(xid_counts=(XidCount(79, 2),), last_xid=79, last_xid_time=T0 + 600)
    # the window runs from the first clean reading after the second XID (1200 s)
    verdicts = run([(0, gpu()), (0.5, one), (300, one), (600, two), (1200, two), (2099, two),
                    (2100, two)])
    assert verdicts == [Verdict.HEALTHY, Verdict.FAILING, Verdict.FAILING, Verdict.FAILING,
                        Verdict.FAILING, Verdict.FAILING, Verdict.HEALTHY]


def test_application_xids_and_old_xids_do_not_fail_a_gpu():
    app = gpu(xid_counts=(XidCount(13, 5),), last_xid=13, last_xid_time=T0)
    assert run([(0, gpu()), (30, app)]) == [Verdict.HEALTHY, Verdict.HEALTHY]
    # counted before the tracker started, an hour ago: not an event now
    old = gpu(xid_counts=(XidCount(79, 1),), last_xid=79, last_xid_time=T0 - 3600)
    assert run([(0, old), (30, old)]) == [Verdict.HEALTHY, Verdict.HEALTHY]
    recent = gpu(xid_counts=(XidCount(79, 1),), last_xid=79, last_xid_time=T0 - 60)
    assert run([(0, recent)]) == [Verdict.FAILING]


def test_dcgm_last_xid_without_a_time_is_an_event_when_it_changes():
    assert run([(0, gpu(last_xid=13)), (30, gpu(last_xid=48))]) == [Verdict.HEALTHY, Verdict.FAILING]


def test_uncorrectable_ecc_is_a_rise_of_the_counter_not_its_value():
    assert run([(0, gpu(ecc_double_bit_volatile=2)), (30, gpu(ecc_double_bit_volatile=2))]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY]
    assert run([(0, gpu(ecc_double_bit_volatile=2)), (30, gpu(ecc_double_bit_volatile=3))]) == \
        [Verdict.HEALTHY, Verdict.FAILING]
    # a reset counter (driver reload) is not an error
    assert run([(0, gpu(ecc_double_bit_volatile=2)), (30, gpu(ecc_double_bit_volatile=0))]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY]


def test_row_remap_failure_fails_and_pending_degrades_after_its_time():
    assert run([(0, gpu(remapped_rows_failure=True))]) == [Verdict.FAILING]
    pending = gpu(remapped_rows_pending=True)
    assert run([(0, pending), (899, pending), (900, pending)]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY, Verdict.DEGRADED]


def test_lost_gpu_fails_after_lost_for_and_one_failed_read_does_not():
    lost = replace(gpu(), up=False)
    assert run([(0, gpu()), (30, lost), (329, lost), (330, lost)]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY, Verdict.HEALTHY, Verdict.FAILING]
    assert run([(0, gpu()), (30, lost), (60, gpu())]) == [Verdict.HEALTHY] * 3


def test_link_error_rates_degrade():
    assert run([(0, gpu(nvlink_replay_errors=10)), (30, gpu(nvlink_replay_errors=11))]) == \
        [Verdict.HEALTHY, Verdict.DEGRADED]
    # CRC errors: 100 a second is the limit; 99/s is not over it, 101/s is
    assert run([(0, gpu(nvlink_crc_flit_errors=0)), (10, gpu(nvlink_crc_flit_errors=990))]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY]
    assert run([(0, gpu(nvlink_crc_flit_errors=0)), (10, gpu(nvlink_crc_flit_errors=1010))]) == \
        [Verdict.HEALTHY, Verdict.DEGRADED]
    # 8 PCIe replays a minute is the limit
    assert run([(0, gpu(pcie_replay_errors=0)), (60, gpu(pcie_replay_errors=8))]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY]
    assert run([(0, gpu(pcie_replay_errors=0)), (60, gpu(pcie_replay_errors=9))]) == \
        [Verdict.HEALTHY, Verdict.DEGRADED]


def test_thermal_slowdown_degrades_only_when_it_holds():
    hot = gpu(clock_event_reasons=0x40)
    power_cap = gpu(clock_event_reasons=0x04)  # sw_power_cap is not a slowdown here
    assert run([(0, hot), (299, hot), (300, hot)]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY, Verdict.DEGRADED]
    assert run([(0, hot), (200, gpu()), (400, hot), (600, hot)]) == [Verdict.HEALTHY] * 4
    assert run([(0, power_cap), (600, power_cap)]) == [Verdict.HEALTHY] * 2


def test_stale_readings_are_unknown_and_hold_a_failing_verdict():
    stale = replace(gpu(), stale=True)
    assert run([(0, gpu()), (30, stale), (330, stale), (360, gpu())]) == \
        [Verdict.HEALTHY, Verdict.HEALTHY, Verdict.UNKNOWN, Verdict.UNKNOWN]
    xid = gpu(xid_counts=(XidCount(79, 1),), last_xid=79, last_xid_time=T0 + 30)
    stale_xid = replace(xid, stale=True)
    # blind for an hour: still failing; the clean window starts with fresh readings
    verdicts = run([(0, gpu()), (30, xid), (600, stale_xid), (4000, stale_xid), (4030, xid),
                    (4929, xid), (4930, xid)])
    assert verdicts == [Verdict.HEALTHY] + [Verdict.FAILING] * 5 + [Verdict.HEALTHY]


def test_node_is_its_worst_gpu_and_a_node_without_readings_is_unknown():
    tracker = HealthTracker(SETTINGS)
    snapshot = snap(T0, gpu(index=0), gpu(index=1, remapped_rows_failure=True),
                    replace(gpu(index=2), stale=True))
    snapshot = replace(snapshot, nodes=(*snapshot.nodes, Node("empty", "h100", 64, "p", "hopper", 8)))
    health = tracker.observe(snapshot)
    n1, empty = health.node("n1"), health.node("empty")
    assert n1 is not None and empty is not None
    assert n1.verdict == Verdict.FAILING
    assert [(r.gpu, r.text) for r in n1.reasons] == [(1, "row remap failed on GPU 1")]
    assert empty.verdict == Verdict.UNKNOWN
    assert health.gpu_counts() == {Verdict.HEALTHY: 2, Verdict.UNKNOWN: 0, Verdict.DEGRADED: 0,
                                   Verdict.FAILING: 1}
    assert [(t.node, t.gpu, t.after) for t in health.transitions if t.gpu is None] == \
        [("empty", None, Verdict.UNKNOWN), ("n1", None, Verdict.FAILING)]


def test_default_settings_read_the_threshold_table():
    settings = HealthSettings()
    assert 79 in settings.critical_xids and 13 not in settings.critical_xids
    assert settings.slowdown_mask() == 0x08 | 0x20 | 0x40 | 0x80


def test_a_gpu_whose_health_is_not_read_is_unknown_not_healthy():
    unread = Gpu("n1", 0, "GPU-n1-0", "h100", "p")  # an allocation source alone: no counters
    tracker = HealthTracker(SETTINGS)
    node = tracker.observe(snap(T0, unread)).nodes[0]
    assert (node.verdict, [r.text for r in node.reasons]) == (Verdict.UNKNOWN, ["GPU 0 health not read"])


def test_an_unchanged_healthy_gpu_is_not_read_again_and_any_change_is(monkeypatch):
    """The tracker's fast path (108,800 GPUs a snapshot): a healthy GPU whose signal fields
    did not change keeps its verdict without its signals being read; a counter that rises,
    a slowdown or a lost GPU goes through them."""
    from exporter.health import verdict

    calls: list[float] = []
    real = verdict._signals
    monkeypatch.setattr(verdict, "_signals", lambda g, state, now, *rest: calls.append(now)
                        or real(g, state, now, *rest))
    tracker = HealthTracker(SETTINGS)
    quiet = gpu("n1", 0, ecc_double_bit_volatile=0, ecc_single_bit_volatile=1)
    for at in (0, 30, 60, 1000):
        tracker.observe(snap(T0 + at, replace(quiet, health=replace(
            quiet.health, ecc_single_bit_volatile=int(at)))))  # a corrected error is no signal
    assert calls == [T0]
    node = tracker.observe(snap(T0 + 1030, quiet)).node("n1")
    assert node is not None and node.settled and node.verdict == Verdict.HEALTHY
    failing = tracker.observe(snap(T0 + 1060, gpu("n1", 0, ecc_double_bit_volatile=1))).node("n1")
    assert failing is not None and failing.verdict == Verdict.FAILING
    assert calls == [T0, T0 + 1060]
    hot = gpu("n1", 1, clock_event_reasons=0x40)
    tracker.observe(snap(T0 + 1090, hot))
    tracker.observe(snap(T0 + 1120, hot))
    assert calls[-2:] == [T0 + 1090, T0 + 1120]  # a slowdown is read every time (its `for`)


def test_failing_signals_are_exactly_those_that_raise_a_failing_verdict():
    """FAILING_SIGNALS are the causes gpufleet_health_faults_total is exported for at 0 from
    the first collection: every signal the tracker raises at the failing level, no other."""
    source = inspect.getsource(verdict_module._signals)
    raised = set(re.findall(r'_Signal\("(\w+)", Verdict\.FAILING', source))
    assert raised == set(FAILING_SIGNALS) == {"xid", "ecc", "remap_failure", "gpu_lost"}
