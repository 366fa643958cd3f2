"""What a job says about itself, on literals: memory quantities, checkpoint times, comments."""

from __future__ import annotations

import pytest

from exporter.sources.job_hints import (
    JobHints,
    from_annotations,
    from_comment,
    parse_quantity,
    parse_time,
    slurm_priority,
)


@pytest.mark.parametrize(("text", "value"), [
    ("100Gi", 100 * 2**30),
    ("80G", 80 * 10**9),
    ("80000M", 80 * 10**9),
    ("1.5Ti", int(1.5 * 2**40)),
    ("512Mi", 512 * 2**20),
    ("1e9", 10**9),
    ("42949672960", 40 * 2**30),
    (" 100Gi ", 100 * 2**30),
])
def test_quantities(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", [
    "", "Gi", "-1Gi", "0", "100GB", "100gi", "1e99", "100Pi", "nan", "inf", "1" * 41, "100m",
])
def test_what_is_not_a_quantity_is_none(text):
    assert parse_quantity(text) is None


def test_times():
    assert parse_time("1764547200") == 1764547200.0
    assert parse_time("2026-12-01T00:00:00Z") == 1796083200.0
    assert parse_time("2026-12-01T01:00:00+01:00") == 1796083200.0
    assert parse_time("2026-12-01T00:00:00") is None  # no zone: whose clock?
    assert parse_time("yesterday") is None


def test_annotations():
    hints = from_annotations({"gpu-memory-required": "100Gi",
                              "gpufleet.io/last-checkpoint": "2026-12-01T00:00:00Z"})
    assert hints == JobHints(100 * 2**30, 1796083200.0)
    assert from_annotations({}) == JobHints()
    assert from_annotations({"gpu-memory-required": "lots"}) == JobHints()


def test_slurm_comments():
    assert from_comment("gpu-memory-required=100Gi") == JobHints(100 * 2**30, None)
    assert from_comment("team=nlp;gpu-memory-required=100Gi,last-checkpoint=1764547200") == \
        JobHints(100 * 2**30, 1764547200.0)
    assert from_comment("gpu-memory-required=60G gpu-memory-required=100G") == JobHints(60 * 10**9)
    assert from_comment("nothing here") == JobHints()
    # only the first 4 KiB of a comment is read
    assert from_comment("x" * 4096 + " gpu-memory-required=1Gi") == JobHints()
    # a site may use its own key
    assert from_comment("mem=20Gi", memory_key="mem") == JobHints(20 * 2**30)


@pytest.mark.parametrize(("qos", "priority"), [
    ("high", 1000), ("normal", 100), ("low", 10), ("", 0), ("debug", 0), (" high ", 1000),
])
def test_slurm_priority_is_the_qos_on_gpufleets_scale(qos, priority):
    assert slurm_priority(qos) == priority
    assert slurm_priority(qos, {"debug": 7}) == (7 if qos == "debug" else 0)


def test_a_sites_qos_priorities_come_from_the_config_and_are_checked(tmp_path):
    from exporter.config import Config, ConfigError, build
    from exporter.sources import SourceStartupError
    from exporter.sources.slurm.source import build as build_source

    for name in ("squeue", "sinfo", "scontrol"):  # build() looks for the clients, runs none
        (tmp_path / name).write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / name).chmod(0o755)

    def slurm(qos_priorities):
        data = {"sources": {"slurm": {"enabled": True, "bin_dir": str(tmp_path),
                                      "qos_priorities": qos_priorities}}}
        return build(Config, data).sources.slurm

    source = build_source(slurm([{"qos": "urgent", "priority": 5000}, {"qos": "normal",
                                                                     "priority": 100}]), float)
    assert source._qos == {"urgent": 5000, "normal": 100}
    assert build_source(slurm([]), float)._qos == {}  # every job 0: all movable
    with pytest.raises(ConfigError, match=r"sources\.slurm\.qos_priorities\[0\]\.priority"):
        slurm([{"qos": "high", "priority": -1}])
    with pytest.raises(SourceStartupError, match=r"sources\.slurm\.qos_priorities: each qos may "
                                                 r"be listed once"):
        build_source(slurm([{"qos": "high", "priority": 1000}, {"qos": "high", "priority": 1}]),
                     float)
