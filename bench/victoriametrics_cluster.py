"""Cluster mode at 108,800 GPUs on VictoriaMetrics (issue 30, Build 6).

Setup, all on loopback: one node-mode ``gpufleet serve`` holding the simulated fleet at
``--scale`` (100: 108,800 GPUs on 13,600 nodes, ~1.6 M series), scraped by ``vmagent``
into a single-node ``victoria-metrics`` (Debian's 1.79: the binaries ``make test``
installs). Once VictoriaMetrics answers for every GPU, a fresh interpreter runs what a
cluster-mode ``gpufleet serve --source prometheus`` runs (``serve.assemble``: the
prometheus source, the collector, the analysis) against VictoriaMetrics' Prometheus API
``--reads`` times, and reports per collection the source's read time and queries, the
collection with the analysis and the /metrics render, the answers' bytes, and its own
peak RSS (``VmHWM``). The cluster index it computes is compared with the one the node-mode
exporter computed itself (its ``gpufleet_cluster_fragmentation_index``, read back from
VictoriaMetrics).

Goals: collection <= 10 s with <= 20 queries; RSS <= 1 GB; the cluster index within
0.5 of node mode's own; judged on the default read (the summaries reader, with
``--summaries``; else the reader of each GPU's up and stale), which the curve fits too.

Issue 45: ``--scales 10,25,50,100`` measures a curve, each point on a fresh stack, and fits a
line to the worst read's wall time and CPU seconds; ``--before DIR`` reads with another
checkout's code on the same stack (``git archive COMMIT | tar -x -C DIR``).

``--summaries`` reads again on the same stack with ``sources.prometheus.node_summaries`` (the
nodes' ``gpufleet_node_gpus`` instead of each GPU's up and stale) and prints the medians' ratios.

``--per-query N`` then sends each query of a read alone, N times, and prints what each costs
VictoriaMetrics (CPU, less its ingestion), with its series and bytes; the exports of identity
and of the value families the source exports too (over 60 and 120 s).

``--identity-refresh 1ms`` reads identity at every read (``sources.prometheus.identity_refresh``,
in every mode, ``--before``'s too): the read that also reads identity, measured warm as well as
first. Each read lists its requests (name, seconds, bytes) in the JSON.

``--priority -15`` runs the bench and all it starts at that nice in a session of its own (with
the kernel's autogroup scheduling a process's nice counts only inside its session; this sets the
session's): on a machine shared with other sessions, the figures are then less the load's.

Usage: ``.venv/bin/python bench/victoriametrics_cluster.py [--scale 100] [--reads 3]
[--scales 10,25,50,100] [--before DIR] [--summaries [--summaries-first]] [--per-query N]
[--identity-refresh 1ms] [--warm-first] [--pause-scrapes | --between-scrapes] [--priority -15]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.priority import prioritise  # noqa: E402

JOB = "gpufleet-nodes"
VM_QUERY_DURATION, VM_QUEUE_DURATION = "300s", "120s"

# the reader, in its own interpreter so that its RSS is cluster mode's alone
READER = r"""
import asyncio, json, sys, time
import exporter.sources.prometheus.source as source_module
from exporter.cli.serve import assemble
from exporter.config import build, Config
from exporter.exposition import LabelCache
from exporter.web.server import collect_and_render

url, selector, reads, query_timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
vm_pid = int(sys.argv[5])
identity_refresh = sys.argv[7]  # "" for the mode's own
# the scrape pipeline (the fleet's node-mode exporter, vmagent): on this machine it shares
# the cores with the reader and VictoriaMetrics, in a fleet it runs on the nodes and on a host
# of its own. --between-scrapes starts each read once it and VictoriaMetrics are idle (a
# scrape ingested); --pause-scrapes stops it while a read runs; both: a scrape is never cut
import os, signal
pipeline = [int(p) for p in sys.argv[8].split(",") if p] if len(sys.argv) > 8 else []
between = len(sys.argv) > 9 and "between" in sys.argv[9]
paused = pipeline if len(sys.argv) > 9 and "pause" in sys.argv[9] else []

def wait_idle(pids, quiet=0.05, every=1.0, limit=180.0):  # seconds until the pids are idle
    started = time.perf_counter()
    last = sum(cpu(p) for p in pids)
    while time.perf_counter() - started < limit:
        time.sleep(every)
        now = sum(cpu(p) for p in pids)
        if now - last < quiet:
            break
        last = now
    return time.perf_counter() - started

def cpu(pid=None):
    import os, resource
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
mode = sys.argv[6]
old_style = mode == "old"  # every family, identity each read by query: the old read
before = mode == "before"  # another checkout (--before), with the options it knows
summaries = mode == "summaries"  # the nodes' gpufleet_node_gpus instead of each GPU's up, stale
answers = {}
requests = []  # (name, seconds from sent to answered, bytes) of each request of a read
if hasattr(source_module.PrometheusFleetSource, "_post"):
    shipped = source_module.PrometheusFleetSource._post

    async def counted(self, name, endpoint, form, headers):  # every request: query and export
        sent = time.perf_counter()
        body = await shipped(self, name, endpoint, form, headers)
        key = name if "/query" in endpoint else f"{name} (export)"
        answers[key] = answers.get(key, 0) + len(body)
        requests.append((key, round(time.perf_counter() - sent, 3), len(body)))
        return body

    source_module.PrometheusFleetSource._post = counted
else:  # a checkout from before the export API
    shipped_query = source_module.PrometheusFleetSource._query

    async def counted_query(self, name, expr, at, headers):
        body = await shipped_query(self, name, expr, at, headers)
        answers[name] = answers.get(name, 0) + len(body)
        return body

    source_module.PrometheusFleetSource._query = counted_query
read_cpu = []
shipped_read = source_module.PrometheusFleetSource.read

async def timed_read(self):  # the process's CPU while the source reads: decoding, building
    before = cpu()
    try:
        return await shipped_read(self)
    finally:
        read_cpu.append(cpu() - before)

source_module.PrometheusFleetSource.read = timed_read
prometheus = {"enabled": True, "url": url, "selector": selector, "query_timeout": query_timeout}
if not before:
    prometheus.update(gpu_telemetry=old_style, identity_refresh="1ms" if old_style else "5m")
if not before:  # each GPU's up and stale, or the summaries (on by default since issue 45)
    prometheus.update(node_summaries=summaries)
if identity_refresh:
    prometheus.update(identity_refresh=identity_refresh)
config = build(Config, {
    "collect_interval": "1h", "source_timeout": "600s",
    "advisor": {"enabled": False},
    "sources": {"sim": {"enabled": False}, "prometheus": prometheus}})
collector, state, _ = assemble(config, ["prometheus"])

def cluster_index(text):  # the rendered index; None when it is not served
    for line in text.splitlines():
        if line.startswith(b"gpufleet_cluster_fragmentation_index "):
            return float(line.split()[1])
    return None

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024

async def main():
    runs = []
    labels = LabelCache()
    source = collector.sources[0]
    if old_style:
        source._export = False
    queries_of = (lambda: source.queries_made) if hasattr(source, "queries_made") else (
        lambda: len(answers))
    for _ in range(reads):
        answers.clear()
        requests.clear()
        queries_before = queries_of() if hasattr(source, "queries_made") else 0
        waited = wait_idle([*pipeline, vm_pid]) if between else 0.0
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        ours, theirs = cpu(), cpu(vm_pid)
        started = time.perf_counter()
        try:
            rendered = await collect_and_render(collector, state, labels, 1)
        finally:
            total = time.perf_counter() - started
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        ours, theirs = cpu() - ours, cpu(vm_pid) - theirs
        snapshot = rendered.snapshot
        prom = [s for s in snapshot.sources if s.source == "prometheus"][0]
        runs.append({"read_s": prom.duration_seconds, "collect_analyse_render_s": total,
                     "waited_for_idle_pipeline_s": round(waited, 1),
                     "cpu_s_ours": ours, "cpu_s_ours_read": read_cpu[-1] if read_cpu else None,
                     "cpu_s_victoria_metrics": theirs,
                     "queries": queries_of() - queries_before,
                     "identity_read": sorted(k for k in answers if k.startswith("identity")),
                     "answer_bytes": sum(answers.values()),
                     "largest_answer": max(answers.items(), key=lambda kv: kv[1]),
                     "gpus": len(snapshot.gpus), "nodes": len(snapshot.nodes),
                     "allocations": len(snapshot.allocations),
                     "stale_gpus": sum(g.stale for g in snapshot.gpus),
                     "up": prom.up, "error": prom.error,
                     "cluster_index": cluster_index(rendered.text),
                     "metrics_series": rendered.series, "metrics_bytes": rendered.text_bytes,
                     "render_s": rendered.render_seconds,
                     "summarised_reads": getattr(source, "summarised_reads", None),
                     "identity_reads": getattr(source, "identity_reads", None),
                     "requests": list(requests)})
    await collector.close()
    print(json.dumps({"runs": runs, "vm_hwm_mb": status("VmHWM"), "vm_rss_mb": status("VmRSS")}))

asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 60) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def instant(base: str, expr: str) -> list[dict]:
    query = urllib.parse.urlencode({"query": expr})
    return get_json(f"{base}/api/v1/query?{query}")["data"]["result"]


def wait_for(check, timeout: float, what: str, every: float = 5.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if check():
                return time.monotonic() - started
        except OSError:
            pass
        time.sleep(every)
    raise TimeoutError(f"{what} not reached within {timeout:.0f} s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=100, help="copies of the 1,088-GPU layout")
    parser.add_argument("--scales", default="",
                        help="a curve: comma-separated scales, each on a fresh stack, e.g. "
                        "10,25,50,100 (10,880 / 27,200 / 54,400 / 108,800 GPUs); a line fitted")
    parser.add_argument("--compare", action="store_true",
                        help="also read the old way on the same stack (every value family, "
                        "identity by query each read)")
    parser.add_argument("--before", type=Path,
                        help="also read with this checkout's code on the same stack (e.g. "
                        "`git archive COMMIT | tar -x -C DIR`)")
    parser.add_argument("--summaries", action="store_true",
                        help="also read with sources.prometheus.node_summaries on the same stack "
                        "(the nodes' gpufleet_node_gpus instead of each GPU's up and stale)")
    parser.add_argument("--summaries-first", action="store_true",
                        help="with --summaries: read with the summaries before each GPU's (the "
                        "order reversed, to see what the order gives the later reads)")
    parser.add_argument("--warm-first", action="store_true",
                        help="before the measured readers, one read by a reader of its own (each "
                        "GPU's path, every query a read sends, identity exported) whose figures "
                        "are printed apart: the measured first reads then meet a VictoriaMetrics "
                        "that has answered these queries before, as one serving vmalert and "
                        "Grafana has, not one queried for the first time since it started")
    parser.add_argument("--pause-scrapes", action="store_true",
                        help="stop the fleet's node-mode exporter and vmagent (SIGSTOP) while "
                        "each read runs, and let them go on after: on this machine their "
                        "scrapes (1.8 M samples a minute at scale 100) share the cores with "
                        "the read; in a fleet they run on the nodes and a host of their own. "
                        "VictoriaMetrics keeps running")
    parser.add_argument("--between-scrapes", action="store_true",
                        help="start each read once the fleet's node-mode exporter, vmagent and "
                        "VictoriaMetrics are idle (under 0.05 CPU s in a second together: a "
                        "scrape scraped and ingested); with --pause-scrapes the pause then never "
                        "cuts a scrape (alone it held them back past max_sample_age)")
    parser.add_argument("--reads", type=int, default=3, help="collections by cluster mode")
    parser.add_argument("--scrape-interval", default="60s", help="vmagent's scrape interval")
    parser.add_argument("--health", action="store_true",
                        help="the simulator's health and performance values too (5.7 M series "
                        "at scale 100 instead of 1.6 M)")
    parser.add_argument("--query-timeout", default="120s",
                        help="sources.prometheus.query_timeout of the reader")
    parser.add_argument("--idle", type=float, default=30.0,
                        help="seconds VictoriaMetrics' CPU is measured with no query, before the "
                        "reads: what ingesting vmagent's scrapes costs it")
    parser.add_argument("--per-query", type=int, default=0, metavar="N",
                        help="after the reads, send each query of a read (every family, the "
                        "summaries, identity by query and by export) alone N times and print "
                        "VictoriaMetrics' CPU, the series and bytes of each: where a read's "
                        "cost goes")
    parser.add_argument("--identity-refresh", default="",
                        help="sources.prometheus.identity_refresh of every reader (1ms: identity "
                        "read at every read); the mode's own when not given")
    parser.add_argument("--priority", type=int, default=None, metavar="NICE",
                        help="run at this nice (-20 to 19) in a session of its own (root for "
                        "a negative one)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    if args.priority is not None:
        if not -20 <= args.priority <= 19:
            parser.error(f"--priority must be -20 to 19, got {args.priority}")
        prioritise(args.priority)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that `finally` stops the servers
    binaries = {name: shutil.which(name) for name in ("victoria-metrics", "vmagent")}
    if None in binaries.values():
        print("victoria-metrics and vmagent are needed; `make vm-deps` installs them",
              file=sys.stderr)
        return 2
    scales = [int(x) for x in args.scales.split(",")] if args.scales else [args.scale]
    points = []
    for scale in scales:
        point = run_point(args, scale, binaries)
        if point is None:
            return 1
        points.append(point)
    if len(points) > 1:
        curve(points)
    return 0


def curve(points: list[dict]) -> None:
    """The points' worst read against GPUs, a least-squares line through them, the time
    per GPU at each against the 27,200-GPU point's, and the line at 1,000,000 GPUs: for the
    wall time and for the CPU seconds (ours + VictoriaMetrics'), which a shared machine's
    load does not inflate."""
    print("\ncurve (each point's worst read; CPU s and RSS of that point's reads):")
    print("GPUs | read s worst (first, later) | queries | CPU s ours / VictoriaMetrics "
          "(worst read) | peak RSS MiB | us per GPU")
    for p in points:
        print(f"{p['gpus']:,} | {p['worst']:.2f} ({p['first']:.2f}, {p['later']:.2f}) | "
              f"{p['queries']} | {p['cpu_ours']:.2f} / {p['cpu_vm']:.2f} | {p['hwm']:.0f} | "
              f"{1e6 * p['worst'] / p['gpus']:.1f}")
    ref = next((p for p in points if p["gpus"] == 27_200), points[0])
    for what, key in (("wall s", lambda p: p["worst"]),
                      ("CPU s", lambda p: p["cpu_ours"] + p["cpu_vm"])):
        xs, ys = [p["gpus"] for p in points], [key(p) for p in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        slope /= sum((x - mx) ** 2 for x in xs)
        intercept = my - slope * mx
        print(f"line, {what} of a read = {intercept:.3f} + {slope * 1e6:.2f} us x GPUs; at "
              f"1,000,000 GPUs {intercept + slope * 1e6:.1f} (one VictoriaMetrics, these cores)")
        for p in points:
            ratio = (key(p) / p["gpus"]) / (key(ref) / ref["gpus"])
            print(f"  {what} per GPU at {p['gpus']:,} / at {ref['gpus']:,}: {ratio:.2f}x "
                  "(goal <= 1.3x at the largest)")


def per_query(vm: str, vm_pid: int, times: int, ingest_per_s: float) -> None:
    """Each query of a read alone, one after another, ``times`` times: the median of
    VictoriaMetrics' CPU (less its ingestion's rate over the query's wall time, measured
    before), its wall time, and the answer's series and bytes. What it costs per series
    selected is what decides which family to read less often."""
    sys.path.insert(0, str(REPO))
    from exporter.sources.prometheus.export import VALUE_FORMAT
    from exporter.sources.prometheus.options import PrometheusSource
    from exporter.sources.prometheus.source import (
        EXPORT_FORMAT,
        EXPORTED_VALUES,
        USED_VALUES,
        build_queries,
    )

    config = PrometheusSource(selector=f'job="{JOB}"', node_summaries=True, gpu_telemetry=True)
    requests = [(name, "query", {"query": expr}) for name, expr in build_queries(config).items()]
    requests.append(("identity (export)", "export/csv", {
        "match[]": build_queries(config)["identity"], "format": EXPORT_FORMAT}))
    # what the source exports of each value family (USED_VALUES but up and stale), over the
    # first read's window (60 s: half of max_sample_age) and the whole one (120 s)
    for family in sorted(EXPORTED_VALUES & USED_VALUES):
        for window in (60, 120):
            requests.append((f"{family} (export, {window} s)", f"export/csv#{window}", {
                "match[]": f'{family}{{job="{JOB}"}}', "format": VALUE_FORMAT}))
    print(f"\nper query, alone (median of {times}): VictoriaMetrics CPU s less ingestion | "
          "wall s | series | MB")
    rows = []
    for name, endpoint, form in requests:
        runs = []
        for _ in range(times):
            at = time.time()
            path, _, window = endpoint.partition("#")  # an export's window, s (120 unless said)
            body = dict(form, time=f"{at:.3f}") if endpoint == "query" else dict(
                form, start=f"{at - float(window or 120):.3f}", end=f"{at:.3f}")
            data = urllib.parse.urlencode(body).encode()
            cpu0, wall0 = cpu_seconds(vm_pid), time.perf_counter()
            with urllib.request.urlopen(f"{vm}/api/v1/{path}", data=data, timeout=600) as r:
                answer = r.read()
            wall = time.perf_counter() - wall0
            cpu = cpu_seconds(vm_pid) - cpu0 - ingest_per_s * wall
            series = answer.count(b'"metric"') if endpoint == "query" else answer.count(b"\n")
            runs.append((cpu, wall, series, len(answer)))
        cpu, wall = sorted(r[0] for r in runs)[times // 2], sorted(r[1] for r in runs)[times // 2]
        rows.append((name, cpu, wall, runs[-1][2], runs[-1][3] / 2 ** 20))
        print(f"  {name} | {cpu:.2f} | {wall:.2f} | {runs[-1][2]:,} | {runs[-1][3] / 2 ** 20:.1f}",
              flush=True)
    print(json.dumps({"per_query": rows}))


def run_point(args: argparse.Namespace, scale: int, binaries: dict) -> dict | None:
    gpus_expected = 1088 * scale
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-vm-"))
    exporter_port, vm_port, agent_port = free_port(), free_port(), free_port()
    vm = f"http://127.0.0.1:{vm_port}"
    (work / "gpufleet.yaml").write_text(
        "collect_interval: 1h\nadvisor: {enabled: false}\nsources:\n"
        f"  sim: {{scale: {scale}, health: {str(args.health).lower()}}}\n")
    (work / "vmagent.yml").write_text(textwrap.dedent(f"""\
        scrape_configs:
          - job_name: {JOB}
            scrape_interval: {args.scrape_interval}
            scrape_timeout: {args.scrape_interval}
            # the default honor_labels: false, as docs/deploy.md says
            static_configs: [{{targets: ["127.0.0.1:{exporter_port}"]}}]
        """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs: dict[str, subprocess.Popen] = {}
    t0 = time.monotonic()
    try:
        procs["exporter"] = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{exporter_port}",
             "--config", str(work / "gpufleet.yaml")], cwd=work, env=env,
            stdout=subprocess.DEVNULL, stderr=(work / "exporter.log").open("w"))
        procs["victoria-metrics"] = subprocess.Popen(
            [binaries["victoria-metrics"], f"-storageDataPath={work / 'vm'}",
             f"-httpListenAddr=127.0.0.1:{vm_port}", "-retentionPeriod=1d",
             # the defaults (30 s, 10 s) refuse the 108,800-series answers on 2 busy cores
             f"-search.maxQueryDuration={VM_QUERY_DURATION}",
             f"-search.maxQueueDuration={VM_QUEUE_DURATION}"],
            stdout=subprocess.DEVNULL, stderr=(work / "victoria-metrics.log").open("w"))
        exporter_ready = wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{exporter_port}/-/ready", timeout=10).status == 200, 1800,
            "the node-mode exporter ready")
        print(f"node-mode exporter ready after {exporter_ready:.0f} s", flush=True)
        procs["vmagent"] = subprocess.Popen(
            [binaries["vmagent"], f"-promscrape.config={work / 'vmagent.yml'}",
             f"-remoteWrite.url={vm}/api/v1/write", f"-httpListenAddr=127.0.0.1:{agent_port}",
             f"-remoteWrite.tmpDataPath={work / 'vmagent-data'}",
             "-promscrape.maxScrapeSize=1GB", "-promscrape.streamParse=true"],
            stdout=subprocess.DEVNULL, stderr=(work / "vmagent.log").open("w"))

        def all_gpus() -> bool:
            result = instant(vm, f'count(gpufleet_gpu_info{{job="{JOB}"}})')
            have = int(float(result[0]["value"][1])) if result else 0
            print(f"  {time.monotonic() - t0:5.0f} s: VictoriaMetrics answers for {have:,} GPUs",
                  flush=True)
            return have == gpus_expected

        filled = wait_for(all_gpus, 1800, "VictoriaMetrics answering for every GPU", every=10)
        print(f"VictoriaMetrics answers for all {gpus_expected:,} GPUs {filled:.0f} s after "
              "vmagent started", flush=True)
        node_answer: list[dict] = []

        def node_index_answered() -> bool:  # a busy VictoriaMetrics may answer it late
            node_answer[:] = instant(vm, f'gpufleet_cluster_fragmentation_index{{job="{JOB}"}}')
            return bool(node_answer)

        wait_for(node_index_answered, 600, "node mode's cluster index", every=10)
        node_index = float(node_answer[0]["value"][1])
        series = instant(vm, f'sum(scrape_samples_scraped{{job="{JOB}"}})')
        scraped = int(float(series[0]["value"][1])) if series else None
        vm_pid = procs["victoria-metrics"].pid
        idle_cpu = cpu_seconds(vm_pid)
        time.sleep(args.idle)
        ingest_per_s = (cpu_seconds(vm_pid) - idle_cpu) / args.idle if args.idle else None
        load_before = os.getloadavg()
        results = {}
        modes = (["new"] + (["old"] if args.compare else []) + (["before"] if args.before else [])
                 + (["summaries"] if args.summaries else []))
        if args.summaries and args.summaries_first:
            modes = ["summaries", *modes[:-1]]
        if args.warm_first:
            modes = ["warm", *modes]
        for mode in modes:
            tree = args.before if mode == "before" else REPO
            reader = subprocess.run(
                [sys.executable, "-c", READER, vm, f'job="{JOB}"',
                 "1" if mode == "warm" else str(args.reads), args.query_timeout,
                 str(procs["victoria-metrics"].pid), "new" if mode == "warm" else mode,
                 args.identity_refresh,
                 ",".join(str(procs[name].pid) for name in ("exporter", "vmagent"))
                 if args.pause_scrapes or args.between_scrapes else "",
                 ",".join(w for w, on in (("between", args.between_scrapes),
                                          ("pause", args.pause_scrapes)) if on)],
                cwd=work, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                timeout=3600)
            if reader.returncode != 0:
                print(reader.stderr[-4000:], file=sys.stderr)
                return None
            results[mode] = json.loads(reader.stdout.strip().splitlines()[-1])
        result = results["new"]
        load_after = os.getloadavg()
        if args.per_query:
            try:
                per_query(vm, vm_pid, args.per_query, ingest_per_s or 0.0)
            except (OSError, ValueError) as exc:  # the reads' figures are still printed
                print(f"per query: {type(exc).__name__}: {exc}", file=sys.stderr)
        others = {name: rss_mb(p.pid) for name, p in procs.items()}
        print(json.dumps({
            "gpus_expected": gpus_expected, "samples_per_scrape": scraped,
            "victoria_metrics_cpu_s_per_s_without_queries": ingest_per_s,
            "node_mode_cluster_index": node_index, "reader": result,
            "reader_old_way": results.get("old"), "reader_before": results.get("before"),
            "reader_summaries": results.get("summaries"),
            "reader_warming_vm": results.get("warm"),
            "rss_mb_other_processes (VmRSS, VmHWM)": others,
            "load_average_before_after": [round(load_before[0], 1), round(load_after[0], 1)],
            "cpus": os.cpu_count()}, indent=1))
        # the goals are the default read's: the summaries reader where it read (node_summaries
        # is on by default), else the "new" one (each GPU's up and stale)
        judged_name = "summaries" if "summaries" in results else "new"
        judged = results[judged_name]
        runs = judged["runs"]
        worst_read = max(r["read_s"] for r in runs)
        worst_queries = max(r["queries"] for r in runs)
        good = [r for r in runs if r["up"] and r["gpus"] == gpus_expected]
        index_gap = max((abs(r["cluster_index"] - node_index) for r in good), default=float("nan"))
        complete = all(r["gpus"] == gpus_expected and r["up"] for r in runs)
        print(f"the {judged_name} reader's collection: worst {worst_read:.2f} s, "
              f"{worst_queries} queries "
              f"(goal <= 10 s, <= 20): {'met' if worst_read <= 10 and worst_queries <= 20 else 'NOT met'}")
        print(f"RSS: peak {judged['vm_hwm_mb']:.0f} MiB (goal <= 1 GB): "
              f"{'met' if judged['vm_hwm_mb'] <= 1024 else 'NOT met'}")
        print(f"cluster index: {index_gap:.3f} from node mode's {node_index:.3f} over {len(good)} "
              "complete reads (goal <= 0.5): "
              f"{'met' if index_gap <= 0.5 else 'NOT met'}")
        print(f"every GPU read, source up: {complete}")
        if "old" in results:
            old = results["old"]["runs"]
            print(f"the old way on the same stack: worst {max(r['read_s'] for r in old):.2f} s, "
                  f"{max(r['queries'] for r in old)} queries, peak RSS "
                  f"{results['old']['vm_hwm_mb']:.0f} MiB")
        if "before" in results:
            old = results["before"]["runs"]
            print(f"{args.before} on the same stack: worst {max(r['read_s'] for r in old):.2f} s, "
                  f"{max(r['queries'] for r in old)} queries, peak RSS "
                  f"{results['before']['vm_hwm_mb']:.0f} MiB")
        if "summaries" in results:
            per_gpu, summary = result["runs"], results["summaries"]["runs"]
            for what in ("cpu_s_victoria_metrics", "cpu_s_ours_read", "answer_bytes", "read_s"):
                a = sorted(r[what] for r in per_gpu)[len(per_gpu) // 2]
                b = sorted(r[what] for r in summary)[len(summary) // 2]
                print(f"node summaries against each GPU's up and stale, median {what}: {b:.3g} "
                      f"against {a:.3g} ({b / a:.2f}x)")
            print(f"  reads summarised: {summary[-1]['summarised_reads']} of {len(summary)}; "
                  f"queries {[r['queries'] for r in summary]} against {[r['queries'] for r in per_gpu]}; "
                  f"GPUs {[r['gpus'] for r in summary]}, stale {[r['stale_gpus'] for r in summary]}; "
                  f"peak RSS {results['summaries']['vm_hwm_mb']:.0f} MiB against {result['vm_hwm_mb']:.0f}")
        worst = max(runs, key=lambda r: r["read_s"])
        return {"gpus": gpus_expected, "worst": worst_read, "first": runs[0]["read_s"],
                "later": max((r["read_s"] for r in runs[1:]), default=float("nan")),
                "queries": worst_queries, "cpu_ours": worst["cpu_s_ours"],
                "cpu_vm": worst["cpu_s_victoria_metrics"], "hwm": judged["vm_hwm_mb"],
                "complete": complete}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
