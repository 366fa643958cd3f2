"""The per-node free GPU counts the scheduler and the wait split keep (``FreeCounts``), brought
up to date from the placer's log, answer as a count of the whole fleet would, at every use in
busy random runs; one that ignores the log is caught; and the runs' outcomes are those of a
count made afresh at every use."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.state import EPS
from exporter.outcome_sim import free_counts
from exporter.outcome_sim.free_counts import FreeCounts, share_needed
from tests.test_simulate_speed_memory import busy_run

STRATEGIES = ("none", "oracle", "consolidate")


def fresh_counts(counter: FreeCounts, need: float) -> np.ndarray:
    return np.count_nonzero(counter.placer.gpu_free >= need - EPS, axis=1)


def fresh_table(counter: FreeCounts, need: float) -> list[list[int]]:
    placer = counter.placer
    top = placer.gpu_free.shape[1]
    counts = fresh_counts(counter, need)
    return [[int(((placer.model == m) & (counts >= g)).sum()) for g in range(top + 1)]
            for m in range(len(placer.model_names))]


class Checked:
    """Every answer compared with a fresh count; ``broken``: the log ignored (the counts kept
    from the first time, whatever changed since)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, broken: bool = False) -> None:
        self.checks = self.differ = self.most_needs = 0
        checked = self
        counts, at_least, sync = FreeCounts.counts, FreeCounts.at_least, FreeCounts._sync

        def stale_sync(self: FreeCounts) -> None:
            if self._clock < 0:
                sync(self)
            self._clock = self.placer.changes

        def checked_counts(self: FreeCounts, need: float) -> np.ndarray:
            found = counts(self, need)
            checked.checks += 1
            checked.most_needs = max(checked.most_needs, len(self._rows))
            checked.differ += not np.array_equal(found, fresh_counts(self, need))
            return found

        def checked_at_least(self: FreeCounts, need: float) -> list[list[int]]:
            found = at_least(self, need)
            checked.checks += 1
            checked.differ += found != fresh_table(self, need)
            return found

        monkeypatch.setattr(FreeCounts, "counts", checked_counts)
        monkeypatch.setattr(FreeCounts, "at_least", checked_at_least)
        if broken:
            monkeypatch.setattr(FreeCounts, "_sync", stale_sync)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", [1, 2])
def test_each_count_kept_is_the_count_of_the_whole_fleet(case, strategy, monkeypatch):
    checked = Checked(monkeypatch)
    busy_run(case, strategy)
    assert checked.checks > 1000
    assert checked.most_needs == 3  # a whole GPU, a half and a quarter, brought up to date together
    assert checked.differ == 0


def test_counts_that_ignore_the_placer_log_are_caught(monkeypatch):
    checked = Checked(monkeypatch, broken=True)
    busy_run(1, "none")
    assert checked.differ > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_kept_counts_change_no_outcome(strategy, monkeypatch):
    kept = busy_run(3, strategy)

    def afresh(self: FreeCounts) -> None:  # every node counted again at every use
        self.forget()
        self._clock = self.placer.changes

    monkeypatch.setattr(FreeCounts, "_sync", afresh)
    assert busy_run(3, strategy) == kept


def test_past_the_changes_read_one_by_one_every_node_is_counted_again(monkeypatch):
    monkeypatch.setattr(free_counts, "MAX_CHANGED", 0)  # every change: a count of the fleet
    checked = Checked(monkeypatch)
    busy_run(1, "none")
    assert checked.checks > 1000
    assert checked.differ == 0


def test_a_part_needs_a_whole_gpu_free_from_a_share_of_one_down():
    assert share_needed(1.0) == 1.0
    assert share_needed(1.0 - EPS / 2) == 1.0
    assert share_needed(0.5) == 0.5
