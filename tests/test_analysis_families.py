"""The analyzer's families: in-process on simulated snapshots, then on a real exporter process."""

from __future__ import annotations

import re
import time

import pytest

from exporter.analysis.analyzer import LiveAnalyzer, report_families
from exporter.analysis.options import AnalysisConfig, ShapeConfig
from exporter.config import ConfigError, build
from exporter.cycle import run_cycle
from exporter.cycle.stages import AnalysisStage, LoadStage
from exporter.exposition import render_families
from exporter.fleet_sim.fleet import Simulation
from exporter.pool_load.tracker import LoadTracker
from exporter.snapshot import FleetSnapshot
from exporter.sources.sim.options import Scenario, SimSource
from tests.helpers import http_get, openb_csv

START = 1_000_000_000.0
FAMILIES = {
    "gpufleet_cluster_fragmentation_index", "gpufleet_cluster_fragmented_gpus",
    "gpufleet_cluster_idle_gpus", "gpufleet_cluster_fragmentation_ratio",
    "gpufleet_cluster_fragmented_gpus_by_reason", "gpufleet_pool_fragmentation_index",
    "gpufleet_pool_fragmented_gpus", "gpufleet_pool_idle_gpus", "gpufleet_node_fragmented_gpus",
    "gpufleet_tier_inversion", "gpufleet_fragmentation_workload_shapes",
    "gpufleet_cluster_tier_inversion_penalty", "gpufleet_pool_tier_inversion_penalty",
    "gpufleet_fragmentation_workload_coverage_ratio",
    "gpufleet_fragmentation_workload_cpu_only_ratio", "gpufleet_fragmentation_workload_info",
    # pool load (issue 20): the analyzer's LoadTracker
    "gpufleet_pool_load_change_total", "gpufleet_pool_load_last_change_timestamp_seconds",
    "gpufleet_pool_recommended_nodes", "gpufleet_pool_scaling_reason",
}
POOLS = {"gpu-h200", "gpu-h100", "gpu-a100", "gpu-b200"}


def samples(text: str, name: str) -> dict[str, float]:
    """{label text: value} of one family in exposition text."""
    pattern = re.compile(rf"^{name}(\{{[^}}]*\}})? (\S+)$", re.M)
    return {m.group(1) or "": float(m.group(2)) for m in pattern.finditer(text)}


def pool_indices(text: str) -> dict[str, float]:
    out = {}
    for labels, value in samples(text, "gpufleet_pool_fragmentation_index").items():
        out[re.search(r'pool="([^"]+)"', labels).group(1)] = value
    return out


def families_of(analyzer: LiveAnalyzer, snapshot: FleetSnapshot):
    """The analysis and load stages' families for ``snapshot``, as serve's cycle gives them,
    and the frame."""
    stages = (AnalysisStage(analyzer), LoadStage(LoadTracker.from_table(60)))
    frame = run_cycle(stages, snapshot)
    return [f for stage in stages for f in stage.families(frame)], frame


def test_families_of_a_simulated_snapshot():
    analyzer = LiveAnalyzer.from_config(AnalysisConfig())
    families, frame = families_of(analyzer, Simulation(SimSource(), START).snapshot())
    assert {f.name for f in families} == FAMILIES
    text = "".join(render_families(families))
    assert set(pool_indices(text)) == POOLS
    assert 'gpufleet_pool_fragmentation_index{model="H100",pool="gpu-h100"}' in text
    assert len(samples(text, "gpufleet_node_fragmented_gpus")) == 136
    assert set(samples(text, "gpufleet_cluster_fragmented_gpus_by_reason")) == {
        f'{{reason="{r}"}}' for r in ("lacks_gpu", "lacks_cpu", "lacks_both", "no_access", "cpu_only")}
    assert len(samples(text, "gpufleet_tier_inversion")) == 6  # every pair of the four tiers
    assert samples(text, "gpufleet_fragmentation_workload_info") == {
        '{cpu_only="included",source="window"}': 1.0}
    by_reason = sum(samples(text, "gpufleet_cluster_fragmented_gpus_by_reason").values())
    assert by_reason == pytest.approx(samples(text, "gpufleet_cluster_fragmented_gpus")[""], abs=1e-6)
    assert frame.report is not None and frame.report.cluster.total_gpus == 1088


def test_fragmented_pool_scenario_pushes_its_pool_index_above_50():
    sim = Simulation(SimSource(scenarios=(Scenario(kind="fragmented_pool", pool="gpu-h100"),)), START)
    analyzer = LiveAnalyzer.from_config(AnalysisConfig())
    for minute in range(10):
        sim.advance(START + 60 * minute)
        report = analyzer.analyze(sim.snapshot())
        pools = {p.name: p for p in report.pools}
        assert pools["gpu-h100"].index > 50, (minute, pools["gpu-h100"])
        assert all(pools[p].index < 50 for p in POOLS - {"gpu-h100"})


def test_fixed_workloads_from_config():
    config = build(AnalysisConfig, {"workload": "shapes", "shapes": [
        {"cpus": 8, "gpus": 1, "weight": 3}, {"cpus": 64, "gpus": 8, "models": ["NVIDIA H200"]}]})
    analyzer = LiveAnalyzer.from_config(config)
    workload = analyzer.fixed
    assert workload is not None and workload.weights == pytest.approx((0.75, 0.25))
    assert workload.shapes[1].models == ("H200",)  # product names resolve through the catalogue
    families, _ = families_of(analyzer, Simulation(SimSource(), START).snapshot())
    text = "".join(render_families(families))
    assert samples(text, "gpufleet_fragmentation_workload_info") == {
        '{cpu_only="included",source="shapes"}': 1.0}
    trace = openb_csv("openb_pod_list_default")
    traced = LiveAnalyzer.from_config(AnalysisConfig(workload="trace", trace=str(trace)))
    assert traced.fixed is not None and len(traced.fixed) == 35


@pytest.mark.parametrize(("config", "message"), [
    (AnalysisConfig(workload="trace"), "analysis.trace: give an openb pod CSV"),
    (AnalysisConfig(workload="trace", trace="/nope.csv"), "analysis.trace: /nope.csv: cannot read"),
    (AnalysisConfig(workload="shapes"), "analysis.shapes: list at least one shape"),
    (AnalysisConfig(workload="shapes", shapes=(ShapeConfig(weight=0),)), "weight above 0"),
])
def test_bad_analysis_config_is_a_config_error(config, message):
    with pytest.raises(ConfigError, match=message):
        LiveAnalyzer.from_config(config)


def test_config_keys_are_validated():
    with pytest.raises(ConfigError, match=r"analysis\.workload: must be one of window, trace, shapes"):
        build(AnalysisConfig, {"workload": "magic"}, "analysis")
    with pytest.raises(ConfigError, match=r"analysis.tier_penalty.busy_above: must be <= 1"):
        build(AnalysisConfig, {"tier_penalty": {"busy_above": 2}}, "analysis")


def test_empty_snapshot_gives_zeros_not_an_error():
    families = report_families(LiveAnalyzer.from_config(AnalysisConfig()).analyze(FleetSnapshot(0.0)))
    text = "".join(render_families(families))
    assert samples(text, "gpufleet_cluster_fragmentation_index") == {"": 0.0}
    assert samples(text, "gpufleet_cluster_idle_gpus") == {"": 0.0}


# --- a real exporter process -------------------------------------------------------------


def test_metrics_carry_indices_that_change_as_jobs_come_and_go(exporter_factory):
    # an hour of simulated time per second: jobs start and finish between scrapes
    exporter = exporter_factory(config="collect_interval: 250ms\nsources:\n  sim:\n    speed: 3600\n")
    seen_cluster, seen_pools, seen_jobs = set(), {p: set() for p in POOLS}, []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = http_get(f"{exporter.url}/metrics").decode()
        seen_cluster.add(samples(text, "gpufleet_cluster_fragmentation_index")[""])
        for pool, value in pool_indices(text).items():
            seen_pools[pool].add(value)
        jobs = set(re.findall(r'gpufleet_gpu_allocation_info\{[^}]*job="([^"]+)"', text))
        seen_jobs.append(jobs)
        changed = [p for p, values in seen_pools.items() if len(values) > 1]
        if len(seen_cluster) >= 3 and len(changed) >= 2:
            break
        time.sleep(0.4)
    assert set(seen_pools) == POOLS and all(seen_pools.values())
    assert all(0 <= v <= 100 for v in seen_cluster)
    assert len(seen_cluster) >= 3, seen_cluster
    assert len([p for p, values in seen_pools.items() if len(values) > 1]) >= 2, seen_pools
    assert seen_jobs[0] != seen_jobs[-1]  # the indices moved because jobs came and went


def test_exporter_with_fragmented_h100_pool(exporter_factory):
    config = ("sources:\n  sim:\n    scenarios:\n      - {kind: fragmented_pool, pool: gpu-h100}\n")
    # the scattered pool's index passes 50 at 32 nodes (62; 30.7 at 4)
    exporter = exporter_factory(config=config, fleet="medium")
    text = http_get(f"{exporter.url}/metrics").decode()
    pools = pool_indices(text)
    assert pools["gpu-h100"] > 50, pools
    assert all(pools[p] < 50 for p in POOLS - {"gpu-h100"}), pools
    cluster = samples(text, "gpufleet_cluster_fragmentation_index")[""]
    assert 0 < cluster < pools["gpu-h100"]


def test_bad_analysis_config_stops_the_start_with_one_line(exporter_factory, tmp_path):
    exporter = exporter_factory(config="analysis:\n  workload: trace\n", ready=False)
    assert exporter.proc.wait(timeout=30) == 2
    log = exporter.log.read_text()
    assert "gpufleet: analysis.trace: give an openb pod CSV" in log
    assert "Traceback" not in log
