"""Product names as NVML and DCGM report them → catalogue model, architecture, NVLink bandwidth.

Kept apart from the catalogue module so that code which must run with only
``nvidia-ml-py`` installed (``bench/nvml_check.py``) can use the sources without
PyYAML: the catalogue is imported only when a resolver is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the GPU catalogue says about a product name."""

    model: str  # catalogue name, or the product name itself when unknown
    architecture: str
    nvlink_bandwidth_bytes_per_second: float | None


ModelResolver = Callable[[str], ModelInfo]


def unknown_model(name: str) -> ModelInfo:
    """No catalogue: report the product name as it is, guess nothing."""
    return ModelInfo(name or "unknown", "unknown", None)


def catalogue_resolver() -> ModelResolver:
    """Resolve product names through the GPU catalogue (``exporter/gpu_catalogue.yaml``)."""
    from exporter.gpu_catalogue import default_catalogue

    catalogue = default_catalogue()

    @lru_cache(maxsize=1024)
    def resolve(name: str) -> ModelInfo:
        if not name:
            return unknown_model(name)
        spec = catalogue.get(name)
        return ModelInfo(spec.name, spec.architecture, spec.nvlink_bandwidth_bytes_per_second)

    return resolve


def memory_model(total_bytes: float | None) -> str:
    """The catalogue model a GPU's framebuffer size names, "" when none or several do.

    For GPUs that report no product name: dcgm-exporter 2.x's series carry no
    ``modelName`` label, and the older A100s still run it (issue 30). See
    :meth:`exporter.gpu_catalogue.Catalogue.by_memory`.
    """
    if not total_bytes or total_bytes <= 0:
        return ""
    from exporter.gpu_catalogue import default_catalogue

    spec = default_catalogue().by_memory(total_bytes)
    return spec.name if spec is not None else ""
