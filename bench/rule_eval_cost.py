"""Rule-group evaluation cost on a real Prometheus at 10,880 GPUs (issue 29, Build 4).

One ``gpufleet serve`` on the simulated fleet at ``--scale`` (10: 10,880 GPUs), one real
Prometheus scraping it every ``--interval`` and evaluating, over the same data at the same
time, this checkout's generated rules and a baseline's alerting groups (``--before``: a
folder holding an older ``gpufleet-alerts.yaml``, e.g. from ``git show main:rules/...``),
renamed ``before:<group>`` so both load side by side. Every interval it reads each group's
``evaluationTime`` from ``/api/v1/rules`` and prints, per group, the median and the
largest over the run, and the rules that cost the most. Goal: every group within 1 s at
a 30 s interval.

``--frozen``: scrape the exporter once, stop it, and serve those bytes to Prometheus from
this process (a thread; no rendering), so that on a small machine the exporter's own CPU
(a render of the whole fleet every interval) does not compete with the rule evaluation it
is measured beside. The values then do not change; a rule's cost is the series and
samples it reads, which stay the same.

Usage: ``.venv/bin/python bench/rule_eval_cost.py --before DIR [--scale 10] [--minutes 4]
[--frozen]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.servers import (  # noqa: E402
    http_get,
    start_exporter,
    start_prometheus,
    stop,
    wait_until,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="folder with the baseline's gpufleet-alerts.yaml")
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--interval", default="30s")
    parser.add_argument("--frozen", action="store_true",
                        help="serve one scrape's bytes from this process, the exporter stopped")
    parser.add_argument("--only-after", action="store_true",
                        help="load only this checkout's rules (no before: groups), so that the "
                        "after figures are not shared with the baseline's cost")
    args = parser.parse_args()
    seconds = float(args.interval.rstrip("s"))
    with tempfile.TemporaryDirectory(prefix="gpufleet-ruleeval-") as tmp:
        base = Path(tmp)
        before = yaml.safe_load((args.before / "gpufleet-alerts.yaml").read_text())
        for group in before["groups"]:
            group["name"] = f"before:{group['name']}"
        (base / "before-alerts.yaml").write_text(yaml.safe_dump(before, sort_keys=False))
        exporter = start_exporter(base, config=f"collect_interval: {args.interval}\n"
                                  f"sources:\n  sim:\n    scale: {args.scale}\n", timeout=300)
        port, frozen = exporter.port, None
        if args.frozen:
            body = http_get(f"{exporter.url}/metrics", timeout=120)
            stop(exporter.proc)
            frozen = serve_bytes(body)
            port = frozen.server_address[1]
            lines = body.count(b"\n")
            print(f"frozen: {len(body):,} bytes, {lines:,} lines", flush=True)
        rule_files = [str(REPO / "rules" / "gpufleet-recording.yaml"),
                      str(REPO / "rules" / "gpufleet-alerts.yaml")]
        if not args.only_after:
            rule_files.append(str(base / "before-alerts.yaml"))
        config = {
            "global": {"scrape_interval": args.interval, "evaluation_interval": args.interval},
            "rule_files": rule_files,
            "scrape_configs": [{"job_name": "gpufleet-nodes", "scrape_interval": args.interval,
                                "scrape_timeout": args.interval,
                                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
        }
        prom = start_prometheus(base / "prometheus", yaml.safe_dump(config))
        try:
            wait_until("the first scrape", lambda: prom.query('up{job="gpufleet-nodes"} == 1'),
                       timeout=300, interval=2)
            times: dict[str, list[float]] = {}
            rule_times: dict[tuple[str, str, int], list[float]] = {}
            deadline = time.monotonic() + args.minutes * 60
            while time.monotonic() < deadline:
                time.sleep(seconds)
                groups = json.loads(http_get(f"{prom.url}/api/v1/rules"))["data"]["groups"]
                for group in groups:
                    times.setdefault(group["name"], []).append(group["evaluationTime"])
                    for index, rule in enumerate(group["rules"]):
                        key = (group["name"], rule["name"], index)
                        rule_times.setdefault(key, []).append(rule["evaluationTime"])
            print(f"## rule groups at scale {args.scale} ({args.scale * 1088:,} GPUs), "
                  f"{args.interval} interval, {len(next(iter(times.values())))} samples")
            print("| group | median s | max s |\n|---|---|---|")
            for name, values in sorted(times.items()):
                print(f"| {name} | {statistics.median(values):.3f} | {max(values):.3f} |")
            # per rule: summed over a group's rules of one name (both severities)
            summed: dict[tuple[str, str], float] = {}
            for (group, rule, _), values in rule_times.items():
                summed[(group, rule)] = summed.get((group, rule), 0.0) + statistics.median(values)
            print("\n## costliest rules (median s, severities summed)")
            for (group, rule), value in sorted(summed.items(), key=lambda kv: -kv[1])[:12]:
                print(f"{value:.3f}  {group}  {rule}")
        finally:
            stop(prom.proc)
            stop(exporter.proc)
            if frozen is not None:
                frozen.shutdown()
    return 0


def serve_bytes(body: bytes) -> ThreadingHTTPServer:
    """``body`` as /metrics on a free local port, in a thread, until ``shutdown()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    sys.exit(main())
