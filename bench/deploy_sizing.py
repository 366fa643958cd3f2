"""Memory of cluster mode as deploy/kubernetes/overlays/cluster runs it, for its requests and limits.

The overlay's own ``cluster.yaml`` (the Kubernetes source, the analysis, the advisor),
changed only where this machine differs from a pod: a kubeconfig to the fake apiserver
(tests/helpers/fake_apiserver.py, in its own process, serving bench/kubernetes.py's
generated cluster: 8 H100 per node, four GPU pods and six CPU pods a node) instead of
the service account; the secrets and the outbox in a temporary folder; the Prometheus
source off (no Prometheus here) with ``exposition.per_gpu: false``, as it is when that
source is on. The timeouts stay the overlay's (``source_timeout`` 10 s, ``sync_timeout``
8 s): when the first lists of a large cluster take longer, the first reads fail as they
would in the pod, and the time to the first full snapshot shows what that costs.

It runs ``python -m exporter serve`` as the container does, waits for the first
snapshot with every GPU, then for ``--seconds`` scrapes ``/metrics`` (plain and gzip)
and reads ``/v1/advice`` and ``/v1/snapshot`` every collect interval, and reports the
serving process's peak RSS (VmHWM). The generated cluster is full (every GPU held), so
the advisor finds nothing to move: its plan-time memory is not in the figure.

Usage: ``.venv/bin/python bench/deploy_sizing.py [--nodes 5000] [--pods 50000] [--seconds 60]``
"""

from __future__ import annotations

import argparse
import gzip
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.kubernetes import wait_ready  # noqa: E402
from tests.helpers.fake_apiserver import write_kubeconfig  # noqa: E402

TOKEN = "bench"
OVERLAY_CONFIG = REPO / "deploy" / "kubernetes" / "overlays" / "cluster" / "cluster.yaml"
GPUS_PER_NODE = 8  # bench/kubernetes.py's generated node: gpu-node-1 of the recorded cluster


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def config_for(folder: Path, listen: int, apiserver: str) -> Path:
    config = yaml.safe_load(OVERLAY_CONFIG.read_text())
    (folder / "token").write_text("bench-advisor-token\n")
    config["listen"] = f"127.0.0.1:{listen}"
    config["exposition"] = {"per_gpu": False}
    kubernetes = config["sources"]["kubernetes"]
    kubernetes["kubeconfig"] = str(write_kubeconfig(folder / "kubeconfig", apiserver, TOKEN))
    config["sources"]["prometheus"] = {"enabled": False}
    advisor = config["advisor"]
    advisor["token_file"] = str(folder / "token")
    advisor["outbox"] = str(folder / "outbox.sqlite")
    for receiver in advisor["receivers"]:
        receiver["secret_file"] = str(folder / "token")
        receiver["url"] = f"http://127.0.0.1:{free_port()}/plan"  # nothing listens: retried
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def get(url: str, gzipped: bool = False) -> bytes:
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as answer:
        body: bytes = answer.read()
    return gzip.decompress(body) if gzipped else body


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise SystemExit(f"no VmHWM for process {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    api_port, port = free_port(), free_port()
    apiserver, url = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        fake = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.fake_apiserver", "--port", str(api_port),
             "--token", TOKEN, "--bench", f"{args.nodes},{args.pods}"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serve = None
        try:
            wait_ready(apiserver, fake)
            config = config_for(Path(tmp), port, apiserver)
            serve = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--config",
                                      str(config)], cwd=REPO, stdout=subprocess.DEVNULL,
                                     stderr=open(Path(tmp) / "serve.log", "wb"))  # noqa: SIM115
            started, want = time.monotonic(), args.nodes * GPUS_PER_NODE
            gpus = 0
            while gpus != want:
                if serve.poll() is not None or time.monotonic() - started > 600:
                    raise SystemExit("no full snapshot: " + (Path(tmp) / "serve.log").read_text()[-2000:])
                time.sleep(2)
                try:
                    gpus = get(f"{url}/metrics").count(b"\ngpufleet_gpu_allocated_ratio{")
                except OSError:
                    continue
            first = time.monotonic() - started
            scrapes = 0
            while time.monotonic() - started < first + args.seconds:
                get(f"{url}/metrics")
                get(f"{url}/metrics", gzipped=True)
                get(f"{url}/v1/advice")
                get(f"{url}/v1/snapshot")
                scrapes += 1
                time.sleep(15)  # the overlay's collect_interval
            peak = peak_rss_kib(serve.pid)
        finally:
            if serve is not None:
                serve.terminate()
                serve.wait(30)
            fake.terminate()
            fake.wait(10)
    print(f"cluster mode (deploy/kubernetes/overlays/cluster/cluster.yaml) on {args.nodes} nodes, "
          f"{args.pods} pods, {want} GPUs: first full snapshot served after {first:.1f} s; "
          f"{scrapes} rounds of /metrics (plain, gzip), /v1/advice, /v1/snapshot; "
          f"peak RSS {peak / 1024:.0f} MiB ({peak:,} kB)")


if __name__ == "__main__":
    main()
