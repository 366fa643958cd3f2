"""The advisor's token file and its receivers' HMAC secret files go through the bounded reader:
regular files only, a size cap, read off the event loop. A FIFO (no writer) or /dev/zero at the
start is one line and exit 2; swapped in under a running ``serve``, the last good secret stays,
``gpufleet_config_last_reload_successful`` reads 0, ``/-/healthy`` answers and SIGTERM stops it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from exporter.advisor.service import SECRET_MAX_BYTES, TokenFile, load_receivers, load_token
from exporter.config import AdvisorConfig, Config, ConfigError, build
from tests.helpers.servers import http_get, wait_until
from tests.test_advisor_api import alertmanager_payload

TOKEN_ENV = "GPUFLEET_ADVISOR_TOKEN"


def _hostile(kind: str, path: Path) -> None:
    """Put a FIFO nobody writes to, or a link to /dev/zero, where ``path`` is, in one rename."""
    new = path.with_name(path.name + ".new")
    if kind == "fifo":
        os.mkfifo(new)
    else:
        os.symlink("/dev/zero", new)
    os.replace(new, path)


def _replace(path: Path, text: str) -> None:
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_fifo_or_dev_zero_is_refused_by_name_without_reading(tmp_path, kind):
    path = tmp_path / "secret"
    _hostile(kind, path)
    with pytest.raises(ConfigError) as info:
        load_token(AdvisorConfig(token_file=str(path)), {})
    assert str(info.value) == f"advisor.token_file: {path} is not a regular file"
    config = build(Config, {"advisor": {"receivers": [
        {"name": "s", "url": "http://127.0.0.1:9/plans", "secret_file": str(path)}]}})
    with pytest.raises(ConfigError) as info:
        load_receivers(config.advisor, {})
    assert str(info.value) == f"advisor.receivers[0].secret_file: {path} is not a regular file"


def test_a_secret_file_over_the_cap_is_refused_by_its_size(tmp_path):
    path = tmp_path / "token"
    path.write_bytes(b"t" * (SECRET_MAX_BYTES + 1))
    with pytest.raises(ConfigError) as info:
        load_token(AdvisorConfig(token_file=str(path)), {})
    assert str(info.value) == (f"advisor.token_file: {path} is {SECRET_MAX_BYTES + 1} bytes, "
                               f"over the {SECRET_MAX_BYTES}-byte limit of a secret")


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_token_file_that_turns_hostile_keeps_the_last_good_token(tmp_path, kind):
    path = tmp_path / "token"
    path.write_text("good-token\n")
    token = TokenFile(str(path))
    assert (token(), token.ok) == (b"good-token", True)
    _hostile(kind, path)
    assert (token(), token.ok) == (b"good-token", False)
    _replace(path, "next-token\n")
    assert (token(), token.ok) == (b"next-token", True)


@pytest.mark.parametrize(("kind", "where"), [("fifo", "token"), ("zero", "token"),
                                             ("fifo", "secret"), ("zero", "secret")])
def test_serve_with_a_hostile_secret_file_exits_2_with_one_line(exporter_factory, tmp_path,
                                                                 kind, where):
    path = tmp_path / where
    _hostile(kind, path)
    if where == "token":
        config, key = f"advisor:\n  token_file: {path}\n", "advisor.token_file"
    else:
        config = ("advisor:\n  receivers:\n    - name: s\n      url: http://127.0.0.1:9/plans\n"
                  f"      secret_file: {path}\n")
        key = "advisor.receivers[0].secret_file"
    env = {TOKEN_ENV: "a-token"} if where == "secret" else {}  # else a warning says "no token"
    exporter = exporter_factory(config=config, drop_env=(TOKEN_ENV,), env=env, ready=False)
    assert exporter.proc.wait(timeout=60) == 2
    lines = exporter.log.read_text().strip().splitlines()
    assert lines == [f"gpufleet: {key}: {path} is not a regular file"]


def _post(url: str, token: str | None) -> int:
    body = json.dumps(alertmanager_payload(group=f"g{time.monotonic()}")).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _reload_gauge(url: str) -> str | None:
    text = http_get(f"{url}/metrics", headers={"Accept-Encoding": "identity"}).decode()
    for line in text.splitlines():
        if line.startswith("gpufleet_config_last_reload_successful "):
            return line.split()[1]
    return None


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_hostile_file_swapped_in_at_run_time_keeps_the_old_secret_and_serve_alive(
        exporter_factory, tmp_path, kind):
    token, secret = tmp_path / "token", tmp_path / "hmac"
    token.write_text("old-token-0001\n")
    secret.write_text("old-secret\n")
    config = ("collect_interval: 1s\n"
              f"advisor:\n  token_file: {token}\n  receivers:\n"
              "    - name: s\n      url: http://127.0.0.1:9/plans\n"
              f"      secret_file: {secret}\n")
    exporter = exporter_factory(config=config, drop_env=(TOKEN_ENV,))
    alerts = f"{exporter.url}/v1/alerts"
    assert _post(alerts, "old-token-0001") == 202
    wait_until("the reload gauge at 1", lambda: _reload_gauge(exporter.url) == "1.0")

    _hostile(kind, token)
    assert _post(alerts, None) == 401  # one unauthenticated POST reads the changed file
    started = time.monotonic()
    assert http_get(f"{exporter.url}/-/healthy", timeout=5) is not None
    assert time.monotonic() - started < 1.0
    assert _post(alerts, "old-token-0001") == 202  # the last good token stays
    wait_until("the reload gauge at 0", lambda: _reload_gauge(exporter.url) == "0.0")

    _hostile(kind, secret)
    exporter.proc.send_signal(signal.SIGHUP)
    wait_until("the reload's log line",
               lambda: "reloaded on SIGHUP" in exporter.log.read_text(), timeout=15)
    line = next(ln for ln in exporter.log.read_text().splitlines() if "reloaded on SIGHUP" in ln)
    assert "token_file=kept" in line and "receiver_secrets=\"1 kept\"" in line, line
    assert f"{secret} is not a regular file" in exporter.log.read_text()
    started = time.monotonic()
    assert http_get(f"{exporter.url}/-/healthy", timeout=5) is not None
    assert time.monotonic() - started < 1.0
    assert _post(alerts, "old-token-0001") == 202

    _replace(token, "new-token-0002\n")  # a good token again: taken at the next POST
    assert _post(alerts, "new-token-0002") == 202
    assert _post(alerts, "old-token-0001") == 401

    exporter.proc.send_signal(signal.SIGTERM)
    assert exporter.proc.wait(timeout=30) == 0
    assert "Traceback" not in exporter.log.read_text()
