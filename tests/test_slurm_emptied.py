"""No blind green (issue 30): Slurm answering with no GPU node, after it listed some, is a
down source with the reason in its status and log, not a healthy empty fleet."""

from __future__ import annotations

import asyncio
import logging

from exporter.collect import Collector
from exporter.sources.slurm.options import SlurmSource as SlurmConfig
from exporter.sources.slurm.source import SlurmAllocationSource
from tests.helpers import REPO

SAMPLES = REPO / "data" / "slurm-samples"
CLOCK = 1_760_000_000.0


def fake_slurm(answers: dict[str, str]):
    async def runner(argv, timeout, env):
        return answers["node" if "node" in argv else "job"]
    return runner


def test_an_emptied_fleet_is_a_down_source(caplog):
    answers = {"node": (SAMPLES / "scontrol_show_node_d_o.txt").read_text(),
               "job": (SAMPLES / "scontrol_show_job_d_o.txt").read_text()}
    source = SlurmAllocationSource(SlurmConfig(enabled=True, format="text"), lambda: CLOCK,
                                   runner=fake_slurm(answers))
    collector = Collector([source], 10, clock=lambda: CLOCK)
    first = asyncio.run(collector.collect())
    assert first.gpus and [(s.source, s.up, s.error) for s in first.sources] == [("slurm", True, "")]
    had = len(first.gpus)
    answers.update(node="", job="")
    with caplog.at_level(logging.WARNING):
        emptied = asyncio.run(collector.collect())
        asyncio.run(collector.collect())
    [status] = emptied.sources
    reason = f"empty fleet: Slurm listed no GPU node, after a read that listed {had} GPUs"
    assert (status.up, status.error) == (False, reason)
    assert emptied.gpus == ()
    logged = [r for r in caplog.records if r.getMessage() == "source returned an empty fleet"]
    assert [(r.source, r.err) for r in logged] == [("slurm", reason)]  # once per outage
    answers.update(node=(SAMPLES / "scontrol_show_node_d_o.txt").read_text())
    back = asyncio.run(collector.collect())
    assert [(s.up, s.error) for s in back.sources] == [(True, "")] and len(back.gpus) == had


def test_a_fleet_empty_from_the_start_is_left_alone():
    source = SlurmAllocationSource(SlurmConfig(enabled=True, format="text"), lambda: CLOCK,
                                   runner=fake_slurm({"node": "", "job": ""}))
    snapshot = asyncio.run(Collector([source], 10, clock=lambda: CLOCK).collect())
    assert [(s.up, s.error) for s in snapshot.sources] == [(True, "")]
