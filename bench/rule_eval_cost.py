"""Rule-group evaluation cost at 10,880 GPUs, on a real Prometheus and on vmalert (issues 29, 45).

One ``gpufleet serve`` on the simulated fleet at ``--scale`` (10: 10,880 GPUs) is scraped once
and stopped; those bytes are served from this process (a thread, no rendering) so that the
exporter's own CPU does not compete with the rules it is measured beside, and every engine
reads the same series. Then, each for ``--minutes``:

- one Prometheus with this checkout's rules and, side by side, a baseline's (``--before DIR``:
  a folder holding an older ``gpufleet-recording.yaml`` and ``gpufleet-alerts.yaml``, e.g. from
  ``git show <commit>:rules/...``; its groups renamed ``before:<group>`` and its recorded
  series ``before_<name>``, so both sets evaluate over the same data under the same load):
  each group's ``evaluationTime`` from ``/api/v1/rules`` every interval; then, once, every
  rule's expression queried with ``stats=all``: the samples it reads
  (``totalQueryableSamples``), a cost that does not depend on the machine's load;
- VictoriaMetrics (scraping the same bytes) and vmalert with this checkout's rules: each group's
  ``vmalert_iteration_duration_seconds`` (its median and 99th percentile over the run).

Prints, per group, the median and the largest against the goal (1 s at a 30 s interval), the
samples read, and the costliest rules. The rules run as generated, over the newer exporter's
series (a baseline's rules read what they read then; the new gauges go unread).

``--priority -15`` runs the engines at a high priority, so that other work on a shared machine
does not count: the bench leaves its session for one of its own (with the kernel's autogroup
scheduling, on by default, ``nice`` weighs a process only against its own session's, so a
per-process nice does nothing against other terminals' work) and sets that session's nice,
which Prometheus, VictoriaMetrics and vmalert inherit; the exporter's one scrape is taken
before. It needs root (a negative nice). The load average is printed beside each run.

Usage: ``.venv/bin/python bench/rule_eval_cost.py [--before DIR] [--scale 10] [--minutes 3]
[--warmup 10] [--no-vmalert] [--priority -15]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.priority import prioritise  # noqa: E402
from tests.helpers.servers import (  # noqa: E402
    Prometheus,
    free_port,
    http_get,
    require_binary,
    start_exporter,
    start_prometheus,
    start_server,
    stop,
    wait_until,
)

GOAL_SECONDS = 1.0
RULE_FILES = ("gpufleet-recording.yaml", "gpufleet-alerts.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, default=None,
                        help="folder with the baseline's gpufleet-recording.yaml and -alerts.yaml")
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="minutes each engine runs before its figures count: 10 fills "
                             "the rules' 10 min windows, which a short run reads part of")
    parser.add_argument("--interval", default="30s")
    parser.add_argument("--no-vmalert", action="store_true")
    parser.add_argument("--advancing", action="store_true",
                        help="two scrapes one collection apart; every counter served grows "
                             "each interval by what it grew between them (default: one "
                             "scrape served as it is, every counter flat)")
    parser.add_argument("--cpu-repeats", type=int, default=5,
                        help="after the run, each rule's query this many times on the quiet "
                             "Prometheus, its CPU per evaluation (0: not measured)")
    parser.add_argument("--priority", type=int, default=None,
                        help="the engines' nice (-20 to 19), set on a session of their own")
    args = parser.parse_args()
    if args.priority is not None and not -20 <= args.priority <= 19:
        parser.error(f"--priority must be -20 to 19, got {args.priority}")
    seconds = float(args.interval.rstrip("s"))
    with tempfile.TemporaryDirectory(prefix="gpufleet-ruleeval-") as tmp:
        base = Path(tmp)
        exporter = start_exporter(base, config=f"collect_interval: {args.interval}\n"
                                  f"sources:\n  sim:\n    scale: {args.scale}\n", timeout=300)
        try:
            body = http_get(f"{exporter.url}/metrics", timeout=120)
            later = next_collection(exporter.url, body, seconds) if args.advancing else None
        finally:
            stop(exporter.proc)
        if args.priority is not None:
            prioritise(args.priority)
        advancing = Advancing(body, later, seconds) if later is not None else None
        frozen = serve_bytes(body, advancing)
        target = f"127.0.0.1:{frozen.server_address[1]}"
        lines = body.count(b"\n")
        grows = (f", {advancing.growing:,} counter series growing each interval"
                 if advancing is not None else ", every counter flat")
        print(f"## {args.scale * 1088:,} GPUs (scale {args.scale}): {len(body):,} bytes, "
              f"{lines:,} lines{grows}; {args.interval} interval, {args.minutes:g} min "
              f"per run after {args.warmup:g} min of warm-up, goal {GOAL_SECONDS:g} s per group", flush=True)
        try:
            files = [REPO / "rules" / name for name in RULE_FILES]
            if args.before is not None:
                files += renamed_before(args.before, base / "before")
            load = os.getloadavg()[0]
            times, rules, samples, cpu = prometheus_run(base / "prom", target, files, args,
                                                        seconds)
            report(f"Prometheus 2.42 (load average {load:.1f} at the start, "
                   f"{os.getloadavg()[0]:.1f} at the end)", times, samples, cpu)
            costliest(rules)
            if cpu:
                costliest({(group, rule): value for group, rules_cpu in cpu.items()
                           for rule, value in rules_cpu.items()}, "CPU s per evaluation, quiet")
            if not args.no_vmalert:
                load = os.getloadavg()[0]
                vm_times = vmalert_run(base / "vm", target, files[:2], args)
                report(f"vmalert (VictoriaMetrics 1.79), this checkout's rules (load average "
                       f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)",
                       vm_times, {}, {})
        finally:
            frozen.shutdown()
    return 0


def renamed_before(folder: Path, out: Path) -> list[Path]:
    """The baseline's rule files with ``before:`` groups and ``before_`` recorded series."""
    out.mkdir(parents=True)
    docs = {name: yaml.safe_load((folder / name).read_text()) for name in RULE_FILES}
    names = sorted({rule["record"] for doc in docs.values() for group in doc["groups"]
                    for rule in group["rules"] if "record" in rule}, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w:])(" + "|".join(map(re.escape, names)) + r")(?![\w:])")
    paths = []
    for name, doc in docs.items():
        for group in doc["groups"]:
            group["name"] = f"before:{group['name']}"
            for rule in group["rules"]:
                rule["expr"] = pattern.sub(r"before_\1", rule["expr"])
                if "record" in rule:
                    rule["record"] = f"before_{rule['record']}"
        path = out / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(path)
    return paths


def prometheus_run(workdir: Path, target: str, files: list[Path], args: argparse.Namespace,
                   seconds: float) -> tuple[dict[str, list[float]], dict[tuple[str, str], float],
                                            dict[str, int], dict[str, dict[str, float]]]:
    config = {
        "global": {"scrape_interval": args.interval, "evaluation_interval": args.interval},
        "rule_files": [str(path) for path in files],
        "scrape_configs": [{"job_name": "gpufleet-nodes", "scrape_interval": args.interval,
                            "scrape_timeout": args.interval,
                            "static_configs": [{"targets": [target]}]}],
    }
    prom = start_prometheus(workdir, yaml.safe_dump(config))
    try:
        wait_until("the first scrape", lambda: prom.query('up{job="gpufleet-nodes"} == 1'),
                   timeout=300, interval=2)
        times: dict[str, list[float]] = {}
        rule_times: dict[tuple[str, str, int], list[float]] = {}
        counted = time.monotonic() + args.warmup * 60
        deadline = counted + args.minutes * 60
        while time.monotonic() < deadline:
            time.sleep(seconds)
            if time.monotonic() < counted:
                continue
            for group in json.loads(http_get(f"{prom.url}/api/v1/rules"))["data"]["groups"]:
                if not group.get("lastEvaluation", "").startswith("0001"):  # evaluated once
                    times.setdefault(group["name"], []).append(group["evaluationTime"])
                for index, rule in enumerate(group["rules"]):
                    rule_times.setdefault((group["name"], rule["name"], index), []).append(
                        rule["evaluationTime"])
        groups = json.loads(http_get(f"{prom.url}/api/v1/rules"))["data"]["groups"]
        at = f"{time.time() - seconds:.3f}"  # one instant for every rule: the same windows
        quiet(prom, workdir)
        samples, cpu = rule_costs(prom, groups, at, args.cpu_repeats)
    finally:
        stop(prom.proc)
    summed: dict[tuple[str, str], float] = {}
    for (group, rule, _), values in rule_times.items():  # both severities of one name summed
        summed[(group, rule)] = summed.get((group, rule), 0.0) + statistics.median(values)
    return times, summed, samples, cpu


def quiet(prom: Prometheus, workdir: Path) -> None:
    """Prometheus with no scrapes and no rules (its data kept): nothing but the queries sent
    to it uses its CPU."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump({"global": {}}))
    urllib.request.urlopen(urllib.request.Request(f"{prom.url}/-/reload", method="POST"),
                           timeout=60).close()
    wait_until("no rule groups", lambda: not json.loads(
        http_get(f"{prom.url}/api/v1/rules"))["data"]["groups"], timeout=60, interval=1)
    time.sleep(2)  # a scrape or evaluation under way ends


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process (its threads together), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rule_costs(prom: Prometheus, groups: list[dict], at: str, repeats: int
               ) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
    """Per group, the samples its rules read and the CPU seconds one evaluation of them takes
    (each rule's query at ``at``, ``repeats`` times on the quiet Prometheus, its process CPU
    over those runs divided by ``repeats``): what a group costs whatever else the machine
    runs, since a process's CPU time counts only while it runs."""
    samples: dict[str, int] = {}
    cpu: dict[str, dict[str, float]] = {}
    for group in groups:
        for rule in group["rules"]:
            query = urllib.parse.urlencode({"query": rule["query"], "stats": "all", "time": at})
            stats = json.loads(http_get(f"{prom.url}/api/v1/query?{query}", timeout=300))
            read = stats["data"].get("stats", {}).get("samples", {})
            samples[group["name"]] = (samples.get(group["name"], 0)
                                      + int(read.get("totalQueryableSamples", 0)))
            if repeats <= 0:
                continue
            plain = urllib.parse.urlencode({"query": rule["query"], "time": at})
            start = cpu_seconds(prom.proc.pid)
            for _ in range(repeats):
                http_get(f"{prom.url}/api/v1/query?{plain}", timeout=300)
            used = (cpu_seconds(prom.proc.pid) - start) / repeats
            rules = cpu.setdefault(group["name"], {})
            rules[rule["name"]] = rules.get(rule["name"], 0.0) + used  # severities summed
    return samples, cpu


def vmalert_run(workdir: Path, target: str, files: list[Path],
                args: argparse.Namespace) -> dict[str, list[float]]:
    workdir.mkdir(parents=True)
    vm_port, alert_port = free_port(), free_port()
    scrape = workdir / "scrape.yml"
    scrape.write_text(yaml.safe_dump({"scrape_configs": [{
        "job_name": "gpufleet-nodes", "scrape_interval": args.interval,
        "scrape_timeout": args.interval, "static_configs": [{"targets": [target]}]}]}))
    vm = f"http://127.0.0.1:{vm_port}"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start_server("victoria-metrics", workdir, vm_port, [
            require_binary("victoria-metrics"), f"-storageDataPath={workdir / 'data'}",
            f"-httpListenAddr=127.0.0.1:{vm_port}", f"-promscrape.config={scrape}",
            "-retentionPeriod=1", "-search.latencyOffset=0s",
            "-promscrape.maxScrapeSize=512MB"], ready_path="/health"))  # 91 MB at scale 10
        wait_until("the target in VictoriaMetrics", lambda: json.loads(http_get(
            f"{vm}/api/v1/query?query=count(gpufleet_gpu_up)"))["data"]["result"],
            timeout=300, interval=2)
        procs.append(start_server("vmalert", workdir, alert_port, [
            require_binary("vmalert"), *(f"-rule={path}" for path in files),
            f"-datasource.url={vm}", f"-remoteWrite.url={vm}",
            f"-evaluationInterval={args.interval}",
            f"-notifier.url=http://127.0.0.1:{free_port()}",
            f"-httpListenAddr=127.0.0.1:{alert_port}"], ready_path="/health"))
        time.sleep((args.warmup + args.minutes) * 60)  # its quantiles span the last 5 min
        text = http_get(f"http://127.0.0.1:{alert_port}/metrics").decode()
    finally:
        for proc in reversed(procs):
            stop(proc)
    # vmalert_iteration_duration_seconds{group="...",quantile="0.5"} and "0.99"; _count
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if line.startswith("vmalert_iteration_duration_seconds{") and 'quantile="' in line:
            labels, value = line.rsplit(" ", 1)
            group = labels.split('group="')[1].split('"')[0]
            if 'quantile="0.5"' in labels or 'quantile="0.99"' in labels:
                out.setdefault(group, []).append(float(value))
    return out


def report(title: str, times: dict[str, list[float]], samples: dict[str, int],
           cpu: dict[str, dict[str, float]]) -> None:
    print(f"\n### {title}\n| group | median s | max s | against {GOAL_SECONDS:g} s "
          "| samples read | CPU s per evaluation, quiet |\n|---|---|---|---|---|---|")
    for name, values in sorted(times.items(), key=lambda kv: (kv[0].removeprefix("before:"),
                                                               kv[0].startswith("before:"))):
        values = [v for v in values if v == v] or [0.0]  # vmalert reports NaN before a run
        worst = max(values)
        verdict = "meets" if worst <= GOAL_SECONDS else "misses"
        read = f"{samples[name]:,}" if name in samples else ""
        used = f"{sum(cpu[name].values()):.3f}" if name in cpu else ""
        print(f"| {name} | {statistics.median(values):.3f} | {worst:.3f} | {verdict} | {read} "
              f"| {used} |")
    sys.stdout.flush()


def costliest(summed: dict[tuple[str, str], float], what: str = "median s") -> None:
    print(f"\ncostliest rules ({what}, severities summed):")
    for (group, rule), value in sorted(summed.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {value:.3f}  {group}  {rule}")
    sys.stdout.flush()


_SNAPSHOT_TIME = re.compile(rb"^gpufleet_snapshot_timestamp_seconds(?:\{[^}]*\})? (\S+)$", re.M)


def next_collection(url: str, body: bytes, seconds: float) -> bytes:
    """The exporter's next snapshot after ``body``'s (it collects every ``seconds``)."""
    first = _SNAPSHOT_TIME.search(body)
    deadline = time.monotonic() + 3 * seconds + 60
    while time.monotonic() < deadline:
        time.sleep(2)
        later = http_get(f"{url}/metrics", timeout=120)
        now = _SNAPSHOT_TIME.search(later)
        if first is None or now is None or now.group(1) != first.group(1):
            return later
    raise RuntimeError("the exporter made no new snapshot")


class Advancing:
    """``later``'s exposition with every counter series grown, each ``seconds`` since the
    first scrape of it, by what it grew from ``earlier`` to ``later`` (a live fleet's pace:
    rates and window growths as the simulator makes them, not 0 everywhere)."""

    def __init__(self, earlier: bytes, later: bytes, seconds: float) -> None:
        counters = set(re.findall(rb"^# TYPE (\S+) counter$", later, re.M))
        before: dict[bytes, float] = {}
        for line in earlier.splitlines():
            key, _, value = line.rpartition(b" ")
            if key and not line.startswith(b"#") and _name(key) in counters:
                before[key] = float(value)
        self.chunks: list[bytes] = []  # text between the growing values
        self.slots: list[tuple[float, float]] = []  # (value in later, growth per interval)
        pending: list[bytes] = []
        for line in later.splitlines(keepends=True):
            key, _, value = line.rstrip(b"\n").rpartition(b" ")
            grown = (float(value) - before.get(key, float(value))
                     if key and not line.startswith(b"#") and _name(key) in counters else 0.0)
            if grown <= 0:
                pending.append(line)
                continue
            pending.append(key + b" ")
            self.chunks.append(b"".join(pending))
            self.slots.append((float(value), grown))
            pending = [b"\n"]
        self.chunks.append(b"".join(pending))
        self.seconds, self.started = seconds, time.monotonic()
        self.cached: tuple[int, bytes] = (-1, b"")

    @property
    def growing(self) -> int:
        return len(self.slots)

    def body(self) -> bytes:
        step = int((time.monotonic() - self.started) // self.seconds)
        if self.cached[0] != step:
            parts = [self.chunks[0]]
            for (value, grown), chunk in zip(self.slots, self.chunks[1:], strict=True):
                parts.append(repr(value + step * grown).encode())
                parts.append(chunk)
            self.cached = (step, b"".join(parts))
        return self.cached[1]


def _name(key: bytes) -> bytes:
    return key.split(b"{", 1)[0]


def serve_bytes(body: bytes, advancing: Advancing | None = None) -> ThreadingHTTPServer:
    """``body`` (or ``advancing``'s current body) as /metrics on a free local port, in a
    thread, until ``shutdown()``."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if advancing is not None:
                with lock:
                    served = advancing.body()
            else:
                served = body
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(served)))
            self.end_headers()
            self.wfile.write(served)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    sys.exit(main())
