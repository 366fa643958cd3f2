"""Render a snapshot to Prometheus text exposition, once per snapshot.

Names, types, HELP texts and the field each per-GPU family reads come from the catalogue
(:mod:`exporter.metrics`); this package supplies only values, split by concern:

- :mod:`~exporter.exposition.families`: the family table, derived from the catalogue, and the
  samples of the families joined from several parts of the snapshot or over the whole fleet;
- :mod:`~exporter.exposition.lines`: the text of label sets, headers and series lines;
- :mod:`~exporter.exposition.go_float`: Go's text of a float, one value or a block in C;
- :mod:`~exporter.exposition.blocks`: the body as gzip blocks kept from one render to the next,
  with one named strategy per kind of family saying which inputs its blocks compare;
- :mod:`~exporter.exposition.options`: which families this process serves.

One copy of each series (issue 15): node mode and cluster mode run side by side under
one Prometheus, and a family is served only by its producer. ``exposition.per_gpu``
(``auto``: off when the ``prometheus`` source is enabled) turns off every family read
from the GPUs and nodes (``node`` in the catalogue: the per-GPU telemetry, ``gpu_info``,
MIG, ``node_info``, ``node_cpu_cores``); the scheduler's joins stay where the scheduler
is read; the fleet-level families (fragmentation, pools, advisor, source health, build
info) are always served. :class:`ExpositionOptions` says it in code. The config's
``cluster`` label is merged into every series by the label-text functions.

Our renderer writes exactly the bytes ``prometheus_client.generate_latest``
writes for the same families (sorted labels, Go float formatting); a test
proves it. It exists because ``generate_latest`` costs about a second per
100k series, and we render once per snapshot rather than once per scrape.
"""

from exporter.exposition.blocks import LabelCache, Rendered, gunzip, gzip_member, render, render_text
from exporter.exposition.families import (
    GPU_FAMILIES,
    GPU_JOINED_FAMILIES,
    GPU_SNAPSHOT_FAMILIES,
    GpuFamily,
    GpuLabelledFamily,
    JoinedFamily,
    allocation_families,
    fleet_families,
    gpu_family,
    gpu_snapshot_samples,
    snapshot_families,
)
from exporter.exposition.go_float import go_float, go_texts
from exporter.exposition.lines import identity, label_text, render_families
from exporter.exposition.options import ExpositionOptions
from exporter.metrics import Family

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

__all__ = [
    "CONTENT_TYPE", "GPU_FAMILIES", "GPU_JOINED_FAMILIES", "GPU_SNAPSHOT_FAMILIES", "ExpositionOptions",
    "Family", "GpuFamily", "GpuLabelledFamily", "JoinedFamily", "LabelCache", "Rendered",
    "allocation_families", "fleet_families", "go_float", "go_texts", "gpu_family",
    "gpu_snapshot_samples", "gunzip", "gzip_member", "identity", "label_text", "render",
    "render_families", "render_text", "snapshot_families",
]
