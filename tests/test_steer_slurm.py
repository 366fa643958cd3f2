"""Steering on Slurm (issue 42, Build 2): the advice's placement preferences as node weights.

The advisor computes every node's Slurm ``Weight`` from FGD (exporter/advisor/steer.py) when
it evaluates, at most once per interval, and /v1/advice carries them grouped by level;
``gpufleet plan --format slurm`` prints the updates and ``gpufleet act --slurm --from``
applies them on a real Slurm, within its budget of updates a minute, leaving a weight an
operator set alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest

from exporter.advisor import openapi, steer
from exporter.advisor.advice import Advice
from exporter.advisor.advise import Steerer, steering_of
from exporter.advisor.wire import advice_json, steering_weights
from exporter.analysis.fgd import compile_workload
from exporter.analysis.index import evaluate
from exporter.analysis.state import build
from exporter.analysis.workload import Shape, from_weighted
from tests.helpers import REPO
from tests.helpers.slurm_cluster import H100_NODES, H200_NODES, SlurmCluster, running_cluster

NAMES = ("empty", "three-free", "full", "six-free", "a100-empty")
FREE = ([1.0] * 8, [1.0] * 3 + [0.0] * 5, [0.0] * 8, [1.0] * 6 + [0.0] * 2, [1.0] * 8)


def _report():
    # and a node without GPUs, which is not steered
    state = build((*NAMES, "cpu-only"), ("H100",) * 4 + ("A100-80GB", ""),
                  ("gpu-h100",) * 4 + ("gpu-a100", "cpu"), [128.0] * 6,
                  [128.0, 80.0, 0.0, 100.0, 128.0, 128.0], (*FREE, []))
    workload = from_weighted([(Shape(8.0, 1.0, 1), 0.7), (Shape(16.0, 1.0, 2), 0.1),
                              (Shape(64.0, 1.0, 8), 0.2)])
    return evaluate(state, compile_workload(workload, state.model_names))


def _advice(steering) -> Advice:
    return Advice(evaluated_at=100.0, snapshot_time=90.0, trigger="snapshot", scopes={},
                  decision="none", reasons=("fine",), steering=steering)


def test_the_advice_carries_every_nodes_weight_by_level_and_the_schema_holds_it():
    report = _report()
    steering = steering_of(report, 100.0, 90.0)
    prefs = {p.node: p for p in steer.preferences(report.state, report.workload)}
    data = advice_json(_advice(steering))["steering"]
    schema = {**openapi.document(), "$ref": "#/components/schemas/Advice"}
    jsonschema.Draft202012Validator(schema).validate(advice_json(_advice(steering)))
    assert data["computed_at"] == 100.0 and data["snapshot_time"] == 90.0
    assert data["default_weight"] == 1 and data["gpu_hours_waiting_saved"] is None
    weights = [level["weight"] for level in data["levels"]]
    assert weights == sorted(set(weights))  # ascending, each level once
    # every GPU node once, at the weight steer gives it; the node without GPUs left out
    # (weighted last, it would send CPU-only jobs to the GPU nodes first)
    assert steering_weights(data) == {n: p.weight for n, p in prefs.items() if n != "cpu-only"}
    assert sorted(n for level in data["levels"] for n in level["nodes"]) == sorted(NAMES)
    worst = data["levels"][-1]
    assert worst["weight"] == steer.WEIGHT_WORST and "full" in worst["nodes"]
    best = data["levels"][0]
    assert best["weight"] == 1 and "three-free" in best["nodes"]
    at_best = [p.growth for p in prefs.values() if p.weight == 1]
    assert best["expected_growth"] == {"min": round(min(at_best), 6), "max": round(max(at_best), 6)}
    assert worst["expected_growth"]["max"] is not None  # "full" (none fits) is left out of it


def test_the_steering_is_computed_at_most_once_per_interval():
    report = _report()
    steerer = Steerer(every=300.0)
    first = steerer(report, 1000.0, 990.0)
    assert steerer(report, 1299.0, 1290.0) is first  # carried: not paid again
    again = steerer(report, 1300.0, 1290.0)
    assert again is not first and again.computed_at == 1300.0 and again.snapshot_time == 1290.0
    assert steerer(report, 900.0, 890.0).computed_at == 900.0  # a clock set back: recomputed


def test_the_advisor_stage_carries_the_weights_and_forgets_them_while_blind():
    from exporter.advisor.advise import Planner
    from exporter.advisor.engine import Advisor, DecisionSettings
    from exporter.cycle.frame import Frame
    from exporter.cycle.stages import AdvisorStage
    from exporter.fleet_sim.fleet import Simulation
    from exporter.sources.sim.options import SimSource
    from tests.test_advisor_sim import START, report_of

    sim = Simulation(SimSource(seed=1), START)
    snapshot = sim.snapshot()
    frame = Frame(snapshot, report=report_of(snapshot))
    clock = [START]
    stage = AdvisorStage(Advisor(DecisionSettings(), clock=lambda: clock[0]), Planner(),
                         steerer=Steerer(every=300.0))
    first = stage.step(frame).advice.steering
    assert first is not None and first.computed_at == START and first.snapshot_time == snapshot.taken_at
    assert sorted(n for level in first.levels for n in level.nodes) == sorted(n.name for n in snapshot.nodes)
    clock[0] += 60
    assert stage.step(frame).advice.steering is first  # within the interval: carried
    stage.skipped(Frame(snapshot, blind=("sim: down",)))
    clock[0] += 60
    again = stage.step(frame).advice.steering
    assert again is not first and again.computed_at == START + 120  # blind: computed afresh
    # without a steerer (the simulator's stage) the advice carries none
    plain = AdvisorStage(Advisor(DecisionSettings(), clock=lambda: clock[0]), Planner())
    assert plain.step(frame).advice.steering is None


@pytest.mark.parametrize(("levels", "message"), [
    ([{"weight": 11, "nodes": ["a"]}], "steering.levels[0].weight: expected an integer 1..10"),
    ([{"weight": True, "nodes": ["a"]}], "steering.levels[0].weight: expected an integer 1..10"),
    ([{"weight": 2, "nodes": ["ALL"]}], "'ALL' is reserved by Slurm"),
    ([{"weight": 2, "nodes": ["gpu-[1-4]"]}], "'gpu-[1-4]' is not a node name"),
    ([{"weight": 2, "nodes": ["a"]}, {"weight": 3, "nodes": ["a"]}], "a is in two levels"),
    ("x", "steering.levels: expected a list"),
])
def test_a_steering_section_that_does_not_hold_together_is_refused(levels, message):
    with pytest.raises(ValueError, match=None) as caught:
        steering_weights({"levels": levels})
    assert message in str(caught.value)


# --- on a real Slurm ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with running_cluster(Path(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


@pytest.fixture
def advice_server() -> Iterator[tuple[str, dict]]:
    """A /v1/advice on 127.0.0.1 answering whatever the test puts in the dict."""
    served: dict = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(served["advice"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()


def _steering(weights: dict[str, int], age: float = 0.0) -> dict:
    levels: dict[int, list[str]] = {}
    for node, weight in weights.items():
        levels.setdefault(weight, []).append(node)
    return {"computed_at": time.time() - age, "snapshot_time": time.time() - age - 10, "default_weight": 1,
            "levels": [{"weight": w, "nodes": levels[w], "expected_growth": {"min": 0.0, "max": 1.0}}
                       for w in sorted(levels)],
            "gpu_hours_waiting_saved": None}


def _weights(slurm: SlurmCluster) -> dict[str, int]:
    out = slurm.run("scontrol", "show", "node", "-o")
    return {line.split(" ", 1)[0].removeprefix("NodeName="): int(line.split(" Weight=")[1].split(" ")[0])
            for line in out.splitlines() if line.startswith("NodeName=")}


def _act(slurm: SlurmCluster, url: str, audit: Path, mode: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", "act", "--slurm", "--mode", mode,
                           "--from", url, "--audit-log", str(audit), "--weights", *extra],
                          env={**slurm.env, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60, check=False)


def _older(audit: Path, seconds: float) -> None:
    """The audit log as if its updates were made ``seconds`` earlier: the minute passes."""
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    audit.write_text("".join(json.dumps({**r, "time": r["time"] - seconds}) + "\n" for r in records))


@pytest.mark.slow  # a real Slurm (slurmctld, slurmd, munge)
def test_act_applies_the_advised_weights_within_the_budget_and_leaves_an_operators_alone(
        slurm, advice_server, tmp_path):
    url, served = advice_server
    assert set(_weights(slurm).values()) == {1}  # Slurm's default everywhere
    slurm.run("scontrol", "update", "NodeName=gpu-006", "Weight=42")  # an operator's choice
    wanted = {**dict.fromkeys(H200_NODES, 1), "gpu-002": 5, "gpu-003": 10, "gpu-004": 3,
              "gpu-005": 7, "gpu-006": 9, "gpu-007": 2, "gpu-008": 1}
    served["advice"] = {"decision": "none", "reasons": [], "health": {"recent_remediation": []},
                        "steering": _steering({**wanted, "k8s-node-1": 4})}
    audit = tmp_path / "audit.jsonl"

    observed = _act(slurm, url, audit, "observe", "--weights-per-minute", "3")
    assert observed.returncode == 0, observed.stderr
    # observe reads nothing from Slurm: the biggest changes from the default, within the budget
    assert observed.stdout.splitlines() == [
        "weight gpu-003: would run: scontrol update NodeName=gpu-003 Weight=10",
        "weight gpu-006: would run: scontrol update NodeName=gpu-006 Weight=9",
        "weight gpu-005: would run: scontrol update NodeName=gpu-005 Weight=7"]
    assert _weights(slurm)["gpu-003"] == 1
    # dry-run reads Slurm: the operator's node is left out, and nothing changes
    dry = _act(slurm, url, audit, "dry-run", "--weights-per-minute", "3")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == ["scontrol update NodeName=gpu-003 Weight=10",
                                       "scontrol update NodeName=gpu-005 Weight=7",
                                       "scontrol update NodeName=gpu-002 Weight=5"]
    assert set(_weights(slurm).values()) == {1, 42}

    done = _act(slurm, url, audit, "act", "--weights-per-minute", "3")
    assert done.returncode == 0, done.stderr
    assert "gpu-006: Weight=42 left as it is: not set by gpufleet (its last: none)" in done.stderr
    assert "2 weight updates over the budget of 3 a minute: left for the next run" in done.stderr
    assert "1 nodes of the advice are not Slurm's, left out: k8s-node-1" in done.stderr
    weights = _weights(slurm)
    assert weights == {"gpu-001": 1, "gpu-002": 5, "gpu-003": 10, "gpu-004": 1, "gpu-005": 7,
                       "gpu-006": 42, "gpu-007": 1, "gpu-008": 1}  # 3 updates, biggest first

    again = _act(slurm, url, audit, "act", "--weights-per-minute", "3")
    assert again.returncode == 0, again.stderr
    assert "2 weight updates over the budget of 3 a minute" in again.stderr
    assert _weights(slurm) == weights  # the minute's budget is spent: nothing more

    _older(audit, 61)
    rest = _act(slurm, url, audit, "act", "--weights-per-minute", "3")
    assert rest.returncode == 0, rest.stderr
    assert "over the budget" not in rest.stderr
    assert _weights(slurm) == {**wanted, "gpu-006": 42}
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    done_records = [(r["node"], r["weight"], r["previous"]) for r in records
                    if r["type"] == "weight" and r["outcome"] == "done"]
    assert done_records == [("gpu-003", 10, 1), ("gpu-005", 7, 1), ("gpu-002", 5, 1),
                            ("gpu-004", 3, 1), ("gpu-007", 2, 1)]
    assert {r["node"] for r in records if r["outcome"] == "skipped"} == {"gpu-006"}
    assert all(re.fullmatch(rf"weight:{r['node']}:{r['weight']}:\d{{13}}", r["id"]) for r in records)

    # the advice changes: a weight gpufleet set is changed again, back to the default too;
    # one an operator changed since is left alone
    slurm.run("scontrol", "update", "NodeName=gpu-004", "Weight=20")
    served["advice"]["steering"] = _steering({**wanted, "gpu-003": 1, "gpu-004": 8, "gpu-005": 6})
    _older(audit, 61)
    changed = _act(slurm, url, audit, "act")
    assert changed.returncode == 0, changed.stderr
    assert "gpu-004: Weight=20 left as it is: not set by gpufleet (its last: 3)" in changed.stderr
    assert _weights(slurm) == {**wanted, "gpu-003": 1, "gpu-004": 20, "gpu-005": 6, "gpu-006": 42}
    # weights computed long ago (a serve that stopped steering) are not applied
    served["advice"] = {"decision": "none", "reasons": [], "health": {"recent_remediation": []},
                        "steering": _steering({n: 4 for n in H100_NODES + H200_NODES}, age=3600)}
    stale = _act(slurm, url, audit, "act")
    assert stale.returncode == 1 and stale.stdout == ""
    assert re.fullmatch(r"gpufleet act: weights not applied: the advice's steering was computed "
                        r"36\d\d s ago, over 1800 s\n", stale.stderr), stale.stderr
    assert _weights(slurm)["gpu-001"] == 1
    # an advice without health (the health monitor off) still carries its steering
    served["advice"] = {"decision": "none", "reasons": [],
                        "steering": _steering({**wanted, "gpu-003": 1, "gpu-004": 8, "gpu-005": 5})}
    healthless = _act(slurm, url, audit, "act")
    assert (healthless.returncode, healthless.stdout) == (0, ""), healthless.stderr
    assert _weights(slurm)["gpu-005"] == 5
    # without --weights, act leaves them all alone: the events only
    served["advice"] = {"decision": "none", "reasons": [], "health": {"recent_remediation": []},
                        "steering": _steering({n: 4 for n in H100_NODES + H200_NODES})}
    untouched = subprocess.run([sys.executable, "-m", "exporter", "act", "--slurm", "--mode", "act",
                                "--from", url, "--audit-log", str(audit)],
                               env={**slurm.env, "PYTHONPATH": str(REPO)}, capture_output=True,
                               text=True, timeout=60, check=False)
    assert (untouched.returncode, untouched.stdout, untouched.stderr) == (0, "", "")
    assert _weights(slurm)["gpu-001"] == 1


def test_the_weights_per_minute_are_range_checked(tmp_path):
    for value in ("0", "10001"):
        done = subprocess.run([sys.executable, "-m", "exporter", "act", "--slurm", "--from",
                               "http://127.0.0.1:9/", "--weights-per-minute", value,
                               "--audit-log", str(tmp_path / "a.jsonl")], cwd=REPO,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2
        assert done.stderr.strip().endswith(f"--weights-per-minute: must be in [1, 10000], got {value}")
    done = subprocess.run([sys.executable, "-m", "exporter", "act", "--kubernetes", "--from",
                           "http://127.0.0.1:9/", "--weights"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (
        2, "gpufleet: --weights: only with --slurm --from URL (the advice's steering section)\n")


@pytest.mark.slow  # a real Slurm, a real gpufleet serve reading it
def test_a_served_advices_weights_reach_slurm_through_act(slurm, exporter_factory, tmp_path):
    """The whole path: jobs on the real Slurm, ``gpufleet serve`` reading it (the slurm
    source) and steering, ``gpufleet act --weights`` applying its /v1/advice: afterwards
    ``scontrol show node`` shows, for every node, the weight the advice gives it."""
    from tests.helpers.servers import http_get

    slurm.run("scontrol", "update", "NodeName=gpu-[001-008]", "Weight=1")  # the earlier test's
    jobs = [slurm.sbatch("-p", "gpu-h100", "-w", "gpu-005", "--gres=gpu:h100:6"),
            slurm.sbatch("-p", "gpu-h100", "-w", "gpu-006", "--gres=gpu:h100:1"),
            slurm.sbatch("-p", "gpu-h100", "-w", "gpu-007", "--gres=gpu:h100:3")]
    try:
        slurm.wait_states(dict.fromkeys(jobs, "RUNNING"))
        exporter = exporter_factory(config=f"""
collect_interval: 1s
sources:
  sim: {{enabled: false}}
  slurm: {{enabled: true, slurm_conf: {slurm.conf}}}
advisor: {{outbox: {tmp_path / "outbox.sqlite"}}}
""")
        advice: dict = {}
        deadline = time.monotonic() + 60
        while "steering" not in advice:
            assert time.monotonic() < deadline, advice
            advice = json.loads(http_get(f"{exporter.url}/v1/advice"))
            time.sleep(0.2)
        wanted = steering_weights(advice["steering"])
        assert set(wanted) == {f"gpu-00{i}" for i in range(1, 9)}
        # the typical job fills a gap first: the fullest H100 node best, an empty one last
        assert wanted["gpu-005"] < wanted["gpu-007"] < wanted["gpu-006"] < wanted["gpu-008"], wanted
        done = _act(slurm, exporter.url, tmp_path / "audit.jsonl", "act")
        assert done.returncode == 0, done.stderr
        assert _weights(slurm) == wanted
        records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
        assert sorted(r["node"] for r in records if r["outcome"] == "done") == \
            sorted(n for n, w in wanted.items() if w != 1)
    finally:
        slurm.run("scancel", *jobs)
        slurm.run("scontrol", "update", "NodeName=gpu-[001-008]", "Weight=1")
