"""Node mode's footprint against its goals: ``serve --help`` CPU time, the node install's
size (<= 100 MB) and its RSS at 1 min (<= 60 MB), and whether it loaded numpy.

- ``gpufleet serve --help``: user+sys CPU seconds of the whole process (interpreter start
  included), the least of ``--runs`` (CPU, not wall: the development machine is shared,
  and the least is the figure least disturbed by the others);
- node mode: ``gpufleet serve`` with ``sources: {sim: {enabled: false}, nvml: {enabled:
  true}}`` on 8 GPUs of the fake pynvml (``tests/helpers/fake_pynvml.py``, loaded from its
  file so that the tests package, which imports pytest, stays out of the process), scraped
  every 15 s; ``VmRSS`` and ``VmHWM`` after ``--seconds``.

- ``--venv DIR``: the node install's size, ``du`` of DIR (a venv made the way docs/deploy.md
  states a node install: ``python3 -m venv --without-pip DIR`` then ``pip --python DIR/bin/python
  install .``; ``--make-venv`` makes it first, from the package indexes pip is set up with),
  its largest packages, and node mode run by DIR's interpreter.

Usage: ``.venv/bin/python bench/node_footprint.py [--runs 5] [--seconds 60] [--venv DIR
[--make-venv]]``
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


def du_mb(path: Path) -> float:
    """Bytes on disk under ``path`` (``du -s``: blocks, as the image pays for them), in MB."""
    out = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0]) / 1e6


def install_size(venv: Path) -> float:
    """The venv's size, and its largest packages, printed against the 100 MB goal."""
    total = du_mb(venv)
    site = next(venv.glob("lib/python3*/site-packages"))
    sizes = sorted(((du_mb(p), p.name) for p in site.iterdir() if not p.name.endswith(
        (".dist-info", ".pth")) and p.name != "__pycache__"), reverse=True)
    print(f"node install {venv}: {total:.1f} MB (goal <= 100 MB: "
          f"{'met' if total <= 100 else 'NOT met'}); numpy "
          f"{'installed' if (site / 'numpy').exists() else 'not installed'}; pip "
          f"{'installed' if (site / 'pip').exists() else 'not installed'}; largest: "
          + ", ".join(f"{name} {size:.1f}" for size, name in sizes[:8]))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--venv", type=Path, help="a node install to measure and run node "
                        "mode with (default: this interpreter)")
    parser.add_argument("--make-venv", action="store_true",
                        help="make --venv first, as docs/deploy.md states a node install")
    parser.add_argument("--find-links", type=Path, help="with --make-venv: install from this "
                        "folder of wheels only (pip --no-index), e.g. .venv/docs-wheelhouse")
    parser.add_argument("--tree", type=Path, default=REPO, help="with --make-venv: the checkout "
                        "to install and run (default: this one; a `git archive` for a before)")
    args = parser.parse_args()
    python = sys.executable
    if args.venv is not None:
        if args.make_venv:
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(args.venv)],
                           check=True)
            index = ["--no-index", "--find-links", str(args.find_links)] if args.find_links else []
            subprocess.run([sys.executable, "-m", "pip", "--python",
                            str(args.venv / "bin" / "python"), "install", "-q", *index,
                            str(args.tree)], check=True)
        install_size(args.venv)
        python = str(args.venv / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(args.tree)}
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
            [python, "-c", LAUNCHER, str(args.tree / "tests" / "helpers" / "fake_pynvml.py"),
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
            numpy = "numpy" in Path(f"/proc/{proc.pid}/maps").read_text()
        finally:
            proc.terminate()
            proc.wait(10)
    rss_mb = memory["VmRSS"] * 2 ** 20 / 1e6
    print(f"node mode on {gpus} fake GPUs ({python}) after {args.seconds:.0f} s and {scrapes} "
          f"scrapes: VmRSS {memory['VmRSS']:.1f} MiB = {rss_mb:.1f} MB (goal <= 60 MB: "
          f"{'met' if rss_mb <= 60 else 'NOT met'}), VmHWM {memory['VmHWM']:.1f} MiB; numpy "
          f"{'loaded' if numpy else 'not loaded'}; load average {os.getloadavg()[0]:.1f}")
    return 0 if gpus == 8 else 1


if __name__ == "__main__":
    sys.exit(main())
