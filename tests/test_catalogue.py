from __future__ import annotations

import pytest

from exporter.catalogue import GB, default_catalogue


@pytest.mark.parametrize(
    ("name", "model", "memory_gb", "tdp", "nvlink", "bandwidth_gbps"),
    [
        ("B200", "B200", 192, 1000, 5, 1800),
        ("NVIDIA H200", "H200", 141, 700, 4, 900),
        ("NVIDIA H100 80GB HBM3", "H100", 80, 700, 4, 900),
        ("H20", "H20", 96, 400, 4, 900),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB", 80, 400, 3, 600),
        ("NVIDIA A100-SXM4-40GB", "A100", 40, 400, 3, 600),
        ("NVIDIA L40S", "L40S", 48, 350, None, None),
        ("T4", "T4", 16, 70, None, None),
        ("P100", "P100", 16, 250, None, None),
        ("V100M16", "V100M16", 16, 300, 2, 300),
        ("V100M32", "V100M32", 32, 300, 2, 300),
        ("A10", "A10", 24, 150, None, None),
    ],
)
def test_catalogue_specs(name, model, memory_gb, tdp, nvlink, bandwidth_gbps):
    spec = default_catalogue().get(name)
    assert spec.name == model and spec.known
    assert spec.memory_bytes == memory_gb * GB
    assert spec.tdp_watts == tdp
    assert spec.nvlink_generation == nvlink
    expected = bandwidth_gbps * GB if bandwidth_gbps else None
    assert spec.nvlink_bandwidth_bytes_per_second == expected


def test_tiers_order_b200_h200_h100_a100_older():
    c = default_catalogue()
    tiers = [c.get(m).tier for m in ("B200", "H200", "H100", "A100", "T4")]
    assert tiers == sorted(tiers, reverse=True) and len(set(tiers)) == 5


@pytest.mark.parametrize("name", ["G2", "G3", "MysteryGPU"])
def test_unknown_models_are_not_guessed(name, caplog):
    spec = default_catalogue().get(name)
    assert spec.name == name and not spec.known
    assert spec.memory_bytes is None and spec.tdp_watts is None and spec.tier is None
    assert spec.nvlink_bandwidth_bytes_per_second is None


def test_find_resolves_like_get_and_returns_none_for_unknown_names_without_a_warning(caplog):
    c = default_catalogue()
    for name in ("H100", "NVIDIA H100 80GB HBM3", "A100-80GB MIG", "V100M32"):
        assert c.find(name) is c.get(name)
    assert c.find("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    with caplog.at_level("WARNING", logger="exporter.catalogue"):
        assert c.find("G2") is None and c.find("FindOnlyGPU") is None and c.find("") is None
    assert caplog.records == []
