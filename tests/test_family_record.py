"""A family is one record: add one catalogue entry and one snapshot field, and it is everywhere.

The throwaway family is docs/sources.md's worked example ("Adding a family"):
its snapshot field and catalogue entry are inserted into ``exporter/snapshot.py``
and ``exporter/metrics.py`` as loaded by a fresh interpreter
(:mod:`tests.helpers.family_example`), and nothing else is touched. The real
derivation code then finds it on /metrics, in docs/metrics.md as generated, in
the prometheus source's reverse map and in the bounds of ``POST /v1/plan``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from exporter import metrics
from exporter.advisor import bounds
from exporter.sources.prometheus.source import GPU_VALUES
from tests.helpers import REPO
from tests.helpers.family_example import FAMILY, FIELD, prelude
from tests.helpers.metrics_doc import DOC

RUN = r"""
import json
from exporter.advisor import bounds
from exporter.exposition import render_text
from exporter.snapshot import FleetSnapshot, Gpu
from exporter.sources.prometheus.source import GPU_VALUES, _Result, build_snapshot
from tests.helpers.metrics_doc import DOC, generate

gpu = Gpu("n1", 0, "GPU-0", "H100", "p", memory_reserved_bytes=536870912)
out = {"metrics": render_text(FleetSnapshot(1_760_000_000.0, gpus=(gpu,))).decode(),
       "doc": generate(DOC.read_text()),
       "reverse": {name: [field, kind.__name__] for name, (field, kind) in GPU_VALUES.items()}}

# the prometheus source reads the family back into the field
identity = [{"metric": {"node": "n1", "gpu": "0", "uuid": "GPU-0", "model": "H100", "pool": "p"},
             "value": [0, "1"]}]
reserved = [{"metric": {"node": "n1", "gpu": "0"}, "value": [0, "536870912"]}]
results = {name: _Result(name, series) for name, series in
           [("identity", identity), ("nodes", []), ("allocations", []), (FAMILY, reserved)]}
snapshot, _, _ = build_snapshot(1_760_000_000.0, results)
out["read_back"] = getattr(snapshot.gpus[0], FIELD)

body = {"taken_at": 1, "gpus": [{"node": "n1", "index": 0, "uuid": "u", "model": "m", "pool": "p"}]}
body["gpus"][0][FIELD] = 536870912
bounds.check_snapshot(body)  # accepted
body["gpus"][0][FIELD] = -1
try:
    bounds.check_snapshot(body)
except bounds.Invalid as exc:
    out["refused"] = str(exc)
out["schema"] = bounds.snapshot_schema()["properties"]["gpus"]["items"]["properties"].get(FIELD)
print(json.dumps(out))
"""


def run_with_the_family() -> dict:
    script = prelude() + RUN.replace("FAMILY", repr(FAMILY)).replace("FIELD", repr(FIELD))
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_family_added_with_one_entry_and_one_field_is_everywhere():
    # not there today, so each finding below is the entry's doing
    assert FAMILY not in metrics.CATALOGUE and FAMILY not in GPU_VALUES
    assert FAMILY not in DOC.read_text()
    assert FIELD not in bounds.SNAPSHOT_FIELDS[bounds.Gpu]

    out = run_with_the_family()

    # /metrics: HELP, TYPE and the GPU's series, among the per-GPU families
    text = out["metrics"]
    assert (f"# HELP {FAMILY} GPU framebuffer memory the driver reserves, in bytes.\n"
            f"# TYPE {FAMILY} gauge\n"
            f'{FAMILY}{{gpu="0",model="H100",node="n1",pool="p",uuid="GPU-0"}} 5.36870912e+08\n') in text
    assert text.index(FAMILY) < text.index("gpufleet_gpu_clock_hertz") < text.index("gpufleet_gpu_info")

    # docs/metrics.md as generated: its row in the per-GPU table
    row = f"| `{FAMILY}` | gauge | identity | GPU framebuffer memory the driver reserves, in bytes. |"
    assert row in out["doc"]
    gpu_table = out["doc"].split("<!-- families: gpu ", 1)[1].split("<!-- end families -->", 1)[0]
    assert row in gpu_table

    # the prometheus source's reverse map, and a read back into the field
    assert out["reverse"][FAMILY] == [FIELD, "int"]
    assert out["read_back"] == 536870912

    # the bounds of POST /v1/plan, and the schema the OpenAPI document shows
    assert out["refused"] == f"gpus[0].{FIELD}: must be an integer from 0 to {2 ** 60}, got -1"
    assert out["schema"] == {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 2 ** 60},
                                       {"type": "null"}]}
