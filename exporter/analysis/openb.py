"""The Alibaba openb trace (cluster-trace-gpu-v2023): node and pod CSVs.

Units as the trace's README gives them: CPU in millicores, GPU share in
thousandths of a GPU (``gpu_milli``, only below 1000 for single-GPU shared
tasks), ``gpu_spec`` a ``|``-separated list of allowed GPU models, empty for
any. Trace model names go through the GPU catalogue (``V100M32``, ``T4``,
``P100``, ``A10``); the undisclosed ``G1``/``G2``/``G3`` are kept under their
own names as unknown models, with a warning the first time each appears.

Files may be gzipped (``.csv.gz``). A trace can also be named instead of
given as paths: ``openb-default`` is package data, so it works from a plain
``pip install``; ``openb-<variant>`` reads ``openb_pod_list_<variant>.csv``
(or ``.csv.gz``) from ``$GPUFLEET_DATA/alibaba-gpu-v2023/csv`` or from the
``data/`` of a checkout it runs in.
"""

from __future__ import annotations

import csv
import gzip
import io
import logging
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from exporter.analysis.state import FleetState, build
from exporter.analysis.workload import Shape
from exporter.bounded_file import Wording, read_bounded
from exporter.gpu_catalogue import Catalogue, default_catalogue

log = logging.getLogger(__name__)

NODE_COLUMNS = ("sn", "cpu_milli", "gpu", "model")
# gpu_spec is optional: the multigpu pod lists of the trace have no such column (no constraints)
POD_COLUMNS = ("name", "cpu_milli", "num_gpu", "gpu_milli")
NO_GPU_POOL = "cpu"  # pool of the trace's CPU-only nodes

DEFAULT_TRACE = "openb-default"
NODE_LIST = "openb_node_list_gpu_node"  # the trace's GPU nodes: the cluster every variant runs on
# the default trace, shipped inside the package; other variants are looked up in the data folders
PACKAGE_TRACES = Path(__file__).resolve().parent.parent / "traces"
# a checkout's data/, when run from the checkout (an installed package has no data/ beside it)
CHECKOUT_TRACES = Path("data") / "alibaba-gpu-v2023" / "csv"


# a trace CSV, gunzipped: the openb lists are 1-2 MB, a million pods some 100 MB
MAX_TRACE_BYTES = 256 * 2**20


class OpenbError(Exception):
    """A trace file is missing or malformed; the message names the file, line and column."""


# pipes are read too (``--pods <(zcat ...)``): up to the limit, and a FIFO with no writer
# as empty (exporter/bounded_file.py)
_TRACE_FILE = Wording(OpenbError, over_limit="{path}: {size} bytes, over the {limit}-byte "
                      "limit of a trace", grew_over_limit="{path}: over the {limit}-byte limit "
                      "of a trace")

@dataclass(frozen=True, slots=True)
class OpenbNode:
    name: str
    cpus: float  # cores
    memory_mib: int
    gpus: int
    model: str  # catalogue name, or the trace's own name when unknown; "" without GPUs


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpus: float  # cores
    memory_mib: int
    gpus: int
    gpu_share: float  # per GPU, 1.0 whole
    models: tuple[str, ...]  # allowed models, empty for any
    qos: str = ""
    phase: str = ""
    creation_time: float | None = None
    deletion_time: float | None = None
    scheduled_time: float | None = None

    @property
    def shape(self) -> Shape:
        return Shape(self.cpus, self.gpu_share if self.gpus else 0.0, self.gpus, self.models)


class ModelMapper:
    """Trace model name -> catalogue name, logged once per name per mapper."""

    def __init__(self, catalogue: Catalogue | None = None) -> None:
        self.catalogue = catalogue or default_catalogue()
        self._seen: dict[str, str] = {}

    def __call__(self, trace_name: str) -> str:
        mapped = self._seen.get(trace_name)
        if mapped is None:
            # find(), not get(): get() would warn a second time about an unknown name
            spec = self.catalogue.find(trace_name)
            if spec is not None:
                mapped = spec.name
                log.info("trace GPU model %r is catalogue model %r", trace_name, mapped)
            else:
                mapped = trace_name
                log.warning("trace GPU model %r is not in the GPU catalogue; kept as an unknown "
                            "model (no tier, no specs)", trace_name)
            self._seen[trace_name] = mapped
        return mapped


@dataclass(frozen=True, slots=True)
class TraceFiles:
    """A named trace resolved to its node list and pod list."""

    name: str
    nodes: Path
    pods: Path


def trace_folders() -> list[Path]:
    """Where named traces are looked up, first match wins: $GPUFLEET_DATA, a checkout, the package."""
    folders = []
    env = os.environ.get("GPUFLEET_DATA")
    if env:
        folders.append(Path(env) / "alibaba-gpu-v2023" / "csv")
    return [*folders, CHECKOUT_TRACES, PACKAGE_TRACES]


def find_csv(folder: Path, stem: str) -> Path | None:
    """``folder/stem.csv``, else ``folder/stem.csv.gz``, else None."""
    for candidate in (folder / f"{stem}.csv", folder / f"{stem}.csv.gz"):
        if candidate.is_file():
            return candidate
    return None


def named_trace(name: str) -> TraceFiles:
    """``openb-<variant>`` -> the GPU node list and ``openb_pod_list_<variant>``.

    >>> named_trace("openb-default").pods.name
    'openb_pod_list_default.csv.gz'
    """
    prefix = "openb-"
    variant = name[len(prefix):] if name.startswith(prefix) else ""
    if not variant or not variant.replace("_", "").isalnum():
        raise OpenbError(f"unknown trace {name!r}: name one as openb-<variant>, e.g. {DEFAULT_TRACE}")
    stem = f"openb_pod_list_{variant}"
    for folder in trace_folders():
        pods, nodes = find_csv(folder, stem), find_csv(folder, NODE_LIST)
        if pods is not None and nodes is not None:
            return TraceFiles(name, nodes, pods)
    searched = ", ".join(str(f) for f in trace_folders())
    raise OpenbError(f"trace {name!r}: no {stem}.csv[.gz] with {NODE_LIST}.csv[.gz] in {searched} "
                     "(set GPUFLEET_DATA to a folder holding alibaba-gpu-v2023/csv/)")


def open_text(path: Path) -> TextIO:
    """A CSV file for reading as text, gunzipped when its name ends in ``.gz``; read by the
    bounded reader, and gunzipped to at most as many bytes (``/dev/zero``, a FIFO or a gzip
    bomb named by mistake is one line, not a hang or a MemoryError)."""
    data = read_bounded(path, MAX_TRACE_BYTES, _TRACE_FILE)
    if path.suffix == ".gz":
        try:
            data = gzip.GzipFile(fileobj=io.BytesIO(data)).read(MAX_TRACE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise OpenbError(f"{path}: cannot read: {exc}") from None
        if len(data) > MAX_TRACE_BYTES:
            raise OpenbError(f"{path}: over {MAX_TRACE_BYTES} bytes once gunzipped")
    try:
        return io.StringIO(data.decode("utf-8"), newline="")
    except UnicodeDecodeError as exc:
        raise OpenbError(f"{path}: cannot read: not UTF-8 at byte {exc.start}") from None


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = open_text(path)
    except OSError as exc:
        raise OpenbError(f"{path}: cannot read: {exc.strerror}") from None
    # a truncated or corrupt .gz, or bytes that are not UTF-8, surface while reading, not at open
    with handle:
        try:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise OpenbError(f"{path}: missing column(s) {', '.join(missing)} "
                                 f"(an openb CSV has {', '.join(required)})")
            yield from enumerate(reader, start=2)
        except (OSError, EOFError, UnicodeDecodeError, csv.Error) as exc:
            raise OpenbError(f"{path}: cannot read: {exc}") from None


def _number(path: Path, line: int, row: dict, column: str, default: float | None = None) -> float:
    text = (row.get(column) or "").strip()
    if not text and default is not None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise OpenbError(f"{path}:{line}: {column}: not a number: {text!r}") from None
    if value < 0 or value != value:
        raise OpenbError(f"{path}:{line}: {column}: must be >= 0, got {text!r}")
    return value


def load_nodes(path: str | Path, mapper: ModelMapper | None = None) -> list[OpenbNode]:
    path = Path(path)
    mapper = mapper or ModelMapper()
    nodes = []
    for line, row in _rows(path, NODE_COLUMNS):
        gpus = _number(path, line, row, "gpu")
        if gpus != int(gpus):
            raise OpenbError(f"{path}:{line}: gpu: must be a whole number, got {row['gpu']!r}")
        model = (row.get("model") or "").strip()
        if model.lower() == "nan":
            model = ""
        if gpus and not model:
            raise OpenbError(f"{path}:{line}: model: a node with GPUs needs a model")
        nodes.append(OpenbNode(
            name=(row.get("sn") or "").strip() or f"line-{line}",
            cpus=_number(path, line, row, "cpu_milli") / 1000.0,
            memory_mib=int(_number(path, line, row, "memory_mib", 0)),
            gpus=int(gpus),
            model=mapper(model) if gpus else "",
        ))
    return nodes


def load_pods(path: str | Path, mapper: ModelMapper | None = None) -> list[OpenbPod]:
    path = Path(path)
    mapper = mapper or ModelMapper()
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        gpus = _number(path, line, row, "num_gpu")
        if gpus != int(gpus):
            raise OpenbError(f"{path}:{line}: num_gpu: must be a whole number, got {row['num_gpu']!r}")
        milli = _number(path, line, row, "gpu_milli", 0)
        if milli > 1000:
            raise OpenbError(f"{path}:{line}: gpu_milli: at most 1000 per GPU, got {row['gpu_milli']!r}")
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(sorted({mapper(m.strip()) for m in spec.split("|") if m.strip()}))

        def time_of(column: str, line: int = line, row: dict = row) -> float | None:
            return _number(path, line, row, column) if (row.get(column) or "").strip() else None

        pods.append(OpenbPod(
            name=(row.get("name") or "").strip() or f"line-{line}",
            cpus=_number(path, line, row, "cpu_milli") / 1000.0,
            memory_mib=int(_number(path, line, row, "memory_mib", 0)),
            gpus=int(gpus),
            gpu_share=milli / 1000.0,
            models=models,
            qos=(row.get("qos") or "").strip(),
            phase=(row.get("pod_phase") or "").strip(),
            creation_time=time_of("creation_time"),
            deletion_time=time_of("deletion_time"),
            scheduled_time=time_of("scheduled_time"),
        ))
    return pods


def empty_state(nodes: list[OpenbNode]) -> FleetState:
    """The trace cluster with nothing placed. Pools are GPU models (the trace has no partitions)."""
    return build(
        names=[n.name for n in nodes],
        models=[n.model for n in nodes],
        pools=[n.model or NO_GPU_POOL for n in nodes],
        cpu_total=[n.cpus for n in nodes],
        cpu_free=[n.cpus for n in nodes],
        gpu_free=[[1.0] * n.gpus for n in nodes],
    )
