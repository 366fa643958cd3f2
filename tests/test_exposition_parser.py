"""The fast exposition line parser, on literals and against prometheus_client on real bodies."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.dcgm.exposition_parser import parse_text
from tests.helpers import data_dir

SAMPLES = sorted((data_dir() / "dcgm-samples").glob("*.prom"))


def test_the_shared_samples_are_there():
    assert [p.name for p in SAMPLES] == [
        "a100-mig-docs.prom", "h100-8gpu-k8s-pod-labels.prom", "l4-1gpu-default-counters.prom"]


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_same_samples_as_prometheus_client(path):
    text = path.read_text()
    ours = parse_text(text)
    theirs = [(s.name, s.labels, s.value)
              for family in text_string_to_metric_families(text) for s in family.samples]
    assert ours.errors == 0
    assert len(ours.samples) == len(theirs)
    for (name, labels, value), (their_name, their_labels, their_value) in zip(
            ours.samples, theirs, strict=True):
        # prometheus_client believes "# TYPE ... counter" and appends _total; we keep the raw name
        assert their_name in (name, f"{name}_total")
        assert (labels, value) == (their_labels, their_value)


def test_go_float_formats_and_specials():
    result = parse_text("a 16.365000\nb 0.000000\nc 4742776\nd +Inf\ne -Inf\nf NaN\ng 1e-3\n")
    values = {name: value for name, _, value in result.samples}
    assert values["a"] == 16.365 and values["b"] == 0 and values["c"] == 4742776
    assert values["d"] == math.inf and values["e"] == -math.inf and math.isnan(values["f"])
    assert values["g"] == 0.001
    assert result.errors == 0


def test_escapes_timestamps_and_trailing_comma():
    result = parse_text(
        'm{path="C:\\\\dir",msg="say \\"hi\\"",nl="a\\nb",} 1 1700000000000\n'
        'm{a="x,y",b="}",c="p=q"} 2\n'
        "m 3 -5\n")
    assert result.errors == 0
    assert result.samples == [
        ("m", {"path": "C:\\dir", "msg": 'say "hi"', "nl": "a\nb"}, 1.0),
        ("m", {"a": "x,y", "b": "}", "c": "p=q"}, 2.0),
        ("m", {}, 3.0),
    ]


def test_comments_blank_lines_crlf_and_leading_space_are_fine():
    result = parse_text("# HELP m x\n# TYPE m gauge\n\r\nm{a=\"1\"} 1\r\n   m 2\n  # note\n")
    assert result.errors == 0
    assert [v for _, _, v in result.samples] == [1.0, 2.0]


@pytest.mark.parametrize("line", [
    'm{a="1"',                 # truncated before the closing brace
    'm{a="1} 2',               # unterminated value
    'm{a="1"} ',               # no value
    "m",                       # no value at all
    'm{a="1"} 1 2 3',          # too many fields
    'm{a="1"} 1 12.5',         # a timestamp must be an integer
    'm{a="1"} one',            # not a number
    "m 1_000",                 # Python would take it, the format does not
    '9m{a="1"} 1',             # bad metric name
    'm{9a="1"} 1',             # bad label name
    'm{a:b="1"} 1',            # ':' is allowed in metric names, not label names
    'm{a="1",a="2"} 1',        # duplicate label
    'm{a=1} 1',                # unquoted value
    'm{a="1" b="2"} 1',        # missing comma
    '{a="1"} 1',               # no name
    'm{a="x\\"} 1',            # escaped quote leaves the value open
])
def test_bad_lines_are_skipped_and_counted(line):
    result = parse_text(f"good 1\n{line}\nalso_good 2\n")
    assert [name for name, _, _ in result.samples] == ["good", "also_good"]
    assert result.errors == 1
    assert result.first_error.strip() == line.strip()


def test_repeated_label_sets_are_parsed_once_and_shared():
    labels = 'gpu="0",UUID="GPU-1",Hostname="n1"'
    result = parse_text(f"a{{{labels}}} 1\nb{{{labels}}} 2\n")
    assert result.samples[0][1] is result.samples[1][1]
    assert result.samples[0][1] == {"gpu": "0", "UUID": "GPU-1", "Hostname": "n1"}
