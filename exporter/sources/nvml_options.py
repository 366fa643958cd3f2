"""Options of the ``nvml`` source (``sources.nvml``), apart from :mod:`.nvml` so that reading
the config does not import its worker threads and asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.options import Duration, opt


@dataclass(frozen=True)
class NvmlSource:
    enabled: bool = opt(False, help="Read this machine's GPUs through NVML (libnvidia-ml).")
    call_timeout: Duration = opt(
        Duration(2), help="Longest one GPU's NVML reads may take; past it the GPU's last good "
        "sample is served, marked stale.", exclusive_min=0,
    )
    node: str = opt("", help="Node name of this machine; empty: the host name.")
    pool: str = opt("", help="Pool (Slurm partition or node pool) of this machine's GPUs.")
    export_serial: bool = opt(
        False, help="Export each GPU's board serial number as the `serial` label of "
        "gpufleet_gpu_info. Off by default: some sites treat serials as asset data.",
    )
