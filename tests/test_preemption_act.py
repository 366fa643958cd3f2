"""``gpufleet act --preemption`` (issue 43, Build 4): the advice's victims under remediation's modes,
an hourly budget and the audit log; against a real Slurm, ``scontrol requeue`` requeues the job
and a replay of the same advice does not requeue it twice."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.preemption.act import PreemptActor, PreemptError
from tests.helpers.slurm_cluster import SlurmCluster, running_cluster

NOW = 2_000_000.0


def section(*jobs: str, at: float = NOW) -> dict:
    return {"computed_at": at, "spot_quota": [], "preempt": {
        "head": "hp-1", "pool": "p", "head_gpus": 8, "head_priority": 10, "node": "gpu-001",
        "lost_gpu_hours": 0.1, "reason": "r",
        "victims": [{"job": j, "namespace": "", "pod": "", "node": "gpu-001", "gpus": 1.0, "priority": 0,
                     "ran_seconds": 3600.0, "lost_seconds": 60.0, "lost_gpu_hours": 0.02} for j in jobs]}}


def actor(mode: str, tmp_path: Path, **kw) -> tuple[PreemptActor, io.StringIO]:
    out = io.StringIO()
    return PreemptActor(mode, tmp_path / "audit.jsonl", out, clock=lambda: NOW + 10, notes=io.StringIO(),
                        **kw), out


def audit(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def test_observe_and_dry_run_say_what_they_would_do_and_run_nothing(tmp_path):
    # a scontrol that does not exist: were it run, the record would be a failure
    a, out = actor("dry-run", tmp_path, scontrol=str(tmp_path / "no-scontrol"), preempt_mode="suspend")
    records = a.apply(section("11", "12"))
    assert [r["outcome"] for r in records] == ["printed", "printed"]
    assert out.getvalue().splitlines() == ["scontrol suspend 11", "scontrol suspend 12"]
    a, out = actor("observe", tmp_path)
    assert [r["outcome"] for r in a.apply(section("11"))] == ["observed"]
    assert "would scontrol requeue 11 (for hp-1)" in out.getvalue()
    assert [r["outcome"] for r in audit(tmp_path)] == ["printed", "printed", "observed"]


def test_a_stale_advice_a_hostile_name_and_an_unknown_mode_are_refused(tmp_path):
    a, _ = actor("act", tmp_path)
    with pytest.raises(PreemptError, match="computed 610 s ago"):
        a.apply(section("11", at=NOW - 600))
    with pytest.raises(PreemptError, match=r"victims\[0\]\.job"):
        a.apply(section("11 --all"))
    # a node may name its job anything: a name scontrol expands would preempt every job
    for hostile in ("ALL", "all", "gpu-001", "11.0"):
        with pytest.raises(PreemptError, match=f"'{hostile}' is not a Slurm job id"):
            a.apply(section("11", hostile))
    for listed in ("11,12", "11_[1-3]"):  # lists and ranges are no names at all
        with pytest.raises(PreemptError, match="is not a job, pod or node name"):
            a.apply(section("11", listed))
    assert not (tmp_path / "audit.jsonl").exists()  # nothing acted on, not even job 11
    from exporter.preemption.advice import AdviceFormatError, slurm_lines

    with pytest.raises(AdviceFormatError, match="not a Slurm job id"):
        slurm_lines(section("ALL"))
    assert slurm_lines(section("11", "12_3"))[1:] == ["scontrol requeue 11", "scontrol requeue 12_3"]
    with pytest.raises(PreemptError, match="PreemptMode"):
        actor("act", tmp_path, preempt_mode="cancel")
    assert a.apply({"computed_at": NOW, "preempt": None, "spot_quota": []}) == []


def test_a_failed_scontrol_is_one_line_in_the_audit_log(tmp_path):
    a, _ = actor("act", tmp_path, scontrol=str(tmp_path / "no-scontrol"))
    [record] = a.apply(section("11"))
    assert record["outcome"] == "failed" and "\n" not in record["error"]


def test_the_cli_wants_slurm_and_an_advice_url(capsys):
    from exporter.cli import main

    assert main(["act", "--kubernetes", "--preemption", "--from", "http://127.0.0.1:1"]) == 2
    assert "--preemption" in capsys.readouterr().err
    assert main(["act", "--slurm", "--preemption", "--events", "-"]) == 2
    assert main(["act", "--slurm", "--preemption", "--preemptions-per-hour", "0",
                 "--from", "http://127.0.0.1:1"]) == 2


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    with running_cluster(Path(tmp_path_factory.mktemp("slurm"))) as cluster:
        yield cluster


@pytest.mark.slow  # a real Slurm (slurmctld, slurmd, munge)
def test_act_requeues_the_victims_on_a_real_slurm_once_within_the_budget(slurm, tmp_path):
    first = slurm.sbatch("-p", "gpu-h100", "--gres=gpu:h100:1")
    second = slurm.sbatch("-p", "gpu-h100", "--gres=gpu:h100:1")
    slurm.wait_states({first: "RUNNING", second: "RUNNING"})
    a, _ = actor("act", tmp_path, env=slurm.env, per_hour=1)
    records = a.apply(section(first, second))
    assert [r["outcome"] for r in records] == ["done", "skipped"]  # the budget: one an hour
    assert records[1]["detail"] == "over the hourly budget"
    shown = slurm.run("scontrol", "show", "job", "-o", first)
    assert "Restarts=1" in shown
    # the same advice replayed by a new run: done already, not requeued again
    again, _ = actor("act", tmp_path, env=slurm.env, per_hour=5)
    assert [r["outcome"] for r in again.apply(section(first))] == ["skipped"]
    assert "Restarts=1" in slurm.run("scontrol", "show", "job", "-o", first)
    slurm.run("scancel", first, second, check=False)
