"""Re-runs the attacks of issue 14 against a real ``gpufleet serve`` process on 127.0.0.1.

Each row starts its own exporter (``python -m exporter serve`` from this checkout, in a
temporary folder, so the advisor's outbox lands there) and prints its input, what the
issue expects and what was observed; a table of all rows comes at the end
(``docs/reliability.md`` holds the last figures). Every attack is bounded in count and
time and stops by itself; all traffic goes to 127.0.0.1; every process started here is
stopped at the end, whatever happens.

Rows (``--only NAME``, repeatable), by defect of the issue:

- ``whatif-1e9`` (1): ``POST /v1/plan`` whose node claims ``gpu_count`` 1e9, with the token.
- ``idle-connections`` (2): 20,000 idle TCP connections, kept open (any the server closes
  is reopened within 0.25 s), while another process scrapes /metrics every second on a
  fresh connection.
- ``dcgm-hostile`` (3): a dcgm source with 9 hostile targets and 1 good one, ~10 collections.
- ``dcgm-dup-secret`` (3, 5): one endpoint listed by address and by name; a target with
  ``user:password@``.
- ``bad-input``, ``token-rotation`` (6, 7): malformed /v1/plan and /v1/alerts bodies, blank
  and non-ASCII tokens, a rotated token file.
- ``config-billion-laughs``, ``bad-configs`` (7): hostile config files.
- ``snapshot-50`` (8): ``wrk -c50`` on /v1/snapshot.
- ``full-disk`` (4): the advisor's outbox on a 2 MB tmpfs filled up before the plan is
  proposed; then space is freed: the plan must reach the scheduler once (needs root for
  ``mount``; skipped otherwise).
- ``expired-plan`` (4): the scheduler down until the plan's TTL passes; the identical plan
  proposed again after the cooldown must reach it once the scheduler is up.
- ``wrk`` (9): ``wrk -c1000 -d15s -t2 --latency`` against /metrics.

Rows of issue 32, by its finding:

- ``slurm-escape`` (1, 12): scontrol wrapped in ``timeout 60``, with a ``setsid`` child
  holding the pipe, and answering then leaving such a child; no process or fd may be left.
- ``slurm-words`` (10): scontrol answering one 2 MB field of words, /-/healthy timed meanwhile.
- ``log-stall`` (3): stderr a pipe nobody reads, 2,000 malformed requests, then the probes.
- ``prometheus-2gb`` (2): every query answered with 2 GB of series, no Content-Length;
  the exporter's peak RSS, its probes and the source's reason.
- ``kube-20k`` (2): 20,000 nodes x 64 GPUs from the tests' fake apiserver; the same.
- ``sighup`` (4): 5 SIGHUPs with the token file rotated; the process lives and reloads.
- ``restart-cooldown`` (6): a restart on the same outbox inside the cooldown: no second plan.
- ``alert-flood`` (11): Alertmanager notifications over 10,000 groups for 10 s; the
  snapshot's age, /-/ready and the info lines.
- ``prometheus-bad-series`` (13): 8 good GPUs beside each bad series of the finding.
- ``malformed-flood`` (17): 8 clients sending malformed requests for 10 s; the log lines.
- ``full-disk-outcome`` (7): the POST succeeds once the disk is full, its outcome cannot be
  written: the POSTs counted (needs root for ``mount``).
- ``clock-step`` (5): the exporter's wall clock stepped back 1 h (a sitecustomize moving
  ``time.time``) while a delivery is retried; the delay once the scheduler is up.
- ``label-churn`` (9): 1,000 snapshots, one node replaced by a new machine in each, through
  serve's pipeline in one process; RSS and the label cache's size along the way.
- ``kube-300k-pods`` (10): 300,000 pods (600 list pages) from the tests' fake apiserver;
  the slowest /metrics and /-/healthy while they are listed and built.
- ``kube-410-storm`` (8, 16): every watch answered with an ERROR 410 whose Status lacks
  ``"status": "Failure"``; the lists counted for 30 s.
- ``kube-deep`` (16): one pod nested 3,000 deep among 100; the rest read, it counted.
- ``dcgm-two-addresses`` (15): one dcgm-exporter reached by two ports; its GPUs once.
- ``corrupt-outbox`` (14): every other page of the outbox zeroed; exit 2 with one line.
- ``sigterm-drain`` (18): SIGTERM during a 1 MB/s scrape; every byte still delivered.

Rows of issue 39, by its finding:

- ``dcgm-claims-other-node``, ``dcgm-claims-all`` (1): a fake dcgm target of a targets file
  turning to name another node (gpu-008 as gpu-005, its node configured), or ``ALL`` (reached
  by address), with XID 79; then another node's own XID 79 as the control: what is refused,
  delivered and printed by ``gpufleet plan --format slurm``.
- ``event-order`` (2): skipped here, as it needs a real Slurm (the tests start one).
- ``webhook-redirect``, ``webhook-1.5gb`` (3): receivers answering 302 and 307 to a recorder
  on another port; a receiver streaming 1.5 GB to the Deliverer in a process of its own.
- ``secret-fifo`` (4): a FIFO or ``/dev/zero`` as the token file at start, and renamed over it
  at run time with one unauthenticated POST; /-/healthy and SIGTERM.
- ``slurm-gres-2m`` (6): a ``Gres=`` of 2,000 ``gpu:h100:1024`` entries (28 kB, 2,048,000 GPUs).
- ``cli-numbers`` (7): the out-of-range numbers of ``simulate`` and ``act --events /dev/zero``.

``--memory-max 1G`` (root) runs ``prometheus-2gb`` and ``kube-20k``'s exporter in a memory
cgroup of that limit, as the shipped unit's ``MemoryMax=1G``, and reports its charged peak
and OOM kills beside the RSS.

Usage: ``make bench-deps && .venv/bin/python bench/attack.py`` (about 15 minutes, 7 of them
``label-churn``: ``--churn-snapshots 200`` shortens it);
``--connections 500 --seconds 3 --collections 3 --wrk-connections 100 --wrk-seconds 3``
for a quick run. Exit status 1 when a row misses its expectation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import helpers  # noqa: E402  (the exporter starter the tests use)
from tests.helpers import Server, free_port, stop  # noqa: E402

GOOD_DCGM_BODY = REPO / "data" / "dcgm-samples" / "h100-8gpu-k8s-pod-labels.prom"
L4_DCGM_BODY = REPO / "data" / "dcgm-samples" / "l4-1gpu-default-counters.prom"
TOKEN = "attack-bench-token"

# every process this bench starts, stopped in main()'s finally whatever happened
_PROCS: list[subprocess.Popen] = []
# every cgroup it made (--memory-max), removed once its processes are stopped
_CGROUPS: list[MemoryCgroup] = []


# -- helpers -----------------------------------------------------------------------------------

def stop_all() -> None:
    while _PROCS:
        stop(_PROCS.pop())
    while _CGROUPS:
        _CGROUPS.pop().remove()


def rss_mb(pid: int) -> float | None:
    """VmRSS of ``pid`` in MB (10^6 bytes), or None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / 1e6
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def open_files_limit(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return line.split()[3]
    except OSError:
        pass
    return "?"


class RssPoller:
    """Polls a process's VmRSS every ``interval`` seconds in a thread; ``peak`` is the largest."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = rss_mb(pid) or 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = rss_mb(self.pid)
            if rss is not None:
                self.peak = max(self.peak, rss)

    def __enter__(self) -> RssPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class MemoryCgroup:
    """A child memory cgroup with a hard limit, as the shipped unit's ``MemoryMax=1G`` makes
    one: cgroup v2's ``memory.max`` where the unified hierarchy has the memory controller,
    else cgroup v1's ``memory.limit_in_bytes`` (what systemd writes for ``MemoryMax=`` on a
    v1 host). Needs root. ``start`` puts a process in it from its first instruction: this
    process joins the cgroup for the fork only (so the child is born inside and every page
    it touches is charged there), then goes back."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit = limit
        unified = Path("/sys/fs/cgroup")
        own = Path("/proc/self/cgroup").read_text().splitlines()
        if "memory" in (unified / "cgroup.controllers").read_text(errors="replace").split() \
                if (unified / "cgroup.controllers").exists() else False:
            self.v2 = True
            parent = unified / next(line.split(":", 2)[2] for line in own
                                    if line.startswith("0::")).lstrip("/")
        else:
            self.v2 = False
            parent = Path("/sys/fs/cgroup/memory") / next(
                line.split(":", 2)[2] for line in own
                if "memory" in line.split(":", 2)[1].split(",")).lstrip("/")
        self.home = parent / "cgroup.procs"
        self.path = parent / f"gpufleet-bench-{name}-{os.getpid()}"
        self.path.mkdir()
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(limit))
        if self.v2:
            # no swap to hide in, as on the machine measured (no swap configured)
            with contextlib.suppress(OSError):
                (self.path / "memory.swap.max").write_text("0")

    def start(self, start: Callable[[], Server]) -> Server:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))
        try:
            return start()
        finally:
            self.home.write_text(str(os.getpid()))

    def read(self) -> dict[str, object]:
        """The limit, the peak charged, and the OOM kills (0 is the claim)."""
        def value(name: str) -> str:
            return (self.path / name).read_text().strip()
        if self.v2:
            events = dict(line.split() for line in value("memory.events").splitlines())
            peak = int(value("memory.peak")) if (self.path / "memory.peak").exists() else None
            return {"cgroup": "v2", "memory.max": int(value("memory.max")), "memory.peak": peak,
                    "oom": int(events.get("oom", 0)), "oom_kill": int(events.get("oom_kill", 0)),
                    "max_events": int(events.get("max", 0))}
        oom = dict(line.split() for line in value("memory.oom_control").splitlines())
        return {"cgroup": "v1", "memory.limit_in_bytes": int(value("memory.limit_in_bytes")),
                "memory.max_usage_in_bytes": int(value("memory.max_usage_in_bytes")),
                "memory.failcnt": int(value("memory.failcnt")),
                "oom_kill": int(oom.get("oom_kill", 0)), "under_oom": int(oom.get("under_oom", 0))}

    def remove(self) -> None:
        # the processes in it are stopped by then (stop_all); rmdir fails while one lives
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def parse_bytes(text: str) -> int:
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1G, 512M)")
    return int(match[1]) * units[match[2]]


def cgroup_summary(seen: dict[str, Any]) -> str:
    cg = seen.get("cgroup")
    if not isinstance(cg, dict):
        return ""
    if cg["cgroup"] == "v2":
        return (f"; cgroup v2 memory.max {cg['memory.max'] / 2**30:g} GiB: memory.peak "
                f"{(cg['memory.peak'] or 0) / 1e6:.0f} MB, oom_kill {cg['oom_kill']}, "
                f"max events {cg['max_events']}")
    return (f"; cgroup v1 memory.limit_in_bytes {cg['memory.limit_in_bytes'] / 2**30:g} GiB: "
            f"max_usage_in_bytes {cg['memory.max_usage_in_bytes'] / 1e6:.0f} MB, failcnt "
            f"{cg['memory.failcnt']}, oom_kill {cg['oom_kill']}")


def start_limited(args: argparse.Namespace, tmp: Path, *argv: str,
                  **kwargs: Any) -> tuple[Server, MemoryCgroup | None]:
    """``start_exporter``, inside a ``--memory-max`` cgroup when one is asked for."""
    if not args.memory_max:
        return start_exporter(tmp, *argv, **kwargs), None
    cgroup = MemoryCgroup(args.memory_max, tmp.name)
    _CGROUPS.append(cgroup)
    timeout = kwargs.pop("timeout", 60.0)
    # born inside; this process leaves before it waits for /-/ready, so nothing of its own
    # is charged there
    exporter = cgroup.start(lambda: start_exporter(tmp, *argv, ready=False, **kwargs))
    try:
        helpers.wait_http(f"{exporter.url}/-/ready", timeout=timeout, proc=exporter.proc)
    except Exception:
        raise RuntimeError(f"exporter did not start: {exporter.log.read_text()[-2000:]}") from None
    return exporter, cgroup


def start_exporter(tmp: Path, *args: str, timeout: float = 60.0, **kwargs) -> Server:
    """The tests' exporter starter (tests/helpers), with the process stopped in main()'s finally."""
    exporter = helpers.start_exporter(tmp, *args, timeout=timeout, **kwargs)
    _PROCS.append(exporter.proc)
    return exporter


def log_lines(exporter: Server) -> list[str]:
    return exporter.log.read_text(errors="replace").splitlines()


def request(url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 10.0) -> tuple[int | None, float, bytes]:
    """One request on a fresh connection: (status or None on failure, seconds, body)."""
    started = time.perf_counter()
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
            return resp.status, time.perf_counter() - started, body
    except urllib.error.HTTPError as exc:
        return exc.code, time.perf_counter() - started, exc.read()
    except OSError as exc:
        return None, time.perf_counter() - started, repr(exc).encode()


@dataclass
class Row:
    name: str
    input: str
    expected: str
    observed: str = ""
    ok: bool | None = None  # None: skipped
    figures: dict[str, object] = field(default_factory=dict)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# -- 1. what-if with a billion GPUs ------------------------------------------------------------

def node(gpu_count: object) -> dict[str, object]:
    return {"name": "gpu-001", "model": "h100-sxm-80gb", "cpu_cores": 64, "pool": "gpu-h100",
            "generation": "hopper", "gpu_count": gpu_count}


def whatif_1e9(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("whatif-1e9", "POST /v1/plan, one node with gpu_count 1e9 (integer 1000000000, "
              f"and the float 1e9), valid bearer token; {args.repeat} times each",
              "400 naming nodes[0].gpu_count, each under 100 ms; exporter RSS not growing")
    exporter = start_exporter(tmp, env={"GPUFLEET_ADVISOR_TOKEN": TOKEN})
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    url = f"{exporter.url}/v1/plan"
    now = time.time()
    # control: the same body with 8 GPUs is planned (200), so the 400 is the bound, not the token
    control, control_s, _ = request(url, json.dumps({"taken_at": now, "nodes": [node(8)]}).encode(),
                                    headers, timeout=30)
    time.sleep(1)
    before = rss_mb(exporter.proc.pid) or 0.0
    statuses: dict[int | None, int] = {}
    times: list[float] = []
    reasons: list[str] = []
    with RssPoller(exporter.proc.pid) as poller:
        for _ in range(args.repeat):
            for count in (1_000_000_000, 1e9):
                body = json.dumps({"taken_at": now, "nodes": [node(count)]}).encode()
                status, took, reply = request(url, body, headers, timeout=30)
                statuses[status] = statuses.get(status, 0) + 1
                times.append(took)
                reason = reply.decode(errors="replace")[:160]
                if reason not in reasons:
                    reasons.append(reason)
    time.sleep(1)
    after = rss_mb(exporter.proc.pid) or 0.0
    alive = exporter.proc.poll() is None
    row.figures = {"statuses": {str(k): v for k, v in statuses.items()},
                   "max_ms": max(times) * 1000, "p50_ms": statistics.median(times) * 1000,
                   "rss_before_mb": before, "rss_peak_mb": poller.peak, "rss_after_mb": after,
                   "control_status": control, "control_ms": control_s * 1000}
    row.ok = (set(statuses) == {400} and max(times) < 0.1 and all("nodes[0].gpu_count" in r for r in reasons)
              and after - before < 5 and alive)
    row.observed = (f"{', '.join(f'{n} x {s}' for s, n in statuses.items())}, "
                    f"max {ms(max(times))}, p50 {ms(statistics.median(times))}; replies {reasons}; "
                    f"RSS {before:.1f} MB before, peak {poller.peak:.1f}, after {after:.1f}; "
                    f"control (8 GPUs) {control} in {ms(control_s)}")
    return row


# -- 2. idle connections -----------------------------------------------------------------------

def raise_nofile(wanted: int) -> tuple[int, int]:
    """Raise this process's RLIMIT_NOFILE soft limit to the hard one; returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted + 256)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft, hard


class IdleFlood:
    """``count`` idle TCP connections to ``port`` that send nothing; ``refill`` reopens those
    the server closed (or that never connected), so the count stays at ``count``."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.socks: dict[int, socket.socket] = {}
        self.opened = 0
        self.closed_by_server = 0
        self.open_errors = 0

    def _open(self, n: int) -> None:
        for _ in range(n):
            sock = socket.socket()
            sock.setblocking(False)
            err = sock.connect_ex(("127.0.0.1", self.port))
            if err not in (0, 115):  # 115: EINPROGRESS
                self.open_errors += 1
                sock.close()
                continue
            self.socks[sock.fileno()] = sock
            self.opened += 1

    def fill(self, batch: int = 1000) -> None:
        while len(self.socks) < self.count:
            before = len(self.socks)
            self._open(min(batch, self.count - len(self.socks)))
            if len(self.socks) == before:
                break

    def reap(self) -> int:
        """Close the sockets the server closed (readable at EOF, or in error); returns how many."""
        poller = select.poll()
        for fd in self.socks:
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        gone = 0
        for fd, _ in poller.poll(0):
            sock = self.socks.pop(fd)
            sock.close()
            gone += 1
        self.closed_by_server += gone
        return gone

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        self.socks.clear()


CONNECTION_LOG = re.compile(r"connection|accept\(|Too many open files", re.I)


def scrape_every_second(url: str, seconds: float, keep_alive: bool = False) -> None:
    """GET ``url`` once a second for ``seconds``; prints one JSON line per scrape (run as its
    own process, so the flood's work does not delay the measurement).

    A fresh connection per scrape, or (``keep_alive``) one connection reused as Prometheus
    reuses it (opened again only when the server has closed it: ``"new": true``)."""
    started = time.monotonic()
    n = 0
    conn: http.client.HTTPConnection | None = None
    parts = urllib.parse.urlsplit(url)
    while n < seconds:
        time.sleep(max(0.0, started + n - time.monotonic()))
        new = False
        if not keep_alive:
            status, took, body = request(url, timeout=10)
        else:
            begun = time.perf_counter()
            try:
                if conn is None or conn.sock is None:
                    conn, new = http.client.HTTPConnection(parts.netloc, timeout=10), True
                conn.request("GET", parts.path)
                resp = conn.getresponse()
                status, body = resp.status, resp.read()
            except (OSError, http.client.HTTPException) as exc:
                if conn is not None:
                    conn.close()
                conn, status, body = None, None, repr(exc).encode()
            took = time.perf_counter() - begun
        print(json.dumps({"at": round(time.monotonic() - started, 2), "status": status,
                          "ms": round(took * 1000, 1), "new": new,
                          "error": "" if status == 200 else body[:80].decode(errors="replace")}),
              flush=True)
        n = max(n + 1, int(time.monotonic() - started))


def idle_connections(args: argparse.Namespace, tmp: Path) -> Row:
    wanted = args.connections
    soft, hard = raise_nofile(wanted)
    count = min(wanted, soft - 64)  # leave this process some descriptors of its own
    note = "" if count == wanted else (f"; only {count:,} opened: this process's hard limit "
                                       f"is {hard:,} open files")
    row = Row("idle-connections",
              f"{count:,} idle TCP connections from one client, opened at once and kept for "
              f"{args.seconds:g} s (any the server closes is reopened within 0.25 s); meanwhile "
              "GET /metrics every second from two other processes: one on a connection it keeps "
              "alive, as Prometheus does, one on a fresh connection each time",
              "every scrape answers; the kept-alive scraper's under 100 ms, on its one connection; "
              "at most one log line about connections per 10 s (fresh-connection times reported)")
    exporter = start_exporter(tmp)
    pid = exporter.proc.pid
    url = f"{exporter.url}/metrics"
    request(url)  # warm
    lines_before = len(log_lines(exporter))
    rss_before = rss_mb(pid) or 0.0
    flood = IdleFlood(exporter.port, count)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    scraper = subprocess.Popen([sys.executable, __file__, "--scrape", url, str(args.seconds)],
                               env=env, stdout=subprocess.PIPE, text=True)
    kept = subprocess.Popen([sys.executable, __file__, "--scrape", url, str(args.seconds),
                             "--keep-alive"], env=env, stdout=subprocess.PIPE, text=True)
    _PROCS.extend((scraper, kept))
    time.sleep(0.3)  # the scrapers' interpreters start; their first scrapes meet the flood's burst
    started = time.monotonic()
    try:
        with RssPoller(pid) as poller:
            flood.fill()
            fill_s = time.monotonic() - started
            while time.monotonic() - started < args.seconds:
                time.sleep(0.25)
                flood.reap()
                flood.fill()
            out, _ = scraper.communicate(timeout=30)
            kept_out, _ = kept.communicate(timeout=30)
    finally:
        flood.close()
    elapsed = time.monotonic() - started
    time.sleep(1)
    scrapes = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    latencies = [s["ms"] / 1000 for s in scrapes if s["status"] == 200]
    failures = [f"{s['status']}: {s['error']}" for s in scrapes if s["status"] != 200]
    each = [s["ms"] for s in scrapes]
    lines = [line for line in log_lines(exporter)[lines_before:] if CONNECTION_LOG.search(line)]
    allowed = 1 + int(elapsed // 10)
    worst = max(latencies) if latencies else float("nan")
    p50 = statistics.median(latencies) if latencies else float("nan")
    later = latencies[1:]
    kept_scrapes = [json.loads(line) for line in kept_out.splitlines() if line.startswith("{")]
    kept_ms = [s["ms"] for s in kept_scrapes]
    kept_failed = [f"{s['status']}: {s['error']}" for s in kept_scrapes if s["status"] != 200]
    kept_new = sum(1 for s in kept_scrapes[1:] if s["new"])  # reconnections after the first
    kept_worst = max(kept_ms) if kept_ms else float("nan")
    row.figures = {"connections": count, "hard_limit": hard, "exporter_nofile": open_files_limit(pid),
                   "fill_s": fill_s, "scrapes": len(scrapes), "failed": len(failures),
                   "max_ms": worst * 1000, "p50_ms": p50 * 1000,
                   "max_after_first_ms": max(later) * 1000 if later else None,
                   "log_lines": len(lines), "seconds": elapsed, "opened": flood.opened,
                   "closed_by_server": flood.closed_by_server, "open_errors": flood.open_errors,
                   "rss_before_mb": rss_before, "rss_peak_mb": poller.peak,
                   "log_sample": lines[:3], "scrape_ms": each,
                   "kept_alive_scrapes": len(kept_scrapes), "kept_alive_failed": len(kept_failed),
                   "kept_alive_max_ms": kept_worst, "kept_alive_reconnects": kept_new,
                   "kept_alive_ms": kept_ms}
    row.ok = (not failures and latencies != [] and not kept_failed and kept_ms != []
              and kept_worst < 100 and kept_new == 0 and len(lines) <= allowed)
    row.observed = (f"kept alive: {len(kept_scrapes)} scrapes, {len(kept_failed)} failed, max "
                    f"{kept_worst:.1f} ms, {kept_new} new connections after the first; fresh "
                    f"connections: {len(scrapes)} scrapes, {len(failures)} failed, max {ms(worst)}, "
                    f"p50 {ms(p50)} (max after the first: {ms(max(later)) if later else '-'}); "
                    f"{len(lines)} "
                    f"connection log line(s) in {elapsed:.0f} s (allowed {allowed}); "
                    f"{count:,} opened in {fill_s:.2f} s, {flood.opened:,} connects in all, "
                    f"{flood.closed_by_server:,} closed by the server; exporter RSS "
                    f"{rss_before:.0f} -> peak {poller.peak:.0f} MB; exporter open-file limit "
                    f"{open_files_limit(pid)}{note}; fresh scrapes in order (ms): {each}; "
                    f"kept-alive scrapes (ms): {kept_ms}")
    if failures or kept_failed:
        row.observed += f"; failures: {(failures + kept_failed)[:3]}"
    return row


# -- 3. wrk -c1000 ---------------------------------------------------------------------------

# counts responses by status over all of wrk's threads (wrk reports only "Non-2xx or 3xx")
WRK_STATUS_LUA = """
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    for status, n in pairs(t:get("statuses")) do io.write(string.format("status %d %d\\n", status, n)) end
  end
end
"""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _wrk_ms(text: str) -> float:
    match = re.match(r"([\d.]+)(us|ms|s|m)", text)
    assert match, text
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_wrk(out: str) -> dict[str, float]:
    result: dict[str, float] = {"requests": int(re.search(r"(\d+) requests in", out).group(1))}
    for pct in ("50", "99"):
        match = re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M)
        result[f"p{pct}_ms"] = _wrk_ms(match.group(1)) if match else float("nan")
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    for i, kind in enumerate(("connect", "read", "write", "timeout"), 1):
        result[kind] = int(errors.group(i)) if errors else 0
    statuses: dict[int, int] = {}
    for status, n in re.findall(r"^status (\d+) (\d+)$", out, re.M):
        statuses[int(status)] = statuses.get(int(status), 0) + int(n)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    result["statuses_counted"] = bool(statuses)
    if statuses:
        result["ok"] = sum(n for s, n in statuses.items() if 200 <= s < 400)
        result["shed"] = statuses.get(503, 0)
        result["other_status"] = sum(n for s, n in statuses.items()
                                     if not 200 <= s < 400 and s != 503)
    else:  # every non-2xx counted as shed; the wrk row checks that with a counting run
        result["ok"] = result["requests"] - result["non2xx"]
        result["shed"] = result["non2xx"]
        result["other_status"] = 0
    return result


def run_wrk(binary: str, exporter: Server, url: str, connections: int, seconds: float,
            tmp: Path, *extra: str, statuses: bool = False) -> dict[str, float]:
    """wrk against ``url``; its figures plus the exporter's RSS before, at peak (polled every
    0.1 s) and 3 s after. ``statuses``: with the status-counting Lua script, which costs wrk
    a copy of every body (on 2 cores, wrk then gets fewer answers and more timeouts)."""
    pid = exporter.proc.pid
    request(url, timeout=60)
    time.sleep(1)
    before = rss_mb(pid) or 0.0
    script = tmp / "statuses.lua"
    script.write_text(WRK_STATUS_LUA)
    lua = ["-s", str(script)] if statuses else []
    overflows = listen_overflows()
    cpu = cpu_seconds(pid)
    with RssPoller(pid) as poller:
        proc = subprocess.run(
            [binary, f"-c{connections}", f"-d{seconds:g}s", f"-t{min(2, connections)}", "--latency",
             *lua, *extra, url],
            capture_output=True, text=True, timeout=seconds + 60)
        load = os.getloadavg()[0]  # the machine's 1-minute load as wrk ends (2 cores here)
        cpu = cpu_seconds(pid) - cpu
        overflows = listen_overflows() - overflows
        time.sleep(3)
    after = rss_mb(pid) or 0.0
    out = proc.stdout + proc.stderr
    (tmp / f"wrk-{connections}.out").write_text(out)
    return {**parse_wrk(out), "rss_before_mb": before, "rss_peak_mb": poller.peak,
            "rss_after_mb": after, "load1": load, "exporter_cpu_s": cpu,
            "listen_overflows": overflows}


def listen_overflows() -> int:
    """The kernel's ``TcpExtListenOverflows`` (every process of the network namespace): a
    connection whose handshake completed while the listen queue was full, dropped."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(row.get("ListenOverflows", 0))
    return 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def describe_wrk(m: dict[str, float]) -> tuple[float, str]:
    errors = m["connect"] + m["read"] + m["write"] + m["other_status"]
    shed = "shed (503)" if m["statuses_counted"] else "shed (non-2xx, taken as 503)"
    return errors, (f"{m['requests']:,} requests: {m['ok']:,} ok, {shed} {m['shed']:,}, "
                    f"timeouts {m['timeout']}, errors {errors} (connect {m['connect']}, read "
                    f"{m['read']}, write {m['write']}, other status {m['other_status']}); "
                    f"p50 {m['p50_ms']:.0f} ms, p99 {m['p99_ms']:.0f} ms; RSS "
                    f"{m['rss_before_mb']:.0f} MB before, peak {m['rss_peak_mb']:.0f}, after "
                    f"{m['rss_after_mb']:.0f}; exporter CPU {m['exporter_cpu_s']:.1f} s; "
                    f"ListenOverflows {m['listen_overflows']}; load {m['load1']:.1f}")


def wrk(args: argparse.Namespace, tmp: Path) -> Row:
    command = f"wrk -c{args.wrk_connections} -d{args.wrk_seconds:g}s -t2 --latency /metrics"
    row = Row("wrk", command + " (wrk's default 2 s timeout); then with --timeout 30s; then "
              "5 s with a Lua script counting statuses, to tell 503s from errors",
              "zero timeouts, zero errors (503 from web.max_requests is shedding, not an error); "
              "p99 and RSS reported")
    binary = shutil.which("wrk")
    if binary is None:
        row.observed = "skipped: run make bench-deps"
        return row
    runs: dict[str, dict[str, float]] = {}
    for name, extra, seconds, statuses in (("default", (), args.wrk_seconds, False),
                                           ("timeout_30s", ("--timeout", "30s"), args.wrk_seconds, False),
                                           ("statuses", (), 5.0, True)):
        exporter = start_exporter(tmp)  # a fresh exporter for each run
        runs[name] = run_wrk(binary, exporter, f"{exporter.url}/metrics", args.wrk_connections,
                             seconds, tmp, *extra, statuses=statuses)
        if name == "default":
            lines = [line for line in log_lines(exporter) if CONNECTION_LOG.search(line)]
        stop(exporter.proc)
    m, counted = runs["default"], runs["statuses"]
    # wrk counts a response slower than --timeout as a timeout and leaves it out of the latency
    # distribution: the 30 s run shows the whole distribution
    errors, row.observed = describe_wrk(m)
    row.observed += (f". Again with --timeout 30s: {describe_wrk(runs['timeout_30s'])[1]}. "
                     f"Statuses counted (5 s, Lua): {counted['ok']:,} 2xx, {counted['shed']:,} 503, "
                     f"{counted['other_status']} other")
    row.figures = {**m, "connection_log_lines": len(lines), "log_sample": lines[:3],
                   "timeout_30s": runs["timeout_30s"], "statuses": counted}
    row.ok = (m["timeout"] == 0 and errors == 0 and counted["other_status"] == 0
              and m["ok"] > 0)
    return row


def snapshot_load(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("snapshot-50", f"wrk -c50 -d{args.wrk_seconds:g}s --latency /v1/snapshot "
              "with Accept-Encoding: gzip (defect 8)",
              "issue 14 asks for a cached, gzipped /v1/snapshot (p99 was 3.68 s at 50 clients)")
    binary = shutil.which("wrk")
    if binary is None:
        row.observed = "skipped: run make bench-deps"
        return row
    exporter = start_exporter(tmp)
    url = f"{exporter.url}/v1/snapshot"
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        encoding = resp.headers.get("Content-Encoding") or "identity"
        size = len(resp.read())
    m = run_wrk(binary, exporter, url, 50, args.wrk_seconds, tmp, "-H", "Accept-Encoding: gzip",
                statuses=True)
    errors, text = describe_wrk(m)
    row.figures = {**m, "content_encoding": encoding, "bytes": size}
    row.observed = f"Content-Encoding {encoding}, {size / 1e6:.2f} MB per reply; {text}"
    row.ok = m["timeout"] == 0 and errors == 0 and encoding == "gzip"
    return row


# -- 4. hostile dcgm targets -----------------------------------------------------------------

HOSTILE = ("hang", "hang", "trickle", "trickle", "lines", "lines", "lines", "claims-300k",
           "garbage")


def serve_dcgm(ports: dict[str, list[int]]) -> None:
    """The dcgm targets, hostile and good, one aiohttp site per port (run as a subprocess)."""
    from aiohttp import web

    good = GOOD_DCGM_BODY.read_bytes()
    l4 = L4_DCGM_BODY.read_bytes()

    async def ok_l4(request: web.Request) -> web.Response:
        return web.Response(body=l4, content_type="text/plain")

    async def ok(request: web.Request) -> web.Response:
        return web.Response(body=good, content_type="text/plain")

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)  # never answers; the bench stops this process
        return web.Response(text="")

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        try:
            for byte in good:  # one byte a second of a valid body
                await response.write(bytes([byte]))
                await asyncio.sleep(1)
        except (ConnectionError, RuntimeError):
            pass
        return response

    async def stream(request: web.Request, chunks: Callable[[], Iterator[bytes]]) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        try:
            for chunk in chunks():
                await response.write(chunk)
            await response.write_eof()
        except (ConnectionError, RuntimeError):  # the reader stopped: as it should
            pass
        return response

    def lines_chunks(name: str) -> Callable[[], Iterator[bytes]]:
        # 1,000,000 valid lines of one 8-GPU node (~75 MB), in chunks of 10,000 lines
        chunk = "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i % 8}",UUID="GPU-{name}-{i % 8}",'
                        f'Hostname="{name}"}} 30\n' for i in range(10_000)).encode()
        return lambda: (chunk for _ in range(100))

    def claims_chunks() -> Iterator[bytes]:
        # 300,000 GPUs, one valid line each (~32 MB with the labels a real body has)
        for start in range(0, 300_000, 10_000):
            yield "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="GPU-claims-{i}",device="nvidia{i}",'
                          f'modelName="NVIDIA H100 80GB HBM3",Hostname="claims"}} 30\n'
                          for i in range(start, start + 10_000)).encode()

    garbage = random.Random(7).randbytes(2 * 1024 * 1024)

    async def garbage_handler(request: web.Request) -> web.Response:
        return web.Response(body=garbage, content_type="text/plain")

    def handler_for(kind: str, index: int) -> Callable:
        if kind == "good":
            return ok
        if kind == "good-l4":
            return ok_l4
        if kind == "hang":
            return hang
        if kind == "trickle":
            return trickle
        if kind == "lines":
            chunks = lines_chunks(f"flood-{index}")
            return lambda request: stream(request, chunks)
        if kind == "claims-300k":
            return lambda request: stream(request, claims_chunks)
        return garbage_handler

    async def main() -> None:
        runners = []
        for kind, kind_ports in ports.items():
            for index, port in enumerate(kind_ports):
                app = web.Application()
                app.router.add_get("/metrics", handler_for(kind, index))
                runner = web.AppRunner(app, access_log=None)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", port).start()
                runners.append(runner)
        await asyncio.Event().wait()

    asyncio.run(main())


def metric_lines(body: str, name: str) -> list[str]:
    return [line for line in body.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]


def good_served(body: str, good_url: str, node: str) -> bool:
    up = [line for line in metric_lines(body, "gpufleet_source_up") if f'target="{good_url}"' in line]
    gpus = [line for line in metric_lines(body, "gpufleet_gpu_up") if f'node="{node}"' in line]
    stale = [line for line in metric_lines(body, "gpufleet_gpu_stale") if f'node="{node}"' in line]
    def value(line: str) -> float:
        return float(line.rsplit(" ", 1)[1])
    return (len(up) == 1 and value(up[0]) == 1 and len(gpus) == 8
            and all(value(line) == 1 for line in gpus) and len(stale) == 8
            and all(value(line) == 0 for line in stale))


def collection_key(body: str) -> tuple[str, ...]:
    return tuple(line for line in body.splitlines()
                 if line.startswith(("gpufleet_collect_duration_seconds{",
                                     "gpufleet_last_collect_success_timestamp_seconds{")))


def dcgm_hostile(args: argparse.Namespace, tmp: Path) -> Row:
    kinds: dict[str, list[int]] = {"good": [free_port()]}
    for kind in HOSTILE:
        kinds.setdefault(kind, []).append(free_port())
    row = Row("dcgm-hostile",
              "--source dcgm, 10 targets on 127.0.0.1: 2 hanging, 2 at 1 byte/s, 3 streaming "
              "1 M valid lines, 1 claiming 300k GPUs, 1 of 2 MB garbage, and 1 good "
              f"(h100-8gpu-k8s-pod-labels.prom); {args.collections} collections at the default "
              "5 s interval, 3 s target timeout, 10 s source timeout",
              "the good target's 8 GPUs served in every collection; each hostile one up 0 with "
              "a reason; RSS under 300 MB")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, __file__, "--serve-dcgm", json.dumps(kinds)],
                              cwd=tmp, env=env, stdout=(tmp / "dcgm-targets.log").open("w"),
                              stderr=subprocess.STDOUT)
    _PROCS.append(server)
    good_url = f"http://127.0.0.1:{kinds['good'][0]}/metrics"
    deadline = time.monotonic() + 30
    while request(good_url, timeout=2)[0] != 200:
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError(f"dcgm targets did not start: {(tmp / 'dcgm-targets.log').read_text()}")
        time.sleep(0.2)
    good_node = re.search(r'Hostname="([^"]+)"', GOOD_DCGM_BODY.read_text()).group(1)
    targets = [f"http://127.0.0.1:{port}/metrics" for ports in kinds.values() for port in ports]
    config = "sources:\n  dcgm:\n    enabled: true\n    targets:\n" + "".join(
        f"      - {t}\n" for t in targets)
    exporter = start_exporter(tmp, "--source", "dcgm", config=config, timeout=90)
    pid = exporter.proc.pid
    seen: dict[tuple[str, ...], bool] = {}
    scrape_times: list[float] = []
    started = time.monotonic()
    with RssPoller(pid) as poller:
        # a new collection shows as new collect-duration / last-success lines; a 10 s bound per
        # collection (the source timeout) stops the run if none comes
        while len(seen) < args.collections and time.monotonic() - started < args.collections * 10 + 20:
            status, took, body = request(f"{exporter.url}/metrics", timeout=10)
            if status == 200:
                scrape_times.append(took)
                text = body.decode()
                key = collection_key(text)
                if key not in seen:
                    seen[key] = good_served(text, good_url, good_node)
            time.sleep(0.5)
    elapsed = time.monotonic() - started
    status, _, snap = request(f"{exporter.url}/v1/snapshot", timeout=30)
    reasons: dict[str, set[str]] = {}
    hostile_up = 0
    if status == 200:
        by_port = {str(p): kind for kind, ports in kinds.items() for p in ports}
        for source in json.loads(snap).get("sources", []):
            port = re.search(r":(\d+)/", source.get("target", "") or "")
            if port:
                kind = by_port.get(port.group(1), "?")
                reasons.setdefault(kind, set()).add("up" if source["up"] else source.get("error", "")[:90])
                hostile_up += kind != "good" and bool(source["up"])
    served = sum(seen.values())
    durations = [float(line.rsplit(" ", 1)[1]) for key in seen for line in key
                 if line.startswith('gpufleet_collect_duration_seconds{source="dcgm"}')]
    row.figures = {"collections": len(seen), "served": served, "rss_peak_mb": poller.peak,
                   "seconds": elapsed, "scrape_max_ms": max(scrape_times, default=0) * 1000,
                   "collect_max_s": max(durations, default=0), "hostile_up": hostile_up,
                   "reasons": {k: sorted(v) for k, v in reasons.items()}}
    row.ok = (len(seen) >= args.collections and served == len(seen) and poller.peak < 300
              and hostile_up == 0 and reasons.get("good") == {"up"})
    row.observed = (f"good target served in {served} of {len(seen)} collections ({elapsed:.0f} s); "
                    f"the source's read took at most {max(durations, default=0):.2f} s; "
                    f"{hostile_up} hostile target(s) up; peak exporter RSS {poller.peak:.0f} MB; "
                    f"slowest scrape {max(scrape_times, default=0) * 1000:.0f} ms; last reasons: "
                    + "; ".join(f"{kind}: {' / '.join(sorted(r))}" for kind, r in sorted(reasons.items())))
    return row


def start_dcgm_targets(tmp: Path, kinds: dict[str, list[int]]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, __file__, "--serve-dcgm", json.dumps(kinds)],
                              cwd=tmp, env=env, stdout=(tmp / "dcgm-targets.log").open("w"),
                              stderr=subprocess.STDOUT)
    _PROCS.append(server)
    for ports in kinds.values():
        deadline = time.monotonic() + 30
        while request(f"http://127.0.0.1:{ports[0]}/-/none", timeout=2)[0] is None:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("dcgm targets did not start: "
                                   + (tmp / "dcgm-targets.log").read_text()[-2000:])
            time.sleep(0.2)


def dcgm_dup_secret(args: argparse.Namespace, tmp: Path) -> Row:
    kinds = {"good": [free_port()], "good-l4": [free_port()]}
    h100, l4 = kinds["good"][0], kinds["good-l4"][0]
    secret = "s3cret-attack-pw"
    targets = [f"http://127.0.0.1:{h100}/metrics", f"http://localhost:{h100}/metrics",
               f"http://admin:{secret}@127.0.0.1:{l4}/metrics"]
    row = Row("dcgm-dup-secret", "--source dcgm with targets " + ", ".join(
                  t.replace(secret, "PASSWORD") for t in targets),
              "the H100 node's 8 GPUs once (not 16 series); the password in no /metrics label, "
              "no /v1/snapshot field and no log line")
    start_dcgm_targets(tmp, kinds)
    config = "sources:\n  dcgm:\n    enabled: true\n    targets:\n" + "".join(
        f"      - {t}\n" for t in targets)
    exporter = start_exporter(tmp, "--source", "dcgm", config=config, timeout=60)
    time.sleep(6)  # a second collection
    _, _, metrics = request(f"{exporter.url}/metrics", timeout=10)
    _, _, snap = request(f"{exporter.url}/v1/snapshot", timeout=10)
    node = re.search(r'Hostname="([^"]+)"', GOOD_DCGM_BODY.read_text()).group(1)
    text = metrics.decode()
    h100_up = [line for line in metric_lines(text, "gpufleet_gpu_up") if f'node="{node}"' in line]
    l4_up = [line for line in metric_lines(text, "gpufleet_gpu_up") if "L4" in line]
    target_lines = [line for line in metric_lines(text, "gpufleet_source_up") if "target=" in line]
    leaks = [where for where, data in (("/metrics", metrics), ("/v1/snapshot", snap),
                                       ("log", exporter.log.read_bytes()))
             if secret.encode() in data]
    row.ok = len(h100_up) == 8 and len(l4_up) == 1 and not leaks
    row.figures = {"h100_series": len(h100_up), "l4_series": len(l4_up), "leaks": leaks,
                   "targets": target_lines}
    row.observed = (f"H100 node: {len(h100_up)} gpu_up series; L4 (behind userinfo): "
                    f"{len(l4_up)}; target series: {target_lines}; password found in: "
                    f"{', '.join(leaks) or 'nothing'}")
    return row


# -- 4. plans are lost: a full disk, an expired plan ----------------------------------------

def advisor_config(outbox: Path, scheduler_port: int, **advisor: str) -> str:
    """The fragmented-pool fleet of tests/test_advisor_e2e.py, nearly frozen (speed 0.001:
    the same fleet gives the same plan), planning after ``dwell``."""
    settings = {"trigger": "50", "clear_below": "40", "dwell": "0s", "cooldown": "1h",
                "min_runtime": "0s",  # the frozen fleet's jobs never age past the default 30 min
                "retry_initial": "300ms", "retry_max": "600ms", **advisor}
    return ("collect_interval: 1s\nadvisor:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items())
            + f"  outbox: {outbox}\n  receivers:\n    - {{name: scheduler, url: "
            f"\"http://127.0.0.1:{scheduler_port}/gpufleet/plan\", timeout: 2s}}\n"
            "sources:\n  sim:\n    seed: 42\n    speed: 0.001\n    scenarios:\n"
            "      - {kind: fragmented_pool, pool: gpu-h100}\n")


def metric_sum(url: str, name: str, **labels: str) -> float:
    _, _, body = request(f"{url}/metrics", timeout=10)
    return sum(float(line.rsplit(" ", 1)[1]) for line in metric_lines(body.decode(), name)
               if all(f'{k}="{v}"' in line for k, v in labels.items()))


def wait_for(check: Callable[[], Any], seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    return None


def current_plan_id(url: str) -> str | None:
    _, _, body = request(f"{url}/v1/advice", timeout=10)
    try:
        plan = json.loads(body).get("plan") or {}
    except ValueError:
        return None
    return plan.get("plan_id")


def expired_plan_id(outbox: Path) -> str | None:
    """The plan of the first delivery the exporter marked expired, read from its outbox."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{outbox}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT plan_id FROM deliveries WHERE status = 'expired' "
                         "ORDER BY created_at LIMIT 1").fetchone()
    return row[0] if row else None


def full_disk(args: argparse.Namespace, tmp: Path) -> Row:
    from tests.test_advisor_e2e import SECRET, Scheduler

    row = Row("full-disk", "the advisor's outbox on a 2 MB tmpfs; once the exporter is up, the "
              "tmpfs is filled to ENOSPC, then the fragmented pool's plan is proposed (dwell "
              "10 s); 15 s later the filler is deleted",
              "the INSERT fails: the plan kept in memory, gpufleet_advisor_outbox_errors_total"
              "{operation=insert} counts it, nothing pending; once space returns the plan "
              "reaches the scheduler once, with a valid signature")
    disk = tmp / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        row.observed = f"skipped: cannot mount a tmpfs ({mounted.stderr.strip()[:100]}); needs root"
        return row
    scheduler = Scheduler(free_port()).start()
    try:
        exporter = start_exporter(tmp, config=advisor_config(disk / "outbox.sqlite", scheduler.port,
                                                             dwell="10s"),
                                  env={"GPUFLEET_ADVISOR_TOKEN": TOKEN,
                                       "GPUFLEET_WEBHOOK_SECRET": SECRET})
        filler = disk / "filler"
        with filler.open("wb") as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError:
                pass
        started = time.monotonic()
        errors = wait_for(lambda: metric_sum(exporter.url, "gpufleet_advisor_outbox_errors_total",
                                             operation="insert"), 40) or 0.0
        plan_id = current_plan_id(exporter.url)
        pending = metric_sum(exporter.url, "gpufleet_advisor_outbox_pending")
        early = len(scheduler.accepted)
        time.sleep(max(0.0, 15 - (time.monotonic() - started)))
        while_full = metric_sum(exporter.url, "gpufleet_advisor_outbox_errors_total",
                                operation="insert")
        filler.unlink()
        freed = time.monotonic()
        wait_for(lambda: scheduler.accepted, 60)
        took = time.monotonic() - freed
        time.sleep(2.0)  # long enough for a duplicate to show
        delivered = [p.get("plan_id") for p in scheduler.accepted]
        row.figures = {"insert_errors_first": errors, "insert_errors_while_full": while_full,
                       "pending_while_full": pending, "accepted_while_full": early,
                       "plan_id": plan_id, "delivered": delivered, "delivered_after_s": took,
                       "bad_signatures": scheduler.bad_signatures}
        row.ok = (errors >= 1 and pending == 0 and early == 0 and len(delivered) == 1
                  and plan_id in (None, delivered[0]) and scheduler.bad_signatures == 0)
        row.observed = (f"disk full: insert errors {errors:g} at first, {while_full:g} after 15 s "
                        f"(the kept plan retried), outbox pending {pending:g}, scheduler got "
                        f"{early}; advice plan {plan_id}; space freed: delivered "
                        f"{len(delivered)} time(s) {took:.1f} s later ({delivered}), bad "
                        f"signatures {scheduler.bad_signatures}")
    finally:
        scheduler.close()
        stop_all()
        subprocess.run(["umount", str(disk)], capture_output=True)
    return row



def full_disk_outcome(args: argparse.Namespace, tmp: Path) -> Row:
    from tests.test_advisor_e2e import SECRET, Scheduler

    row = Row("full-disk-outcome", "the outbox on a 2 MB tmpfs, the scheduler down: the plan is "
              "written, its POST fails and is retried (0.3-0.6 s); the tmpfs is then filled to "
              "ENOSPC and the scheduler comes up, so the POST succeeds but its outcome cannot be "
              "written; 15 s watched, then the filler deleted",
              "one POST while the disk is full, not one per round (issue 32, finding 7: 29 "
              "POSTs in 15 s); the outcome written once space returns, no POST more")
    disk = tmp / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        row.observed = f"skipped: cannot mount a tmpfs ({mounted.stderr.strip()[:100]}); needs root"
        return row
    scheduler = Scheduler(free_port())
    try:
        exporter = start_exporter(tmp, config=advisor_config(disk / "outbox.sqlite", scheduler.port),
                                  env={"GPUFLEET_ADVISOR_TOKEN": TOKEN,
                                       "GPUFLEET_WEBHOOK_SECRET": SECRET})
        pending = wait_for(lambda: metric_sum(exporter.url, "gpufleet_advisor_outbox_pending"), 60) or 0.0
        time.sleep(1.0)  # a failed POST or two, their retry times written
        filler = disk / "filler"
        with filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 4096)
        scheduler.start()
        time.sleep(15)
        posts_full = len(scheduler.requests)
        errors = metric_sum(exporter.url, "gpufleet_advisor_outbox_errors_total")
        filler.unlink()
        time.sleep(5)
        posts_after = len(scheduler.requests)
        delivered = metric_sum(exporter.url, "gpufleet_advisor_webhook_deliveries_total",
                               result="delivered")
        left = metric_sum(exporter.url, "gpufleet_advisor_outbox_pending")
        row.figures = {"pending_before": pending, "posts_while_full": posts_full,
                       "outbox_errors": errors, "posts_after": posts_after,
                       "delivered": delivered, "pending_after": left}
        row.ok = pending >= 1 and posts_full == 1 and posts_after == 1 and errors >= 1 and left == 0
        row.observed = (f"pending {pending:g} before; disk full, scheduler up: {posts_full} POST(s) "
                        f"in 15 s, outbox errors {errors:g}; space freed: {posts_after} POST(s) in "
                        f"all, deliveries_total{{result=delivered}} {delivered:g}, pending {left:g}")
    finally:
        scheduler.close()
        stop_all()
        subprocess.run(["umount", str(disk)], capture_output=True)
    return row



CLOCK_SHIFT = """\
# bench/attack.py's clock-step row: this process's wall clock (time.time) moved by the
# seconds in the file $GPUFLEET_BENCH_CLOCK_OFFSET, as a stepped system clock moves it;
# the monotonic clock is left alone, as a step leaves it
import os
import time

_real, _path, _read = time.time, os.environ["GPUFLEET_BENCH_CLOCK_OFFSET"], [0.0, 0.0]


def _stepped():
    now = time.monotonic()
    if now - _read[0] > 0.2:
        try:
            with open(_path) as f:
                _read[1] = float(f.read() or 0)
        except (OSError, ValueError):
            pass
        _read[0] = now
    return _real() + _read[1]


time.time = _stepped
"""


def clock_step(args: argparse.Namespace, tmp: Path) -> Row:
    from tests.test_advisor_e2e import SECRET, Scheduler

    row = Row("clock-step", "the scheduler down, the plan's POST failing and retried (0.3-0.6 s); "
              "the exporter's wall clock then stepped back 1 h (time.time only, through a "
              "sitecustomize) and the scheduler brought up",
              "the next delivery within its backoff, seconds (issue 32, finding 5: about an "
              "hour; the 15-min plan expired first)")
    shim = tmp / "clockshift"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(CLOCK_SHIFT)
    offset = tmp / "offset"
    offset.write_text("0")
    scheduler = Scheduler(free_port())
    try:
        exporter = start_exporter(tmp, config=advisor_config(tmp / "outbox.sqlite", scheduler.port),
                                  env={"GPUFLEET_ADVISOR_TOKEN": TOKEN,
                                       "GPUFLEET_WEBHOOK_SECRET": SECRET,
                                       "GPUFLEET_BENCH_CLOCK_OFFSET": str(offset),
                                       "PYTHONPATH": os.pathsep.join([str(REPO), str(shim)])})
        pending = wait_for(lambda: metric_sum(exporter.url, "gpufleet_advisor_outbox_pending"), 60) or 0.0
        time.sleep(1.0)  # failed POSTs, each retry written for a wall time ahead
        offset.write_text("-3600")
        # a snapshot taken after the step shows it (collections take seconds on a loaded machine)
        stamp = wait_for(lambda: (v := metric_sum(exporter.url, "gpufleet_snapshot_timestamp_seconds"))
                         < time.time() - 3000 and v, 60) or time.time()
        scheduler.start()
        up = time.monotonic()
        wait_for(lambda: scheduler.accepted, 120)
        took = time.monotonic() - up
        plans = [p.get("plan_id") for p in scheduler.accepted]
        stepped = time.time() - stamp > 3000  # the exporter's wall clock is an hour behind
        row.ok = pending >= 1 and stepped and len(plans) == 1 and took < 5
        row.figures = {"pending": pending, "stepped": stepped, "delivered_after_s": took,
                       "plans": plans, "bad_signatures": scheduler.bad_signatures}
        row.observed = (f"pending {pending:g}; the exporter's clock {time.time() - stamp:.0f} s "
                        f"behind; scheduler up: {len(plans)} delivery {took:.1f} s later "
                        f"({plans}), bad signatures {scheduler.bad_signatures}")
    finally:
        scheduler.close()
    return row


def expired_plan(args: argparse.Namespace, tmp: Path) -> Row:
    from tests.test_advisor_e2e import SECRET, Scheduler

    row = Row("expired-plan", "the scheduler down; plan_ttl 3 s, retries every 0.3-0.6 s, "
              "cooldown 8 s, the fleet nearly frozen so the next plan is the same plan; the "
              "scheduler comes up once the first plan has expired",
              "the identical plan proposed again, and delivered once (UNIQUE(receiver, plan_id) "
              "blocked it forever before)")
    port = free_port()
    exporter = start_exporter(tmp, config=advisor_config(tmp / "outbox.sqlite", port,
                                                         plan_ttl="3s", cooldown="8s"),
                              env={"GPUFLEET_ADVISOR_TOKEN": TOKEN,
                                   "GPUFLEET_WEBHOOK_SECRET": SECRET})
    expired = wait_for(lambda: metric_sum(exporter.url, "gpufleet_advisor_webhook_deliveries_total",
                                          result="expired"), 40) or 0.0
    scheduler = Scheduler(port).start()
    try:
        up = time.monotonic()
        wait_for(lambda: scheduler.accepted, 60)
        took = time.monotonic() - up
        time.sleep(1.0)  # a duplicate would show here (the next re-proposal is 8 s away)
        delivered = [p.get("plan_id") for p in scheduler.accepted]
        first = expired_plan_id(tmp / "outbox.sqlite")
        row.figures = {"first_plan": first, "expired": expired, "delivered": delivered,
                       "delivered_after_s": took, "bad_signatures": scheduler.bad_signatures}
        row.ok = (first is not None and expired >= 1 and delivered == [first]
                  and scheduler.bad_signatures == 0)
        row.observed = (f"plan {first} expired undelivered ({expired:g} expired); scheduler up: "
                        f"{len(delivered)} delivery {took:.1f} s later, plan ids {delivered} "
                        f"({'the same plan' if delivered == [first] else 'not the first plan'}); "
                        f"bad signatures {scheduler.bad_signatures}")
    finally:
        scheduler.close()
    return row


# -- 5. billion laughs -----------------------------------------------------------------------

def billion_laughs() -> str:
    levels = ['  - &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"  - &{name} [{', '.join(['*' + prev] * 9)}]")
    return "listen:\n" + "\n".join(levels) + "\n"


def config_billion_laughs(args: argparse.Namespace, tmp: Path) -> Row:
    path = tmp / "laughs.yaml"
    path.write_text(billion_laughs())
    row = Row("config-billion-laughs",
              f"gpufleet serve --config laughs.yaml: {path.stat().st_size} bytes, anchors 9 deep "
              "under listen (9^9 = 387M strings once expanded)",
              "exit 2 with one line, at once")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--config", str(path),
                             "--listen", f"127.0.0.1:{free_port()}"],
                            cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    _PROCS.append(proc)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    took = time.perf_counter() - started
    lines = out.strip().splitlines()
    row.figures = {"exit": proc.returncode, "lines": len(lines), "seconds": took,
                   "output": out.strip()[:300]}
    row.ok = proc.returncode == 2 and len(lines) == 1 and took < 5
    row.observed = f"exit {proc.returncode} in {took:.2f} s, {len(lines)} line(s): {out.strip()[:200]!r}"
    return row


# -- 6. bad API input and tokens (defects 6 and 7) -------------------------------------------

def alertmanager(alertname: object, group: str) -> bytes:
    alert = {"status": "firing", "labels": {"alertname": alertname, "action": "compact"},
             "annotations": {}, "startsAt": "2026-11-29T10:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
             "generatorURL": "http://prom/graph", "fingerprint": "abc"}
    return json.dumps({"receiver": "gpufleet-advisor", "status": "firing", "version": "4",
                       "groupKey": group, "truncatedAlerts": 0, "externalURL": "http://am:9093",
                       "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
                       "alerts": [alert]}).encode()


def bad_input(args: argparse.Namespace, tmp: Path) -> Row:
    def plan(**fields: object) -> bytes:
        return json.dumps({"taken_at": time.time(), "nodes": [node(8)], **fields},
                          allow_nan=True).encode()

    cases: list[tuple[str, str, bytes, dict[str, str] | None]] = [
        ("nodes:[1]", "/v1/plan", plan(nodes=[1]), None),
        ('gpu_count:"eight"', "/v1/plan", plan(nodes=[node("eight")]), None),
        ("5,000-digit integer", "/v1/plan", b'{"taken_at": ' + b"7" * 5000 + b"}", None),
        ("100k-deep nesting", "/v1/plan",
         b'{"taken_at": 1, "nodes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
        ("gpu_count -1", "/v1/plan", plan(nodes=[node(-1)]), None),
        ("cpu_cores NaN", "/v1/plan", plan(nodes=[{**node(8), "cpu_cores": float("nan")}]), None),
        ('taken_at:"yesterday"', "/v1/plan", plan(taken_at="yesterday"), None),
        ("taken_at 1e400", "/v1/plan", b'{"taken_at": 1e400, "nodes": []}', None),
        ("alertname 5 (not a string)", "/v1/alerts", alertmanager(5, "g1"), None),
        ("Bearer U+00A0", "/v1/plan", plan(), {"Authorization": "Bearer \u00a0"}),
        ("Bearer wrong", "/v1/plan", plan(), {"Authorization": "Bearer wrong"}),
    ]
    row = Row("bad-input", "POST " + "; ".join(name for name, *_ in cases) + "; then the "
              "alert group again with a string alertname; and a start with "
              'GPUFLEET_ADVISOR_TOKEN="   "',
              "400 for each body (401 for the bad bearers), strict JSON replies, no 5xx; the "
              "retried group is processed (202), not a duplicate; the blank token exits 2 "
              "with one line")
    exporter = start_exporter(tmp, env={"GPUFLEET_ADVISOR_TOKEN": TOKEN})
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    results = []
    ok = True
    for name, path, body, headers in cases:
        status, took, reply = request(exporter.url + path, body, {**auth, **(headers or {})},
                                      timeout=30)
        try:
            json.loads(reply, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
            strict = True
        except ValueError:
            strict = False
        expected = 401 if name.startswith("Bearer") else 400
        ok &= status == expected and strict
        results.append(f"{name}: {status}{'' if strict else ' (not strict JSON)'} in {ms(took)}")
    status, _, reply = request(f"{exporter.url}/v1/alerts", alertmanager("GpuClusterFragmentationHigh", "g1"),
                               auth, timeout=30)
    retried = f"{status} {reply[:80].decode(errors='replace')}"
    ok &= status == 202
    stop(exporter.proc)
    blank = subprocess.run([sys.executable, "-m", "exporter", "serve", "--listen",
                            f"127.0.0.1:{free_port()}"], cwd=tmp, capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONPATH": str(REPO),
                                            "GPUFLEET_ADVISOR_TOKEN": "   "})
    blank_out = (blank.stdout + blank.stderr).strip()
    ok &= blank.returncode == 2 and len(blank_out.splitlines()) == 1
    row.ok = bool(ok)
    row.figures = {"cases": results, "retried_group": retried, "blank_token_exit": blank.returncode,
                   "blank_token_output": blank_out[:200]}
    row.observed = ("; ".join(results) + f"; retried group: {retried}; blank token: exit "
                    f"{blank.returncode}, {len(blank_out.splitlines())} line: {blank_out[:120]!r}")
    return row


def token_rotation(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("token-rotation", "advisor.token_file holding token A; POST /v1/plan with A; the "
              "file rewritten with token B (no restart); POST with A, then with B",
              "200, then 401 for the old token and 200 for the new one")
    token_file = tmp / "token"
    token_file.write_text("token-A-first\n")
    # the variable would win over the file: the exporter starts without it
    exporter = start_exporter(tmp, config=f"advisor:\n  token_file: {token_file}\n",
                              drop_env=("GPUFLEET_ADVISOR_TOKEN",))
    body = json.dumps({"taken_at": time.time(), "nodes": [node(8)]}).encode()
    url = f"{exporter.url}/v1/plan"

    def post(token: str) -> int | None:
        return request(url, body, {"Authorization": f"Bearer {token}"}, timeout=30)[0]

    first = post("token-A-first")
    token_file.write_text("token-B-rotated-later\n")
    old, new = post("token-A-first"), post("token-B-rotated-later")
    row.ok = (first, old, new) == (200, 401, 200)
    row.figures = {"first": first, "old_after_rotation": old, "new_after_rotation": new}
    row.observed = f"A: {first}; after the rewrite: A {old}, B {new}"
    return row


# -- 7. bad configs (defect 7) ---------------------------------------------------------------

BAD_CONFIGS: list[tuple[str, bytes]] = [
    ("collect_interval .nan", b"collect_interval: .nan\n"),
    ("collect_interval .inf", b"collect_interval: .inf\n"),
    ("sim.scale 1000000", b"sources:\n  sim:\n    scale: 1000000\n"),
    ("duplicate key", b"listen: 127.0.0.1:1\nlisten: 127.0.0.1:2\n"),
    ('url: "not a url"', b"sources:\n  prometheus:\n    url: \"not a url\"\n"),
    ("non-UTF-8 file", b"listen: \"\xff\xfe\"\n"),
]


def bad_configs(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("bad-configs", "gpufleet serve --config with: " + "; ".join(n for n, _ in BAD_CONFIGS),
              "each exits 2 with one line, at once")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    results = []
    ok = True
    for i, (name, text) in enumerate(BAD_CONFIGS):
        path = tmp / f"bad-{i}.yaml"
        path.write_bytes(text)
        started = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", "exporter", "serve", "--config", str(path),
                                   "--listen", f"127.0.0.1:{free_port()}"], cwd=tmp, env=env,
                                  capture_output=True, text=True, timeout=30)
            code, out = proc.returncode, (proc.stdout + proc.stderr).strip()
        except subprocess.TimeoutExpired:
            code, out = None, "still running after 30 s (killed)"
        took = time.perf_counter() - started
        one = len(out.splitlines()) == 1
        ok &= code == 2 and one and took < 5
        results.append(f"{name}: exit {code}, {len(out.splitlines())} line(s), {took:.2f} s "
                       f"({out.split(': ', 2)[-1][:90]!r})")
    row.ok = bool(ok)
    row.figures = {"cases": results}
    row.observed = "; ".join(results)
    return row


# -- main ------------------------------------------------------------------------------------


# -- issue 32: hostile Slurm clients, a stalled stderr -------------------------------------

SLURM_SAMPLES = REPO / "data" / "slurm-samples"
# each variant's stand-in scontrol; "answer" prints the recorded output for its argument.
# The sleeps are told apart by their length, so what is left of each can be counted.
SLURM_ESCAPES = {
    "timeout-wrapper": "timeout 60 sleep 61",  # timeout moves into a process group of its own
    "setsid-child": "setsid sleep 62 &\nwait",  # leaves the session, holds the pipe
    "answered-and-left": f'cat "{SLURM_SAMPLES}/scontrol_show_$2_d_o.txt"\n'
                         "setsid sleep 63 &\nsleep 0.1\nexit 0",
}


def sleeps_left(seconds: int) -> int:
    """Processes ``sleep <seconds>`` still running (the variants' escaped children)."""
    count = 0
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == \
                    f"sleep\0{seconds}\0".encode():
                count += 1
    return count


def slurm_exporter(tmp: Path, scontrol: str, command_timeout: float = 2.0) -> Server:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\n{scontrol}\n")
    script.chmod(0o755)
    config = ("sources:\n  slurm:\n    enabled: true\n    format: text\n"
              f"    bin_dir: {bin_dir}\n    command_timeout: {command_timeout:g}s\n")
    return start_exporter(tmp, "--source", "slurm", config=config, timeout=60)


def slurm_escape(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("slurm-escape", "scontrol as " + "; ".join(
                  f"{name}: `{body.splitlines()[0]}`" for name, body in SLURM_ESCAPES.items())
              + "; command_timeout 2 s, 12 s of collections each",
              "each read ends by its deadline (duration under 3 s), down with the reason where "
              "nothing answered, up where the client answered; no escaped process and no fd "
              "left behind")
    observed, ok = [], True
    for n, (name, body) in enumerate(SLURM_ESCAPES.items()):
        folder = tmp / name
        folder.mkdir()
        exporter = slurm_exporter(folder, body)
        time.sleep(4)
        fds_early = len(os.listdir(f"/proc/{exporter.proc.pid}/fd"))
        time.sleep(8)
        fds_late = len(os.listdir(f"/proc/{exporter.proc.pid}/fd"))
        up = metric_sum(exporter.url, "gpufleet_source_up", source="slurm")
        took = metric_sum(exporter.url, "gpufleet_collect_duration_seconds", source="slurm")
        _, _, body_text = request(f"{exporter.url}/v1/snapshot", timeout=10)
        errors = [s.get("error", "") for s in json.loads(body_text).get("sources", [])
                  if s.get("source") == "slurm"]
        stop(exporter.proc)
        time.sleep(0.5)
        left = sleeps_left(61 + n)
        want_up = name == "answered-and-left"
        met = took < 3 and (up == 1) == want_up and left == 0 and fds_late <= fds_early
        ok = ok and met
        row.figures[name] = {"up": up, "duration_s": took, "error": errors, "escaped_left": left,
                             "fds": [fds_early, fds_late]}
        observed.append(f"{name}: up {up:g}, read {took:.2f} s, error {errors[0] if errors else ''!r}"
                        f", escaped left {left}, fds {fds_early} -> {fds_late}")
    row.ok, row.observed = ok, "; ".join(observed)
    return row


def slurm_words(args: argparse.Namespace, tmp: Path) -> Row:
    line = (SLURM_SAMPLES / "scontrol_show_node_d_o.txt").read_text().splitlines()[0]
    words = tmp / "nodes.txt"
    words.write_text(line.replace(" OS=Linux", " OS=Linux" + " word" * 300_000, 1) + "\n")
    row = Row("slurm-words", "scontrol show node answering one node whose OS field is 300,000 "
              "words (2 MB); /-/healthy timed every 0.1 s for 12 s",
              "the read in well under a second; /-/healthy never waits on the parse")
    exporter = slurm_exporter(tmp, 'if [ "$2" = node ]; then cat ' + f'"{words}"; else cat '
                              f'"{SLURM_SAMPLES}/scontrol_show_job_d_o.txt"; fi',
                              command_timeout=5)
    slowest = 0.0
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        _, seconds, _ = request(f"{exporter.url}/-/healthy", timeout=10)
        slowest = max(slowest, seconds)
        time.sleep(0.1)
    took = metric_sum(exporter.url, "gpufleet_collect_duration_seconds", source="slurm")
    up = metric_sum(exporter.url, "gpufleet_source_up", source="slurm")
    row.ok = up == 1 and took < 1 and slowest < 0.5
    row.figures = {"duration_s": took, "healthy_slowest_s": slowest, "up": up}
    row.observed = f"up {up:g}, read {took:.3f} s, slowest /-/healthy {ms(slowest)}"
    return row


def log_stall(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("log-stall", "stderr and stdout a pipe nobody reads; 2,000 malformed requests (20 s at most) "
              "(one ERROR line each), then /-/healthy and /metrics",
              "both answer within a second; the lines past the queue are dropped, not waited on")
    port = free_port()
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    read_end, write_end = os.pipe()  # read_end is never read
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--listen",
                             f"127.0.0.1:{port}", "--source", "sim"], cwd=tmp,
                            stdout=write_end, stderr=write_end,
                            env={**os.environ, "PYTHONPATH": path})
    os.close(write_end)
    _PROCS.append(proc)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: request(f"{url}/-/ready", timeout=2)[0] == 200, 60)
        sent, answered, flood_ends = 0, 0, time.monotonic() + 20  # bounded: 20 s at most
        while sent < 2000 and time.monotonic() < flood_ends:
            sent += 1
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
                s.settimeout(1)
                # aiohttp logs each at ERROR, about 250 bytes: 2,000 fill a pipe's 64 KB 8 times
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
                answered += bool(s.recv(100))
        healthy, healthy_s, _ = request(f"{url}/-/healthy", timeout=20)
        metrics, metrics_s, _ = request(f"{url}/metrics", timeout=20)
    finally:
        stop(proc)
        os.close(read_end)
    row.ok = healthy == 200 and metrics == 200 and healthy_s < 1 and metrics_s < 1 and \
        answered == sent
    row.figures = {"sent": sent, "answered": answered, "healthy": [healthy, healthy_s],
                   "metrics": [metrics, metrics_s]}
    row.observed = (f"{answered} of {sent} bad requests answered (400); /-/healthy {healthy} in "
                    f"{ms(healthy_s)}, /metrics {metrics} in {ms(metrics_s)}")
    return row



# -- issue 32, finding 9: identity churn -------------------------------------------------------

CHURN_MARKS = (100, 250, 500, 750, 1000)


def churn_child(snapshots: int, outbox: str) -> None:
    """In this process: serve's pipeline as ``assemble`` wires it (the analyzer, the advisor,
    the family providers, one LabelCache) fed ``snapshots`` snapshots of the simulated
    1,088-GPU fleet, one node replaced by a new machine in each (new name, new GPU UUIDs, its
    jobs renamed: an autoscaled fleet); prints JSON: VmRSS and the label cache's size at
    each of ``CHURN_MARKS``."""
    import dataclasses

    from exporter.cli.serve import assemble
    from exporter.config import Config, build
    from exporter.exposition import LabelCache
    from exporter.fleet_sim.fleet import Simulation
    from exporter.sources.sim.options import SimSource
    from exporter.web.server import _render_all

    start = 1_760_000_000.0
    sim = Simulation(SimSource(), start_time=start)
    sim.advance(start + 600)
    base = sim.snapshot()
    config = build(Config, {"advisor": {"outbox": outbox}})
    _, state, advisor = assemble(config, ["sim"])
    labels = LabelCache()
    names = [n.name for n in base.nodes]
    nodes, gpus, allocations = list(base.nodes), list(base.gpus), list(base.allocations)
    marks: dict[int, dict[str, float]] = {}

    async def run() -> None:
        for step in range(1, snapshots + 1):
            k = step % len(names)
            old, new = nodes[k].name, f"{names[k]}-{step}"
            nodes[k] = dataclasses.replace(nodes[k], name=new)
            for i, gpu in enumerate(gpus):
                if gpu.node == old:
                    gpus[i] = dataclasses.replace(gpu, node=new, uuid=f"GPU-{new}-{gpu.index}")
            for i, alloc in enumerate(allocations):
                if any(p.node == old for p in alloc.placements):
                    allocations[i] = dataclasses.replace(
                        alloc, job=f"{alloc.job}-{step}", placements=tuple(
                            dataclasses.replace(p, node=new) if p.node == old else p
                            for p in alloc.placements))
            snapshot = dataclasses.replace(base, taken_at=start + 600 + 5 * step, nodes=tuple(nodes),
                                           gpus=tuple(gpus), allocations=tuple(allocations))
            frame = await state.cycle.run(snapshot)
            _render_all(snapshot, frame, state, labels, 5)
            if step in CHURN_MARKS or step == snapshots:
                sizes = labels.sizes() if hasattr(labels, "sizes") else {
                    "label_texts": sum(map(len, labels._cache.values()))}  # the tree before the fix
                marks[step] = {"rss_mb": rss_mb(os.getpid()) or 0.0, **sizes}

    asyncio.run(run())
    if advisor is not None:
        advisor.deliverer.store.close()
    print(json.dumps({"gpus": len(base.gpus), "nodes": len(names), "marks": marks}))


def label_churn(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("label-churn", f"{args.churn_snapshots:,} snapshots of the simulated 1,088-GPU fleet "
              "through serve's pipeline (analyzer, advisor, render), one node replaced by a new "
              "machine each time (new name, GPU UUIDs and job names)",
              "the label cache holds the current fleet's texts only; RSS flat after the first "
              "hundred snapshots (within 10 MB)")
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--churn-child",
                          str(args.churn_snapshots), str(tmp / "outbox.sqlite")],
                         capture_output=True, text=True, timeout=1200, cwd=tmp, check=False)
    if out.returncode != 0:
        row.ok, row.observed = False, f"child failed: {out.stderr[-400:]}"
        return row
    result = json.loads(out.stdout.strip().splitlines()[-1])
    marks = {int(k): v for k, v in result["marks"].items()}
    first, last = marks[min(marks)], marks[max(marks)]
    growth = last["rss_mb"] - first["rss_mb"]
    row.ok = last["label_texts"] <= result["gpus"] and growth < 10
    row.figures = {**result, "seconds": time.monotonic() - started}
    row.observed = (f"{time.monotonic() - started:.0f} s; " + "; ".join(
        f"after {step}: RSS {m['rss_mb']:.1f} MB, {m['label_texts']:,.0f} label texts"
        for step, m in sorted(marks.items())) + f"; growth {growth:+.1f} MB")
    return row



# -- issue 32, finding 2: upstreams that would run the exporter out of memory ------------------

PROMETHEUS_ANSWER_BYTES = 2 * 1024 ** 3  # what every query is answered: 2 GB of valid series


def serve_prometheus(port: int, log_path: str) -> None:
    """A Prometheus API answering every query with 2 GB of valid vector series, streamed
    without Content-Length (run as a subprocess); logs how much of each answer was taken."""
    from aiohttp import web

    chunk = b'{"metric":{"node":"n","gpu":"0","uuid":"GPU-x"},"value":[1,"1"]},' * 16_000  # ~1 MB
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - the process's lifetime

    async def query(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        sent = 0
        try:
            await response.write(b'{"status":"success","data":{"resultType":"vector","result":[')
            while sent < PROMETHEUS_ANSWER_BYTES:
                await response.write(chunk)
                sent += len(chunk)
            await response.write(b'{"metric":{},"value":[1,"1"]}]}}')
        except (ConnectionError, RuntimeError):
            pass  # the reader hung up at its cap
        log.write(f"{sent}\n")
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/api/v1/query", query)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def start_helper(tmp: Path, name: str, argv: list[str], url: str, timeout: float = 120) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = tmp / f"{name}.log"
    proc = subprocess.Popen([sys.executable, __file__, *argv], cwd=tmp, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    _PROCS.append(proc)
    deadline = time.monotonic() + timeout
    while request(url, timeout=2)[0] is None:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"{name} did not start: " + log.read_text()[-2000:])
        time.sleep(0.3)


def watch_memory(exporter: Server, seconds: float, source: str,
                 cgroup: MemoryCgroup | None = None) -> dict[str, Any]:
    """Poll the exporter's RSS for ``seconds`` while probing /-/healthy and /metrics once a
    second; then its source's status from /v1/snapshot, and the cgroup's peak and OOM kills
    when it runs in one (``--memory-max``)."""
    probes: list[tuple[int | None, float, int | None, float]] = []
    with RssPoller(exporter.proc.pid) as poller:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            healthy, healthy_s, _ = request(f"{exporter.url}/-/healthy", timeout=10)
            metrics, metrics_s, _ = request(f"{exporter.url}/metrics", timeout=10)
            probes.append((healthy, healthy_s, metrics, metrics_s))
            time.sleep(1)
    up = metric_sum(exporter.url, "gpufleet_source_up", source=source)
    _, _, body = request(f"{exporter.url}/v1/snapshot", timeout=10)
    errors = [s.get("error", "") for s in json.loads(body).get("sources", []) if s.get("source") == source]
    return {"peak_rss_mb": poller.peak, "after_rss_mb": rss_mb(exporter.proc.pid), "up": up,
            "alive": exporter.proc.poll() is None, "cgroup": cgroup.read() if cgroup else None,
            "error": errors[0] if errors else "", "probes": len(probes),
            "healthy_ok": sum(p[0] == 200 for p in probes),
            "metrics_ok": sum(p[2] == 200 for p in probes),
            "slowest_probe_s": max((max(p[1], p[3]) for p in probes), default=0.0)}


def prometheus_2gb(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("prometheus-2gb", "--source prometheus against a Prometheus API answering each of "
              "its queries with 2 GB of valid series, streamed without Content-Length; 30 s of "
              "collections (5 s apart), /-/healthy and /metrics probed each second",
              "RSS under 1 GB (the shipped MemoryMax=1G) throughout; every probe answered; "
              "source_up 0 with the reason (max_answer_bytes)")
    port = free_port()
    start_helper(tmp, "prometheus", ["--serve-prometheus", str(port), str(tmp / "taken.log")],
                 f"http://127.0.0.1:{port}/-/none")
    exporter, cgroup = start_limited(args, tmp, "--source", "prometheus", config=(
        f"sources:\n  prometheus:\n    enabled: true\n    url: http://127.0.0.1:{port}\n"), timeout=60)
    seen = watch_memory(exporter, args.memory_seconds, "prometheus", cgroup)
    taken = [int(line) for line in (tmp / "taken.log").read_text().split()]
    seen["answers_cut"] = len(taken)
    seen["largest_taken_mb"] = max(taken, default=0) / 1e6
    row.figures = seen
    row.ok = (seen["peak_rss_mb"] < 1000 and seen["up"] == 0 and "max_answer_bytes" in seen["error"]
              and seen["healthy_ok"] == seen["metrics_ok"] == seen["probes"] and seen["alive"]
              and (seen["cgroup"] is None or seen["cgroup"]["oom_kill"] == 0))
    row.observed = (f"peak RSS {seen['peak_rss_mb']:.0f} MB (after {seen['after_rss_mb'] or 0:.0f}); "
                    f"{seen['answers_cut']} answers cut, the largest after "
                    f"{seen['largest_taken_mb']:.0f} MB sent; probes {seen['healthy_ok']}/"
                    f"{seen['metrics_ok']} of {seen['probes']} answered, slowest "
                    f"{ms(seen['slowest_probe_s'])}; source_up {seen['up']:g}: {seen['error']!r}"
                    + cgroup_summary(seen))
    return row


def serve_kube(port: int, nodes: int, gpus: int) -> None:
    """The tests' fake apiserver holding ``nodes`` nodes of ``gpus`` GPUs each and no pods
    (run as a subprocess)."""
    from bench.kubernetes import generated_cluster
    from tests.helpers.fake_apiserver import NODES, FakeApiserver

    fake = FakeApiserver(port=port)
    for path, raws in generated_cluster(nodes, 0):
        if path != NODES:
            continue
        grown = []
        for raw in raws:
            node = json.loads(raw)
            node["status"]["capacity"]["nvidia.com/gpu"] = str(gpus)
            node["status"].get("allocatable", {})["nvidia.com/gpu"] = str(gpus)
            node["metadata"]["labels"]["nvidia.com/gpu.count"] = str(gpus)
            grown.append(json.dumps(node, separators=(",", ":")).encode())
        fake.load_quietly(path, grown)

    async def main() -> None:
        await fake.start()
        await asyncio.Event().wait()

    asyncio.run(main())


def kube_20k(args: argparse.Namespace, tmp: Path) -> Row:
    from tests.helpers.fake_apiserver import write_kubeconfig

    nodes, gpus = args.kube_nodes, 64
    row = Row("kube-20k", f"--source kubernetes against an apiserver (the tests' fake) listing "
              f"{nodes:,} nodes labelled with {gpus} GPUs each ({nodes * gpus:,} GPUs); "
              f"{args.memory_seconds:g} s of collections, /-/healthy and /metrics probed each second",
              "RSS under 1 GB throughout; every probe answered; source_up 0 with the reason "
              "(sources.kubernetes.max_gpus)")
    port = free_port()
    start_helper(tmp, "apiserver", ["--serve-kube", str(port), str(nodes), str(gpus)],
                 f"http://127.0.0.1:{port}/version", timeout=300)
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", f"http://127.0.0.1:{port}")
    exporter, cgroup = start_limited(args, tmp, "--source", "kubernetes", config=(
        f"sources:\n  kubernetes:\n    enabled: true\n    kubeconfig: {kubeconfig}\n"), timeout=90)
    seen = watch_memory(exporter, args.memory_seconds, "kubernetes", cgroup)
    row.figures = seen
    row.ok = (seen["peak_rss_mb"] < 1000 and seen["up"] == 0 and "max_gpus" in seen["error"]
              and seen["healthy_ok"] == seen["metrics_ok"] == seen["probes"] and seen["alive"]
              and (seen["cgroup"] is None or seen["cgroup"]["oom_kill"] == 0))
    row.observed = (f"peak RSS {seen['peak_rss_mb']:.0f} MB (after {seen['after_rss_mb'] or 0:.0f}); "
                    f"probes {seen['healthy_ok']}/{seen['metrics_ok']} of {seen['probes']} answered, "
                    f"slowest {ms(seen['slowest_probe_s'])}; source_up {seen['up']:g}: {seen['error']!r}"
                    + cgroup_summary(seen))
    return row



def serve_kube_pods(port: int, nodes: int, pods: int) -> None:
    """The tests' fake apiserver holding ``bench/kubernetes.py``'s cluster of ``nodes`` 8-GPU
    nodes and ``pods`` pods (run as a subprocess). The pods are stored as their JSON only:
    the fake serves lists and watches from it, and 300,000 pods as dicts would take GBs."""
    import re as re_

    from bench.kubernetes import generated_cluster
    from tests.helpers.fake_apiserver import PODS, FakeApiserver, Stored

    fake = FakeApiserver(port=port)
    name_re = re_.compile(rb'"name":"(worker-\d+)"')
    namespace_re = re_.compile(rb'"namespace":"([^"]+)"')
    for path, raws in generated_cluster(nodes, pods):
        if path != PODS:
            fake.load_quietly(path, raws)
            continue
        fake.version += 1
        store = fake.objects.setdefault(path, {})
        for raw in raws:
            name, namespace = name_re.search(raw), namespace_re.search(raw)
            assert name and namespace
            store[f"{namespace[1].decode()}/{name[1].decode()}"] = Stored({}, raw)

    async def main() -> None:
        await fake.start()
        await asyncio.Event().wait()

    asyncio.run(main())


def kube_pods(args: argparse.Namespace, tmp: Path) -> Row:
    from tests.helpers.fake_apiserver import write_kubeconfig

    nodes, pods = 1000, args.kube_pods
    row = Row("kube-300k-pods", f"--source kubernetes against an apiserver (the tests' fake) "
              f"holding {nodes:,} nodes of 8 GPUs and {pods:,} pods (~3.5 KB each, as recorded; "
              f"{pods // 500:,} list pages); /metrics and /-/healthy probed every 0.5 s from the "
              f"start for {args.kube_pods_seconds:g} s",
              "the source up with the pods read; no scrape waits on the list's decoding or the "
              "snapshot's build (the slowest /metrics well under a second)")
    port = free_port()
    start_helper(tmp, "apiserver", ["--serve-kube-pods", str(port), str(nodes), str(pods)],
                 f"http://127.0.0.1:{port}/version", timeout=600)
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", f"http://127.0.0.1:{port}")
    exporter = start_exporter(tmp, "--source", "kubernetes", config=(
        f"sources:\n  kubernetes:\n    enabled: true\n    kubeconfig: {kubeconfig}\n"),
        ready=False)
    helpers.wait_http(f"{exporter.url}/-/healthy", timeout=60, proc=exporter.proc)
    slowest = {"metrics": 0.0, "healthy": 0.0}
    probes, failed, up_after = 0, 0, None
    started = time.monotonic()
    with RssPoller(exporter.proc.pid) as poller:
        while time.monotonic() - started < args.kube_pods_seconds:
            for name, path in (("metrics", "/metrics"), ("healthy", "/-/healthy")):
                status, seconds, body = request(f"{exporter.url}{path}", timeout=30)
                slowest[name] = max(slowest[name], seconds)
                failed += status not in (200, 503)  # 503: /metrics before the first snapshot
                if name == "metrics" and up_after is None and re.search(
                        rb'^gpufleet_source_up\{[^}]*source="kubernetes"[^}]*\} 1', body, re.M):
                    up_after = time.monotonic() - started
            probes += 1
            time.sleep(0.5)
    took = metric_sum(exporter.url, "gpufleet_collect_duration_seconds", source="kubernetes")
    up = metric_sum(exporter.url, "gpufleet_source_up", source="kubernetes")
    row.figures = {"probes": probes, "failed": failed, "slowest_metrics_s": slowest["metrics"],
                   "slowest_healthy_s": slowest["healthy"], "up": up, "up_after_s": up_after,
                   "read_s": took, "peak_rss_mb": poller.peak}
    row.ok = up == 1 and failed == 0 and slowest["metrics"] < 1 and slowest["healthy"] < 1
    first_up = f"first up after {up_after:.1f} s" if up_after is not None else "never up"
    row.observed = (f"source_up {up:g} ({first_up}), "
                    f"last read {took:.2f} s; {probes} probes of each, {failed} failed; slowest "
                    f"/metrics {ms(slowest['metrics'])}, /-/healthy {ms(slowest['healthy'])}; "
                    f"peak RSS {poller.peak:.0f} MB")
    return row


# -- issue 32, findings 4, 6, 11: signals, restarts, alert floods ------------------------------

def sighup(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("sighup", "5 SIGHUPs, 0.5 s apart, to a serving exporter with advisor.token_file; "
              "the token file rotated before the third",
              "the process lives and answers; each SIGHUP (or a burst of them) logs one "
              "'reloaded on SIGHUP' line; the rotated token is taken, the old one refused")
    token_file = tmp / "token"
    token_file.write_text("first-token\n")
    exporter = start_exporter(tmp, config=f"advisor:\n  token_file: {token_file}\n"
                              f"  outbox: {tmp / 'outbox.sqlite'}\n")
    for n in range(5):
        if n == 2:
            token_file.write_text("rotated-token\n")
        os.kill(exporter.proc.pid, signal.SIGHUP)
        time.sleep(0.5)
    time.sleep(1.0)
    alive = exporter.proc.poll() is None
    healthy, _, _ = request(f"{exporter.url}/-/healthy", timeout=10)

    def post(token: str) -> int | None:
        return request(f"{exporter.url}/v1/alerts", data=alertmanager("GpuClusterFragmentationHigh", "g"),
                       headers={"Authorization": f"Bearer {token}",
                                "Content-Type": "application/json"}, timeout=20)[0]

    new, old = post("rotated-token"), post("first-token")
    lines = [line for line in log_lines(exporter) if "reloaded on SIGHUP" in line]
    row.ok = alive and healthy == 200 and 1 <= len(lines) <= 5 and new in (200, 202) and old == 401
    row.figures = {"alive": alive, "healthy": healthy, "reload_lines": lines, "new_token": new,
                   "old_token": old}
    row.observed = (f"alive {alive}, /-/healthy {healthy}; {len(lines)} 'reloaded on SIGHUP' "
                    f"lines (last: {lines[-1][-60:] if lines else ''!r}); rotated token -> {new}, "
                    f"old token -> {old}")
    return row


def restart_cooldown(args: argparse.Namespace, tmp: Path) -> Row:
    from tests.test_advisor_e2e import SECRET, Scheduler

    row = Row("restart-cooldown", "the fragmented-pool fleet (nearly frozen), cooldown 30 m; once "
              "the first plan is delivered the exporter is stopped (SIGTERM) and started again "
              "on the same outbox; 20 s watched after the restart",
              "no second plan: the cooldown read back from the outbox (before: a second plan "
              "9.4 s after the first)")
    port = free_port()
    scheduler = Scheduler(port).start()
    env = {"GPUFLEET_ADVISOR_TOKEN": TOKEN, "GPUFLEET_WEBHOOK_SECRET": SECRET}
    config = advisor_config(tmp / "outbox.sqlite", port, cooldown="30m")
    (tmp / "one").mkdir()
    (tmp / "two").mkdir()
    try:
        first = start_exporter(tmp / "one", config=config, env=env)
        wait_for(lambda: scheduler.accepted, 60)
        delivered_first = len(scheduler.accepted)
        stop(first.proc)
        restarted = time.monotonic()
        second = start_exporter(tmp / "two", config=config, env=env)
        up_after = time.monotonic() - restarted
        time.sleep(20)
        evaluations = metric_sum(second.url, "gpufleet_advisor_evaluations_total")
        plans = [p.get("plan_id") for p in scheduler.accepted]
        row.ok = delivered_first == 1 and len(plans) == 1 and scheduler.bad_signatures == 0
        row.figures = {"plans": plans, "evaluations_after_restart": evaluations,
                       "restart_ready_s": up_after}
        row.observed = (f"first plan {plans[0] if plans else None} delivered; restarted (ready in "
                        f"{up_after:.1f} s), {evaluations:g} evaluations in the next 20 s; "
                        f"{len(plans)} plan(s) delivered in all")
    finally:
        scheduler.close()
    return row


def alert_flood(args: argparse.Namespace, tmp: Path) -> Row:
    seconds, groups = 10.0, 10_000
    row = Row("alert-flood", f"Alertmanager notifications to /v1/alerts as fast as 8 keep-alive "
              f"clients send them for {seconds:g} s, over {groups:,} groups (collect_interval 5 s)",
              "the snapshot never older than 2 intervals (10 s); /-/ready 200 throughout; "
              "notification info lines rate-limited (before: the snapshot aged to 49 s, 7,000 "
              "info lines)")
    exporter = start_exporter(tmp, config=f"advisor:\n  outbox: {tmp / 'outbox.sqlite'}\n",
                              env={"GPUFLEET_ADVISOR_TOKEN": TOKEN})
    host, port = exporter.url.removeprefix("http://").split(":")
    sent = [0] * 8
    statuses: dict[int, int] = {}
    ends = time.monotonic() + seconds

    def client(k: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        i = k
        while time.monotonic() < ends:
            body = alertmanager("GpuClusterFragmentationHigh", f"g{i % groups}")
            i += 8
            try:
                conn.request("POST", "/v1/alerts", body, {"Authorization": f"Bearer {TOKEN}",
                                                          "Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                statuses[resp.status] = statuses.get(resp.status, 0) + 1
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
            sent[k] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    ages, ready = [], []
    for thread in threads:
        thread.start()
    while time.monotonic() < ends + 6:
        _, _, body = request(f"{exporter.url}/v1/snapshot", headers={"Authorization": f"Bearer {TOKEN}"},
                             timeout=10)
        with contextlib.suppress(ValueError):
            ages.append(time.time() - json.loads(body)["taken_at"])
        ready.append(request(f"{exporter.url}/-/ready", timeout=10)[0])
        time.sleep(1)
    for thread in threads:
        thread.join()
    lines = [line for line in log_lines(exporter) if "alertmanager notification accepted" in line]
    evaluations = metric_sum(exporter.url, "gpufleet_advisor_evaluations_total")
    oldest = max(ages, default=float("inf"))
    row.ok = oldest < 10 and all(r == 200 for r in ready) and len(lines) <= 5
    row.figures = {"sent": sum(sent), "statuses": statuses, "oldest_snapshot_s": oldest,
                   "ready": ready, "info_lines": len(lines), "evaluations": evaluations}
    row.observed = (f"{sum(sent):,} notifications sent ({sum(sent) / seconds:.0f}/s; statuses "
                    f"{statuses}); oldest snapshot seen {oldest:.1f} s; /-/ready "
                    f"{sum(r == 200 for r in ready)} of {len(ready)} 200; {evaluations:g} "
                    f"evaluations; {len(lines)} notification info lines")
    return row



# -- issue 32, finding 13: one bad Prometheus series ------------------------------------------

def bad_series_answers() -> dict[str, list[dict]]:
    """Per query name of the prometheus source: 8 good GPUs on node good-1 beside each bad
    series finding 13 lists (+Inf memory, gpu="abc", a MIG series without gpu_instance, a
    value that is no number, no value, a huge GPU index, negative sizes and counts)."""
    now = time.time()

    def series(name: str, value: object, **labels: str) -> dict:
        return {"metric": {"__name__": name, **labels}, "value": [now, str(value)]}

    good = [{"node": "good-1", "gpu": str(i), "uuid": f"GPU-good-{i}", "model": "H100",
             "pool": "p", "instance": "10.0.0.1:9874", "job": "gpufleet-nodes"} for i in range(8)]
    bad = {"node": "bad-1", "uuid": "GPU-bad", "model": "H100", "pool": "p",
           "instance": "10.0.0.2:9874", "job": "gpufleet-nodes"}
    return {
        "identity": [*(series("gpufleet_gpu_info", 1, **g) for g in good),
                     series("gpufleet_gpu_info", 1, **bad, gpu="abc"),
                     series("gpufleet_gpu_info", 1, **dict(bad, uuid="GPU-huge"), gpu="9" * 30)],
        "gpufleet_gpu_up": [series("gpufleet_gpu_up", 1, **g) for g in good],
        "gpufleet_gpu_memory_total_bytes": [
            *(series("gpufleet_gpu_memory_total_bytes", 80e9, **g) for g in good[1:]),
            series("gpufleet_gpu_memory_total_bytes", "+Inf", **good[0])],
        "gpufleet_gpu_memory_used_bytes": [series("gpufleet_gpu_memory_used_bytes", -80e9, **good[1])],
        "gpufleet_gpu_power_watts": [series("gpufleet_gpu_power_watts", "watts", **good[2])],
        "gpufleet_gpu_temperature_celsius": [{"metric": {"__name__": "x", **good[3]}}],
        "gpufleet_gpu_utilization_ratio": [series("gpufleet_gpu_utilization_ratio", 0.5, **g)
                                           for g in good],
        "nodes": [series("gpufleet_node_info", 1, node="good-1", pool="p", model="H100", gpus="8"),
                  series("gpufleet_node_info", 1, node="bad-1", pool="p", model="H100", gpus="-8"),
                  series("gpufleet_node_cpu_cores", -128, node="bad-1")],
        "mig": [series("gpufleet_gpu_mig_instance_info", 1, **good[4], profile="1g.10gb")],
        "targets": [series("up", 1, instance="10.0.0.1:9874", job="gpufleet-nodes")],
    }


def serve_bad_series(port: int) -> None:
    """A Prometheus API answering the prometheus source's queries with bad_series_answers()
    (run as a subprocess)."""
    from aiohttp import web

    from exporter.sources.prometheus.options import PrometheusSource
    from exporter.sources.prometheus.source import build_queries

    names = {expr: name for name, expr in build_queries(PrometheusSource(enabled=True)).items()}

    async def query(request: web.Request) -> web.Response:
        form = await request.post()
        name = names.get(str(form.get("query", "")), "")
        result = bad_series_answers().get(name, [])
        return web.json_response({"status": "success",
                                  "data": {"resultType": "vector", "result": result}})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/api/v1/query", query)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


def prometheus_bad_series(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("prometheus-bad-series", "--source prometheus against a backend whose answers hold "
              "8 good GPUs beside finding 13's bad series (+Inf memory, gpu=\"abc\", GPU index "
              "10^30, a value that is no number, no value, memory -80 GB, gpus=\"-8\", -128 CPUs)",
              "source_up 1, the 8 good GPUs served, each bad series dropped and counted in "
              "gpufleet_source_parse_errors_total (before: the whole fleet stale)")
    port = free_port()
    start_helper(tmp, "prometheus", ["--serve-bad-series", str(port)],
                 f"http://127.0.0.1:{port}/-/none")
    exporter = start_exporter(tmp, "--source", "prometheus", config=(
        f"sources:\n  prometheus:\n    enabled: true\n    url: http://127.0.0.1:{port}\n"), timeout=60)
    time.sleep(2)
    # cluster mode serves no per-GPU series (exposition.per_gpu auto): the snapshot has them
    _, _, body = request(f"{exporter.url}/v1/snapshot", timeout=10)
    snapshot = json.loads(body)
    (status,) = [s for s in snapshot["sources"] if s["source"] == "prometheus" and not s.get("target")]
    up, errors = status["up"], status.get("parse_errors", 0)
    gpus = [g for g in snapshot["gpus"] if g["node"] == "good-1"]
    stale = [g for g in snapshot["gpus"] if g.get("stale")]
    nodes = sorted(n["name"] for n in snapshot["nodes"])
    row.ok = up and len(gpus) == 8 and not stale and errors >= 8
    row.figures = {"up": up, "parse_errors": errors, "good_gpus": len(gpus), "stale": len(stale),
                   "nodes": nodes, "error": status.get("error", "")}
    row.observed = (f"source_up {int(up)}; {len(gpus)} good GPUs served ({len(snapshot['gpus'])} "
                    f"in all), {len(stale)} stale; parse errors {errors}; nodes {nodes}")
    return row



def malformed_flood(args: argparse.Namespace, tmp: Path) -> Row:
    seconds = 10.0
    row = Row("malformed-flood", f"unauthenticated requests with a bad Content-Length (aiohttp "
              f"logs each at ERROR) from 8 clients for {seconds:g} s, a fresh connection each",
              "every one answered 400; at most one 'Error handling request' line per 10 s, "
              "the next saying how many were not logged (before: 20,000 lines, 10.2 MB, in 10 s)")
    exporter = start_exporter(tmp)
    host, port = exporter.url.removeprefix("http://").split(":")
    sent, answered = [0] * 8, [0] * 8
    ends = time.monotonic() + seconds

    def client(k: int) -> None:
        while time.monotonic() < ends:
            sent[k] += 1
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 2) as s:
                s.settimeout(2)
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
                answered[k] += b" 400 " in s.recv(100)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(1)
    lines = [line for line in log_lines(exporter) if "Error handling request" in line]
    size = exporter.log.stat().st_size
    row.ok = sum(answered) == sum(sent) and 1 <= len(lines) <= 2
    row.figures = {"sent": sum(sent), "answered": sum(answered), "error_lines": lines,
                   "log_bytes": size}
    row.observed = (f"{sum(answered):,} of {sum(sent):,} answered 400; {len(lines)} 'Error handling "
                    f"request' line(s); the whole log {size:,} bytes")
    return row



# -- issue 32, findings 8, 14, 15, 16, 18: the rows its first bench lacked -------------------

class ThreadedApiserver:
    """A tests' fake apiserver served from a thread of this process, so the bench can count
    the requests it got (``fake.requests``); ``gone`` answers every watch with that ERROR
    event instead (finding 8's storm, with finding 16's Status shape)."""

    def __init__(self, fake: Any) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedApiserver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.fake.kill(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def kube_410_storm(args: argparse.Namespace, tmp: Path) -> Row:
    from aiohttp import web

    from tests.helpers.fake_apiserver import NODES, PODS, FakeApiserver, write_kubeconfig

    # a Status without "status": "Failure", as finding 16's: the pods' shape decoder kept
    # none of its fields, the 410 was never seen
    gone = {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "message": "too old resource version", "reason": "Expired", "code": 410}

    class Gone(FakeApiserver):
        async def _watch(self, request: web.Request, path: str) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response

    row = Row("kube-410-storm", "--source kubernetes against an apiserver answering every watch "
              "(nodes and pods) with an ERROR 410 whose Status lacks \"status\": \"Failure\"; "
              "30 s counted",
              "the 410 seen (relists happen), at most one relist per backoff step per informer "
              "(client-go's: 0.8 s doubling to backoff_max, 30 s, each wait 1-2 x its step: "
              "about 4-5 lists each in 30 s, never over 60; before: 20,196 in 30 s)")
    fake = Gone(port=free_port())
    with contextlib.suppress(Exception):
        fake.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
                  "status": {"capacity": {}, "allocatable": {}}}, NODES)
    with ThreadedApiserver(fake):
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", f"http://127.0.0.1:{fake.port}")
        exporter = start_exporter(tmp, "--source", "kubernetes", config=(
            f"sources:\n  kubernetes:\n    enabled: true\n    kubeconfig: {kubeconfig}\n"),
            ready=False)
        helpers.wait_http(f"{exporter.url}/-/healthy", timeout=60, proc=exporter.proc)
        def by_path() -> dict[str, int]:
            return {p: sum(r.startswith(f"GET {p}?") and "watch=1" not in r
                           for r in list(fake.requests)) for p in (NODES, PODS)}
        start = by_path()
        time.sleep(30)
        lists = {p: n - start[p] for p, n in by_path().items()}
        up = metric_sum(exporter.url, "gpufleet_source_up", source="kubernetes")
    row.figures = {"lists_in_30s": lists, "up": up}
    # one relist per backoff step, from 0.8 s doubling to backoff_max (30 s, the default),
    # each wait 1-2 x its step: about 4-5 per informer in 30 s, and never over 60
    row.ok = all(2 <= n <= 60 for n in lists.values())
    row.observed = (f"lists in 30 s: {', '.join(f'{p} {n}' for p, n in lists.items())}; "
                    f"source_up {up:g}")
    return row


def kube_deep(args: argparse.Namespace, tmp: Path) -> Row:
    from bench.kubernetes import generated_cluster
    from tests.helpers.fake_apiserver import PODS, FakeApiserver, Stored, write_kubeconfig

    row = Row("kube-deep", "--source kubernetes against the tests' fake apiserver: 10 nodes, "
              "100 pods (40 of them GPU pods), and one more pod with a field nested 3,000 deep; "
              "10 s", "source_up 1, the 40 GPU pods read, the deep pod alone skipped and counted in "
              "gpufleet_source_parse_errors_total (before: the whole list failed, once a second)")
    fake = FakeApiserver(port=free_port())
    for path, raws in generated_cluster(10, 100):
        fake.load_quietly(path, raws)
    deep = (b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"deep","namespace":"ns",'
            b'"resourceVersion":"1"},"spec":{"x":' + b"[" * 3000 + b"]" * 3000 + b"}}")
    fake.objects[PODS]["ns/deep"] = Stored({}, deep)
    with ThreadedApiserver(fake):
        kubeconfig = write_kubeconfig(tmp / "kubeconfig", f"http://127.0.0.1:{fake.port}")
        exporter = start_exporter(tmp, "--source", "kubernetes", config=(
            f"sources:\n  kubernetes:\n    enabled: true\n    kubeconfig: {kubeconfig}\n"),
            timeout=60)
        time.sleep(10)
        up = metric_sum(exporter.url, "gpufleet_source_up", source="kubernetes")
        errors = metric_sum(exporter.url, "gpufleet_source_parse_errors_total", source="kubernetes")
        _, _, body = request(f"{exporter.url}/v1/snapshot", timeout=10)
        lines = [line for line in log_lines(exporter) if "nested too deep" in line]
    snapshot = json.loads(body)
    # the 100 pods are 40 GPU pods (4 a node) and 60 CPU-only ones, which are dropped
    jobs = len(snapshot.get("allocations", [])) + len(snapshot.get("pending", []))
    row.figures = {"up": up, "parse_errors": errors, "gpu_pods": jobs, "log_lines": len(lines)}
    row.ok = up == 1 and errors == 1 and jobs == 40
    row.observed = (f"source_up {up:g}; parse_errors {errors:g}; {jobs} GPU pods of 40 in the "
                    "snapshot (allocations and pending); "
                    f"{len(lines)} 'nested too deep' log line(s)")
    return row


def dcgm_two_addresses(args: argparse.Namespace, tmp: Path) -> Row:
    ports = [free_port(), free_port()]
    row = Row("dcgm-two-addresses", "--source dcgm with one H100 node's dcgm-exporter reached by two "
              f"addresses the resolver does not tie (ports {ports[0]} and {ports[1]}, the same "
              "answer)", "its 8 GPUs once (before: 16 gpu_up series, 76 duplicates)")
    start_dcgm_targets(tmp, {"good": ports})
    config = "sources:\n  dcgm:\n    enabled: true\n    targets:\n" + "".join(
        f"      - http://127.0.0.1:{p}/metrics\n" for p in ports)
    exporter = start_exporter(tmp, "--source", "dcgm", config=config, timeout=60)
    time.sleep(6)
    _, _, metrics = request(f"{exporter.url}/metrics", timeout=10)
    node = re.search(r'Hostname="([^"]+)"', GOOD_DCGM_BODY.read_text()).group(1)
    up = [line for line in metric_lines(metrics.decode(), "gpufleet_gpu_up") if f'node="{node}"' in line]
    lines = [line for line in log_lines(exporter) if "UUID" in line or "duplicate" in line.lower()]
    row.figures = {"gpu_up_series": len(up), "log_lines": lines[:3]}
    row.ok = len(up) == 8
    row.observed = f"{len(up)} gpu_up series for node {node}; {len(lines)} log line(s) on the duplicates"
    return row


def corrupt_outbox(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("corrupt-outbox", "the advisor's outbox written by one exporter, then every other "
              "4 KiB page after the first zeroed; a new exporter started on it",
              "exit 2 with one line naming advisor.outbox (before: ready, 17 advisor and job "
              "families missing from /metrics)")
    outbox = tmp / "outbox.sqlite"
    config = advisor_config(outbox, free_port())
    from tests.test_advisor_e2e import SECRET

    env = {"GPUFLEET_ADVISOR_TOKEN": TOKEN, "GPUFLEET_WEBHOOK_SECRET": SECRET}
    (tmp / "one").mkdir()
    (tmp / "two").mkdir()
    first = start_exporter(tmp / "one", config=config, env=env)
    time.sleep(3)
    stop(first.proc)
    size = outbox.stat().st_size
    with outbox.open("r+b") as db:
        for page in range(1, size // 4096, 2):
            db.seek(page * 4096)
            db.write(bytes(4096))
    second = start_exporter(tmp / "two", config=config, env=env, ready=False)
    try:
        rc = second.proc.wait(60)
    except subprocess.TimeoutExpired:
        rc = None
    lines = [line for line in log_lines(second) if line.strip()]
    row.figures = {"outbox_bytes": size, "rc": rc, "lines": lines[:5]}
    row.ok = rc == 2 and len(lines) == 1 and "advisor.outbox" in lines[0]
    first_line = lines[0][:160] if lines else ""
    row.observed = f"{size:,}-byte outbox; exit {rc}, {len(lines)} line(s): {first_line!r}"
    return row


def sigterm_drain(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("sigterm-drain", "a client reading /metrics (the simulated 1,088 GPUs, identity "
              "encoding) at about 1 MB/s; SIGTERM after its first MB; then a new connection",
              "the client gets every byte (Content-Length); the new connection refused; exit 0 "
              "(before: exit in 0.16 s, 3.9 of 8.97 MB)")
    exporter = start_exporter(tmp, "--source", "sim", timeout=60)
    sock = socket.create_connection(("127.0.0.1", exporter.port), 10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n"
                 b"Connection: close\r\n\r\n")
    sock.settimeout(30)
    data = bytearray()
    signalled_at = None
    refused = None
    started = time.monotonic()
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if signalled_at is None and len(data) > 1_000_000:
            exporter.proc.send_signal(signal.SIGTERM)
            signalled_at = time.monotonic()
            time.sleep(0.3)
            try:
                socket.create_connection(("127.0.0.1", exporter.port), 2).close()
                refused = False
            except OSError:
                refused = True
        time.sleep(len(chunk) / 1_000_000)  # about 1 MB/s
    sock.close()
    try:
        rc = exporter.proc.wait(30)
    except subprocess.TimeoutExpired:
        rc = None
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    match = re.search(rb"content-length: *(\d+)", head, re.I)
    declared = int(match[1]) if match else None
    row.figures = {"declared": declared, "received": len(body), "refused": refused, "rc": rc,
                   "read_s": time.monotonic() - started}
    row.ok = declared is not None and len(body) == declared and refused is True and rc == 0
    row.observed = (f"{len(body) / 1e6:.2f} of {(declared or 0) / 1e6:.2f} MB received, "
                    f"{time.monotonic() - started:.1f} s; a new connection "
                    f"{'refused' if refused else 'accepted'}; exit {rc}")
    return row


# -- issue 39: remediation that cannot be turned against the fleet --------------------------

class ThreadedApp:
    """aiohttp applications served from a thread of this process, one per port, so a row can
    read what they were sent (the receivers and recorders of issue 39's webhook rows)."""

    def __init__(self, apps: dict[int, Any]) -> None:
        self.apps = apps
        self.loop = asyncio.new_event_loop()
        self._runners: list[Any] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _start(self) -> None:
        from aiohttp import web

        for port, app in self.apps.items():
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self._runners.append(runner)

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def __enter__(self) -> ThreadedApp:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def dcgm_liar(tmp: Path, liar: str, claims: str, configured: bool) -> dict[str, Any]:
    """tests/test_node_identity.py's fleet behind a real ``serve --source dcgm``: pools p-a
    (gpu-004, gpu-005, gpu-008), p-b (gpu-001, gpu-007), p-c (gpu-002, gpu-006), each node's
    dcgm-exporter a file under ``python -m http.server``, a signed receiver recording what
    it gets. Once all 56 GPUs are healthy, ``liar``'s target turns to naming ``claims`` with
    XID 79 (its node written in the targets file when ``configured``, else reached by address
    only); once it is refused, gpu-006 reports its own XID 79, the control that the drain path
    is live. What /metrics, /v1/snapshot, the receiver and ``gpufleet plan`` then say."""
    from tests.test_advisor_e2e import ENV, Scheduler
    from tests.test_health_slurm import dcgm_body, publish

    root = tmp / "dcgm"
    root.mkdir()
    pools = {"p-a": ("gpu-004", "gpu-005", "gpu-008"), "p-b": ("gpu-001", "gpu-007"),
             "p-c": ("gpu-002", "gpu-006")}
    for name in (n for nodes in pools.values() for n in nodes):
        publish(root, name, dcgm_body(name))
    port = free_port()
    files = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                              "127.0.0.1", "--directory", str(root)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _PROCS.append(files)

    def url(name: str) -> str:
        return f"http://127.0.0.1:{port}/{name}/metrics"

    groups: list[dict[str, Any]] = [
        {"targets": [url(n) for n in nodes if not (configured and n == liar)], "labels": {"pool": p}}
        for p, nodes in pools.items()]
    if configured:
        pool = next(p for p, nodes in pools.items() if liar in nodes)
        groups.append({"targets": [url(liar)], "labels": {"pool": pool, "node": liar}})
    (tmp / "targets.json").write_text(json.dumps(groups))
    helpers.wait_http(url("gpu-001"), timeout=30, proc=files)
    scheduler = Scheduler(free_port()).start()
    try:
        exporter = start_exporter(tmp, "--source", "dcgm", env=ENV, timeout=60, config=(
            "collect_interval: 500ms\nsource_timeout: 3s\nsources:\n  dcgm:\n"
            f"    targets_file: {tmp / 'targets.json'}\n    timeout: 2s\nadvisor:\n"
            f"  outbox: {tmp / 'outbox.sqlite'}\n  retry_initial: 200ms\n  retry_max: 1s\n"
            f"  receivers:\n    - {{name: slurm, url: \"http://127.0.0.1:{scheduler.port}"
            "/gpufleet/plan\", timeout: 5s}\n"))
        healthy = wait_for(lambda: sum(metric_sum(exporter.url, "gpufleet_health_gpus", pool=p,
                                                  verdict="healthy") for p in pools) == 56, 60)
        publish(root, liar, dcgm_body(liar, xid_on_gpu=3).replace(
            f'Hostname="{liar}"', f'Hostname="{claims}"'))
        switched = time.monotonic()
        refused = wait_for(lambda: metric_sum(exporter.url, "gpufleet_source_up", source="dcgm",
                                              target=url(liar)) == 0 or None, 30)
        refused_s = time.monotonic() - switched
        publish(root, "gpu-006", dcgm_body("gpu-006", xid_on_gpu=3))
        control = wait_for(lambda: any(b.get("type") == "drain" for b in scheduler.accepted), 60)
        # a few more collections: whatever the liar caused would have been decided by now
        seen = metric_sum(exporter.url, "gpufleet_snapshot_timestamp_seconds")
        wait_for(lambda: metric_sum(exporter.url, "gpufleet_snapshot_timestamp_seconds")
                 > seen + 1.5, 30)
        _, _, metrics = request(f"{exporter.url}/metrics", timeout=10)
        _, _, snap = request(f"{exporter.url}/v1/snapshot", timeout=10)
        plan = subprocess.run([sys.executable, "-m", "exporter", "plan", "--from", exporter.url,
                               "--format", "slurm"], env={**os.environ, "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=60, check=False)
        text = metrics.decode()
        errors = {s["target"]: s.get("error", "") for s in json.loads(snap).get("sources", [])
                  if s.get("target")}
        return {
            "healthy_first": bool(healthy), "refused_after_s": refused_s if refused else None,
            "control_drained": bool(control),
            "liar_up": metric_sum(exporter.url, "gpufleet_source_up", source="dcgm",
                                  target=url(liar)),
            "liar_reason": errors.get(url(liar), ""),
            "delivered": sorted((b.get("type"), b.get("node")) for b in scheduler.accepted),
            "bad_signatures": scheduler.bad_signatures,
            "pages": metric_sum(exporter.url, "gpufleet_remediation_events_total", action="page"),
            "plan_rc": plan.returncode, "plan_out": plan.stdout, "plan_err": plan.stderr.strip(),
            "gpu_up": {n: sum(1 for line in metric_lines(text, "gpufleet_gpu_up")
                              if f'node="{n}"' in line) for n in (liar, claims)},
            "refusal_log_lines": exporter.log.read_text(errors="replace").count(
                "dcgm target refused"),
        }
    finally:
        scheduler.close()


def dcgm_verdict(row: Row, seen: dict[str, Any], liar: str, claims: str) -> Row:
    """The common checks of the two dcgm-claims rows: the liar refused and visible, the
    control's drain (gpu-006) the only one delivered and the only command printed."""
    control = [("drain", "gpu-006"), ("reset_gpu", "gpu-006")]
    printed = [line for line in seen["plan_out"].splitlines() if line.strip()]
    named = [line for line in printed + [str(d) for d in seen["delivered"]]
             if claims in line or liar in line]
    row.figures = seen
    row.ok = (seen["healthy_first"] and seen["refused_after_s"] is not None
              and seen["liar_up"] == 0 and seen["liar_reason"].startswith("refused: ")
              and seen["delivered"] == control and seen["bad_signatures"] == 0
              and seen["pages"] == 0 and seen["plan_rc"] == 0 and not named
              and printed == ['scontrol update NodeName=gpu-006 State=DRAIN '
                              'Reason="gpufleet: XID 79 on GPU 3"'])
    row.observed = (f"{liar}'s target refused {seen['refused_after_s'] or 0:.1f} s after the "
                    f"switch: source_up{{target}} {seen['liar_up']:g}, /v1/snapshot "
                    f"{seen['liar_reason']!r}, {seen['refusal_log_lines']} 'dcgm target refused' "
                    f"log line(s); delivered {seen['delivered']} (the control gpu-006's XID 79); "
                    f"pages {seen['pages']:g}; plan --format slurm exit {seen['plan_rc']}: "
                    f"{printed}; lines or deliveries naming {claims} or {liar}: {len(named)}; "
                    f"gpu_up series {seen['gpu_up']}")
    return row


def dcgm_claims_other_node(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("dcgm-claims-other-node", "serve --source dcgm, 7 fake dcgm targets in 3 pools "
              "from a targets file, gpu-008's written with labels.node: gpu-008; once all 56 GPUs "
              "are healthy gpu-008's body names Hostname=\"gpu-005\" and reports XID 79; then "
              "gpu-006 reports its own XID 79 (the control)",
              "gpu-008's target up 0 with 'refused: …' in /v1/snapshot; gpu-005 keeps its 8 GPUs "
              "and no drain; only gpu-006's drain reaches the receiver and is printed by "
              "`gpufleet plan --format slurm` (before: gpu-005 drained and printed)")
    seen = dcgm_liar(tmp, "gpu-008", "gpu-005", configured=True)
    dcgm_verdict(row, seen, "gpu-008", "gpu-005")
    row.ok = row.ok and seen["gpu_up"] == {"gpu-008": 0, "gpu-005": 8}
    return row


def dcgm_claims_all(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("dcgm-claims-all", "serve --source dcgm, the same 7 targets; gpu-007's, reached "
              "by address only (no node in the targets file), turns to Hostname=\"ALL\" with "
              "XID 79; then gpu-006 reports its own XID 79 (the control)",
              "gpu-007's target up 0, 'refused: … reserved by Slurm'; no node=\"ALL\" on "
              "/metrics; no NodeName=ALL printed or delivered, only gpu-006's drain (before: "
              "`scontrol update NodeName=ALL State=DRAIN` printed, which drained all 8 nodes)")
    seen = dcgm_liar(tmp, "gpu-007", "ALL", configured=False)
    dcgm_verdict(row, seen, "gpu-007", "ALL")
    row.ok = (row.ok and seen["gpu_up"]["ALL"] == 0 and "NodeName=ALL" not in seen["plan_out"]
              and "reserved by Slurm" in seen["liar_reason"])
    return row


REDIRECT_NOTE = "redirects are not followed"


def webhook_redirect(args: argparse.Namespace, tmp: Path) -> Row:
    from aiohttp import web

    from tests.test_advisor_e2e import SECRET

    ports = {302: free_port(), 307: free_port()}
    recorder_port = free_port()
    row = Row("webhook-redirect", "serve proposing the fragmented pool's plan to two receivers: "
              "r302 answers every POST 302 and r307 answers 307, both pointing at a recorder "
              f"on another port ({recorder_port}); 30 s at most",
              "the recorder gets nothing; the plan pending for both receivers in the outbox, "
              f"retried, with \"HTTP 302: {REDIRECT_NOTE}\" and \"HTTP 307: …\"; nothing "
              "delivered (before: 302 became a body-less GET there and the plan was recorded "
              "delivered; 307 re-sent the signed body and its signature there)")
    posts = {302: 0, 307: 0}
    recorded: list[str] = []

    def redirector(status: int) -> Any:
        async def answer(request: web.Request) -> web.Response:
            await request.read()
            posts[status] += 1
            return web.Response(status=status, headers={
                "Location": f"http://127.0.0.1:{recorder_port}/gpufleet/plan"})
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        return app

    async def record(request: web.Request) -> web.Response:
        body = await request.read()
        recorded.append(f"{request.method} {request.path} {len(body)} bytes"
                        f"{' signed' if 'X-Gpufleet-Signature' in request.headers else ''}")
        return web.json_response({"status": "accepted"})

    recorder = web.Application()
    recorder.router.add_route("*", "/{tail:.*}", record)
    outbox = tmp / "outbox.sqlite"
    config = advisor_config(outbox, ports[302]).replace("name: scheduler", "name: r302").replace(
        "  receivers:\n", "  receivers:\n    - {name: r307, url: \"http://127.0.0.1:"
        f"{ports[307]}/gpufleet/plan\", timeout: 2s}}\n")
    with ThreadedApp({ports[302]: redirector(302), ports[307]: redirector(307),
                      recorder_port: recorder}):
        exporter = start_exporter(tmp, config=config, env={"GPUFLEET_ADVISOR_TOKEN": TOKEN,
                                                           "GPUFLEET_WEBHOOK_SECRET": SECRET})
        started = time.monotonic()
        wait_for(lambda: min(posts.values()) >= 3, 30)
        took = time.monotonic() - started
        delivered = metric_sum(exporter.url, "gpufleet_advisor_webhook_deliveries_total",
                               result="delivered")
        import sqlite3

        with contextlib.closing(sqlite3.connect(f"file:{outbox}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT receiver, plan_id, status, attempts, last_error "
                              "FROM deliveries ORDER BY receiver").fetchall()
    by_receiver = {r[0]: r for r in rows}
    row.figures = {"posts": posts, "recorded": recorded, "outbox": rows, "delivered": delivered,
                   "seconds": took}
    row.ok = (min(posts.values()) >= 2 and recorded == [] and delivered == 0
              and all(by_receiver.get(f"r{s}", ("",) * 5)[2:3] == ("pending",)
                      and by_receiver[f"r{s}"][4] == f"HTTP {s}: {REDIRECT_NOTE}" for s in posts))
    row.observed = (f"POSTs to the redirectors in {took:.1f} s: 302 {posts[302]}, 307 "
                    f"{posts[307]}; the recorder got {len(recorded)} request(s) {recorded[:3]}; "
                    f"delivered {delivered:g}; outbox: "
                    + "; ".join(f"{r[0]} {r[1]} {r[2]}, {r[3]} attempts, {r[4]!r}" for r in rows))
    return row


WEBHOOK_ANSWER_BYTES = 1536 * (1 << 20)  # what the receiver streams: 1.5 GB, chunked


def webhook_1_5gb(args: argparse.Namespace, tmp: Path) -> Row:
    from aiohttp import web

    from tests.test_http_client import SENDER

    row = Row("webhook-1.5gb", "the real Deliverer and outbox in a process of their own (the "
              "test's sender, timeout 120 s so only the cap can stop the read) posting a plan "
              "to a receiver that answers 200 and streams 1.5 GB chunked",
              "sender VmHWM and sampled RSS under 100 MB; one retry, the plan pending with "
              "\"answer over the 65,536-byte limit\"; the receiver cut off long before 1.5 GB "
              "(before: 36 MB to 3.1 GB)")
    streamed = [0]

    async def huge(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(status=200)
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b"x" * (1 << 20)
        try:
            while streamed[0] < WEBHOOK_ANSWER_BYTES:
                await response.write(chunk)
                streamed[0] += len(chunk)
        except (ConnectionError, RuntimeError):  # the sender hung up: as it should
            pass
        return response

    app = web.Application()
    app.router.add_post("/gpufleet", huge)
    port = free_port()
    with ThreadedApp({port: app}):
        sender = subprocess.Popen([sys.executable, "-c", SENDER, f"http://127.0.0.1:{port}/gpufleet",
                                   str(tmp / "outbox.sqlite")], cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _PROCS.append(sender)
        started = time.monotonic()
        with RssPoller(sender.pid, interval=0.02) as poller:
            while sender.poll() is None and time.monotonic() - started < 120:
                if poller.peak > 100:  # over the bound: stopped here, not at 3 GB
                    sender.kill()
                    break
                time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            sender.wait(10)
        took = time.monotonic() - started
        out, err = sender.communicate(timeout=10) if sender.returncode is not None else (b"", b"")
    try:
        answer = json.loads(out)
    except ValueError:
        answer = {"error": err.decode(errors="replace")[-300:]}
    hwm = answer.get("hwm_kib", 0) * 1024 / 1e6
    status = answer.get("status") or []
    row.figures = {"rss_peak_mb": poller.peak, "vmhwm_mb": hwm, "report": answer,
                   "streamed_bytes": streamed[0], "seconds": took, "rc": sender.returncode}
    row.ok = (sender.returncode == 0 and poller.peak < 100 and 0 < hwm < 100
              and answer.get("results") == {"slurm/retry": 1} and status[:2] == ["pending", 1]
              and "65,536-byte limit" in str(status[2:]) and streamed[0] < WEBHOOK_ANSWER_BYTES)
    row.observed = (f"sender VmHWM {hwm:.1f} MB, sampled RSS peak {poller.peak:.1f} MB, exit "
                    f"{sender.returncode} after {took:.1f} s; results {answer.get('results')}; "
                    f"outbox {status}; the receiver streamed {streamed[0] / 1e6:.0f} MB before "
                    "the sender hung up")
    return row


def hostile(kind: str, path: Path) -> None:
    """A FIFO nobody writes to, or a link to /dev/zero, put where ``path`` is in one rename."""
    new = path.with_name(path.name + ".new")
    if kind == "fifo":
        os.mkfifo(new)
    else:
        os.symlink("/dev/zero", new)
    os.replace(new, path)


def secret_fifo(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("secret-fifo", "serve with advisor.token_file a FIFO (no writer), then a link to "
              "/dev/zero; then a serve started on a good token file, a FIFO renamed over it, one "
              "unauthenticated POST /v1/plan, /-/healthy timed; the same with /dev/zero; SIGTERM",
              "exit 2 with one line at start, each; at run time the POST 401, /-/healthy within "
              "1 s, the old token still 200, gpufleet_config_last_reload_successful 0, RSS "
              "within 100 MB of its level before the swaps, SIGTERM exits 0 (before: a hang at "
              "start, MemoryError exit 1; at run time the loop blocked for good, SIGTERM "
              "ignored, and one POST could allocate 4 GB)")
    ok, observed = True, []
    for kind in ("fifo", "zero"):
        folder = tmp / f"start-{kind}"
        folder.mkdir()
        path = folder / "token"
        hostile(kind, path)
        started = time.monotonic()
        exporter = start_exporter(folder, config=f"advisor:\n  token_file: {path}\n",
                                  drop_env=("GPUFLEET_ADVISOR_TOKEN",), ready=False)
        try:
            rc = exporter.proc.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - started
        lines = [line for line in log_lines(exporter) if line.strip()]
        met = rc == 2 and len(lines) == 1 and "is not a regular file" in lines[0]
        ok &= met
        row.figures[f"start_{kind}"] = {"rc": rc, "seconds": took, "lines": lines[:3]}
        observed.append(f"start, {kind}: exit {rc} in {took:.1f} s, {len(lines)} line(s) "
                        f"{(lines[0] if lines else '')[:110]!r}")
    token = tmp / "token"
    token.write_text("old-token-0001\n")
    exporter = start_exporter(tmp, config=f"collect_interval: 1s\nadvisor:\n  token_file: {token}\n",
                              drop_env=("GPUFLEET_ADVISOR_TOKEN",))
    body = json.dumps({"taken_at": time.time(), "nodes": [node(8)]}).encode()
    plan_url = f"{exporter.url}/v1/plan"

    def post(token_text: str | None) -> int | None:
        headers = {"Content-Type": "application/json"}
        if token_text is not None:
            headers["Authorization"] = f"Bearer {token_text}"
        return request(plan_url, body, headers, timeout=10)[0]

    first = post("old-token-0001")
    ok &= first == 200
    observed.append(f"run time: good token {first}")
    with RssPoller(exporter.proc.pid) as poller:
        baseline = poller.peak
        for kind in ("fifo", "zero"):
            hostile(kind, token)
            unauthenticated = post(None)
            healthy, healthy_s, _ = request(f"{exporter.url}/-/healthy", timeout=5)
            old = post("old-token-0001")
            gauge = wait_for(lambda: metric_sum(exporter.url,
                                                "gpufleet_config_last_reload_successful") == 0, 10)
            met = unauthenticated == 401 and healthy == 200 and healthy_s < 1 and old == 200 \
                and bool(gauge)
            ok &= met
            row.figures[f"run_{kind}"] = {"unauthenticated": unauthenticated, "healthy": healthy,
                                          "healthy_s": healthy_s, "old_token": old,
                                          "reload_gauge_0": bool(gauge)}
            observed.append(f"{kind} renamed over it: unauthenticated POST {unauthenticated}, "
                            f"/-/healthy {healthy} in {ms(healthy_s)}, old token {old}, reload "
                            f"gauge {'0' if gauge else 'not 0'}")
    exporter.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        rc = exporter.proc.wait(30)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.monotonic() - started
    tracebacks = exporter.log.read_text(errors="replace").count("Traceback")
    # the simulated fleet's own warm-up adds some 20-40 MB; /dev/zero read whole was 4 GB
    ok &= rc == 0 and tracebacks == 0 and poller.peak - baseline < 100
    row.figures.update({"sigterm_rc": rc, "sigterm_s": took, "rss_baseline_mb": baseline,
                        "rss_peak_mb": poller.peak, "tracebacks": tracebacks})
    observed.append(f"RSS {baseline:.0f} -> peak {poller.peak:.0f} MB; SIGTERM: exit {rc} in "
                    f"{took:.1f} s; {tracebacks} traceback(s)")
    row.ok, row.observed = bool(ok), "; ".join(observed)
    return row


def slurm_gres_2m(args: argparse.Namespace, tmp: Path) -> Row:
    huge = ",".join(["gpu:h100:1024"] * 2000)
    nodes = tmp / "nodes.txt"
    nodes.write_text("".join(f"NodeName={name} CPUTot=64 Gres={gres} State=IDLE ThreadsPerCore=1 "
                             "Partitions=gpu-h100\n"
                             for name, gres in (("gpu-001", "gpu:h100:8"), ("gpu-666", huge))))
    row = Row("slurm-gres-2m", "scontrol show node answering gpu-001 (gpu:h100:8) and gpu-666 "
              f"whose Gres= repeats gpu:h100:1024 2,000 times ({len(huge):,} bytes: 2,048,000 "
              "GPUs); 15 s of collections",
              "gpu-666 absent, gpu-001's 8 GPUs served, the node counted in "
              "gpufleet_source_parse_errors_total, each read well under a second, RSS flat "
              "(before: 2,048,000 GPUs, 32 s, 598 MB)")
    exporter = slurm_exporter(tmp, f'if [ "$2" = node ]; then cat "{nodes}"; fi', command_timeout=5)
    with RssPoller(exporter.proc.pid) as poller:
        first = poller.peak
        time.sleep(15)
    _, _, metrics = request(f"{exporter.url}/metrics", timeout=10)
    text = metrics.decode()
    gpus = {n: sum(1 for line in metric_lines(text, "gpufleet_gpu_up") if f'node="{n}"' in line)
            for n in ("gpu-001", "gpu-666")}
    errors = metric_sum(exporter.url, "gpufleet_source_parse_errors_total", source="slurm")
    took = metric_sum(exporter.url, "gpufleet_collect_duration_seconds", source="slurm")
    up = metric_sum(exporter.url, "gpufleet_source_up", source="slurm")
    row.figures = {"gpu_up": gpus, "parse_errors": errors, "duration_s": took, "up": up,
                   "rss_first_mb": first, "rss_peak_mb": poller.peak}
    row.ok = (gpus == {"gpu-001": 8, "gpu-666": 0} and errors >= 1 and up == 1 and took < 1
              and poller.peak - first < 10 and poller.peak < 200)
    row.observed = (f"gpu_up series: {gpus}; parse_errors {errors:g}; source_up {up:g}; last read "
                    f"{took:.3f} s; RSS {first:.0f} MB at ready, peak {poller.peak:.0f} MB")
    return row


CLI_NUMBERS = [
    ["simulate", "--days", "1e9"], ["simulate", "--days", "nan"], ["simulate", "--days", "inf"],
    ["simulate", "--warmup-days", "1e9"], ["simulate", "--seeds", "1-1000000000"],
    ["simulate", "--advisor-interval", "1e-9"], ["act", "--slurm", "--events", "/dev/zero"],
]


def cli_numbers(args: argparse.Namespace, tmp: Path) -> Row:
    row = Row("cli-numbers", "gpufleet " + "; ".join(" ".join(a) for a in CLI_NUMBERS)
              + " (simulate with --out, act with --audit-log; each under a 2 GiB address-space "
              "limit and 60 s)",
              "each exits 2 with one stderr line and no traceback, at once, writing nothing "
              "(before: MemoryError, ValueError, OverflowError tracebacks; minutes of running)")

    def limit() -> None:  # a regression fails inside this, not by taking the machine
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    results, ok = [], True
    for i, argv in enumerate(CLI_NUMBERS):
        out = tmp / f"out-{i}"
        extra = ["--out", str(out)] if argv[0] == "simulate" else ["--audit-log", str(out)]
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-m", "exporter", *argv, *extra], cwd=tmp,
                                  env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                                  text=True, timeout=60, preexec_fn=limit)
            rc, err = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            rc, err = None, "still running after 60 s (killed)"
        took = time.monotonic() - started
        lines = err.splitlines()
        met = (rc == 2 and len(lines) == 1 and "Traceback" not in err and not out.exists()
               and took < 30)
        ok &= met
        results.append(f"{' '.join(argv)}: exit {rc}, {len(lines)} line(s), {took:.1f} s "
                       f"({(lines[-1] if lines else '')[:90]!r})")
    row.ok, row.figures, row.observed = bool(ok), {"cases": results}, "; ".join(results)
    return row


def event_order(args: argparse.Namespace, tmp: Path) -> Row:
    # the bench's Slurm rows run a stand-in scontrol; ordering needs a real slurmctld, which
    # tests/helpers/slurm_cluster.py starts for the tests (as root, 8 slurmd)
    return Row("event-order", "a drain retried through a receiver's outage and overtaken by its "
               "resume, delivered by the real Deliverer and outbox to `gpufleet act --slurm "
               "--mode act` on a real Slurm",
               "the node ends resumed; act refuses the stale drain",
               "skipped: no real Slurm is given to the bench (its Slurm rows run a stand-in "
               "scontrol); proven by tests/test_event_order.py::test_on_slurm_a_drain_retried_"
               "through_an_outage_and_overtaken_leaves_the_node_resumed and "
               "::test_on_slurm_act_alone_refuses_the_stale_drain (a real Slurm 22.05)", None)


ATTACKS: dict[str, Callable[[argparse.Namespace, Path], Row]] = {
    "whatif-1e9": whatif_1e9,
    "idle-connections": idle_connections,
    "dcgm-hostile": dcgm_hostile,
    "dcgm-dup-secret": dcgm_dup_secret,
    "bad-input": bad_input,
    "token-rotation": token_rotation,
    "config-billion-laughs": config_billion_laughs,
    "bad-configs": bad_configs,
    "snapshot-50": snapshot_load,
    "full-disk": full_disk,
    "expired-plan": expired_plan,
    "wrk": wrk,
    "slurm-escape": slurm_escape,
    "slurm-words": slurm_words,
    "log-stall": log_stall,
    "label-churn": label_churn,
    "prometheus-2gb": prometheus_2gb,
    "kube-20k": kube_20k,
    "kube-300k-pods": kube_pods,
    "kube-410-storm": kube_410_storm,
    "kube-deep": kube_deep,
    "dcgm-two-addresses": dcgm_two_addresses,
    "corrupt-outbox": corrupt_outbox,
    "sigterm-drain": sigterm_drain,
    "sighup": sighup,
    "restart-cooldown": restart_cooldown,
    "alert-flood": alert_flood,
    "prometheus-bad-series": prometheus_bad_series,
    "malformed-flood": malformed_flood,
    "full-disk-outcome": full_disk_outcome,
    "clock-step": clock_step,
    "dcgm-claims-other-node": dcgm_claims_other_node,
    "dcgm-claims-all": dcgm_claims_all,
    "webhook-redirect": webhook_redirect,
    "webhook-1.5gb": webhook_1_5gb,
    "secret-fifo": secret_fifo,
    "slurm-gres-2m": slurm_gres_2m,
    "cli-numbers": cli_numbers,
    "event-order": event_order,
}


def report(rows: list[Row]) -> None:
    print()
    print("| row | input | expected | observed | met |")
    print("|---|---|---|---|---|")
    for row in rows:
        met = "skipped" if row.ok is None else ("yes" if row.ok else "**no**")
        cells = [c.replace("|", "\\|") for c in (row.name, row.input, row.expected, row.observed)]
        print(f"| {' | '.join(cells)} | {met} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(ATTACKS),
                        help="run only this row (repeatable)")
    parser.add_argument("--connections", type=int, default=20_000, help="idle-connections: how many")
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="idle-connections: how long to hold them and scrape")
    parser.add_argument("--wrk-connections", type=int, default=1000)
    parser.add_argument("--wrk-seconds", type=float, default=15.0)
    parser.add_argument("--collections", type=int, default=10, help="dcgm-hostile: collections")
    parser.add_argument("--repeat", type=int, default=10, help="whatif-1e9: requests per variant")
    parser.add_argument("--json", metavar="FILE", help="also write the raw figures here")
    parser.add_argument("--churn-snapshots", type=int, default=1000,
                        help="label-churn: snapshots fed")
    parser.add_argument("--churn-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--memory-seconds", type=float, default=30.0,
                        help="prometheus-2gb, kube-20k: how long to watch")
    parser.add_argument("--kube-nodes", type=int, default=20_000, help="kube-20k: nodes")
    parser.add_argument("--memory-max", type=parse_bytes, default=None, metavar="BYTES",
                        help="prometheus-2gb, kube-20k: run the exporter in a memory cgroup "
                        "limited to this (1G: the shipped unit's MemoryMax); needs root")
    parser.add_argument("--serve-prometheus", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--serve-kube", nargs=3, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-kube-pods", nargs=3, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--kube-pods", type=int, default=300_000, help="kube-300k-pods: pods")
    parser.add_argument("--kube-pods-seconds", type=float, default=90.0,
                        help="kube-300k-pods: how long to probe")
    parser.add_argument("--serve-bad-series", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-dcgm", help=argparse.SUPPRESS)
    parser.add_argument("--scrape", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--keep-alive", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scrape:
        scrape_every_second(args.scrape[0], float(args.scrape[1]), args.keep_alive)
        return
    if args.serve_prometheus:
        serve_prometheus(int(args.serve_prometheus[0]), args.serve_prometheus[1])
        return
    if args.serve_bad_series:
        serve_bad_series(args.serve_bad_series)
        return
    if args.serve_kube:
        serve_kube(*args.serve_kube)
        return
    if args.serve_kube_pods:
        serve_kube_pods(*args.serve_kube_pods)
        return
    if args.churn_child:
        churn_child(int(args.churn_child[0]), args.churn_child[1])
        return
    if args.serve_dcgm:
        serve_dcgm(json.loads(args.serve_dcgm))
        return
    names = args.only or list(ATTACKS)
    rows: list[Row] = []
    # SIGTERM (e.g. a timeout's) goes through the finally below too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with tempfile.TemporaryDirectory(prefix="gpufleet-attack-") as tmp_name:
            for name in names:
                tmp = Path(tmp_name) / name
                tmp.mkdir()
                print(f"{name} ...", file=sys.stderr, flush=True)
                try:
                    row = ATTACKS[name](args, tmp)
                except Exception as exc:  # one broken row still reports the others
                    row = Row(name, "", "", f"bench error: {exc!r}"[:500], False)
                finally:
                    stop_all()
                print(f"  input:    {row.input}\n  expected: {row.expected}\n"
                      f"  observed: {row.observed}\n  met:      "
                      f"{'skipped' if row.ok is None else row.ok}", file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        stop_all()
    report(rows)
    if args.json:
        Path(args.json).write_text(json.dumps([row.__dict__ for row in rows], indent=2, default=str))
    sys.exit(0 if all(row.ok is not False for row in rows) else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
