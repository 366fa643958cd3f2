"""LastGood: remember a reading, serve it stale, forget it after max_age."""

from __future__ import annotations

import doctest

import exporter.sources.lastgood
from exporter.sources.lastgood import LastGood


def stale(value: tuple[str, bool]) -> tuple[str, bool]:
    return (value[0], True)


def test_the_module_example_runs():
    failed, tried = doctest.testmod(exporter.sources.lastgood)
    assert (failed, tried > 0) == (0, True)


def test_nothing_remembered_serves_nothing():
    last: LastGood[str, tuple[str, bool]] = LastGood(stale, max_age=10)
    assert last.recall("a", now=0.0) is None
    assert "a" not in last and len(last) == 0


def test_served_stale_up_to_max_age_inclusive_then_forgotten():
    last: LastGood[str, tuple[str, bool]] = LastGood(stale, max_age=10)
    last.remember("a", ("reading", False), now=100.0)
    assert last.recall("a", now=100.0) == ("reading", True)
    assert last.recall("a", now=110.0) == ("reading", True)  # exactly max_age: still served
    assert last.recall("a", now=110.5) is None
    assert "a" not in last
    assert last.recall("a", now=105.0) is None  # forgotten means gone, whatever the clock says


def test_a_new_reading_restarts_the_deadline_and_the_stored_value_stays_fresh():
    last: LastGood[str, tuple[str, bool]] = LastGood(stale, max_age=10)
    last.remember("a", ("old", False), now=0.0)
    last.remember("a", ("new", False), now=8.0)
    assert last.recall("a", now=17.0) == ("new", True)
    assert last.recall("a", now=17.0) == ("new", True)  # stale() runs on a copy each time


def test_without_max_age_it_is_kept_until_forgotten():
    last: LastGood[int, tuple[str, bool]] = LastGood(stale)
    last.remember(0, ("gpu0", False), now=0.0)
    last.remember(1, ("gpu1", False), now=0.0)
    assert last.recall(0, now=1e9) == ("gpu0", True)
    last.forget(0)
    last.forget(7)  # unknown keys are fine
    assert list(last) == [1]


def test_keys_may_be_recalled_or_forgotten_while_iterating():
    last: LastGood[str, tuple[str, bool]] = LastGood(stale, max_age=5)
    for key, at in (("a", 0.0), ("b", 10.0), ("c", 0.0)):
        last.remember(key, (key, False), now=at)
    served = {key: last.recall(key, now=12.0) for key in last}
    assert served == {"a": None, "b": ("b", True), "c": None}
    assert list(last) == ["b"]
