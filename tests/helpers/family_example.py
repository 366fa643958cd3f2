"""The worked example of docs/sources.md, "Adding a family", applied to a fresh interpreter.

The section's three code blocks are a snapshot field, a catalogue entry and a
source's line. :data:`PRELUDE` is Python that, run first in a new interpreter,
loads ``exporter.metrics`` and ``exporter.snapshot`` from their files with the
first two blocks inserted where the document says (at the end of ``Gpu``'s
fields, with the per-GPU families), as if they were written there; whatever is
imported afterwards derives its tables from that catalogue, exactly as it does
from the real one. :func:`with_source_line` applies the third block to the
example source of "Adding a source".
"""

from __future__ import annotations

import re

from tests.helpers import REPO

DOC = REPO / "docs" / "sources.md"
FAMILY = "gpufleet_gpu_memory_reserved_bytes"
FIELD = "memory_reserved_bytes"

# where each block goes: after this line of Gpu, and before this line of the catalogue
GPU_LAST_FIELD = "    performance: GpuPerformance | None = None"
BEFORE_PERFORMANCE_FAMILIES = "# -- per GPU: performance"


def blocks() -> tuple[str, str, str]:
    """The field, the catalogue entry and the source's line, as docs/sources.md writes them."""
    section = DOC.read_text().split("## Adding a family", 1)[1].split("\n## ", 1)[0]
    field, entry, source_line = re.findall(r"```python\n(.*?)```", section, re.S)
    return field, entry, source_line


def patched_sources() -> tuple[str, str]:
    """exporter/metrics.py and exporter/snapshot.py with the example's field and entry in place."""
    field, entry, _ = blocks()
    metrics = (REPO / "exporter" / "metrics.py").read_text()
    snapshot = (REPO / "exporter" / "snapshot.py").read_text()
    gpu = snapshot.index("\nclass Gpu:")
    last = snapshot.index("\n", snapshot.index(GPU_LAST_FIELD, gpu)) + 1
    at = metrics.index(BEFORE_PERFORMANCE_FAMILIES)
    return metrics[:at] + entry + metrics[at:], snapshot[:last] + field + snapshot[last:]


PRELUDE = r"""
import importlib.util, sys
import exporter

def _load(name, text):
    path = f"{{exporter.__path__[0]}}/{{name}}.py"
    spec = importlib.util.spec_from_file_location(f"exporter.{{name}}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module.__name__] = module
    exec(compile(text, path, "exec"), module.__dict__)
    setattr(exporter, name, module)

_load("metrics", {metrics!r})  # first: the snapshot imports it
_load("snapshot", {snapshot!r})
"""


def prelude() -> str:
    """:data:`PRELUDE` with the patched sources pasted in, ready to run before anything else."""
    metrics, snapshot = patched_sources()
    return PRELUDE.format(metrics=metrics, snapshot=snapshot)


def with_source_line(module: str) -> str:
    """The example source of "Adding a source" with its ``gpus = ...`` line replaced by the
    family example's, which fills the new field."""
    *_, source_line = blocks()
    start = module.index("        gpus = tuple(Gpu(")
    end = module.index("\n", start) + 1
    return module[:start] + source_line + module[end:]
