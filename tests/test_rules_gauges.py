"""Issue 45: the ratios the exporter already knows are gauges, so no recording rule recomputes
them over every GPU each interval (memory used over total, the power limit a GPU is held to);
and a drained node (issue 44) as the scheduler says it."""

from __future__ import annotations

from exporter.exposition import render_text
from exporter.snapshot import FleetSnapshot, Gpu, Node


def _gpu(index: int, model: str, **values) -> Gpu:
    return Gpu("n1", index, f"GPU-{index}", model, "p", **values)


def _samples(body: bytes, family: str) -> dict[str, float]:
    out = {}
    for line in body.decode().splitlines():
        if line.startswith(family + "{"):
            labels, _, value = line.rpartition(" ")
            gpu = labels.split('gpu="')[1].split('"')[0] if 'gpu="' in labels else labels
            out[gpu] = float(value)
    return out


def test_memory_used_ratio_and_the_effective_power_limit_are_served_per_gpu():
    gpus = (
        _gpu(0, "H100", memory_used_bytes=40, memory_total_bytes=80, power_limit_watts=500.0),
        # no enforced limit reported (dcgm's default counters): the catalogue TDP, 700 W
        _gpu(1, "H100", memory_used_bytes=0, memory_total_bytes=80),
        # a limit of 0 is a driver that cannot say: no limit, the TDP again
        _gpu(2, "H100", power_limit_watts=0.0),
        # a model the catalogue does not know, and no limit, no memory total: absent
        _gpu(3, "G2", memory_used_bytes=5),
    )
    body = render_text(FleetSnapshot(1.0, (Node("n1", "H100", 8, "p", "hopper", 4),), gpus))
    assert _samples(body, "gpufleet_gpu_memory_used_ratio") == {"0": 0.5, "1": 0.0}
    assert _samples(body, "gpufleet_gpu_power_limit_effective_watts") == {
        "0": 500.0, "1": 700.0, "2": 700.0}


def test_a_node_the_scheduler_drained_is_served_and_one_it_does_not_describe_is_not():
    nodes = (Node("a", "H100", 8, "p", "hopper", 1, drained=True),
             Node("b", "H100", 8, "p", "hopper", 1, drained=False),
             Node("c", "H100", 8, "p", "hopper", 1))
    body = render_text(FleetSnapshot(1.0, nodes, ()))
    lines = [line for line in body.decode().splitlines()
             if line.startswith("gpufleet_node_drained")]
    assert lines == ['gpufleet_node_drained{node="a",pool="p"} 1.0']
