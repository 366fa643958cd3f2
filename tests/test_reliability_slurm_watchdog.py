"""Issue 32, finding 1, end to end: a real ``gpufleet serve`` reading Slurm through an
``scontrol`` that escapes its process group (the ``timeout 60`` sites wrap it in, or a
``setsid`` child holding the pipe), scraped by a real Prometheus with the generated rules.

What it shows: every read ends at ``command_timeout`` (the escaped child would have held it
60 s), the source is down with the reason, the escaped children are killed and no pipe is
left open in the exporter, the snapshot keeps being renewed, and GpufleetSourceDown fires.

GpufleetSnapshotStale does not fire here, and cannot: it fires on a snapshot that stopped
being renewed, and with the deadline a live exporter's collection ends every round, down
source or not. Its firing on a snapshot that did stop is tests/test_reliability_watchdog.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

# the reads of one minute that Prometheus saw: a read held by the escaped child takes 60 s
HELD_READ_SECONDS = 10.0


def _escaped(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _pipes(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("pipe:")
    return count


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["timeout 60", "setsid"])
def test_a_slurm_client_that_escapes_its_group_is_down_at_its_deadline_and_alerts(
        tmp_path, wrapper, exporter_factory, prometheus_factory, capsys):
    from exporter.cli import main

    rules = tmp_path / "rules"
    assert main(["rules", "--out", str(rules), "--for-scale", "0.01",
                 "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    capsys.readouterr()
    bin_dir, escaped = tmp_path / "bin", tmp_path / "escaped"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    # the child records its pid and sleeps 60 s holding the client's stdout; `wait` keeps
    # the client itself running as long as the child (timeout's own group, or setsid's
    # session: killpg of the client's group reaches neither)
    scontrol.write_text(f"#!/bin/sh\n{wrapper} sh -c 'echo $$ >> {escaped}; exec sleep 60' &\n"
                        "wait\n")
    scontrol.chmod(0o755)
    try:
        exporter = exporter_factory(config=f"""
collect_interval: 1s
advisor: {{enabled: false}}
sources:
  sim: {{enabled: false}}
  slurm: {{enabled: true, format: text, bin_dir: "{bin_dir}", command_timeout: 1s}}
""", ready=False)  # never ready: its one source never lists a GPU
        prom = prometheus_factory(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules / "gpufleet-alerts.yaml")],
            "scrape_configs": [{"job_name": "gpufleet-nodes", "scrape_interval": "1s",
                                "scrape_timeout": "1s",
                                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}]}))

        firing = prom.wait_for('ALERTS{alertname="GpufleetSourceDown",alertstate="firing"}',
                               bool, timeout=90)
        assert {r["metric"]["source"] for r in firing} == {"slurm"}
        # a few more reads, so that what each left behind would add up
        prom.wait_for('count_over_time(gpufleet_source_up{source="slurm"}[1m])',
                      lambda r: bool(r) and float(r[0]["value"][1]) >= 10, timeout=90)

        up = prom.query('gpufleet_source_up{source="slurm"}')
        assert [float(r["value"][1]) for r in up] == [0.0]
        longest = prom.query('max_over_time(gpufleet_collect_duration_seconds{source="slurm"}[1m])')
        assert longest and float(longest[0]["value"][1]) < HELD_READ_SECONDS
        # the collection ends every round, so the snapshot keeps being renewed and the
        # watchdog stays quiet: the snapshot's timestamp moved at nearly every scrape
        renewed = prom.query("changes(gpufleet_snapshot_timestamp_seconds[10s])")
        assert renewed and float(renewed[0]["value"][1]) >= 5
        assert prom.query('ALERTS{alertname="GpufleetSnapshotStale"}') == []

        with urllib.request.urlopen(f"{exporter.url}/v1/snapshot", timeout=10) as resp:
            sources = json.loads(resp.read())["sources"]
        slurm = next(s for s in sources if s["source"] == "slurm")
        assert "no answer within 1s" in slurm["error"]
        assert "no answer within 1s" in exporter.log.read_text()

        # every child escaped so far is killed by its read's deadline (1 s; they sleep 60 s),
        # including those of the read in flight now; and no pipe is held but that read's
        # (a read runs `scontrol show node` and `show job` side by side: 2 x stdout, stderr)
        pids = _escaped(escaped)
        assert len(pids) >= 10
        killed_by = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < killed_by:
            time.sleep(0.1)
        assert [pid for pid in pids if _alive(pid)] == []
        # the least over a few seconds: reads run back to back (1 s interval, 1 s deadline),
        # so on a loaded machine the last read's pipes may still be closing as the next read
        # opens its own (6 once, under stress-ng); a leak stays, and only grows, over 10 reads
        held = []
        settle_by = time.monotonic() + 5
        while time.monotonic() < settle_by and (not held or min(held) > 4):
            held.append(_pipes(exporter.proc.pid))
            time.sleep(0.05)
        assert min(held) <= 4, held
    finally:
        for pid in _escaped(escaped):  # only if the exporter left them: this test's children
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
