"""Config validation: bad input stops the start with exit 2 and one line naming the key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from exporter.config import Config, ConfigError, Duration, build, load
from tests.conftest import REPO


def _serve(tmp_path, config_text: str, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "gpufleet.yaml"
    path.write_text(config_text)
    # from the test's folder: a start that gets as far as the advisor leaves its outbox there
    return subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config", str(path), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    ("config_text", "key", "allowed"),
    [
        ("collect_intervall: 5s\n", "collect_intervall", "unknown key"),
        ("sources:\n  sim:\n    seed: forty-two\n", "sources.sim.seed", "must be an integer"),
        ("collect_interval: -5s\n", "collect_interval", "must be > 0"),
        ("collect_interval: soon\n", "collect_interval", "must be a duration"),
        ("log:\n  level: chatty\n", "log.level", "must be one of debug, info, warning, error"),
        ("sources:\n  sim:\n    scenarios:\n      - {kind: meteor}\n",
         "sources.sim.scenarios[0].kind", "must be one of"),
        ("listen: nowhere\n", "listen", "HOST:PORT"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path, config_text, key, allowed):
    result = _serve(tmp_path, config_text)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert key in lines[0] and allowed in lines[0]
    assert "Traceback" not in result.stderr


def test_unreadable_and_malformed_files_are_one_line_errors(tmp_path):
    missing = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config", str(tmp_path / "nope.yaml")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert missing.returncode == 2
    assert missing.stderr == (f"gpufleet: {tmp_path / 'nope.yaml'}: cannot read config file: "
                              "No such file or directory\n")
    broken = _serve(tmp_path, "sources: [unclosed\n")
    assert broken.returncode == 2
    assert broken.stderr == (f"gpufleet: {tmp_path / 'gpufleet.yaml'}: not valid YAML at line 2, "
                             "column 1 (in sources[0]): expected ',' or ']', but got '<stream end>'\n")
    twice = _serve(tmp_path, "sources:\n  sim:\n    seed: 1\n    seed: 2\n")
    assert twice.returncode == 2
    assert twice.stderr == (f"gpufleet: {tmp_path / 'gpufleet.yaml'}: sources.sim.seed: given "
                            "twice, at lines 3 and 4; keep one\n")
    (tmp_path / "gpufleet.yaml").write_bytes(b"# caf\xe9\n")
    latin = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config", str(tmp_path / "gpufleet.yaml")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert latin.returncode == 2
    assert latin.stderr == f"gpufleet: {tmp_path / 'gpufleet.yaml'}: not UTF-8 at line 1 (byte 0xE9)\n"


def test_empty_file_is_the_default_config(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load(path) == Config()
    assert load(None) == Config()


def test_values_are_typed_and_nested():
    config = build(Config, {
        "collect_interval": "2m",
        "sources": {"sim": {"seed": 9, "speed": 60, "scenarios": [
            {"kind": "overheat", "node": "gpu-003", "gpu": 2, "value": 95}]}},
    })
    assert config.collect_interval == 120.0 and isinstance(config.collect_interval, Duration)
    assert config.sources.sim.seed == 9
    assert config.sources.sim.speed == 60.0
    assert config.sources.sim.scenarios[0].value == 95.0
    assert config.sources.sim.pools[0].name == "gpu-h200"  # defaults kept


def test_booleans_are_not_numbers():
    with pytest.raises(ConfigError, match=r"sources\.sim\.seed: must be an integer"):
        build(Config, {"sources": {"sim": {"seed": True}}})
    with pytest.raises(ConfigError, match=r"sources\.sim\.enabled: must be true or false"):
        build(Config, {"sources": {"sim": {"enabled": "yes"}}})


def test_durations_take_the_config_forms_and_name_the_key():
    config = build(Config, {"collect_interval": "1.5h", "source_timeout": 7,
                            "advisor": {"dwell": "1h30m"}})
    assert (config.collect_interval, config.source_timeout, config.advisor.dwell) == (5400, 7, 5400)
    with pytest.raises(ConfigError) as info:
        build(Config, {"advisor": {"cooldown": "1 hour"}})
    assert str(info.value) == ("advisor.cooldown: must be a duration such as 30s, 5m or 1h30m, "
                               "got '1 hour'")


def test_flags_override_the_file(tmp_path):
    from exporter.serve_cmd import add_arguments, effective_config

    path = tmp_path / "c.yaml"
    path.write_text("listen: 127.0.0.1:1111\nsources:\n  sim:\n    seed: 1\n")
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", str(path), "--listen", "127.0.0.1:2222", "--seed", "5",
                              "--log-format", "json"])
    config = effective_config(args)
    assert config.listen == "127.0.0.1:2222"
    assert config.sources.sim.seed == 5
    assert config.log.format == "json"


def test_help_describes_every_option():
    result = subprocess.run([sys.executable, "-m", "exporter", "serve", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for option in ("--config", "--listen", "--source", "--seed", "--log-level", "--log-format",
                   "collect_interval", "sources.sim.seed", "sources.sim.scenarios", "log.format"):
        assert option in result.stdout
    top = subprocess.run([sys.executable, "-m", "exporter", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert top.returncode == 0 and "serve" in top.stdout


def test_port_in_use_is_a_one_line_error(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _serve(tmp_path, "", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert "cannot listen on" in result.stderr and "--listen" in result.stderr
    assert "Traceback" not in result.stderr


def test_compaction_threshold_defaults_agree_with_the_threshold_table():
    """The table is the source of truth; the analyzer's and advisor's defaults must not drift from it."""
    from exporter.alerting.thresholds import load_thresholds

    table = load_thresholds(REPO / "rules" / "thresholds.yaml")
    threshold = table.alert("GpuClusterFragmentationHigh").threshold("warning")
    config = Config()
    assert config.analysis.compaction_threshold == threshold == 50
    assert config.advisor.trigger == threshold
