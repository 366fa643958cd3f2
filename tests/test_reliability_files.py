"""Issue 32, Build 2 ("every input bounded"): every YAML file gpufleet reads (the config, a
kubeconfig, the threshold table, dcgm's targets file) goes through exporter/bounded_file.py,
so a huge file or a device is refused, not read whole."""

from __future__ import annotations

import pytest

from exporter.errors import ConfigError
from exporter.yamlfile import MAX_FILE_BYTES, load_mapping, read_text


def test_a_yaml_file_over_the_limit_is_refused_by_its_size_before_it_is_read(tmp_path):
    big = tmp_path / "gpufleet.yaml"
    big.write_text("listen: 127.0.0.1:9874\n" + "# padding\n" * 2000)
    with pytest.raises(ConfigError) as caught:
        read_text(big, "config file", limit=1024)
    assert str(caught.value) == f"{big}: {big.stat().st_size} bytes, over the 1024-byte limit for config file"
    assert read_text(big, "config file", limit=big.stat().st_size).startswith("listen:")


def test_a_device_named_as_the_config_is_read_to_the_limit_and_refused():
    with pytest.raises(ConfigError) as caught:
        load_mapping("/dev/zero", "config file")
    assert str(caught.value) == f"/dev/zero: over the {MAX_FILE_BYTES}-byte limit for config file"


def test_the_messages_users_know_are_kept(tmp_path):
    with pytest.raises(ConfigError) as caught:
        read_text(tmp_path / "missing.yaml", "config file")
    missing = tmp_path / "missing.yaml"
    assert str(caught.value) == f"{missing}: cannot read config file: No such file or directory"
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 at line 2 \(byte 0xE9\)"):
        read_text(bad, "config file")
