"""Run the real exporter, with its NVML source on the fake pynvml, as a subprocess.

``python -m tests.helpers.fake_nvml_exporter serve ...`` takes ``gpufleet serve``'s
arguments. Before the exporter starts, it puts a :class:`FakeNvml` where ``import
pynvml`` finds it (``sys.modules``), which is how the NVML source loads the library
(``exporter.sources.nvml.source.load_pynvml``): no exporter code is patched, and everything
from the source's worker threads to ``/metrics`` runs as in production.

The fake is described by :data:`ENV`, a JSON object:

- ``gpus``: a list of :class:`FakeGpu` keyword arguments (``uuid`` required; ``mig``, a
  list of :class:`FakeMig` keyword arguments);
- ``xids``: ``[gpu, xid, after_seconds]`` triples. Each XID is injected through the
  fake's event set (:meth:`FakeNvml.inject_xid`) ``after_seconds`` after the source
  registered that GPU for XID events, as the driver would report it; a line on
  stderr (the exporter's log file) says when.

Test-only: it imports the fake, so it is never part of the installed package.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from tests.helpers.fake_pynvml import FakeGpu, FakeMig, FakeNvml

ENV = "GPUFLEET_FAKE_NVML"
REGISTER_TIMEOUT = 60.0  # seconds the injector waits for the source to register a GPU
MAX_GPUS = 64  # a test describes a few GPUs; bound what a bad variable can make us build


def parse_spec(text: str) -> tuple[list[FakeGpu], list[tuple[int, int, float]]]:
    """The fake's GPUs and XID schedule from :data:`ENV`'s JSON; ValueError names the key."""
    spec = json.loads(text)
    if not isinstance(spec, dict) or set(spec) - {"gpus", "xids"}:
        raise ValueError(f"{ENV}: must be an object with gpus and xids")
    raw_gpus = spec.get("gpus")
    if not isinstance(raw_gpus, list) or not 1 <= len(raw_gpus) <= MAX_GPUS:
        raise ValueError(f"{ENV}.gpus: must be a list of 1 to {MAX_GPUS} GPUs")
    gpus = [FakeGpu(**{**g, "mig": [FakeMig(**m) for m in g["mig"]]})
            if isinstance(g, dict) and isinstance(g.get("mig"), list)
            else FakeGpu(**g) for g in raw_gpus]
    xids = []
    for index, item in enumerate(spec.get("xids", [])):
        if not (isinstance(item, list) and len(item) == 3
                and all(not isinstance(v, bool) for v in item)  # JSON true is no number
                and isinstance(item[0], int) and 0 <= item[0] < len(gpus)
                and isinstance(item[1], int) and isinstance(item[2], int | float)
                and 0 <= item[2] <= REGISTER_TIMEOUT):
            raise ValueError(f"{ENV}.xids[{index}]: must be [gpu index, xid, after seconds]")
        xids.append((item[0], item[1], float(item[2])))
    return gpus, xids


def _registered(nvml: FakeNvml, gpu: int) -> bool:
    return any(not s.freed and s.registered.get(gpu) for s in nvml.event_sets)


def _inject_later(nvml: FakeNvml, gpu: int, xid: int, after: float) -> None:
    """Inject once the source listens on ``gpu``: an event nobody listens to is lost."""
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while not _registered(nvml, gpu):
        if time.monotonic() > deadline:
            print(f"fake pynvml: GPU {gpu} never registered for XID events", file=sys.stderr)
            return
        time.sleep(0.05)
    time.sleep(after)
    delivered = nvml.inject_xid(gpu, xid)
    print(f"fake pynvml: injected XID {xid} on GPU {gpu} ({delivered} event set(s))",
          file=sys.stderr, flush=True)


def install(spec_text: str) -> FakeNvml:
    """Make ``import pynvml`` return the fake, and start its XID injectors."""
    gpus, xids = parse_spec(spec_text)
    nvml = FakeNvml(gpus)
    module: Any = nvml  # the fake stands in for the module; import hands back what is here
    sys.modules["pynvml"] = module
    for gpu, xid, after in xids:
        threading.Thread(target=_inject_later, args=(nvml, gpu, xid, after),
                         name=f"fake-xid-{gpu}-{xid}", daemon=True).start()
    return nvml


def main(argv: list[str]) -> int:
    text = os.environ.get(ENV)
    if not text:
        print(f"{ENV} is not set: it describes the fake GPUs", file=sys.stderr)
        return 2
    try:
        install(text)
    except (ValueError, TypeError) as exc:  # TypeError: an unknown FakeGpu field
        print(f"{ENV}: {exc}", file=sys.stderr)
        return 2
    from exporter.cli import main as exporter_main  # after the fake is in place

    return exporter_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
