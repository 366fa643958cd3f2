"""Options of the ``dcgm`` source (``sources.dcgm``), apart from :mod:`.dcgm` so that reading
the config does not import aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.options import Duration, opt


@dataclass(frozen=True)
class DcgmSource:
    enabled: bool = opt(False, help="Scrape dcgm-exporter endpoints across the cluster.")
    targets: tuple[str, ...] = opt(
        (), help="dcgm-exporter endpoints, host:port or http://host:port/metrics.",
        url="host:port",
    )
    targets_file: str = opt(
        "", help="Prometheus file_sd-style JSON or YAML file of targets (labels.pool sets the "
        "pool), re-read when it changes.",
    )
    timeout: Duration = opt(
        Duration(3), help="Per-target scrape timeout; keep it below source_timeout.",
        exclusive_min=0,
    )
    pool: str = opt("", help="Pool of targets that name none.")
    max_concurrency: int = opt(64, help="Targets scraped at once.", min=1)
    stale_for: Duration = opt(
        Duration(300), help="How long a down target's last reading is served, marked stale.",
        min=0,
    )
