"""Trace replay: the paper's protocol on small inputs, then ``gpufleet replay`` as a real process."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import struct
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from exporter.analysis import openb
from exporter.analysis.fgd import compile_workload, node_fragmentation
from exporter.analysis.state import build
from exporter.analysis.workload import Shape, Workload, from_tasks
from exporter.cli import main
from exporter.cli.replay import ProgressBar, parse_seeds
from exporter.placement.engine import Placer
from exporter.placement.replay import (
    COLUMNS,
    Setup,
    arrivals,
    fleet_for,
    node_permutation,
    replay,
    replay_many,
)
from exporter.placement.task import Task
from exporter.policy_names import POLICIES
from tests.helpers import REPO, data_dir, openb_csv

TRACE = data_dir() / "alibaba-gpu-v2023" / "csv"


def small_setup(arrive: float = 1.3) -> Setup:
    """Three 2-GPU nodes; whole, half and CPU-only pods."""
    state = build(["a", "b", "c"], ["A"] * 3, ["p"] * 3, [16] * 3, [16] * 3, [[1, 1]] * 3)
    tasks = (Task(4, 1), Task(2, 1, 0.5), Task(8), Task(4, 2))
    workload = Workload(tuple(Shape(t.cpus, t.gpu_share if t.gpus else 0.0, t.gpus) for t in tasks),
                        (0.25,) * 4)
    return Setup(state, tasks, compile_workload(workload, state.model_names), arrive)


def test_arrivals_shuffle_then_append_copies_until_the_ratio():
    setup = small_setup()
    order = arrivals(setup.tasks, 6, 1.3, seed=42)
    demand = [setup.tasks[i].gpu_demand for i in order]
    assert sorted(order[:4]) == [0, 1, 2, 3]  # every pod once, shuffled
    assert sum(demand) >= 1.3 * 6 - 1e-9
    assert sum(demand[:-1]) < 1.3 * 6  # not one copy more than needed
    assert order == arrivals(setup.tasks, 6, 1.3, seed=42)
    assert order != arrivals(setup.tasks, 6, 1.3, seed=43)
    with pytest.raises(ValueError, match="ask for no GPUs"):
        arrivals((Task(4),), 6, 1.3, seed=1)


def test_the_seeded_node_order_is_a_permutation_of_the_names_drawn_per_seed():
    names = [f"node-{i:02d}" for i in range(20)]
    order = node_permutation(names, 42)
    assert sorted(order.tolist()) == list(range(20))
    assert order.tolist() == node_permutation(names, 42).tolist()  # the seed decides it
    assert order.tolist() != node_permutation(names, 43).tolist()
    assert order.tolist() != list(range(20))
    # the names are sorted first: the same nodes listed in another order get the same order
    shuffled = names[::-1]
    assert [shuffled[i] for i in node_permutation(shuffled, 42)] == [names[i] for i in order]


def test_a_seeded_run_considers_the_nodes_in_that_order():
    """Every per-node array moves with its node; the name order is the fleet as given."""
    state = build(["a", "b", "c", "d"], ["A", "A", "B", "B"], ["p", "p", "q", "q"], [4, 8, 16, 32],
                  [4, 8, 16, 32], [[1], [1, 1], [1, 1, 1], [1, 0.5, 1, 1]])
    memory = np.array([1.0, 2.0, 3.0, 4.0])
    named = Setup(state, small_setup().tasks, small_setup().workload, node_memory=memory)
    same, same_memory = fleet_for(named, 7)
    assert same is state and same_memory is memory
    seeded = dataclasses.replace(named, node_order="seeded")
    fleet, mem = fleet_for(seeded, 7)
    order = node_permutation(state.names, 7)
    assert fleet.names == tuple(state.names[i] for i in order) != state.names
    for i, node in enumerate(fleet.names):
        j = state.names.index(node)
        assert (fleet.model_names[fleet.model[i]], fleet.cpu_total[i], fleet.gpu_count[i], mem[i]) == \
            (state.model_names[state.model[j]], state.cpu_total[j], state.gpu_count[j], memory[j])
        assert fleet.gpu_free[i].tolist() == state.gpu_free[j].tolist()
    with pytest.raises(ValueError, match="node_order"):
        dataclasses.replace(named, node_order="random")


def test_the_node_order_decides_where_packing_sends_cpu_only_pods():
    """packing scores every node alike for a CPU-only pod, so it goes to the first node: in
    name order always node a, in the seeded order the seed's first node (as the reference's
    random name prefixes do), so the runs of two seeds differ only by it."""
    state = build([f"n{i}" for i in range(8)], ["A"] * 8, ["p"] * 8, [8] * 8, [8] * 8, [[1]] * 8)
    tasks = (Task(8), Task(1, 1))
    workload = Workload((Shape(1, 1.0, 1),), (1.0,))
    setups = {order: Setup(state, tasks, compile_workload(workload, state.model_names), 0.25,
                           node_order=order) for order in ("name", "seeded")}
    for order, setup in setups.items():
        for seed in (1, 2, 3):
            fleet, _ = fleet_for(setup, seed)
            found = Placer(fleet, setup.workload).place(Task(8), "packing", np.random.default_rng(0))
            assert found is not None
            expected = "n0" if order == "name" else fleet.names[0]
            assert fleet.names[found.node] == expected
    firsts = {fleet_for(setups["seeded"], seed)[0].names[0] for seed in range(1, 9)}
    assert len(firsts) > 1


def test_replay_rows_follow_the_arrivals():
    setup = small_setup()
    rows = replay(setup, "fgd", 7)
    assert [r.arrived_pct for r in rows] == list(range(131))
    first = rows[0]
    empty = node_fragmentation(setup.state, setup.workload).sum()
    assert (first.alloc_pct, first.failed_pods) == (0.0, 0)
    assert first.frag_pct == pytest.approx(100 * empty / 6)
    assert first.frag_ratio_pct == pytest.approx(100 * empty / 6)
    for before, after in pairwise(rows):
        assert after.failed_pods >= before.failed_pods
        assert after.alloc_pct >= before.alloc_pct - 1e-9  # nothing departs
    for row in rows:
        # what is allocated has arrived; the pod that brought a row's percent is counted
        assert row.alloc_pct <= row.arrived_pct + 100 * 2 / 6 + 1e-9
        assert 0 <= row.frag_ratio_pct <= 100 + 1e-9
    # 7.8 GPUs asked of 6: the cluster fills and some pods fail
    assert rows[-1].alloc_pct > 75
    assert rows[-1].failed_pods > 0


def test_runs_in_worker_processes_give_the_same_rows_as_in_process():
    setup = small_setup(arrive=0.8)
    inline = replay_many(setup, ["fgd", "random"], [1, 2], jobs=1)
    assert inline == replay_many(setup, ["fgd", "random"], [1, 2], jobs=2)
    runs = [(r.policy, r.seed) for r in inline[::81]]
    assert runs == [("fgd", 1), ("fgd", 2), ("random", 1), ("random", 2)]


def test_openb_subset_ranks_fgd_above_random():
    """A small replay of real trace pods: fgd's allocation at the end beats random's."""
    mapper = openb.ModelMapper()
    nodes = openb.load_nodes(openb_csv("openb_node_list_gpu_node"), mapper)[:120]
    pods = openb.load_pods(openb_csv("openb_pod_list_default"), mapper)[:800]
    state = openb.empty_state(nodes)
    workload = compile_workload(from_tasks(p.shape for p in pods), state.model_names)
    setup = Setup(state, tuple(Task.from_shape(p.shape) for p in pods), workload, 1.3)
    end = {policy: np.mean([replay(setup, policy, seed)[-1].alloc_pct for seed in (1, 2)])
           for policy in ("fgd", "random")}
    assert end["fgd"] > end["random"] + 1.0, end


def test_progress_bar_reports_rate_and_time_left():
    out = io.StringIO()
    bar = ProgressBar(1000, 4, stream=out)
    bar.drawn = -1e9  # draw now
    bar.update({0: 250, 1: 250}, 1)
    bar.finish()
    lines = out.getvalue().splitlines()
    assert "50%" in lines[0] and "500/1,000 pods" in lines[0] and "runs 1/4" in lines[0]
    assert "pods/s" in lines[0] and "left" in lines[0]


def test_seed_lists_and_ranges():
    assert parse_seeds("42,43") == [42, 43]
    assert parse_seeds("42-44") == [42, 43, 44]
    assert parse_seeds("7, 42-43, 7") == [7, 42, 43]


def trace_subset(tmp_path: Path, nodes: int = 40, pods: int = 300) -> tuple[str, str]:
    """The first nodes and pods of the real trace, as small CSVs of the same format."""
    node_csv, pod_csv = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    for target, stem, rows in ((node_csv, "openb_node_list_gpu_node", nodes),
                               (pod_csv, "openb_pod_list_default", pods)):
        with openb.open_text(openb_csv(stem)) as handle:
            target.write_text("".join(handle.readlines()[: rows + 1]))
    return str(node_csv), str(pod_csv)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_replay_command_contract(tmp_path):
    nodes, pods = trace_subset(tmp_path)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "replay", "--nodes", nodes, "--pods", pods,
         "--policy", ",".join(POLICIES), "--seeds", "42,43", "--arrive", "1.3", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "pods/s" in done.stderr  # the progress bar
    with (out / "replay.csv").open() as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = list(reader)
    assert len(rows) == len(POLICIES) * 2 * 131
    keys = {(r["policy"], r["seed"], r["arrived_pct"]) for r in rows}
    assert keys == {(p, s, str(a)) for p in POLICIES for s in ("42", "43") for a in range(131)}
    for row in rows:
        for column in ("alloc_pct", "frag_pct", "frag_ratio_pct"):
            assert 0.0 <= float(row[column]) <= 100.0
        assert int(row["failed_pods"]) >= 0
    width, height = png_size(out / "replay.png")
    assert width > 800 and height > 300
    # the summary names every policy, best allocation first
    assert all(policy in done.stdout for policy in POLICIES)
    assert "At 130% arrived workload, mean of 2 seeds" in done.stdout


def test_replay_on_the_simulated_fleet(tmp_path, capsys):
    _, pods = trace_subset(tmp_path, pods=200)
    out = tmp_path / "sim"
    assert main(["replay", "--sim", "--pods", pods, "--policy", "fgd,bestfit", "--arrive", "0.3",
                 "--out", str(out), "--jobs", "1", "--no-progress"]) == 0
    assert "the simulated fleet" not in capsys.readouterr().err
    rows = list(csv.DictReader((out / "replay.csv").open()))
    assert len(rows) == 2 * 31
    assert rows[-1]["arrived_pct"] == "30"
    assert float(rows[-1]["alloc_pct"]) == pytest.approx(30, abs=0.5)  # 1,088 GPUs: everything fits


@pytest.mark.parametrize(("argv", "message"), [
    (["--policy", "fgd,worst"], "--policy: unknown worst"),
    (["--seeds", "4x"], "--seeds: expected numbers"),
    (["--arrive", "0"], "--arrive: must be in (0, 10]"),
    (["--sim"], "give either --nodes NODES.csv or --sim"),
    (["--fgd-tie", "2"], "--fgd-tie: must be in [0, 1]"),
    (["--fgd-tie-rel", "-0.1"], "--fgd-tie-rel: must be in [0, 1]"),
    (["--node-order", "random"], "--node-order: one of name, seeded, got 'random'"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    nodes, pods = trace_subset(tmp_path, nodes=5, pods=20)
    assert main(["replay", "--nodes", nodes, "--pods", pods, "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("gpufleet: ")


def test_bad_trace_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,cpu_milli\nx,1\n")
    nodes, _ = trace_subset(tmp_path, nodes=5, pods=1)
    assert main(["replay", "--nodes", nodes, "--pods", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "missing column(s)" in capsys.readouterr().err


def test_every_pod_list_of_the_trace_loads():
    """Replay takes any openb_pod_list_*.csv[.gz]; the multigpu ones have no gpu_spec column."""
    files = sorted(TRACE.glob("openb_pod_list_*.csv*"))
    assert len(files) == 24  # every pod list the trace publishes: the default and 23 variants
    for path in files:
        pods = openb.load_pods(path)
        assert len(pods) > 1000, path.name
        assert sum(p.gpus * p.gpu_share for p in pods) > 0, path.name
    multi = openb.load_pods(openb_csv("openb_pod_list_multigpu50"))
    assert any(p.gpus == 8 for p in multi) and all(p.models == () for p in multi)


def test_replay_node_order_seeded(tmp_path, capsys):
    """``--node-order seeded`` runs the same pods on the nodes in the seed's order: packing
    sends its first CPU-only pods elsewhere than the first node by name."""
    ends = {}
    for order in ("name", "seeded"):
        assert main(["replay", "--policy", "packing", "--arrive", "0.3", "--node-order", order,
                     "--out", str(tmp_path / order), "--jobs", "1", "--no-progress"]) == 0
        out = capsys.readouterr().out
        assert ("nodes in a seeded order" in out) == (order == "seeded")
        rows = list(csv.DictReader((tmp_path / order / "replay.csv").open()))
        ends[order] = float(rows[-1]["frag_pct"])
    assert ends["name"] != ends["seeded"]


def test_replay_with_no_file_runs_the_built_in_trace(tmp_path, capsys):
    assert main(["replay", "--policy", "fgd", "--arrive", "0.05", "--out", str(tmp_path / "o"),
                 "--jobs", "1", "--no-progress"]) == 0
    rows = list(csv.DictReader((tmp_path / "o" / "replay.csv").open()))
    assert [r["arrived_pct"] for r in rows] == [str(p) for p in range(6)]
    assert float(rows[-1]["alloc_pct"]) == pytest.approx(5, abs=0.5)
    assert "openb_pod_list_default.csv.gz on openb_node_list_gpu_node.csv.gz" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--trace", "openb-nope"], "--trace: trace 'openb-nope': no openb_pod_list_nope.csv[.gz]"),
    (["--trace", "default"], "--trace: unknown trace 'default': name one as openb-<variant>"),
    (["--trace", "openb-../x"], "--trace: unknown trace 'openb-../x'"),
    (["--trace", "openb-default", "--pods", "p.csv"], "no --nodes or --pods with it"),
    (["--nodes", "n.csv"], "--nodes needs --pods PODS.csv"),
])
def test_trace_usage_errors(tmp_path, capsys, argv, message):
    assert main(["replay", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_out_never_writes_through_a_planted_link_or_into_a_fifo(tmp_path, capsys, planted):
    """``replay --out`` wrote through a symlinked replay.csv (to wherever it pointed); a FIFO
    there would have hung the write after the whole run."""
    nodes, pods = trace_subset(tmp_path, nodes=5, pods=20)
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("keep me\n")
    if planted == "link":
        (out / "replay.csv").symlink_to(victim)
    else:
        os.mkfifo(out / "replay.csv")
    argv = ["replay", "--nodes", nodes, "--pods", pods, "--policy", "bestfit", "--arrive", "0.2",
            "--out", str(out), "--jobs", "1", "--no-progress"]
    assert main(argv) == 2
    what = "a symbolic link" if planted == "link" else "not a regular file"
    assert capsys.readouterr().err == (f"gpufleet: --out {out}: replay.csv is {what}; not "
                                       "written through it (remove it, or pick another folder)\n")
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in out.iterdir()) == ["replay.csv"]  # nothing else written


def test_write_out_replaces_a_link_that_appears_during_the_run(tmp_path):
    from exporter.cli.replay import write_out

    victim, target = tmp_path / "victim.txt", tmp_path / "replay.csv"
    victim.write_text("keep me\n")
    target.symlink_to(victim)  # planted after out_dir() looked
    write_out(target, lambda path: path.write_text("rows\n"))
    assert victim.read_text() == "keep me\n"
    assert not target.is_symlink() and target.read_text() == "rows\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.csv", "victim.txt"]


@pytest.mark.parametrize(("argv", "name"), [
    (["simulate", "--days", "0.01"], "outcomes.csv"),
    (["simulate", "--days", "0.01"], "timeline.png"),
    (["load", "--series", "s.csv", "--capacity", "c.csv"], "load.png"),
])
def test_simulate_and_load_refuse_a_planted_link_in_out_too(tmp_path, capsys, argv, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(tmp_path / "victim")
    if argv[0] == "load":
        (tmp_path / "s.csv").write_text("hour,p\n0,8\n1,8\n")
        (tmp_path / "c.csv").write_text("pool,total_gpus\np,64\n")
        argv = [a if not a.endswith(".csv") else str(tmp_path / a) for a in argv]
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"gpufleet: --out {out}: {name} is a symbolic link; not "
                                       "written through it (remove it, or pick another folder)\n")
    assert not (tmp_path / "victim").exists()
