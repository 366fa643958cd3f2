"""Scrape cost of gpufleet against (a) a naive exporter and (b) the limit, at 1k/10k/100k GPUs.

For each fleet size it prints the series count, the render time per snapshot
(text, and text plus gzip), and, measured by wrk (a separate load-generator
process) with 1 client (how Prometheus scrapes) and with 20 concurrent clients:
scrape latency p50/p99 and scrapes per second, for

- gpufleet: the real ``gpufleet serve`` process, serving its cached bytes;
- (a) naive: prometheus-client's ``generate_latest`` over an equivalent Gauge
  registry, rendered per scrape (``prometheus_client.aiohttp`` handler);
- (b) bare: an aiohttp handler returning the same cached bytes, nothing else.

All requests send ``Accept-Encoding: gzip``, as Prometheus does. Targets at 10k
GPUs: latency at least 50x lower than (a); within 1.5x of (b) in p50 and in
scrapes per second.

Usage: ``make bench-deps && .venv/bin/python bench/scrape.py [--sizes 1,10,100] [--seconds 5]``

``--render-only`` (issue 14, Build 8) measures only what one snapshot costs to render and
what the serving process holds: per size, the first render (nothing to reuse) and the
median of ``--renders`` steady renders (the simulator advanced 5 s before each, so every
changing value changes), text and gzip bodies as served; the plain text made on demand;
and the RSS (and peak) of a ``gpufleet serve`` process after its first collection. With
``--no-health`` the simulator serves no issue-16 health and performance values (16 series
per GPU, the fleet issue 14 measured: 1.6 M series at 108,800 GPUs).

``--against DIR`` (issue 27) compares this checkout's renderer with another's (a worktree of
the commit before, ``git worktree add --detach /tmp/render-before main``) in one run:
``--rounds`` times, a ``--render-only`` measurement of each, alternating, each in its own
interpreter importing that checkout's ``exporter`` (``--checkout``), with this same script.
Besides wall time it reports each steady render's CPU time (``time.process_time``), which
other processes on a busy machine inflate far less. Separate interpreters still differ by
more than 5% on a loaded machine: ``bench/render_ab.py`` renders the same snapshots with both
renderers in one process, alternately, which is the comparison to decide on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(url)


def serve_bare(port: int, text_path: str, gzip_path: str) -> None:
    """(b): the fastest an aiohttp exporter can be — the same cached bytes, no logic."""
    from aiohttp import web

    text = Path(text_path).read_bytes()
    gzipped = Path(gzip_path).read_bytes()
    headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    async def metrics(request: web.Request) -> web.Response:
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=gzipped, headers={**headers, "Content-Encoding": "gzip"})
        return web.Response(body=text, headers=headers)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/-/ready", ready)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def serve_naive(port: int, text_path: str) -> None:
    """(a): what most exporters do — a Gauge registry rendered by generate_latest per scrape."""
    from aiohttp import web
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.aiohttp import make_aiohttp_handler
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry(auto_describe=False)
    for family in text_string_to_metric_families(Path(text_path).read_text()):
        samples = family.samples
        names = sorted({k for s in samples for k in s.labels})
        name = samples[0].name if samples else family.name
        gauge = Gauge(name, family.documentation or "help", names, registry=registry)
        for sample in samples:
            values = [sample.labels.get(k, "") for k in names]
            (gauge.labels(*values) if names else gauge).set(sample.value)

    async def ready(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/-/ready", ready)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    match = re.match(r"([\d.]+)(us|ms|s|m)", text)
    assert match, text
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk(url: str, clients: int, seconds: float) -> dict[str, float]:
    binary = shutil.which("wrk")
    if binary is None:
        sys.exit("wrk is not installed: run `make bench-deps`")
    out = subprocess.run(
        [binary, "-t", str(min(clients, 2)), "-c", str(clients), "-d", f"{seconds:g}s", "--latency",
         "--timeout", "60s", "-H", "Accept-Encoding: gzip", url],
        capture_output=True, text=True, check=True,
    ).stdout
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return {"p50_ms": p50, "p99_ms": p99, "rps": rps, "requests": requests}


def render_times(scale: int, renders: int = 3, health: bool = True) -> dict[str, float]:
    """The first render of a snapshot and the median of ``renders`` steady ones (text and
    gzip bodies as the server makes them, ``exposition.render``), then the plain text."""
    import statistics

    from exporter.exposition import LabelCache, render
    from exporter.fleet_sim.fleet import Simulation
    from exporter.sources.sim.options import SimSource

    start = 1_760_000_000.0
    sim = Simulation(SimSource(scale=scale, health=health), start_time=start)
    sim.advance(start + 5)
    labels = LabelCache()  # the server keeps one for its life: what a render may reuse
    snapshot = sim.snapshot()
    started = time.perf_counter()
    rendered = render(snapshot, labels)
    first_s = time.perf_counter() - started
    steady, steady_cpu = [], []
    for step in range(renders):
        sim.advance(start + 10 + 5 * step)
        snapshot = sim.snapshot()
        started, started_cpu = time.perf_counter(), time.process_time()
        rendered = render(snapshot, labels)
        steady.append(time.perf_counter() - started)
        steady_cpu.append(time.process_time() - started_cpu)
    started = time.perf_counter()
    text = rendered.text
    text_s = time.perf_counter() - started
    series = sum(1 for line in text.split(b"\n") if line and not line.startswith(b"#"))
    import exporter.exposition

    return {"renderer": exporter.exposition.__file__,  # the checkout measured (--checkout)
            "gpus": len(snapshot.gpus), "series": series, "text_bytes": len(text),
            "gzip_bytes": len(rendered.gzipped), "render_first_s": first_s,
            "render_steady_s": statistics.median(steady), "render_steady_all_s": steady,
            "render_steady_cpu_s": statistics.median(steady_cpu), "render_steady_cpu_all_s": steady_cpu,
            "plain_text_s": text_s,
            # the wrk report's columns: the steady render is the text and gzip bodies together
            "render_text_s": text_s, "render_gzip_s": statistics.median(steady)}


def serving_rss(scale: int, tmp: Path, health: bool = True) -> dict[str, float]:
    """RSS and peak RSS (MB) of ``gpufleet serve`` on the simulated fleet at ``scale``, once
    its first collection is served (collect_interval 1h: no second one starts)."""
    port = free_port()
    config = tmp / f"rss-{scale}.yaml"
    config.write_text(f"collect_interval: 1h\nsources:\n  sim:\n    scale: {scale}\n"
                      f"    health: {'true' if health else 'false'}\n")
    proc = spawn([sys.executable, "-m", "exporter", "serve", "--config", str(config),
                  "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
                 tmp / f"rss-{scale}.log")
    try:
        wait(f"http://127.0.0.1:{port}/-/ready", timeout=900)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                         headers={"Accept-Encoding": "gzip"})
        urllib.request.urlopen(request, timeout=120).read()  # a scrape, as Prometheus makes
        status = Path(f"/proc/{proc.pid}/status").read_text()
        kb = {k: int(v.split()[0]) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(.+)$", status, re.M)}
        return {"rss_mb": kb["VmRSS"] / 1024, "rss_peak_mb": kb["VmHWM"] / 1024}
    finally:
        proc.terminate()
        proc.wait(30)


def render_only(sizes: list[int], renders: int, health: bool, rss: bool) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in sizes:
            print(f"rendering scale {scale} ...", file=sys.stderr, flush=True)
            result = {"scale": scale, **render_times(scale, renders, health)}
            if rss:
                result.update(serving_rss(scale, Path(tmp), health))
            results.append(result)
    print()
    print("| GPUs | series | text MB | gzip MB | first render s | steady render s "
          "| plain text s | RSS MB | peak RSS MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['gpus']:,} | {r['series']:,} | {r['text_bytes'] / 1e6:.1f} | "
              f"{r['gzip_bytes'] / 1e6:.1f} | {r['render_first_s']:.2f} | "
              f"{r['render_steady_s']:.2f} | {r['plain_text_s']:.2f} | "
              f"{r.get('rss_mb', float('nan')):.0f} | {r.get('rss_peak_mb', float('nan')):.0f} |")
    return results


def against(other: Path, sizes: str, renders: int, health: bool, rounds: int) -> dict[str, list[dict]]:
    """``--render-only`` of ``other``'s renderer ("before") and this checkout's ("after"),
    alternating for ``rounds``, each in a fresh interpreter running this script."""
    import statistics

    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(rounds):
            for side, checkout in (("before", other), ("after", REPO)):
                out = Path(tmp) / f"{side}-{round_}.json"
                print(f"round {round_ + 1}/{rounds}: {side} ({checkout}) ...", file=sys.stderr, flush=True)
                subprocess.run([sys.executable, __file__, "--render-only", "--sizes", sizes,
                                "--renders", str(renders), "--no-rss", "--checkout", str(checkout),
                                "--json", str(out), *([] if health else ["--no-health"])],
                               check=True, stdout=subprocess.DEVNULL)
                runs[side] += json.loads(out.read_text())
                print(f"  rendered by {runs[side][-1]['renderer']}", file=sys.stderr)
    print()
    print("| GPUs | series | | steady render s, median per run | all steady, median | "
          "steady CPU s, median per run | all steady CPU, median |")
    print("|---:|---:|---|---|---:|---|---:|")
    medians: dict[tuple[str, int], tuple[float, float]] = {}
    for side in ("before", "after"):
        for scale in sorted({r["scale"] for r in runs[side]}):
            mine = [r for r in runs[side] if r["scale"] == scale]
            wall = statistics.median(t for r in mine for t in r["render_steady_all_s"])
            cpu = statistics.median(t for r in mine for t in r["render_steady_cpu_all_s"])
            medians[(side, scale)] = (wall, cpu)
            per_run = ", ".join(f"{r['render_steady_s']:.3f}" for r in mine)
            per_run_cpu = ", ".join(f"{r['render_steady_cpu_s']:.3f}" for r in mine)
            print(f"| {mine[0]['gpus']:,} | {mine[0]['series']:,} | {side} | {per_run} | {wall:.3f} | "
                  f"{per_run_cpu} | {cpu:.3f} |")
    for (side, scale), (wall, cpu) in medians.items():
        if side == "after":
            wall_before, cpu_before = medians[("before", scale)]
            print(f"scale {scale}: after/before steady render {wall / wall_before:.3f}x wall, "
                  f"{cpu / cpu_before:.3f}x CPU")
    return runs


def spawn(cmd: list[str], log: Path) -> subprocess.Popen:
    # run in the temp folder so the exporter's relative files (the advisor's outbox) stay there
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, cwd=log.parent, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def measure_size(scale: int, seconds: float, tmp: Path, naive: bool) -> dict:
    result = {"scale": scale, **render_times(scale)}
    del result["gzip_bytes"]  # the served body's, measured below
    port = free_port()
    config = tmp / f"gpufleet-{scale}.yaml"
    # one collection only: later ones would render in the background and disturb the timing
    config.write_text(f"collect_interval: 1h\nsources:\n  sim:\n    scale: {scale}\n")
    procs = [spawn([sys.executable, "-m", "exporter", "serve", "--config", str(config),
                    "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
                   tmp / f"gpufleet-{scale}.log")]
    try:
        wait(f"http://127.0.0.1:{port}/-/ready")
        url = f"http://127.0.0.1:{port}/metrics"
        text_path, gzip_path = tmp / "body.txt", tmp / "body.gz"
        text_path.write_bytes(urllib.request.urlopen(url, timeout=60).read())
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        gzip_path.write_bytes(urllib.request.urlopen(request, timeout=60).read())
        result["gzip_bytes"] = gzip_path.stat().st_size
        servers = {"gpufleet": url}
        bare_port = free_port()
        procs.append(spawn([sys.executable, __file__, "--serve-bare", str(bare_port),
                            str(text_path), str(gzip_path)], tmp / "bare.log"))
        servers["bare"] = f"http://127.0.0.1:{bare_port}/metrics"
        if naive:
            naive_port = free_port()
            procs.append(spawn([sys.executable, __file__, "--serve-naive", str(naive_port),
                                str(text_path)], tmp / "naive.log"))
            servers["naive"] = f"http://127.0.0.1:{naive_port}/metrics"
        for name, server_url in servers.items():
            wait(server_url.replace("/metrics", "/-/ready"))
            for clients in (1, 20):
                urllib.request.urlopen(server_url, timeout=120).read()  # warm-up
                # the naive server renders for seconds per scrape: give wrk time for several
                duration = seconds * (clients if name == "naive" else 1)
                result[f"{name}_c{clients}"] = wrk(server_url, clients, duration)
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # the naive server may be mid-render
                proc.kill()
                proc.wait()
    return result


def report(results: list[dict]) -> None:
    print()
    print("| GPUs | series | text MB | gzip MB | render text ms | render text+gzip ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['gpus']:,} | {r['series']:,} | {r['text_bytes'] / 1e6:.1f} | "
              f"{r['gzip_bytes'] / 1e6:.2f} | {r['render_text_s'] * 1000:.0f} | "
              f"{r['render_gzip_s'] * 1000:.0f} |")
    print()
    print("| GPUs | clients | server | p50 ms | p99 ms | scrapes/s | p50 vs gpufleet "
          "| scrapes/s vs gpufleet |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        for clients in (1, 20):
            ours = r[f"gpufleet_c{clients}"]
            for name in ("gpufleet", "bare", "naive"):
                m = r.get(f"{name}_c{clients}")
                if m is None:
                    continue
                if not m["requests"]:
                    print(f"| {r['gpus']:,} | {clients} | {name} | no scrape finished | | | | |")
                    continue
                print(f"| {r['gpus']:,} | {clients} | {name} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} "
                      f"| {m['rps']:.1f} | {m['p50_ms'] / ours['p50_ms']:.2f}x | "
                      f"{m['rps'] / ours['rps']:.2f}x |")
    print()
    for r in results:
        ours, bare = r["gpufleet_c1"], r["bare_c1"]
        line = (f"{r['gpus']:,} GPUs, 1 client: gpufleet p50 {ours['p50_ms']:.2f} ms is "
                f"{ours['p50_ms'] / bare['p50_ms']:.2f}x bare (target <= 1.5x), "
                f"scrapes/s {bare['rps'] / ours['rps']:.2f}x below bare (target <= 1.5x)")
        if "naive_c1" in r:
            line += (f"; naive p50 is {r['naive_c1']['p50_ms'] / ours['p50_ms']:.0f}x gpufleet's "
                     "(target >= 50x)")
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,10,100",
                        help="sim scale factors: 1 = 1,088 GPUs, 10 = 10,880, 100 = 108,800")
    parser.add_argument("--seconds", type=float, default=5.0, help="wrk duration per measurement")
    parser.add_argument("--naive-up-to", type=int, default=10,
                        help="largest scale at which the naive exporter (a) is measured")
    parser.add_argument("--json", metavar="FILE", help="also write the raw results here")
    parser.add_argument("--render-only", action="store_true",
                        help="render times and serving RSS only, no wrk (issue 14, Build 8)")
    parser.add_argument("--renders", type=int, default=3, help="steady renders per size")
    parser.add_argument("--no-health", action="store_true",
                        help="simulate no health and performance values (16 series per GPU)")
    parser.add_argument("--no-rss", action="store_true", help="skip the serving process's RSS")
    parser.add_argument("--against", metavar="DIR", type=Path,
                        help="compare render times with the checkout DIR (before) in one run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of --against")
    parser.add_argument("--checkout", metavar="DIR", type=Path,
                        help="import exporter from the checkout DIR instead of this one")
    parser.add_argument("--serve-bare", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--serve-naive", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(int(args.serve_bare[0]), args.serve_bare[1], args.serve_bare[2])
        return
    if args.serve_naive:
        serve_naive(int(args.serve_naive[0]), args.serve_naive[1])
        return
    if args.checkout:
        sys.path.insert(0, str(args.checkout.resolve()))
    if args.against:
        runs = against(args.against.resolve(), args.sizes, args.renders, not args.no_health, args.rounds)
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=2))
        return
    if args.render_only:
        results = render_only([int(s) for s in args.sizes.split(",")], args.renders,
                              not args.no_health, not args.no_rss)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (int(s) for s in args.sizes.split(",")):
            print(f"measuring scale {scale} ...", file=sys.stderr, flush=True)
            results.append(measure_size(scale, args.seconds, Path(tmp), scale <= args.naive_up_to))
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
