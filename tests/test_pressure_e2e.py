"""The node pressure rules on real data: Debian's prometheus-node-exporter, scraped by the real
Prometheus running the generated recording rules, under a CPU and disk load made here.

The recorded score must equal the score computed by hand, from the issue's formula, over
the raw samples Prometheus holds at the rule's evaluation timestamp: each counter's rate
with Prometheus' extrapolation (promql/functions.go ``extrapolatedRate``), 1 - the mean
idle rate for the CPUs, 1 - MemAvailable/MemTotal, the busiest device's I/O time. Only
float rounding is tolerated (1e-9).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from exporter.cli import main
from tests.helpers import REPO, require_binary
from tests.helpers.servers import (
    Prometheus,
    free_port,
    start_node_exporter,
    start_server,
    stop,
    wait_until,
)

pytestmark = pytest.mark.slow  # real node_exporter, Prometheus and stress-ng

RATE_WINDOW = 5  # seconds: 5 scrapes at 1 s, so rate() has samples at both ends
INSTANCE_JOB = "node"
SCRAPE_MS = 100  # a scrape of the three collectors takes a few ms; 100 ms is ten times that
# the formula, written here rather than read from the generator it checks
WEIGHTS = {"cpu": 0.4, "memory": 0.35, "io": 0.25}
CAPS = {"cpu": 0.9, "memory": 0.85, "io": 0.7}


def _rules(tmp: Path) -> Path:
    """The committed table with a 5 s rate window (the scrapes are 1 s apart here)."""
    text = (REPO / "rules" / "thresholds.yaml").read_text()
    assert text.count("rate_window: 1m") == 1
    table = tmp / "thresholds.yaml"
    table.write_text(text.replace("rate_window: 1m", f"rate_window: {RATE_WINDOW}s"))
    out = tmp / "rules"
    assert main(["rules", "--thresholds", str(table), "--out", str(out)]) == 0
    return out / "gpufleet-recording.yaml"


def _extrapolated_rate(samples: list[tuple[int, float]], start: int, end: int) -> float:
    """Prometheus 2's rate(): the increase between the first and last samples (counter resets
    added back), extrapolated towards the range's ends unless a sample is farther than 1.1
    average intervals from one, and never below a zero counter; per second of the range.

    Times are integer milliseconds, as Prometheus keeps them: in float seconds, a Unix time
    of 1.8e9 has a 2.4e-7 s resolution, which moved a 5 s rate by 3e-8 (measured)."""
    (first_ms, first_v), (last_ms, last_v) = samples[0], samples[-1]
    increase = last_v - first_v
    previous = 0.0
    for _, value in samples:
        if value < previous:
            increase += previous
        previous = value
    to_start, to_end = (first_ms - start) / 1000, (end - last_ms) / 1000
    sampled = (last_ms - first_ms) / 1000
    average = sampled / (len(samples) - 1)
    if increase > 0 and first_v >= 0:
        to_start = min(to_start, sampled * (first_v / increase))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return increase * (interval / sampled) / ((end - start) / 1000)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)  # the API writes milliseconds as a decimal fraction


def _raw(prom: Prometheus, selector: str, at: float, unseen_ms: int
         ) -> dict[tuple, list[tuple[int, float]]]:
    """Every series of ``selector`` with its samples (milliseconds, value) in the rate window
    ending at ``at``, less those scraped in its last ``unseen_ms``."""
    out = {}
    end = _ms(at)
    for series in prom.query(f"{selector}[{RATE_WINDOW}s]", at):
        labels = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
        out[labels] = [(_ms(t), float(v)) for t, v in series["values"]
                       if _ms(t) <= end - unseen_ms]
    return out


def _recorded(prom: Prometheus, name: str, at: float) -> float:
    """The sample the rule wrote at exactly ``at``."""
    [series] = prom.query(f'{name}{{job="{INSTANCE_JOB}"}}[2s]', at)
    values = {float(t): float(v) for t, v in series["values"]}
    return values[at]


def _by_hand(prom: Prometheus, at: float, unseen_ms: int = 0) -> dict[str, float]:
    """The four values from the raw samples. ``unseen_ms``: leave out the samples of a scrape
    that started just before the evaluation but was stored after it (a scrape's samples carry
    its start time), which the API shows now but the rule could not see then."""
    end = _ms(at)
    start = end - RATE_WINDOW * 1000
    idle = _raw(prom, f'node_cpu_seconds_total{{job="{INSTANCE_JOB}",mode="idle"}}', at,
                unseen_ms)
    assert len(idle) == os.cpu_count(), idle.keys()  # one idle series per CPU
    cpu = 1 - sum(_extrapolated_rate(s, start, end) for s in idle.values()) / len(idle)
    # an instant selector takes each series' latest sample at or before `at`
    [available] = _raw(prom, f'node_memory_MemAvailable_bytes{{job="{INSTANCE_JOB}"}}', at,
                       unseen_ms).values()
    [total] = _raw(prom, f'node_memory_MemTotal_bytes{{job="{INSTANCE_JOB}"}}', at,
                   unseen_ms).values()
    memory = 1 - available[-1][1] / total[-1][1]
    disks = _raw(prom, f'node_disk_io_time_seconds_total{{job="{INSTANCE_JOB}"}}', at,
                 unseen_ms)
    assert disks
    io = min(max(_extrapolated_rate(s, start, end) for s in disks.values() if len(s) > 1), 1.0)
    values = {"cpu": cpu, "memory": memory, "io": io}
    score = sum(WEIGHTS[r] * min(values[r] / CAPS[r], 1.0) for r in ("cpu", "memory", "io"))
    return {**values, "score": score}


def _equal(recorded: dict[str, float], hand: dict[str, float]) -> bool:
    return all(recorded[k] == pytest.approx(hand[k], rel=1e-9, abs=1e-12)
               for k in ("cpu", "memory", "io", "score"))


def _write_with_fsync(path: Path, stop_at: float) -> int:
    """Disk load: rewrite one 1 MiB block with an fsync after each write, until ``stop_at``
    (bounded: the file never grows past 8 MiB)."""
    block = os.urandom(1 << 20)
    writes = 0
    with path.open("wb") as f:
        while time.monotonic() < stop_at:
            f.seek((writes % 8) << 20)
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
            writes += 1
    return writes


def test_the_recorded_pressure_score_equals_the_score_by_hand(tmp_path):
    recording = _rules(tmp_path)
    node = start_node_exporter(tmp_path / "node-exporter")
    load: subprocess.Popen | None = None
    prom: Prometheus | None = None
    try:
        prom_dir = tmp_path / "prometheus"
        prom_dir.mkdir()
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(recording)],
            "scrape_configs": [{"job_name": INSTANCE_JOB, "static_configs": [
                {"targets": [f"127.0.0.1:{node.port}"]}]}],
        }))
        port = free_port()
        proc = start_server("prometheus", prom_dir, port, [
            require_binary("prometheus"), f"--config.file={prom_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={prom_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"])
        prom = Prometheus(proc, port, prom_dir, prom_dir / "prometheus.log")

        # the load, for 15 s: every CPU 70% busy (not 100%: an idle counter that stands
        # still would leave the CPU rate untested, unless others fill the machine) and one
        # fsync'd writer
        load = subprocess.Popen([require_binary("stress-ng"), "--cpu", str(os.cpu_count()),
                                 "--cpu-load", "70", "--timeout", "15s", "--quiet"],
                                cwd=tmp_path)
        loaded_from = time.time()
        writer = threading.Thread(target=_write_with_fsync,
                                  args=(tmp_path / "fsync.bin", time.monotonic() + 15))
        writer.start()
        # evaluations whose whole rate window lies inside the load
        def loaded_scores() -> list[float]:
            result = prom.query(f'instance:gpufleet_node_pressure:score{{job="{INSTANCE_JOB}"}}'
                                "[20s]")
            return [float(t) for t, _ in (result[0]["values"] if result else [])
                    if float(t) - RATE_WINDOW > loaded_from + 1]
        stamps = wait_until("8 scores recorded under load", lambda: (
            s if len(s := loaded_scores()) >= 8 else None), timeout=40, interval=0.5)
        writer.join()

        checked = []
        for at in stamps[-3:]:  # three evaluations, each against its own raw samples
            hand = _by_hand(prom, at)
            recorded = {
                "cpu": _recorded(prom, "instance:gpufleet_node_cpu_busy:ratio", at),
                "memory": _recorded(prom, "instance:gpufleet_node_memory_used:ratio", at),
                "io": _recorded(prom, "instance:gpufleet_node_disk_io_busy:ratio", at),
                "score": _recorded(prom, "instance:gpufleet_node_pressure:score", at),
            }
            if not _equal(recorded, hand):
                # Scrapes and evaluations keep a fixed phase: if a scrape (a few ms for
                # these collectors) straddles the evaluation, its samples are stamped
                # before it but were stored after it. Then the rule saw the samples up to
                # the previous scrape, 1 s earlier; no other set may match.
                hand = _by_hand(prom, at, unseen_ms=SCRAPE_MS)
            assert _equal(recorded, hand), (at, recorded, hand)
            checked.append((at, hand))
            gap = max(abs(recorded[k] - hand[k]) for k in recorded)
            print(f"at {at}: recorded {recorded}, largest gap to the hand value {gap:.3g}")
        # the load was real: the CPUs busy, the disk doing I/O
        for _, hand in checked:
            assert hand["cpu"] > 0.5, checked
            assert hand["io"] > 0, checked
    finally:
        if load is not None:
            stop(load)
        if prom is not None:
            stop(prom.proc)
        stop(node.proc)
