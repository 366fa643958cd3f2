"""Node mode's footprint against issue 30's goals: ``serve --help`` CPU time, and RSS at 1 min.

- ``gpufleet serve --help``: user+sys CPU seconds of the whole process (interpreter start
  included), the least of ``--runs`` (CPU, not wall: the development machine is shared,
  and the least is the figure least disturbed by the others);
- node mode: ``gpufleet serve`` with ``sources: {sim: {enabled: false}, nvml: {enabled:
  true}}`` on 8 GPUs of the fake pynvml (``tests/helpers/fake_pynvml.py``, loaded from its
  file so that the tests package, which imports pytest, stays out of the process), scraped
  every 15 s; ``VmRSS`` and ``VmHWM`` after ``--seconds``.

The venv's size is not measured here (``du -sm`` of a fresh ``pip install .``; see
docs/performance.md, "A lean node").

Usage: ``.venv/bin/python bench/node_footprint.py [--runs 5] [--seconds 60]``
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LAUNCHER = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("fake_pynvml", sys.argv[1])
fake = importlib.util.module_from_spec(spec)
sys.modules["fake_pynvml"] = fake  # its dataclasses look their module up there
spec.loader.exec_module(fake)
gpus = [fake.FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
                     pci_bus_id=f"00000000:{0x18 + i:02X}:00.0", utilization=40, memory_used=2**34)
        for i in range(8)]
sys.modules["pynvml"] = fake.FakeNvml(gpus)
from exporter.cli import main
sys.exit(main(sys.argv[2:]))
"""


def cpu_of(cmd: list[str], env: dict[str, str]) -> float:
    """user + sys CPU seconds of one run of ``cmd`` (its children's rusage)."""
    before = os.times()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system
                                                            - before.children_system)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_mb(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) / 1024
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    help_cpu = [cpu_of([sys.executable, "-m", "exporter", "serve", "--help"], env)
                for _ in range(args.runs)]
    bare = min(cpu_of([sys.executable, "-c", "pass"], env) for _ in range(args.runs))
    print(f"serve --help: CPU {min(help_cpu):.2f} s least of {args.runs} "
          f"(all: {', '.join(f'{c:.2f}' for c in help_cpu)}); a bare interpreter {bare:.2f} s; "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="gpufleet-node-") as work:
        config = Path(work) / "node.yaml"
        config.write_text("collect_interval: 5s\nanalysis: {enabled: false}\n"
                          "advisor: {enabled: false}\n"
                          "sources: {sim: {enabled: false}, nvml: {enabled: true}}\n")
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(REPO / "tests" / "helpers" / "fake_pynvml.py"),
             "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"],
            cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            started = time.monotonic()
            scrapes, gpus = 0, 0
            while time.monotonic() - started < args.seconds:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        body = r.read().decode()
                    scrapes += 1
                    gpus = body.count("\ngpufleet_gpu_up{")
                except OSError:
                    pass
                time.sleep(15 if scrapes else 0.5)
            memory = status_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    print(f"node mode on {gpus} fake GPUs after {args.seconds:.0f} s and {scrapes} scrapes: "
          f"VmRSS {memory['VmRSS']:.1f} MiB, VmHWM {memory['VmHWM']:.1f} MiB; "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0 if gpus == 8 else 1


if __name__ == "__main__":
    sys.exit(main())
