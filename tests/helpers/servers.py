"""Real servers on 127.0.0.1 for the tests: free ports, start, wait, stop.

One ``Server`` record serves every process a test starts (the exporter,
Prometheus, Alertmanager); ``Prometheus`` and ``Alertmanager`` (in
``tests.helpers.alerting``) only add their HTTP APIs to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from exporter.sources.sim.options import REFERENCE_POOLS
from tests.helpers.data import REPO

# The simulated fleet the tests' exporters serve unless a test asks for the reference one
# (exporter_factory's default; start_exporter's is the reference fleet, which the benches that
# call it measure): the reference pools at 4 nodes each, 128 GPUs, so every model and pool,
# MIG on 2 of the 4 A100 nodes and 4-node training jobs are kept. A scrape of it is about an
# eighth of the reference fleet's 10.2 MB, and each Prometheus a test starts ingests it and
# evaluates every generated rule over it each second. Nodes gpu-001..gpu-016: H200 1-4,
# H100 5-8, A100 9-12 (MIG 11-12), B200 13-16.
SMALL_POOLS = tuple(dataclasses.replace(pool, nodes=4) for pool in REFERENCE_POOLS)
SMALL_GPUS = sum(pool.nodes * pool.gpus_per_node for pool in SMALL_POOLS)
# A third of the reference fleet (336 GPUs), for the tests that scatter the H100 pool: its
# fragmentation index depends on the pool's size (30.7 at 4 nodes, 62 at 32, 69.6 at 64 at
# seed 42), and the compaction alert and the advisor act above 50. Nodes gpu-001..004 H200,
# gpu-005..036 H100, gpu-037..040 A100-80GB (MIG 039-040), gpu-041..042 B200.
MEDIUM_POOLS = tuple(dataclasses.replace(pool, nodes=nodes) for pool, nodes
                     in zip(REFERENCE_POOLS, (4, 32, 4, 2), strict=True))
FLEETS = MappingProxyType({"small": SMALL_POOLS, "medium": MEDIUM_POOLS, "reference": None})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


def http_get(url: str, timeout: float = 10.0, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return resp.read()


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def discard(proc: subprocess.Popen) -> None:
    """SIGKILL and reap, for a server whose state nothing reads again (a test's own Prometheus
    at teardown). Prometheus' graceful stop waits for every rule group's evaluation in flight,
    and over the simulated fleet at a 1 s interval those run back to back: it took 7-10 s
    (to the 10 s kill) at load 12-16, for a TSDB in a temporary folder."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@dataclass
class Server:
    """A process serving HTTP on 127.0.0.1:``port``, started in ``workdir``, logging to ``log``."""

    proc: subprocess.Popen
    port: int
    workdir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def fleet_config(config: str | None, args: tuple[str, ...], fleet: str) -> str | None:
    """``config`` with ``sources.sim.pools`` set to ``fleet``'s pools (FLEETS) when the
    exporter will serve the simulated fleet with the default layout; otherwise (the
    reference fleet asked for, sim not served, pools already set, a config file given in
    ``args``, or a config that is not a YAML mapping, e.g. a test of a broken one) as given."""
    if fleet not in FLEETS:
        raise ValueError(f"fleet must be one of {', '.join(FLEETS)}, not {fleet!r}")
    pools = FLEETS[fleet]
    source = next((a.split("=", 1)[1] for a in args if a.startswith("--source=")), None)
    if "--source" in args[:-1]:
        source = args[args.index("--source") + 1]
    if pools is None or "--config" in args or source not in (None, "sim"):
        return config
    try:
        data = yaml.safe_load(config or "") or {}
    except yaml.YAMLError:
        return config
    if not isinstance(data, dict):
        return config
    sources = data.setdefault("sources", {})
    sim = sources.setdefault("sim", {}) if isinstance(sources, dict) else None
    if not isinstance(sim, dict) or "pools" in sim or (sim.get("enabled") is False
                                                       and source is None):
        return config
    sim["pools"] = [dataclasses.asdict(pool) for pool in pools]
    return yaml.safe_dump(data, sort_keys=False)


def start_exporter(tmp: Path, *args: str, config: str | None = None,
                   env: dict[str, str] | None = None, ready: bool = True, timeout: float = 30.0,
                   drop_env: tuple[str, ...] = (), module: str = "exporter",
                   fleet: str = "reference") -> Server:
    """``python -m exporter serve`` from this checkout, on a free port; ``drop_env`` names
    variables of this process's environment the exporter must not inherit. ``module`` runs
    a test launcher that takes the same arguments instead (tests.helpers.fake_nvml_exporter:
    the NVML source on the fake pynvml). ``fleet``: "reference" serves the simulated fleet
    as the config says (1,088 GPUs, gpu-001..gpu-136, by default); "small" SMALL_POOLS' 128
    GPUs, "medium" MEDIUM_POOLS' 336, unless the config sets its pools."""
    config = fleet_config(config, args, fleet)
    port = free_port()
    cmd = [sys.executable, "-m", module, "serve", "--listen", f"127.0.0.1:{port}", *args]
    if config is not None:
        path = tmp / f"gpufleet-{port}.yaml"
        path.write_text(config)
        cmd += ["--config", str(path)]
    log = tmp / f"exporter-{port}.log"
    # run in the test's folder, so relative paths (the advisor's outbox) land there, not in
    # the checkout; PYTHONPATH keeps `-m exporter` on this checkout's code
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, cwd=tmp, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**{k: v for k, v in os.environ.items() if k not in drop_env},
                                 "PYTHONPATH": path, **(env or {})})
    exporter = Server(proc, port, tmp, log)
    if ready:
        try:
            wait_http(f"{exporter.url}/-/ready", timeout=timeout, proc=proc)
        except Exception:
            stop(proc)
            raise RuntimeError(f"exporter did not start: {log.read_text()[-2000:]}") from None
    return exporter


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        # make test installs these; a missing one is a broken environment, not a skip
        pytest.fail(f"{name} is not installed; run `make test`, which installs it")
    return path


class Prometheus(Server):
    """A real Prometheus, with its query API."""

    def query(self, expr: str, time_: float | None = None) -> list[dict]:
        params = {"query": expr}
        if time_ is not None:
            params["time"] = str(time_)
        body = http_get(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}")
        payload = json.loads(body)
        assert payload["status"] == "success", payload
        return payload["data"]["result"]

    def wait_for(self, expr: str, predicate, timeout: float = 60.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{expr!r} never satisfied the condition; last result {result!r}")


def start_prometheus(workdir: Path, config: str, extra_args: tuple[str, ...] = ()) -> Prometheus:
    binary = require_binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(config)
    port = free_port()
    proc = start_server(
        "prometheus", workdir, port,
        [binary, f"--config.file={workdir / 'prometheus.yml'}",
         f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--web.enable-lifecycle", *extra_args])
    return Prometheus(proc, port, workdir, workdir / "prometheus.log")


def start_node_exporter(workdir: Path) -> Server:
    """Debian's prometheus-node-exporter with only the collectors the node pressure rules
    read (issue 20): CPU, memory and disks; a scrape of them takes milliseconds."""
    binary = require_binary("prometheus-node-exporter")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = start_server("node-exporter", workdir, port, [
        binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
        "--collector.cpu", "--collector.meminfo", "--collector.diskstats"])
    return Server(proc, port, workdir, workdir / "node-exporter.log")


def start_server(name: str, workdir: Path, port: int, cmd: list[str],
                 ready_path: str = "/-/ready") -> subprocess.Popen:
    """Start a server whose log goes to ``workdir/<name>.log``; wait for its ``ready_path``
    (VictoriaMetrics' servers answer ``/health``)."""
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=workdir)
    try:
        wait_http(f"http://127.0.0.1:{port}{ready_path}", timeout=60, proc=proc)
    except Exception:
        stop(proc)
        raise RuntimeError(f"{name} did not start: {log.read_text()[-2000:]}") from None
    return proc


def wait_until(what: str, check, timeout: float = 45.0, interval: float = 0.2):
    """Poll ``check`` until it returns something true, and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within ``seconds``."""
    try:
        while await asyncio.wait_for(reader.read(65536), seconds):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True
