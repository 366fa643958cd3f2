"""Issue 45: NVLink utilisation is the exporter's gauge (exporter/cycle/nvlink.py), the rate of
the two byte counters over the last 5 min of collections over the capacity, so that no
recording rule computes two rates over every GPU's series each interval."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from exporter.config import load
from exporter.cycle import BLIND_SAFE, run_cycle
from exporter.cycle.nvlink import NvlinkStage, NvlinkWindows
from exporter.exposition import render_text
from exporter.snapshot import FleetSnapshot, Gpu, Node

H200 = 900e9  # bytes per second, both directions together (the catalogue's H200)
T0 = 1_760_000_000.0


def _gpu(tx: float | None, rx: float | None, index: int = 3, **kw) -> Gpu:
    return Gpu("gpu-001", index, kw.pop("uuid", f"GPU-0001-{index}"), "H200", "gpu-h200",
               nvlink_transmit_bytes=tx, nvlink_receive_bytes=rx,
               nvlink_capacity_bytes_per_second=kw.pop("capacity", H200), **kw)


def _snap(at: float, *gpus: Gpu) -> FleetSnapshot:
    return FleetSnapshot(at, (Node("gpu-001", "H200", 64, "gpu-h200", "hopper", 8),), gpus)


def _values(windows: NvlinkWindows, at: float, *gpus: Gpu, whole: bool = True) -> dict[str, float]:
    return {dict(labels)["gpu"]: value for labels, value in windows.observe(_snap(at, *gpus), whole)}


def test_two_collections_10_s_apart_give_the_known_ratio():
    windows = NvlinkWindows()
    # a first reading: no rate yet, no sample (not a 0)
    assert _values(windows, T0, _gpu(1e12, 2e12)) == {}
    # 0.9e12 bytes each way in 10 s: 1.8e11 B/s of 9e11, 20%
    assert _values(windows, T0 + 10, _gpu(1.9e12, 2.9e12)) == {"3": pytest.approx(0.2, rel=1e-12)}
    # the rate runs from the oldest reading of the window: 0.9e12 + 2.7e12 more by 30 s is
    # (3.6e12 + 3.6e12) / 30 s of 9e11, not the last 20 s alone
    assert _values(windows, T0 + 30, _gpu(4.6e12, 5.6e12)) == {
        "3": pytest.approx((3.6e12 + 3.6e12) / 30 / H200, rel=1e-12)}


def test_the_window_is_the_rules_5_min_and_holds_a_reading_every_30_s():
    windows = NvlinkWindows()
    rate = 0.5 * H200 / 2  # bytes a second each way: 50% of the capacity
    for t in range(0, 601, 5):
        values = _values(windows, T0 + t, _gpu(rate * t, rate * t))
    assert values == {"3": pytest.approx(0.5, rel=1e-12)}
    kept = windows.windows[("gpu-001", 3)].readings()
    # ten readings at most, 30 s apart, none older than 5 min
    assert [at - T0 for at, _, _ in kept] == [330.0, 360.0, 390.0, 420.0, 450.0, 480.0, 510.0, 540.0,
                                         570.0, 600.0]
    # traffic that stopped 4 min ago is still in the window: a 5 min rate, not the last 5 s
    windows = NvlinkWindows()
    for t in range(0, 301, 5):
        tx = rate * min(t, 60)
        values = _values(windows, T0 + t, _gpu(tx, tx))
    # from the reading at 30 s (the oldest kept inside the 5 min) to 300 s: 30 s of traffic
    assert values == {"3": pytest.approx(0.5 * 30 / 270, rel=1e-12)}


def test_a_counter_reset_gives_no_sample_then_a_rate_from_the_new_counts():
    windows = NvlinkWindows()
    _values(windows, T0, _gpu(5e12, 5e12))
    assert _values(windows, T0 + 10, _gpu(6e12, 6e12)) == {"3": pytest.approx(2e12 / 10 / H200)}
    # a driver reload zeroed one counter: no sample (the rule's rate would not read a negative)
    assert _values(windows, T0 + 20, _gpu(7e12, 1e9)) == {}
    assert _values(windows, T0 + 30, _gpu(7e12 + 9e11, 1e9 + 9e11)) == {
        "3": pytest.approx(1.8e12 / 10 / H200, rel=1e-12)}


@pytest.mark.parametrize("later", [
    _gpu(2e12, 2e12, uuid="GPU-replaced"),  # another GPU at the same place
    _gpu(2e12, 2e12, stale=True),  # the last good values served again
    _gpu(None, None, up=False),  # lost
    _gpu(2e12, None),  # one counter unreadable
])
def test_no_sample_where_the_reading_is_not_a_continuation(later: Gpu):
    windows = NvlinkWindows()
    _values(windows, T0, _gpu(1e12, 1e12))
    assert _values(windows, T0 + 10, later) == {}


def test_a_stale_reading_is_skipped_and_the_rate_spans_the_gap():
    windows = NvlinkWindows()
    _values(windows, T0, _gpu(0.0, 0.0))
    assert _values(windows, T0 + 10, _gpu(1e12, 1e12, stale=True)) == {}
    assert _values(windows, T0 + 20, _gpu(1.8e12, 1.8e12)) == {"3": pytest.approx(0.2)}


def test_a_clock_that_went_back_and_a_gpu_without_nvlink_give_no_sample():
    windows = NvlinkWindows()
    _values(windows, T0, _gpu(1e12, 1e12), _gpu(0.0, 0.0, index=4, capacity=None))
    assert _values(windows, T0 - 10, _gpu(2e12, 2e12), _gpu(1e9, 1e9, index=4, capacity=None)) == {}
    assert _values(windows, T0, _gpu(2e12, 2e12), _gpu(2e9, 2e9, index=4, capacity=None)) == {
        "3": 0.0}


def test_a_gpu_gone_from_a_whole_snapshot_loses_its_window_and_a_blind_one_keeps_it():
    windows = NvlinkWindows()
    _values(windows, T0, _gpu(0.0, 0.0), _gpu(0.0, 0.0, index=4))
    _values(windows, T0 + 10, _gpu(9e11, 9e11), whole=False)
    assert set(windows.windows) == {("gpu-001", 3), ("gpu-001", 4)}
    assert _values(windows, T0 + 20, _gpu(1.8e12, 1.8e12), _gpu(1.8e12, 1.8e12, index=4)) == {
        "3": pytest.approx(0.2), "4": pytest.approx(0.2)}
    _values(windows, T0 + 30, _gpu(2e12, 2e12))
    assert set(windows.windows) == {("gpu-001", 3)}


def test_the_stage_serves_the_gauge_from_the_catalogue_on_blind_frames_too():
    stage = NvlinkStage()
    assert "nvlink" in BLIND_SAFE
    run_cycle([stage], _snap(T0, _gpu(0.0, 0.0)))
    frame = run_cycle([stage], _snap(T0 + 10, _gpu(9e11, 9e11)), blind=("sim: part of the fleet",))
    [family] = stage.families(frame)
    body = render_text(frame.snapshot, extra=[family]).decode()
    assert ('gpufleet_gpu_nvlink_utilization_ratio{gpu="3",model="H200",node="gpu-001",'
            'pool="gpu-h200",uuid="GPU-0001-3"} 0.2') in body.splitlines()


def test_serve_wires_the_stage_where_it_serves_per_gpu_telemetry_only():
    from exporter.cli.serve import assemble

    def stages(config_text: str, names: list[str]) -> list[str]:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "c.yaml"
            path.write_text(config_text)
            config = load(str(path))
            config = dataclasses.replace(config, advisor=dataclasses.replace(
                config.advisor, enabled=False, outbox=str(Path(folder) / "o.sqlite")))
            collector, state, _ = assemble(config, names)
            try:
                assert state.cycle is not None
                return [s.name for s in state.cycle.stages]
            finally:
                asyncio.run(collector.close())

    assert "nvlink" in stages("exposition:\n  per_gpu: true\n", ["sim"])
    assert "nvlink" not in stages("exposition:\n  per_gpu: false\n", ["sim"])
