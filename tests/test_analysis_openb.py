"""The openb trace loader, and FGD on the empty openb cluster with the default trace's workload."""

from __future__ import annotations

import csv
import gzip
import logging
import os
from collections import Counter

import pytest

from exporter.analysis import openb
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import evaluate
from exporter.analysis.workload import from_tasks
from tests.helpers import openb_csv

NODES = openb_csv("openb_node_list_gpu_node")
PODS = openb_csv("openb_pod_list_default")


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
    spec = openb.load_pods(openb_csv("openb_pod_list_gpuspec33"))
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
    with openb.open_text(NODES) as f:
        nodes = [(int(r["cpu_milli"]), int(r["gpu"])) for r in csv.DictReader(f)]
    with openb.open_text(PODS) as f:
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


def test_gzipped_and_plain_csv_load_the_same(tmp_path):
    plain = tmp_path / "pods.csv"
    with openb.open_text(PODS) as handle:
        plain.write_text(handle.read())
    gzipped = tmp_path / "pods.csv.gz"
    gzipped.write_bytes(gzip.compress(plain.read_bytes()))
    assert openb.load_pods(plain) == openb.load_pods(gzipped) == openb.load_pods(PODS)


@pytest.mark.parametrize(("content", "message"), [
    (gzip.compress(b"name,cpu_milli,num_gpu,gpu_milli\n" + b"p,1000,1,500\n" * 1000, mtime=0)[:-40],
     "cannot read"),
    (b"not gzip at all", "cannot read"),
    (gzip.compress(b"name,cpu_milli,num_gpu,gpu_milli\n\xff\xfe,1,1,1\n", mtime=0), "cannot read"),
], ids=["truncated", "not-gzip", "not-utf8"])
def test_a_corrupt_gzip_is_one_openb_error(tmp_path, content, message):
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(content)
    with pytest.raises(openb.OpenbError, match=message) as raised:
        openb.load_pods(path)
    assert str(raised.value).startswith(f"{path}: ")


def test_a_gzip_bomb_a_fifo_or_dev_zero_is_one_openb_error_not_a_hang(tmp_path, monkeypatch):
    """The trace reader streamed whatever it was named: a FIFO hung it at open(), and
    /dev/zero or a gzip bomb grew one line without end."""
    monkeypatch.setattr(openb, "MAX_TRACE_BYTES", 1024 * 1024)
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(b"name,cpu_milli,num_gpu,gpu_milli\n" + b"0" * 8 * 2**20))
    with pytest.raises(openb.OpenbError) as raised:
        openb.load_pods(bomb)
    assert str(raised.value) == f"{bomb}: over 1048576 bytes once gunzipped"
    with pytest.raises(openb.OpenbError) as raised:
        openb.load_pods("/dev/zero")
    assert str(raised.value) == "/dev/zero: over the 1048576-byte limit of a trace"
    fifo = tmp_path / "pods.csv"
    os.mkfifo(fifo)  # nobody writes: read as empty, so no columns
    with pytest.raises(openb.OpenbError, match="missing column"):
        openb.load_pods(fifo)


def test_named_traces_follow_gpufleet_data(tmp_path, monkeypatch):
    assert openb.named_trace("openb-default").pods.name == "openb_pod_list_default.csv.gz"
    folder = tmp_path / "alibaba-gpu-v2023" / "csv"
    folder.mkdir(parents=True)
    (folder / "openb_node_list_gpu_node.csv").write_text("sn,cpu_milli,gpu,model\nn1,8000,2,T4\n")
    (folder / "openb_pod_list_tiny.csv").write_text("name,cpu_milli,num_gpu,gpu_milli\np,1000,1,500\n")
    monkeypatch.setenv("GPUFLEET_DATA", str(tmp_path))
    trace = openb.named_trace("openb-tiny")
    assert (trace.nodes, trace.pods) == (folder / "openb_node_list_gpu_node.csv",
                                         folder / "openb_pod_list_tiny.csv")
    assert [n.gpus for n in openb.load_nodes(trace.nodes)] == [2]
    # a variant GPUFLEET_DATA lacks is still found in the package (default) or refused by name
    assert openb.named_trace("openb-default").pods.name == "openb_pod_list_default.csv.gz"
    for bad in ("openb-", "openb-a/b", "gpuspec33"):
        with pytest.raises(openb.OpenbError, match="unknown trace"):
            openb.named_trace(bad)


def test_analysis_trace_takes_a_trace_name_or_a_file():
    from exporter.analysis.configure import trace_workload
    from exporter.config import AnalysisConfig, ConfigError

    config = AnalysisConfig()
    by_name = trace_workload("openb-default", config)
    assert by_name == trace_workload(str(PODS), config)
    assert len(by_name) == 35
    with pytest.raises(ConfigError, match=r"analysis\.trace: trace 'openb-nope': no openb_pod_list_nope"):
        trace_workload("openb-nope", config)
