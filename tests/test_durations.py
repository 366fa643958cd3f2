"""The one duration parser: Prometheus' grammar for the threshold table, plus the config
file's numbers and decimals."""

from __future__ import annotations

import pytest

from exporter.durations import HINT, format_duration, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("5m", 300), ("1h", 3600), ("1h30m", 5400), ("250ms", 0.25), ("2d", 172800),
    ("1w", 7 * 86400), ("1y", 365 * 86400), ("1d2h3m4s5ms", 93784.005), ("0s", 0),
])
def test_durations_parse_like_prometheus(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)
    assert parse_duration(text, config=True) == pytest.approx(seconds)  # the config takes them too


@pytest.mark.parametrize("text", ["", "1 hour", "5", "1.5h", "m5", "5M", "1h 30m", "-5m", "30m1h",
                                  "1h1h", "-", 5, 2.5, None, True, [], " 5m"])
def test_malformed_durations_are_rejected(text):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == HINT == "a duration such as 30s, 5m or 1h30m"


@pytest.mark.parametrize(("value", "seconds"), [
    ("250ms", 0.25), ("15s", 15), ("5m", 300), ("1h", 3600), (7, 7.0), (2.5, 2.5), ("30", 30),
    ("1.5h", 5400), ("0.5s", 0.5), (" 5m ", 300), ("-5s", -5), ("1h30m", 5400),
])
def test_the_config_also_takes_numbers_decimals_and_a_sign(value, seconds):
    """A YAML number is seconds; the sign is parsed so the range check can name it."""
    assert parse_duration(value, config=True) == seconds


@pytest.mark.parametrize("value", ["soon", "", "-", "1 h", True, None, "5M", "1e3",
                                   float("nan"), float("inf"), -float("inf"), "1" + "0" * 400,
                                   "1" + "0" * 400 + "s"])
def test_the_config_rejects_what_is_no_duration(value):
    with pytest.raises(ValueError, match=HINT):
        parse_duration(value, config=True)


@pytest.mark.parametrize(("seconds", "text"), [
    (3600, "1h"), (36, "36s"), (72, "1m12s"), (5400, "1h30m"), (1.2, "1s200ms"), (0.5, "500ms"),
    (0, "0s"), (86400 * 2, "2d"),
])
def test_durations_format_in_the_shortest_prometheus_form(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_prometheus_durations_are_finite():
    with pytest.raises(ValueError, match=HINT):
        parse_duration("1" + "0" * 400 + "y")
