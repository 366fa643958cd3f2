"""The GPU catalogue: specs per model, loaded from ``gpu_catalogue.yaml``.

Specs are data, never code branches: adding a model means adding a YAML entry.
A name the catalogue does not know (the Alibaba trace's ``G2``/``G3``) yields a
spec whose numbers are all ``None``: we report such GPUs but never guess their
memory, power or NVLink bandwidth.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

from exporter.yamlfile import parse_mapping

log = logging.getLogger(__name__)

GB = 1_000_000_000


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_bytes: int | None
    tdp_watts: float | None
    nvlink_generation: int | None
    nvlink_bandwidth_bytes_per_second: float | None
    architecture: str
    generation: float | None
    tier: int | None
    known: bool = True
    # The model a variant is sold as ("H100" for "H100-PCIe" and "H100-NVL"): what the tier
    # rule, which speaks in models rather than SKUs, compares. A model's own name otherwise.
    family: str = ""
    # training speed per GPU relative to the H100 SXM (1.0), from published MLPerf results;
    # None where the catalogue cites none (the simulator then runs the model at 1.0)
    throughput: float | None = None


@dataclass(frozen=True, slots=True)
class Catalogue:
    models: tuple[GpuSpec, ...]
    patterns: tuple[tuple[re.Pattern[str], str], ...]

    def find(self, name: str) -> GpuSpec | None:
        """The spec for a catalogue name or any product/trace name that matches one; None when unknown.

        Quiet: for callers that treat an unknown model as "no tier" rather than as news.
        """
        return _find(self, name)

    def get(self, name: str) -> GpuSpec:
        """Like :meth:`find`, but an unknown name gets a spec of Nones, logged once per name."""
        return _lookup(self, name)

    def resolve(self, name: str) -> str:
        """The catalogue name for ``name``, or ``name`` itself when unknown."""
        return self.get(name).name

    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def by_memory(self, total_bytes: float) -> GpuSpec | None:
        """The model a framebuffer of ``total_bytes`` names, for a GPU that reports no product
        name (dcgm-exporter 2.x has no ``modelName`` label); None unless one family fits.

        The marketed size is GiB for some parts and decimal GB for others, less what the
        driver keeps (an A100 40GB reports 40,536 MiB, 39.6 GiB; an L40S 48GB 46,068 MiB,
        48.3 GB), so a model fits when either reading is within 5%. Sizes that several
        families share (80 GB: A100-80GB and H100; 141-144 GB: H200 and GH200; 24 GB: L4
        and A10) name none: a wrong model would be worse than "unknown". Of one family,
        the family's own entry (A100 40GB SXM and PCIe are both "A100").
        """

        def near(value: float, marketed: float) -> bool:
            return abs(value / marketed - 1) <= 0.05

        fits = [m for m in self.models if m.memory_bytes and (
            near(total_bytes / 2**30, m.memory_bytes / GB) or near(total_bytes, m.memory_bytes))]
        families = {m.family for m in fits}
        if len(families) != 1:
            return None
        return self.find(families.pop())


def speed(spec: GpuSpec) -> float:
    """What a job's work runs at on ``spec``: its throughput, the reference 1.0 when not cited."""
    return spec.throughput if spec.throughput is not None else 1.0


def unknown_spec(name: str) -> GpuSpec:
    return GpuSpec(name, None, None, None, None, "unknown", None, None, known=False, family=name)


_warned: set[str] = set()


@lru_cache(maxsize=4096)
def _find(catalogue: Catalogue, name: str) -> GpuSpec | None:
    by_name = {m.name: m for m in catalogue.models}
    if name in by_name:
        return by_name[name]
    for pattern, model in catalogue.patterns:
        if pattern.search(name):
            return by_name[model]
    return None


@lru_cache(maxsize=4096)
def _lookup(catalogue: Catalogue, name: str) -> GpuSpec:
    found = _find(catalogue, name)
    if found is not None:
        return found
    if name not in _warned:
        _warned.add(name)
        log.warning("GPU model %r is not in the catalogue; reported as unknown, specs not guessed", name)
    return unknown_spec(name)


def parse_catalogue(text: str) -> Catalogue:
    raw = parse_mapping(text, "gpu_catalogue.yaml")
    models = []
    patterns = []
    for entry in raw["models"]:
        gb = entry.get("memory_gb")
        bw = entry.get("nvlink_bandwidth_gbps")
        models.append(
            GpuSpec(
                name=entry["name"],
                memory_bytes=int(gb * GB) if gb is not None else None,
                tdp_watts=float(entry["tdp_watts"]) if entry.get("tdp_watts") else None,
                nvlink_generation=entry.get("nvlink_generation"),
                nvlink_bandwidth_bytes_per_second=float(bw) * GB if bw else None,
                architecture=entry["architecture"],
                generation=entry.get("generation"),
                tier=entry.get("tier"),
                family=entry.get("family", entry["name"]),
                throughput=float(entry["throughput"]) if entry.get("throughput") else None,
            )
        )
        for expr in entry.get("match", []):
            patterns.append((re.compile(expr, re.IGNORECASE), entry["name"]))
    return Catalogue(tuple(models), tuple(patterns))


@cache
def default_catalogue() -> Catalogue:
    text = resources.files("exporter").joinpath("gpu_catalogue.yaml").read_text()
    return parse_catalogue(text)
