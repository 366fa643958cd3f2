"""exporter/snapshot.py: the JSON form round-trips the nested issue-16 values."""

from __future__ import annotations

import json

import pytest

from exporter.snapshot import (
    FleetSnapshot,
    Gpu,
    GpuHealth,
    GpuPerformance,
    XidCount,
    from_json,
    to_json,
)


def test_health_and_performance_survive_the_json_form():
    gpu = Gpu("gpu-001", 3, "GPU-1", "H100", "gpu-h100", driver_version="550.54.15",
              vbios_version="96.00.99.00.01", serial="1654923012345",
              health=GpuHealth(xid_counts=(XidCount(48, 2), XidCount(79, 1)), last_xid=79,
                               last_xid_time=1.76e9, ecc_single_bit_volatile=4,
                               remapped_rows_pending=True, clock_event_reasons=0x44),
              performance=GpuPerformance(sm_clock_hertz=1.98e9, performance_state=0,
                                         sm_active_ratio=0.25))
    bare = Gpu("gpu-001", 4, "GPU-2", "H100", "gpu-h100")  # a source that reads neither
    snapshot = FleetSnapshot(1.76e9, gpus=(gpu, bare))
    back = from_json(json.loads(json.dumps(to_json(snapshot))))
    assert back == snapshot
    assert back.gpus[0].health is not None
    assert back.gpus[0].health.xid_counts == (XidCount(48, 2), XidCount(79, 1))
    assert back.gpus[1].health is None and back.gpus[1].performance is None


def test_an_unknown_health_field_is_refused():
    data = to_json(FleetSnapshot(1.0, gpus=(Gpu("n", 0, "u", "m", "p", health=GpuHealth()),)))
    data["gpus"][0]["health"]["ecc_triple_bit"] = 1
    with pytest.raises(ValueError, match="GpuHealth: unknown field 'ecc_triple_bit'"):
        from_json(data)


def test_an_unknown_field_is_named_with_its_path():
    data = to_json(FleetSnapshot(1.0, gpus=(Gpu("n", 0, "u", "m", "p"), Gpu("n", 1, "u", "m", "p"))))
    data["gpus"][1]["temprature_celsius"] = 40
    with pytest.raises(ValueError) as info:
        from_json(data)
    assert str(info.value) == "Gpu: unknown field 'temprature_celsius' (at gpus[1].temprature_celsius)"
