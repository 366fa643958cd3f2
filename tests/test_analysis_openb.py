"""The openb trace loader, and FGD on the empty openb cluster with the default trace's workload."""

from __future__ import annotations

import csv
import logging
from collections import Counter

import pytest

from exporter.analysis import openb
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import evaluate
from exporter.analysis.workload import from_tasks
from tests.conftest import data_dir

TRACE = data_dir() / "alibaba-gpu-v2023" / "csv"
NODES = TRACE / "openb_node_list_gpu_node.csv"
PODS = TRACE / "openb_pod_list_default.csv"


def test_nodes_load_with_catalogue_models_and_unknown_ones_kept(caplog):
    caplog.set_level(logging.INFO, logger="exporter.analysis.openb")
    nodes = openb.load_nodes(NODES)
    assert len(nodes) == 1213
    assert sum(n.gpus for n in nodes) == 6212
    assert Counter(n.model for n in nodes) == {
        "G2": 549, "T4": 404, "P100": 134, "V100M16": 55, "G3": 39, "V100M32": 30, "A10": 2}
    first = nodes[0]
    assert (first.name, first.cpus, first.gpus, first.model) == ("openb-node-0000", 64.0, 2, "P100")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # each unknown trace model is warned about once, the first time it appears
    assert sorted(w.split("'")[1] for w in warnings) == ["G2", "G3"]
    assert all("not in the GPU catalogue" in w for w in warnings)


def test_pods_load_with_units_converted():
    pods = openb.load_pods(PODS)
    assert len(pods) == 8152
    first = pods[1]  # openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061
    assert (first.name, first.cpus, first.gpus, first.gpu_share, first.models) == (
        "openb-pod-0001", 6.0, 1, 0.46, ())
    assert (first.qos, first.phase, first.creation_time) == ("LS", "Running", 427061.0)
    spec = openb.load_pods(TRACE / "openb_pod_list_gpuspec33.csv")
    assert ("V100M16", "V100M32") in {p.models for p in spec}


def test_bad_files_give_one_line_errors(tmp_path):
    with pytest.raises(openb.OpenbError, match="cannot read"):
        openb.load_nodes(tmp_path / "missing.csv")
    bad = tmp_path / "nodes.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,1,2,T4\nn2,lots,1,2,T4\n")
    with pytest.raises(openb.OpenbError, match=r"nodes.csv:3: cpu_milli: not a number: 'lots'"):
        openb.load_nodes(bad)
    bad.write_text("sn,cpu\nn1,1\n")
    with pytest.raises(openb.OpenbError, match="missing column"):
        openb.load_nodes(bad)
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,num_gpu,gpu_milli,gpu_spec\np,1000,1,1500,\n")
    with pytest.raises(openb.OpenbError, match=r"pods.csv:2: gpu_milli: at most 1000"):
        openb.load_pods(pods)
    pods.write_text("name,cpu_milli,num_gpu,gpu_milli,gpu_spec\np,1000,-1,0,\n")
    with pytest.raises(openb.OpenbError, match=r"num_gpu: must be >= 0"):
        openb.load_pods(pods)


def _independent_expectation() -> tuple[float, float, int]:
    """The expected ratio on the empty cluster, from the CSVs with nothing of the analyzer.

    On an empty node every GPU is whole, so a shape that fits leaves no
    fragment and one that does not (CPU-only, more GPUs or CPUs than the node
    has) makes all the node's GPUs fragments. The ratio is therefore the
    weighted share of GPUs on nodes each shape cannot use.
    """
    with NODES.open() as f:
        nodes = [(int(r["cpu_milli"]), int(r["gpu"])) for r in csv.DictReader(f)]
    with PODS.open() as f:
        counts = Counter((int(r["cpu_milli"]), int(r["num_gpu"]), int(r["gpu_milli"]))
                         for r in csv.DictReader(f))  # the default trace has no gpu_spec
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    total, kept, covered = sum(counts.values()), [], 0
    for shape, count in ranked:
        if covered >= 0.95 * total:
            break
        kept.append((shape, count))
        covered += count
    all_gpus = sum(g for _, g in nodes)
    cpu_only = sum(c for (_, gpus, milli), c in kept if gpus == 0 or milli == 0) / covered
    unusable = 0.0
    for (cpu, gpus, milli), count in kept:
        if gpus == 0 or milli == 0:
            continue
        stranded = sum(g for node_cpu, g in nodes if node_cpu < cpu or g < gpus)
        unusable += count / covered * stranded / all_gpus
    return cpu_only, unusable, len(kept)


def test_empty_openb_cluster_ratio_is_the_cpu_only_share_plus_shapes_too_big_for_small_nodes():
    mapper = openb.ModelMapper()
    state = openb.empty_state(openb.load_nodes(NODES, mapper))
    workload = from_tasks(p.shape for p in openb.load_pods(PODS, mapper))
    report = evaluate(state, compile_workload(workload, state.model_names))
    cpu_only, too_big, shapes = _independent_expectation()
    assert len(workload) == shapes == 35
    assert workload.cpu_only_share == pytest.approx(cpu_only)
    assert report.cluster.total_gpus == report.cluster.idle_gpus == 6212
    ratio = report.cluster.fragmentation_ratio
    assert abs(ratio - (cpu_only + too_big)) < 0.01
    # the reading: close to the CPU-only share (about 14%), a little above it
    assert cpu_only == pytest.approx(0.136, abs=0.002)
    assert cpu_only < ratio < 0.15
    assert report.cluster.breakdown["cpu_only"] / 6212 == pytest.approx(cpu_only)
