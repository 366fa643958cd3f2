"""A run collects garbage less often than Python's default (``run._fewer_collections``): the
collector's thresholds are as they were after the run, and the outcome is the one a run at the
default thresholds gives."""

from __future__ import annotations

import gc

from exporter.outcome_sim import run
from tests.test_simulate_speed_memory import busy_run


def test_a_run_puts_the_collector_thresholds_back():
    was = gc.get_threshold()
    try:
        gc.set_threshold(701, 11, 12)
        busy_run(1, "none")
        assert gc.get_threshold() == (701, 11, 12)
    finally:
        gc.set_threshold(*was)


def test_within_a_run_the_young_generation_waits_for_more_objects(monkeypatch):
    seen = []
    scheduler_pass = run.Scheduler.run_pass

    def run_pass(self, now):  # type: ignore[no-untyped-def]
        seen.append(gc.get_threshold()[0])
        return scheduler_pass(self, now)

    monkeypatch.setattr(run.Scheduler, "run_pass", run_pass)
    busy_run(1, "none")
    assert seen and set(seen) == {run.YOUNG_COLLECTION}


def test_collecting_less_often_changes_no_outcome(monkeypatch):
    kept = busy_run(2, "consolidate")
    monkeypatch.setattr(run, "YOUNG_COLLECTION", gc.get_threshold()[0])
    assert busy_run(2, "consolidate") == kept
