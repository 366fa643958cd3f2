"""Cost of building a 10k-GPU snapshot from a real Prometheus: the prometheus source
against one query per node, measured in the same run.

Setup: one ``gpufleet serve`` with ``sources.sim.scale: 10`` (10,880 GPUs on 1,360
nodes) holding one snapshot, a real Prometheus scraping it, both on loopback. Then:

- gpufleet: ``PrometheusFleetSource.read()`` (18 instant queries, one per per-GPU
  family plus a few small ones, each decoded in a worker thread on arrival);
- baseline: one instant query per node for all of that node's gpufleet series,
  8 in flight at a time over one keep-alive session, uncompressed like gpufleet's,
  decoded and built by the same code.

Both produce the full snapshot and are checked to hold every GPU. Target:
gpufleet at most 2 s and at most 20 queries per snapshot.

Two variants of gpufleet's own design are measured too, to back its two choices:
raw series per family (no ``max by (node, gpu, instance, job)``, so every identity
label is encoded and decoded), and the shipped queries with the cyclic GC left
running while decoding.

Usage: ``.venv/bin/python bench/prometheus_source.py [--scale 10] [--reads 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import exporter.sources.prometheus.source as prometheus_module  # noqa: E402
from exporter.sources.prometheus.options import PrometheusSource  # noqa: E402
from exporter.sources.prometheus.source import (  # noqa: E402
    ALLOCATION_FAMILIES,
    GPU_VALUES,
    MIG_FAMILIES,
    NODE_FAMILIES,
    _Result,
    build,
    build_snapshot,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} not ready within {timeout}s")


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time of a process (this one by default): contention-proof, unlike wall time."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by us and by Prometheus between start() and stop()."""

    def __init__(self, prom_pid: int) -> None:
        self.prom_pid = prom_pid

    def __enter__(self) -> CpuMeter:
        self.ours, self.prom = cpu_seconds(), cpu_seconds(self.prom_pid)
        return self

    def __exit__(self, *exc) -> None:
        self.ours = cpu_seconds() - self.ours
        self.prom = cpu_seconds(self.prom_pid) - self.prom


def instant(prom: str, expr: str) -> list[dict]:
    query = urllib.parse.urlencode({"query": expr})
    return get_json(f"{prom}/api/v1/query?{query}")["data"]["result"]


# the baseline sorts each node's series into the source's query groups by name
_GROUP_OF = {name: name for name in GPU_VALUES}
_GROUP_OF |= {name: "allocations" for name in ALLOCATION_FAMILIES}
_GROUP_OF |= {name: "mig" for name in MIG_FAMILIES}
_GROUP_OF |= {name: "nodes" for name in NODE_FAMILIES}
_GROUP_OF["gpufleet_gpu_info"] = "identity"


async def per_node_baseline(prom: str, nodes: list[str], at: float) -> tuple[float, int, int]:
    """One query per node; returns (seconds, queries, GPUs in the built snapshot)."""
    import aiohttp

    expr = '{{__name__=~"gpufleet_(gpu|node|allocation)_.+", node="{node}"}}'
    limit = asyncio.Semaphore(8)
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:

        async def one(node: str) -> bytes:
            async with limit, session.post(f"{prom}/api/v1/query", data={
                    "query": expr.format(node=node), "time": f"{at:.3f}"},
                    headers={"Accept-Encoding": "identity"}) as resp:
                resp.raise_for_status()
                return await resp.read()

        bodies = await asyncio.gather(*(one(n) for n in nodes))
    groups: dict[str, list[dict]] = {g: [] for g in {*_GROUP_OF.values(), "old"}}
    with prometheus_module._no_cycle_collection():  # the same decoding as gpufleet's
        for body in bodies:
            for series in json.loads(body)["data"]["result"]:
                group = _GROUP_OF.get(series["metric"]["__name__"])
                if group:
                    groups[group].append(series)
        results = {name: _Result(name, items) for name, items in groups.items()}
        snapshot, _, _ = build_snapshot(at, results)
    return time.perf_counter() - started, len(nodes), len(snapshot.gpus)


async def gpufleet_reads(prom: str, reads: int, raw: bool = False) -> tuple[list[float], int, int]:
    source = build(PrometheusSource(enabled=True, url=prom, query_timeout=30.0), time.time)
    if raw:  # variant: every value family as raw series, all labels included
        source._queries.update({family: f"{family}{{}}" for family in GPU_VALUES})
    times = []
    try:
        snapshot = None
        for _ in range(reads):
            before = source.queries_made
            started = time.perf_counter()
            snapshot = await source.read()
            times.append(time.perf_counter() - started)
            queries = source.queries_made - before
    finally:
        await source.close()
    return times, queries, len(snapshot.gpus) if snapshot else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=int, default=10, help="copies of the 1,088-GPU layout")
    parser.add_argument("--reads", type=int, default=5, help="snapshots built by gpufleet")
    parser.add_argument("--baseline-reads", type=int, default=3,
                        help="snapshots built one query per node")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("prometheus is not installed; `make test` installs it", file=sys.stderr)
        return 2
    gpus_expected = 1088 * args.scale
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-prom-"))
    exporter_port, prom_port = free_port(), free_port()
    (work / "gpufleet.yaml").write_text(
        f"collect_interval: 1h\nsources:\n  sim: {{scale: {args.scale}}}\n")
    (work / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 10s, scrape_timeout: 9s}}
scrape_configs:
  - job_name: gpufleet-nodes
    static_configs: [{{targets: ["127.0.0.1:{exporter_port}"]}}]
""")
    procs = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{exporter_port}",
             "--config", str(work / "gpufleet.yaml")], cwd=work,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL, stderr=(work / "exporter.log").open("w")))
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("w")))
        prom = f"http://127.0.0.1:{prom_port}"
        wait_for(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{exporter_port}/-/ready", timeout=5).status == 200, 600, "exporter")

        def scraped() -> bool:
            result = instant(prom, "count(gpufleet_gpu_info)")
            return bool(result) and int(float(result[0]["value"][1])) == gpus_expected

        wait_for(scraped, 300, "Prometheus holding every GPU")
        time.sleep(1)
        series = int(float(instant(prom, 'count({__name__=~"gpufleet_.+"})')[0]["value"][1]))
        nodes = sorted(r["metric"]["node"] for r in instant(prom, "gpufleet_node_info"))

        with CpuMeter(procs[1].pid) as ours_cpu:
            times, queries, gpus = asyncio.run(gpufleet_reads(prom, args.reads))
        base_runs = []
        with CpuMeter(procs[1].pid) as base_cpu:
            for _ in range(args.baseline_reads):
                base_runs.append(asyncio.run(per_node_baseline(prom, nodes, time.time())))
        base_seconds = statistics.median(run[0] for run in base_runs)
        base_queries, base_gpus = base_runs[0][1], min(run[2] for run in base_runs)
        with CpuMeter(procs[1].pid) as raw_cpu:
            raw_times, _, _ = asyncio.run(gpufleet_reads(prom, args.reads, raw=True))
        shipped_pause = prometheus_module._no_cycle_collection
        prometheus_module._no_cycle_collection = contextlib.nullcontext
        try:
            with CpuMeter(procs[1].pid) as gc_cpu:
                gc_times, _, _ = asyncio.run(gpufleet_reads(prom, args.reads))
        finally:
            prometheus_module._no_cycle_collection = shipped_pause
        if gpus != gpus_expected or base_gpus != gpus_expected:
            print(f"snapshot incomplete: gpufleet {gpus}, baseline {base_gpus}, "
                  f"expected {gpus_expected}", file=sys.stderr)
            return 1
        median = statistics.median(times)
        print(f"fleet: {gpus_expected} GPUs on {len(nodes)} nodes, {series} gpufleet series "
              f"in Prometheus; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        print(f"gpufleet (one query per family): median {median:.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}) over {len(times)} reads, "
              f"{queries} queries per snapshot; CPU per snapshot: "
              f"{ours_cpu.ours / len(times):.2f} s ours + {ours_cpu.prom / len(times):.2f} s "
              "Prometheus")
        print(f"baseline (one query per node): median {base_seconds:.3f} s over "
              f"{len(base_runs)} reads, {base_queries} queries per snapshot; CPU per snapshot: "
              f"{base_cpu.ours / len(base_runs):.2f} s ours + "
              f"{base_cpu.prom / len(base_runs):.2f} s Prometheus")
        print(f"ratio baseline/gpufleet: {base_seconds / median:.1f}x time, "
              f"{base_queries / queries:.0f}x queries")
        for label, variant, meter in (("raw series per family", raw_times, raw_cpu),
                                      ("GC running while decoding", gc_times, gc_cpu)):
            print(f"variant, {label}: median {statistics.median(variant):.3f} s; CPU per "
                  f"snapshot: {meter.ours / len(variant):.2f} s ours + "
                  f"{meter.prom / len(variant):.2f} s Prometheus")
        met = median <= 2.0 and queries <= 20
        print(f"target (<= 2 s and <= 20 queries): {'met' if met else 'NOT met'}")
        return 0
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
