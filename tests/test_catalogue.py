from __future__ import annotations

from pathlib import Path

import pytest

from exporter.gpu_catalogue import GB, default_catalogue, parse_catalogue
from exporter.placement.tiers import tier_models
from exporter.sources.gpu_models import catalogue_resolver
from exporter.thresholds import load_thresholds

TABLE = Path(__file__).resolve().parent.parent / "rules" / "thresholds.yaml"


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
        # NVML's exact product names (nvmlDeviceGetName; dcgm-exporter's modelName is the same)
        ("NVIDIA H100 PCIe", "H100-PCIe", 80, 350, 4, 600),
        ("NVIDIA H100 NVL", "H100-NVL", 94, 400, 4, 600),
        ("NVIDIA H200 NVL", "H200-NVL", 141, 600, 4, 900),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe", 40, 250, 3, 600),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe", 80, 300, 3, 600),
        ("NVIDIA L4", "L4", 24, 72, None, None),
        ("NVIDIA B200", "B200", 192, 1000, 5, 1800),
        ("NVIDIA B100", "B100", 192, 700, 5, 1800),
        # NVIDIA publishes these GPUs' power only for the CPU+GPU module: no TDP
        ("NVIDIA GB200", "GB200", 186, None, 5, 1800),
        ("NVIDIA GH200 480GB", "GH200", 96, None, 4, None),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB", 144, None, 4, None),
        # other spellings drivers report for the same parts (seen in public nvidia-smi output)
        ("NVIDIA GH200 144GB HBM3e", "GH200-144GB", 144, None, 4, None),
        ("NVIDIA A100-PCIE-80GB", "A100-80GB-PCIe", 80, 300, 3, 600),
        ("NVIDIA H200 141GB HBM3e", "H200", 141, 700, 4, 900),
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
    with caplog.at_level("WARNING", logger="exporter.gpu_catalogue"):
        assert c.find("G2") is None and c.find("FindOnlyGPU") is None and c.find("") is None
    assert caplog.records == []


@pytest.mark.parametrize(
    ("product", "model", "power_watts", "tdp_share", "nvlink_bytes_per_second", "nvlink_share"),
    [
        # 300 W on a 350 W H100 PCIe is 86% of its TDP (folded into the SXM H100 it read 43%),
        # and 300 GB/s over its 600 GB/s bridge is half its NVLink (a third of the SXM's 900)
        ("NVIDIA H100 PCIe", "H100-PCIe", 300.0, 300 / 350, 300e9, 0.5),
        ("NVIDIA H200 NVL", "H200-NVL", 540.0, 0.9, 450e9, 0.5),
        ("NVIDIA A100-PCIE-40GB", "A100-PCIe", 200.0, 0.8, 150e9, 0.25),
    ],
)
def test_variants_give_the_right_power_and_nvlink_ratios(product, model, power_watts, tdp_share,
                                                          nvlink_bytes_per_second, nvlink_share):
    spec = default_catalogue().get(product)
    info = catalogue_resolver()(product)  # what the nvml and dcgm sources label and divide by
    assert info.model == spec.name == model
    assert power_watts / spec.tdp_watts == pytest.approx(tdp_share)
    assert nvlink_bytes_per_second / info.nvlink_bandwidth_bytes_per_second == nvlink_share


def test_power_alert_thresholds_follow_each_variants_tdp():
    power = load_thresholds(TABLE).alert("GpuPowerHigh")
    assert power.threshold("critical", "H100-PCIe") == 350
    assert power.threshold("critical", "H200-NVL") == 600
    assert power.threshold("critical", "A100-PCIe") == 250
    assert power.threshold("critical", "H100") == 700  # the SXM part keeps its own
    # no per-GPU TDP published: no per-model threshold, so the enforced limit is used
    assert power.threshold("critical", "GH200") == 1.0


def test_every_variant_comes_before_the_model_its_name_also_matches():
    """A product name resolves to the first entry whose pattern matches it (file order)."""
    c = default_catalogue()
    for spec in c.models:
        assert c.get(spec.name) is spec
    first = {}
    for pattern, model in c.patterns:
        first.setdefault(model, pattern)
    for earlier, later in (("H100-PCIe", "H100"), ("H100-NVL", "H100"), ("H200-NVL", "H200"),
                           ("A100-PCIe", "A100"), ("A100-80GB-PCIe", "A100-80GB"),
                           ("GH200-144GB", "GH200")):
        order = [m.name for m in c.models]
        assert order.index(earlier) < order.index(later)
        # the plain model's pattern does match the variant's NVML name: the order is what decides
        assert first[later].search(earlier.replace("-", " "))


@pytest.mark.parametrize("name", ["NVIDIA GB100", "NVIDIA H800 PCIe", "NVIDIA RTX A6000",
                                  "NVIDIA L40", "NVIDIA GeForce RTX 4090"])
def test_unlisted_product_names_stay_unknown(name):
    assert default_catalogue().find(name) is None


def test_a_model_without_published_figures_parses_to_none():
    c = parse_catalogue("models:\n  - {name: X1, match: ['\\bX1\\b'], memory_gb: null, "
                        "tdp_watts: null, nvlink_bandwidth_gbps: null, architecture: x}\n")
    spec = c.get("NVIDIA X1")
    assert spec.known and spec.name == "X1"
    assert spec.memory_bytes is None and spec.tdp_watts is None
    assert spec.nvlink_bandwidth_bytes_per_second is None


@pytest.mark.parametrize(("product", "family"), [
    ("NVIDIA H100 PCIe", "H100"), ("NVIDIA H100 NVL", "H100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H200 NVL", "H200"), ("NVIDIA A100-PCIE-40GB", "A100"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("NVIDIA B200", "B200"), ("NVIDIA GH200 480GB", "GH200"),
])
def test_each_variant_names_the_model_it_is_sold_as(product, family):
    assert default_catalogue().get(product).family == family


def test_variants_stay_in_their_models_placement_tier():
    # the reference tiers list H100 for 40-80 GB: an H100 PCIe node takes such a job, as
    # it did when the catalogue folded it into H100; an A100 PCIe node does not
    fleet = ["NVIDIA A100-PCIE-40GB", "NVIDIA H100 PCIe", "NVIDIA H200 NVL"]
    assert tier_models(60 * GB, fleet) == ("NVIDIA H100 PCIe",)
    assert tier_models(100 * GB, fleet) == ("NVIDIA H200 NVL",)
    assert tier_models(20 * GB, fleet) == ("NVIDIA A100-PCIE-40GB", "NVIDIA H100 PCIe")
    assert default_catalogue().get("G2").family == "G2"


@pytest.mark.parametrize("mib, model", [
    (40_536, "A100"),  # an A100 40GB (SXM or PCIe: one family)
    (46_068, "L40S"),
    (143_771, None),  # H200 or GH200-144GB
    (81_559, None),  # A100-80GB or H100: two families, so no guess
    (23_034, None),  # L4 or A10
    (15_360, None),  # T4, V100 16GB or P100
    (1_000, None),
])
def test_a_framebuffer_names_a_model_only_when_one_family_fits(mib, model):
    spec = default_catalogue().by_memory(mib * 2**20)
    assert (spec.name if spec else None) == model


@pytest.mark.parametrize("sample, models", [
    ("l4-1gpu-default-counters.prom", {"L4"}),
    ("h100-8gpu-k8s-pod-labels.prom", {"H100"}),
    ("a100-mig-docs.prom", {"A100"}),  # dcgm-exporter 2.x: no modelName label (issue 30)
])
def test_every_part_in_the_dcgm_samples_gets_its_model(sample, models):
    from exporter.sources.dcgm.source import parse_body, target_from

    body = (Path(__file__).parents[1] / "data" / "dcgm-samples" / sample).read_bytes()
    fleet, _ = parse_body(body, target_from("http://node:9400/metrics", ""), catalogue_resolver())
    assert fleet.gpus and {g.model for g in fleet.gpus} == models
    assert {n.model for n in fleet.nodes} == models
