"""Config validation: bad input stops the start with exit 2 and one line naming the key."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.config import Config, ConfigError, Duration, build, load
from tests.helpers import REPO


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
        # issue 14, defect 7: each of these started serving (or spun) before
        ("collect_interval: .nan\n", "collect_interval", "must be a finite duration"),
        ("source_timeout: .inf\n", "source_timeout", "must be a finite duration"),
        ("advisor:\n  dwell: -1s\n", "advisor.dwell", "must be >= 0"),
        ("advisor:\n  health:\n    min_drain: -1m\n", "advisor.health.min_drain", "must be >= 0"),
        ("sources:\n  sim:\n    scale: 1000000\n", "sources.sim.scale", "must be <= 100"),
        # issue 15: a scenario naming a node or pool the simulated fleet lacks started "ready"
        ("sources:\n  sim:\n    scenarios:\n      - {kind: overheat, node: gpu-999}\n",
         "sources.sim.scenarios[0].node", "no node gpu-999 in the simulated fleet (gpu-001..gpu-136)"),
        ("sources:\n  sim:\n    scenarios:\n      - {kind: gpu_lost, node: gpu-001}\n"
         "      - {kind: fragmented_pool, pool: gpu-z100}\n",
         "sources.sim.scenarios[1].pool", "no pool gpu-z100 in the simulated fleet (gpu-h200, "),
        ("sources:\n  sim:\n    scenarios:\n      - {kind: idle_allocated, node: gpu-001, gpu: 8}\n",
         "sources.sim.scenarios[0].gpu", "gpu-001 has 8 GPUs (0..7)"),
        ('sources:\n  prometheus:\n    url: "not a url"\n', "sources.prometheus.url",
         "must be an http(s) URL"),
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


def test_a_billion_laughs_in_a_valid_key_is_refused_on_one_short_line(tmp_path):
    """Nine levels of nine aliases under ``listen``: 9**9 strings once expanded. The error
    message used to format the whole value, at 100% CPU and +45 MB/s, and never finished."""
    lines = ["listen:", '  - &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    path = tmp_path / "gpufleet.yaml"
    path.write_text("\n".join(lines) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config", str(path)], cwd=tmp_path,
        capture_output=True, text=True, timeout=20, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr[:1000]
    assert len(result.stderr) < 200 + len(str(path)) and "listen" in result.stderr


def test_a_non_utf8_file_exits_2_on_one_line(tmp_path):
    """Issue 14 says exit 1 with a traceback's name: yamlfile.read_text had fixed it already."""
    path = tmp_path / "gpufleet.yaml"
    path.write_bytes(b"listen: 127.0.0.1:0\nlog:\n  level: d\xe9bug\n")
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--config", str(path)], cwd=tmp_path,
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert (result.returncode, result.stderr) == (2, f"gpufleet: {path}: not UTF-8 at line 3 "
                                                     "(byte 0xE9)\n")


@pytest.mark.parametrize("key", ["collect_interval", "source_timeout"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1" + "0" * 400 + "s", -1.0, "-1s"])
def test_durations_are_finite_and_not_negative(key, value):
    with pytest.raises(ConfigError, match=rf"^{key}: must be "):
        build(Config, {key: value})
    with pytest.raises(ConfigError, match=r"^advisor\.dwell: must be "):  # 0 allowed, not -1
        build(Config, {"advisor": {"dwell": value}})


@pytest.mark.parametrize(("data", "key"), [
    ({"sources": {"sim": {"speed": float("nan")}}}, "sources.sim.speed"),
    ({"sources": {"sim": {"speed": float("inf")}}}, "sources.sim.speed"),
    ({"analysis": {"slack_nodes": float("inf")}}, "analysis.slack_nodes"),
    ({"advisor": {"min_recovered_per_migration": float("nan")}},
     "advisor.min_recovered_per_migration"),
])
def test_numbers_are_finite(data, key):
    with pytest.raises(ConfigError) as info:
        build(Config, data)
    assert str(info.value).startswith(f"{key}: must be a finite number, got ")


def test_the_simulated_fleet_is_bounded():
    assert build(Config, {"sources": {"sim": {"scale": 100}}}).sources.sim.scale == 100
    with pytest.raises(ConfigError, match=r"^sources\.sim\.scale: must be <= 100, got 101$"):
        build(Config, {"sources": {"sim": {"scale": 101}}})
    huge = {"name": "p", "model": "H100", "nodes": 1_000_000}
    with pytest.raises(ConfigError) as info:
        build(Config, {"sources": {"sim": {"pools": [huge]}}})
    assert str(info.value) == ("sources.sim.pools: 8,000,000 simulated GPUs; at most 108,800 "
                               "(scale 100 of the reference layout)")
    with pytest.raises(ConfigError, match=r"^sources\.sim\.pools: 217,600 simulated GPUs"):
        build(Config, {"sources": {"sim": {"scale": 100, "pools": [
            {"name": "p", "model": "H100", "nodes": 272}]}}})


@pytest.mark.parametrize(("data", "key"), [
    ({"sources": {"prometheus": {"url": "not a url"}}}, "sources.prometheus.url"),
    ({"sources": {"prometheus": {"url": "ftp://prom:9090"}}}, "sources.prometheus.url"),
    ({"sources": {"prometheus": {"url": "http://"}}}, "sources.prometheus.url"),
    ({"sources": {"prometheus": {"url": "http://prom :9090"}}}, "sources.prometheus.url"),
    ({"sources": {"prometheus": {"url": "http://prom:99999"}}}, "sources.prometheus.url"),
    ({"sources": {"prometheus": {"url": "prom:9090"}}}, "sources.prometheus.url"),
    ({"advisor": {"receivers": [{"name": "a", "url": "http://a/x"},
                                {"name": "b", "url": "scheduler"}]}}, "advisor.receivers[1].url"),
    ({"sources": {"dcgm": {"targets": ["node1:9400", "node 2:9400"]}}}, "sources.dcgm.targets[1]"),
    ({"sources": {"dcgm": {"targets": ["gopher://node1:9400"]}}}, "sources.dcgm.targets[0]"),
    ({"sources": {"dcgm": {"targets": ["node1:port"]}}}, "sources.dcgm.targets[0]"),
])
def test_urls_are_validated(data, key):
    with pytest.raises(ConfigError) as info:
        build(Config, data)
    assert str(info.value).startswith(f"{key}: must be ")
    assert "URL" in str(info.value)


def test_good_urls_pass():
    config = build(Config, {
        "sources": {"prometheus": {"url": "https://thanos.example:10902/prefix/"},
                    "dcgm": {"targets": ["node1:9400", "http://[::1]:9400/metrics",
                                         "https://user:pw@node2/metrics"]}},
        "advisor": {"receivers": [{"name": "a", "url": "http://127.0.0.1:8080/plans"}]},
    })
    assert config.sources.prometheus.url == "https://thanos.example:10902/prefix/"
    assert len(config.sources.dcgm.targets) == 3


def test_a_url_error_hides_the_password():
    with pytest.raises(ConfigError) as info:
        build(Config, {"sources": {"prometheus": {"url": "http://me:s3cret@prom :9090"}}})
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("data", [
    {"log": {"level": "x" * 300}},
    {"listen": ["x" * 300]},
    {"listen": [["x" * 300] * 300] * 300},
    {"sources": {"sim": {"seed": "x" * 300}}},
    {"advisor": {"cooldown": "x" * 300}},
    {"sources": {"prometheus": {"url": "http://" + "x" * 300 + " /"}}},
])
def test_an_error_quotes_at_most_80_characters_of_the_value(data):
    with pytest.raises(ConfigError) as info:
        build(Config, data)
    message = str(info.value)
    assert "x" * 81 not in message
    assert len(message) < 250, message


def test_a_long_listen_value_is_quoted_to_80_characters(tmp_path):
    result = _serve(tmp_path, f"listen: {'x' * 300}\n")
    assert result.returncode == 2
    assert result.stderr.startswith("gpufleet: listen: must be HOST:PORT, got 'xxxx")
    assert "x" * 81 not in result.stderr and len(result.stderr) < 200
    result = _serve(tmp_path, f"listen: 'x:{'9' * 5000}'\n")
    assert result.returncode == 2
    assert result.stderr.startswith("gpufleet: listen: must be HOST:PORT, got 'x:999")


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
    from exporter.cli.serve import add_arguments, effective_config

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


def _package_copy(tmp_path) -> Path:
    """A copy of the exporter package (links followed, as pip installs it), without the traces."""
    shutil.copytree(REPO / "exporter", tmp_path / "exporter", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "traces"))
    return tmp_path / "exporter"


def _python(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})


def test_the_compaction_defaults_come_from_the_threshold_table(tmp_path):
    """analysis.compaction_threshold and advisor.trigger are written once, in the table's
    fragmentation row: a package whose table says 65 defaults to 65; the config still wins."""
    table = _package_copy(tmp_path) / "thresholds.yaml"
    row = "    metric: pool_fragmentation_index\n    op: \">\"\n"
    text = table.read_text()
    assert text.count(row) == 1
    # that row's level (the cluster index row, GpuFleetFragmentationHigh, has its own)
    level = text.index("warning: {threshold: 50, for: 15m}", text.index(row))
    table.write_text(text[:level] + "warning: {threshold: 65, for: 15m}"
                     + text[level + len("warning: {threshold: 50, for: 15m}"):])
    (tmp_path / "c.yaml").write_text("analysis:\n  compaction_threshold: 70\n")
    done = _python(tmp_path, "-c", "from exporter.config import Config, load; "
                   "c = Config(); f = load('c.yaml'); "
                   "print(c.analysis.compaction_threshold, c.advisor.trigger, "
                   "f.analysis.compaction_threshold, f.advisor.trigger)")
    assert done.stdout.split() == ["65.0", "65.0", "70.0", "65.0"], done.stderr
    helped = _python(tmp_path, "-m", "exporter", "serve", "--help")
    assert "analysis.compaction_threshold = 65.0:" in helped.stdout
    assert "advisor.trigger = 65.0:" in helped.stdout
    # this checkout's own table, as installed: the same level the dashboards colour at
    from exporter.thresholds import load_thresholds

    level = load_thresholds(REPO / "rules" / "thresholds.yaml").compaction_threshold()
    assert (Config().analysis.compaction_threshold, Config().advisor.trigger) == (level, level)


def test_an_install_without_the_threshold_table_fails_on_one_line(tmp_path):
    (_package_copy(tmp_path) / "thresholds.yaml").unlink()
    for argv in (["serve", "--help"], ["serve", "--listen", "127.0.0.1:0"]):
        done = _python(tmp_path, "-m", "exporter", *argv)
        assert done.returncode == 2, done.stderr
        assert done.stderr == (f"gpufleet: {tmp_path / 'exporter' / 'thresholds.yaml'}: cannot read "
                               "the threshold table: No such file or directory\n")


def test_the_what_if_time_limit_is_a_bounded_setting():
    assert Config().api.what_if_timeout == 10.0
    assert build(Config, {"api": {"what_if_timeout": "2m"}}).api.what_if_timeout == 120.0
    for value, reason in ((0, "must be > 0, got 0.0"), ("301s", "must be <= 300, got 301.0"),
                          (float("nan"), "must be a finite duration, got nan")):
        with pytest.raises(ConfigError) as info:
            build(Config, {"api": {"what_if_timeout": value}})
        assert str(info.value) == f"api.what_if_timeout: {reason}"


def test_a_dcgm_deadline_at_or_past_the_source_timeout_is_refused(tmp_path):
    # the collector would cancel the whole read first: every target lost, the good ones too
    enabled = "sources:\n  dcgm:\n    enabled: true\n    targets: [127.0.0.1:9400]\n"
    result = _serve(tmp_path, enabled + "    timeout: 10s\n")
    assert (result.returncode, result.stderr) == (
        2, "gpufleet: sources.dcgm.timeout: must be below source_timeout (10s >= 10s)\n")
    # enabled by --source instead of the file: checked once the flag is applied
    result = _serve(tmp_path, "source_timeout: 4s\nsources:\n  dcgm:\n    targets: "
                    "[127.0.0.1:9400]\n    timeout: 5s\n", "--source", "dcgm")
    assert (result.returncode, result.stderr) == (
        2, "gpufleet: sources.dcgm.timeout: must be below source_timeout (5s >= 4s)\n")
    # below it, or with dcgm off, the pair is fine
    assert build(Config, {"source_timeout": 4, "sources": {"dcgm": {
        "enabled": True, "timeout": 3.9}}}).sources.dcgm.timeout == 3.9
    assert build(Config, {"source_timeout": 2}).sources.dcgm.timeout == 3.0


def test_a_kubernetes_first_sync_at_or_past_the_source_timeout_is_refused():
    with pytest.raises(ConfigError, match=r"^sources.kubernetes.sync_timeout: must be below "
                                          r"source_timeout \(8s >= 8s\)$"):
        build(Config, {"source_timeout": 8, "sources": {"kubernetes": {"enabled": True}}})
    assert build(Config, {"source_timeout": 8, "sources": {"kubernetes": {
        "enabled": True, "sync_timeout": 7.5}}}).sources.kubernetes.sync_timeout == 7.5
    assert build(Config, {"source_timeout": 2}).sources.kubernetes.sync_timeout == 8  # off: fine
