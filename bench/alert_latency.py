"""Alert latency end to end: simulated condition -> Prometheus rule -> Alertmanager -> webhook.

Runs the stack of tests/test_alerting_e2e.py (the exporter simulating one
overheating H200 and a fragmented H100 pool, a real Prometheus evaluating the
rules `gpufleet rules --for-scale` generates, a real Alertmanager with the
committed routing tree and 1s grouping waits, an aiohttp webhook receiver) and
prints, per alert:

- when it arrived at its receiver, counted from the exporter's start (the
  issue's target: every alert within 60 s);
- the latency from Prometheus's `activeAt` (first evaluation that saw the
  condition) to the webhook, against the floor the configuration sets in the
  same run (the alert's scaled `for` plus the route's group_wait): the ratio
  is the overhead of evaluation, sending and delivery.

Usage: ``.venv/bin/python bench/alert_latency.py [--for-scale 0.01] [--runs 3]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter.cli import main as gpufleet  # noqa: E402
from exporter.thresholds import load_thresholds  # noqa: E402
from tests.helpers import http_get, start_exporter, start_prometheus, stop  # noqa: E402
from tests.helpers.alerting import (  # noqa: E402
    WebhookReceiver,
    routed_config,
    start_alertmanager,
)
from tests.test_alerting_e2e import EXPORTER_CONFIG, HOT, _prometheus_config  # noqa: E402

# (alert, severity, receiver, labels that pick the one instance we watch)
WATCHED = (
    ("GpuTemperatureHigh", "critical", "pager", HOT),
    ("GpuClusterFragmentationHigh", "warning", "gpufleet-advisor", {"pool": "gpu-h100"}),
)
GROUP_WAIT = 1.0  # routed_config(fast=True) sets every group_wait to 1s


def _matches(labels: dict, name: str, severity: str, want: dict) -> bool:
    return (labels.get("alertname") == name and labels.get("severity") == severity
            and all(labels.get(k) == v for k, v in want.items()))


def _active_at(prom_url: str, name: str, severity: str, want: dict) -> float | None:
    alerts = json.loads(http_get(f"{prom_url}/api/v1/alerts"))["data"]["alerts"]
    for alert in alerts:
        if _matches(alert["labels"], name, severity, want):
            return datetime.fromisoformat(alert["activeAt"].replace("Z", "+00:00")).timestamp()
    return None


def one_run(workdir: Path, for_scale: float, timeout: float) -> dict[str, tuple]:
    rules = workdir / "rules"
    with contextlib.redirect_stdout(io.StringIO()):  # its "wrote FILE" lines
        assert gpufleet(["rules", "--out", str(rules), "--for-scale", str(for_scale),
                         "--thresholds", str(REPO / "rules" / "thresholds.yaml")]) == 0
    thresholds = load_thresholds(REPO / "rules" / "thresholds.yaml")
    receiver = WebhookReceiver().start()
    procs = []
    try:
        started_wall, started = time.time(), time.monotonic()
        exporter = start_exporter(workdir, config=EXPORTER_CONFIG)
        procs.append(exporter.proc)
        manager = start_alertmanager(workdir / "alertmanager", routed_config(receiver.url))
        procs.append(manager.proc)
        prom = start_prometheus(workdir / "prometheus", _prometheus_config(
            exporter.port, manager.port,
            [str(rules / "gpufleet-recording.yaml"), str(rules / "gpufleet-alerts.yaml")]))
        procs.append(prom.proc)
        results: dict[str, tuple] = {}
        active: dict[str, float] = {}
        deadline = started + timeout
        while time.monotonic() < deadline and len(results) < len(WATCHED):
            for name, severity, target, want in WATCHED:
                if name in results:
                    continue
                if name not in active:
                    at = _active_at(prom.url, name, severity, want)
                    if at is not None:
                        active[name] = at
                arrived = [at for at, alert in receiver.alerts(target)
                           if _matches(alert["labels"], name, severity, want)]
                if arrived and name in active:
                    arrived_wall = started_wall + (arrived[0] - started)
                    level = thresholds.alert(name).level(severity)
                    floor = level.for_seconds * for_scale + GROUP_WAIT
                    results[name] = (arrived[0] - started, arrived_wall - active[name], floor)
            time.sleep(0.1)
        return results
    finally:
        receiver.stop()
        for proc in reversed(procs):
            stop(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--for-scale", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args()
    runs = []
    for number in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="gpufleet-alert-bench-") as tmp:
            result = one_run(Path(tmp), args.for_scale, args.timeout)
        runs.append(result)
        shown = ", ".join(f"{k} {v[0]:.1f}s" for k, v in result.items())
        print(f"run {number + 1}: {shown or 'nothing arrived'}", flush=True)
    print(f"\nfor-scale {args.for_scale:g}, {args.runs} runs, medians\n")
    print("| alert | severity | arrived after exporter start s | activeAt -> webhook s "
          "| floor (for + group_wait) s | ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for name, severity, _, _ in WATCHED:
        got = [r[name] for r in runs if name in r]
        if not got:
            print(f"| {name} | {severity} | did not arrive within {args.timeout:.0f}s | | | |")
            continue
        arrival = statistics.median(g[0] for g in got)
        latency = statistics.median(g[1] for g in got)
        floor = got[0][2]
        print(f"| {name} | {severity} | {arrival:.1f} | {latency:.2f} | {floor:.2f} "
              f"| {latency / floor:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
