"""``gpufleet analyze``: the JSON contract, the readable report, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exporter.cli import main
from exporter.fleet_sim.fleet import Simulation
from exporter.snapshot import to_json
from exporter.sources.sim.options import Scenario, SimSource
from tests.helpers import REPO, openb_csv

NODES = str(openb_csv("openb_node_list_gpu_node"))
PODS = str(openb_csv("openb_pod_list_default"))
KEYS = {"index", "fragmented_gpus", "idle_gpus", "total_gpus", "fragmentation_ratio", "breakdown",
        "workload", "pools"}


def run_json(capsys, *argv: str) -> dict:
    assert main(["analyze", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_empty_openb_cluster_contract(capsys):
    out = run_json(capsys, "--nodes", NODES, "--pods", PODS, "--empty")
    assert set(out) >= KEYS
    assert out["total_gpus"] == out["idle_gpus"] == 6212
    assert 0.13 < out["fragmentation_ratio"] < 0.15
    assert out["fragmented_gpus"] == pytest.approx(out["fragmentation_ratio"] * 6212, abs=0.01)
    assert out["index"] == pytest.approx(100 * out["fragmented_gpus"] / (6212 + 8), abs=1e-3)
    assert set(out["breakdown"]) == {"fits", "lacks_gpu", "lacks_cpu", "lacks_both", "no_access",
                                     "cpu_only"}
    assert sum(out["breakdown"].values()) == pytest.approx(6212, abs=0.01)
    workload = out["workload"]
    assert (workload["shapes"], workload["source"], workload["include_cpu_only"]) == (35, "trace", True)
    assert workload["coverage"] == pytest.approx(0.9526, abs=1e-4)
    assert workload["cpu_only_share"] == pytest.approx(0.1355, abs=1e-3)
    assert set(out["pools"]) == {"G2", "T4", "P100", "V100M16", "G3", "V100M32", "A10"}
    g2 = out["pools"]["G2"]
    assert {"model", "index", "fragmented_gpus", "idle_gpus", "total_gpus",
            "fragmentation_ratio", "breakdown"} <= set(g2)
    assert (g2["model"], g2["total_gpus"]) == ("G2", 4392)
    assert sum(p["fragmented_gpus"] for p in out["pools"].values()) == pytest.approx(
        out["fragmented_gpus"], abs=0.01)


def test_cpu_only_switch_and_coverage(capsys):
    out = run_json(capsys, "--nodes", NODES, "--pods", PODS, "--empty", "--no-cpu-only",
                   "--coverage", "0.5")
    assert out["workload"]["cpu_only_share"] == 0.0
    assert out["workload"]["include_cpu_only"] is False
    assert out["workload"]["coverage"] >= 0.5 and out["workload"]["shapes"] < 35
    assert out["breakdown"]["cpu_only"] == 0.0


def test_snapshot_file_from_the_exporter(capsys, tmp_path):
    sim = Simulation(SimSource(scenarios=(Scenario(kind="fragmented_pool", pool="gpu-h100"),)),
                     start_time=1_000_000_000.0)
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(to_json(sim.snapshot())))
    out = run_json(capsys, "--snapshot", str(path))
    assert out["total_gpus"] == 1088
    assert out["workload"]["source"] == "snapshot"
    assert out["pools"]["gpu-h100"]["index"] > 50
    assert next(iter(out["pools"])) == "gpu-h100"  # worst first
    # the same snapshot against the trace's workload instead of its own jobs
    traced = run_json(capsys, "--snapshot", str(path), "--pods", PODS)
    assert traced["workload"]["source"] == "trace" and traced["workload"]["shapes"] == 35


def test_placed_by_a_policy_then_measured(capsys):
    """The trace's pods placed in trace order: fgd leaves less idle and fragmented than random."""
    out = {policy: run_json(capsys, "--nodes", NODES, "--pods", PODS, "--placed-by", policy, "--seed", "3")
           for policy in ("fgd", "random")}
    for report in out.values():
        assert report["total_gpus"] == 6212
        assert report["workload"]["shapes"] == 35
    fgd, rnd = out["fgd"], out["random"]
    assert fgd["allocated_ratio"] > rnd["allocated_ratio"] + 0.05
    assert fgd["fragmented_gpus"] < rnd["fragmented_gpus"] - 200
    assert fgd == run_json(capsys, "--nodes", NODES, "--pods", PODS, "--placed-by", "fgd")  # no seed in fgd


def test_readable_report(capsys):
    assert main(["analyze", "--nodes", NODES, "--pods", PODS, "--empty", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Fragmentation index 13.9 / 100 (compaction due above 50: no)\n")
    assert "Workload: 35 shapes (trace) covering 95.3% of tasks; CPU-only 13.6% (included)" in text
    assert "  cpu_only         844.7   13.6%" in text
    assert "Tier inversions: none" in text
    assert text.count("idle GPUs\n") == 3


@pytest.mark.parametrize(("argv", "message"), [
    ([], "give one of --snapshot FILE.json, --nodes NODES.csv or --trace NAME"),
    (["--trace", "openb-default", "--nodes", NODES], "give one of --snapshot"),
    (["--trace", "openb-default", "--pods", PODS], "--trace names both the nodes and the pods"),
    (["--trace", "openb-missing"], "--trace: trace 'openb-missing': no openb_pod_list_missing.csv[.gz]"),
    (["--nodes", NODES, "--empty"], "--nodes needs --pods"),
    (["--nodes", NODES, "--pods", PODS], "either --empty or --placed-by"),
    (["--nodes", NODES, "--pods", PODS, "--placed-by", "worst"], "--placed-by worst: unknown policy"),
    (["--nodes", "/nonexistent.csv", "--pods", PODS, "--empty"], "/nonexistent.csv: cannot read"),
    (["--snapshot", "/nonexistent.json"], "/nonexistent.json: cannot read"),
    (["--nodes", NODES, "--pods", PODS, "--empty", "--coverage", "0"], "--coverage: must be in"),
])
def test_usage_errors_are_one_line_exit_2(capsys, argv, message):
    assert main(["analyze", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("gpufleet: ")


def test_bad_snapshot_json(capsys, tmp_path):
    path = tmp_path / "s.json"
    path.write_text("{not json")
    assert main(["analyze", "--snapshot", str(path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    path.write_text(json.dumps({"nodes": [{"name": "a", "oops": 1}]}))
    assert main(["analyze", "--snapshot", str(path)]) == 2
    assert "not a valid snapshot" in capsys.readouterr().err


def test_real_process_prints_json_and_no_traceback():
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "analyze", "--nodes", NODES, "--pods", PODS, "--empty",
         "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) >= KEYS
    assert "Traceback" not in done.stderr
    bad = subprocess.run([sys.executable, "-m", "exporter", "analyze", "--snapshot", "/nope.json"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_named_trace_is_the_same_as_its_files(capsys):
    """--trace openb-default measures the empty cluster, exactly as --nodes/--pods --empty does."""
    assert run_json(capsys, "--trace", "openb-default") == run_json(capsys, "--nodes", NODES, "--pods", PODS,
                                                                     "--empty")


def _node(gpu_count: object) -> dict:
    return {"name": "gpu-001", "model": "h100-sxm-80gb", "cpu_cores": 64, "pool": "gpu-h100",
            "generation": "hopper", "gpu_count": gpu_count}


def test_a_snapshot_file_is_held_to_the_what_if_bounds(capsys, tmp_path):
    """The bounds of POST /v1/plan (advisor/bounds.py), before anything is built: a node
    claiming a billion GPUs made from_snapshot build a set of a billion indices."""
    path = tmp_path / "s.json"
    config = tmp_path / "gpufleet.yaml"
    config.write_text("advisor:\n  max_body_bytes: 1024\n")
    cases = [
        (json.dumps({"taken_at": 1e9, "nodes": [_node(1_000_000_000)]}), (),
         "not a valid snapshot: nodes[0].gpu_count: must be an integer from 0 to 64, "
         "got 1000000000"),
        (json.dumps({"taken_at": 1e9, "nodes": [0] * 100_001}), (),
         "not a valid snapshot: nodes: 100001 items (at most 100000)"),
        ('{"taken_at": 1e9, "nodes": ' + "[" * 40 + "]" * 40 + "}", (),
         "JSON nested deeper than 32 levels"),
        ('{"taken_at": 1e400}', (), "the number 1e400 is out of range"),
        (" " * 1025, ("--config", str(config)),
         "1025 bytes, over the 1024-byte limit (advisor.max_body_bytes)"),
    ]
    for text, extra, reason in cases:
        path.write_text(text)
        assert main(["analyze", "--snapshot", str(path), *extra]) == 2
        assert capsys.readouterr().err == f"gpufleet: {path}: {reason}\n"
    # a pipe or device has no size to check first: read up to one byte past the limit
    assert main(["analyze", "--snapshot", "/dev/zero", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "gpufleet: /dev/zero: over the 1024-byte limit (advisor.max_body_bytes)\n")
