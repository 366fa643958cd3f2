"""The preemption advice (issue 43, Build 4): the victims for the blocked high-priority head, with
the work each would lose, the spot quota per pool, and their rendering for Slurm and Kubernetes."""

from __future__ import annotations

import json

import pytest

from exporter.preemption.advice import (
    AdviceFormatError,
    AdviceSettings,
    QuotaTracker,
    advise,
    choose,
    evictions,
    lost_seconds,
    slurm_lines,
    to_json,
)
from exporter.snapshot import Allocation, FleetSnapshot, Gpu, JobRequest, Node, Placement
from tests.test_advisor_api import advisor_client as advisor_client  # the fixture, reused

NOW = 1_000_000.0
MIN = 60.0


def node(name: str, gpus: int = 8, pool: str = "p") -> tuple[Node, list[Gpu]]:
    return (Node(name, "H100", 64.0, pool, "hopper", gpus),
            [Gpu(name, i, f"u-{name}-{i}", "H100", pool) for i in range(gpus)])


def alloc(job: str, node_name: str, gpus: range, priority: int = 0, started_min_ago: float = 120.0,
          checkpoint_min_ago: float | None = None, qos: str = "") -> Allocation:
    return Allocation(job, (Placement(node_name, tuple(gpus), 1.0, 4.0),), namespace="team", pod=f"{job}-0",
                      priority=priority, qos=qos, start_time=NOW - started_min_ago * MIN,
                      last_checkpoint_time=None if checkpoint_min_ago is None
                      else NOW - checkpoint_min_ago * MIN)


def fleet(allocations: list[Allocation], pending: list[JobRequest]) -> FleetSnapshot:
    nodes, gpus = [], []
    for name in ("a", "b", "c"):
        n, g = node(name)
        nodes.append(n)
        gpus += g
    return FleetSnapshot(NOW, tuple(nodes), tuple(gpus), tuple(allocations), tuple(pending))


HEAD = JobRequest("train-hp", 4, pool="p", priority=10, submit_time=NOW - 600)


def test_a_job_preempted_after_40_minutes_with_a_checkpoint_at_30_loses_10():
    job = alloc("s", "a", range(4), started_min_ago=40, checkpoint_min_ago=10)
    assert lost_seconds(job, NOW, 900.0) == pytest.approx(10 * MIN)
    # no checkpoint stated: the last whole 15 minutes of its run (at 30)
    assert lost_seconds(alloc("s", "a", range(4), started_min_ago=40), NOW, 900.0) == pytest.approx(10 * MIN)
    assert lost_seconds(alloc("s", "a", range(4), started_min_ago=40), NOW, None) == pytest.approx(40 * MIN)


def test_the_victims_lose_the_fewest_gpu_hours_and_a_job_at_20_minutes_is_never_preempted():
    snapshot = fleet([
        alloc("spot-old", "a", range(4), started_min_ago=40),  # loses 10 min x 4 GPUs
        alloc("spot-fresh-ckpt", "a", range(4, 8), started_min_ago=300, checkpoint_min_ago=2),  # 2 x 4
        alloc("hp", "b", range(8), priority=10),
        alloc("spot-young", "c", range(8), started_min_ago=20),  # alone it would free a whole node
    ], [HEAD])
    choice = choose(snapshot, NOW)
    assert choice is not None and choice.node == "a" and choice.head == "train-hp"
    [victim] = choice.victims
    assert victim.job == "spot-fresh-ckpt" and victim.lost_seconds == pytest.approx(2 * MIN)
    assert victim.lost_gpu_hours == pytest.approx(4 * 2 / 60)
    assert "spot-young" not in choice.reason


def test_nothing_is_advised_when_the_head_fits_or_only_young_or_higher_jobs_hold_the_gpus():
    fits = fleet([alloc("spot", "a", range(8))], [HEAD])
    assert choose(fits, NOW) is None  # nodes b and c are free
    held = fleet([alloc("hp1", "a", range(8), priority=20), alloc("hp2", "b", range(8), priority=10),
                  alloc("young", "c", range(8), started_min_ago=20)], [HEAD])
    assert choose(held, NOW) is None
    # a spot-QOS job is spot whatever its priority: its pending request is no head
    assert choose(fleet([alloc("x", "a", range(8)), alloc("y", "b", range(8)), alloc("z", "c", range(8))],
                        [JobRequest("low", 4, pool="p", priority=-5)]), NOW) is None


def test_slurm_renders_requeue_or_suspend_as_the_preempt_mode_says_and_kubernetes_an_eviction():
    snapshot = fleet([alloc("101", "a", range(8), started_min_ago=60),
                      alloc("hp", "b", range(8), priority=10),
                      alloc("hp2", "c", range(8), priority=10)], [HEAD])
    section = to_json(advise(snapshot, NOW))
    assert section["preempt"]["victims"][0]["job"] == "101"
    assert slurm_lines(section, "requeue")[1:] == ["scontrol requeue 101"]
    assert slurm_lines(section, "suspend")[1:] == ["scontrol suspend 101"]
    assert slurm_lines(section)[0].startswith("# preemption for train-hp: 1 job(s)")
    [eviction] = evictions(section)
    assert eviction["kind"] == "Eviction" and eviction["apiVersion"] == "policy/v1"
    assert eviction["metadata"]["name"] == "101-0" and eviction["metadata"]["namespace"] == "team"
    with pytest.raises(AdviceFormatError, match="PreemptMode"):
        slurm_lines(section, "cancel")
    assert slurm_lines({"computed_at": 0, "preempt": None, "spot_quota": []}) == []


def test_a_hostile_name_in_a_saved_advice_is_refused_before_any_command_is_written():
    section = {"preempt": {"head": "h", "victims": [{"job": "1; scancel -u root", "node": "a"}]}}
    with pytest.raises(AdviceFormatError, match=r"victims\[0\]\.job"):
        slurm_lines(section)
    with pytest.raises(AdviceFormatError, match="expected a list"):
        evictions({"preempt": {"victims": "all"}})
    with pytest.raises(AdviceFormatError, match="over the limit"):
        evictions({"preempt": {"victims": [{"job": "j", "node": "a"}] * 65}})


def test_the_quota_tracker_gives_spot_jobs_what_high_priority_jobs_leave():
    tracker = QuotaTracker(AdviceSettings())
    for minute in range(0, 4 * 60, 5):  # four hours of 8 high-priority GPUs held and 4 asked
        snapshot = fleet([alloc("hp", "a", range(8), priority=10),
                          alloc("spot", "b", range(8), qos="spot", priority=10)], [HEAD])
        tracker.observe(FleetSnapshot(NOW + minute * MIN, snapshot.nodes, snapshot.gpus,
                                      snapshot.allocations, snapshot.pending))
    [quota] = tracker.quotas()
    assert quota.pool == "p" and quota.capacity_gpus == 24.0
    assert quota.high_now_gpus == pytest.approx(12.0)  # the spot-QOS job counts as spot
    assert quota.quota_gpus == pytest.approx(12.0)
    later = FleetSnapshot(NOW + 4 * 60 * MIN, snapshot.nodes, snapshot.gpus, snapshot.allocations,
                          snapshot.pending)
    section = to_json(advise(later, later.taken_at, tracker))
    assert section["spot_quota"][0]["quota_gpus"] == pytest.approx(12.0)


async def test_serve_s_advice_carries_the_preemption_section_as_the_schema_says(advisor_client):
    from tests.test_openapi import _check

    advice = json.loads(await _check(advisor_client, "GET", "/v1/advice", 200))
    section = advice["preemption"]
    assert section["computed_at"] == advice["snapshot_time"]
    pools = {q["pool"] for q in section["spot_quota"]}
    snapshot = json.loads(await _check(advisor_client, "GET", "/v1/snapshot", 200))
    assert pools == {g["pool"] for g in snapshot["gpus"]}
    for quota in section["spot_quota"]:
        assert 0 <= quota["quota_gpus"] <= quota["capacity_gpus"]


def test_gpufleet_plan_renders_the_saved_advice_s_preemption(tmp_path, capsys):
    from exporter.cli import main

    snapshot = fleet([alloc("4242", "a", range(8), started_min_ago=60),
                      alloc("hp", "b", range(8), priority=10), alloc("hp2", "c", range(8), priority=10)],
                     [HEAD])
    saved = tmp_path / "advice.json"
    saved.write_text(json.dumps({"evaluated_at": NOW, "preemption": to_json(advise(snapshot, NOW))}))
    assert main(["plan", "--from", str(saved), "--format", "slurm", "--preemption",
                 "--preempt-mode", "suspend"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["scontrol suspend 4242"] and out[0].startswith("# preemption for train-hp")
    assert main(["plan", "--from", str(saved), "--format", "kubernetes", "--preemption"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["metadata"] == {"name": "4242-0", "namespace": "team",
                                            "annotations": {"gpufleet.io/reason": "preemption"}}
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps({"evaluated_at": NOW, "preemption": {
        "preempt": {"head": "h", "victims": [{"job": "$(reboot)", "node": "a"}]}}}))
    assert main(["plan", "--from", str(hostile), "--format", "slurm", "--preemption"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "victims[0].job" in captured.err
    assert main(["plan", "--from", str(saved), "--format", "json", "--preemption"]) == 2
