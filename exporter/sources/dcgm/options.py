"""Options of the ``dcgm`` source (``sources.dcgm``), apart from :mod:`.dcgm` so that reading
the config does not import aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.errors import ConfigError
from exporter.node_names import node_name_problem, shown
from exporter.options import Duration, opt


@dataclass(frozen=True)
class TargetGroup:
    """Inline targets with their pool, as a targets file's ``{targets, labels: {pool}}`` group
    (issue 30): an L4 node and an A100 node listed inline need not share one pool."""

    targets: tuple[str, ...] = opt(
        (), help="dcgm-exporter endpoints of the group, host:port or http://host:port/metrics.",
        url="host:port",
    )
    pool: str = opt("", help="Pool of the group's GPUs; empty: sources.dcgm.pool.")
    node: str = opt("", help="The node the group's targets serve: their samples must name it "
                    "(Hostname) and are refused otherwise; empty: the host of each target's URL "
                    "when it is a host name (an address is checked only against the other "
                    "targets).")

    def check(self, prefix: str) -> None:
        problem = node_name_problem(self.node) if self.node else ""
        if problem:
            raise ConfigError(f"{prefix}.node: {shown(self.node)} {problem}")


@dataclass(frozen=True)
class DcgmSource:
    enabled: bool = opt(False, help="Scrape dcgm-exporter endpoints across the cluster.")
    targets: tuple[str, ...] = opt(
        (), help="dcgm-exporter endpoints, host:port or http://host:port/metrics.",
        url="host:port",
    )
    target_groups: tuple[TargetGroup, ...] = opt(
        (), help="Inline targets per pool: a list of {targets: [host:port, ...], pool: name}.",
    )
    targets_file: str = opt(
        "", help="Prometheus file_sd-style JSON or YAML file of targets (labels.pool sets the "
        "pool), re-read when it changes.",
    )
    timeout: Duration = opt(
        Duration(3), help="Deadline of every target's fetch and parse, from the start of the "
        "read (a target still waiting for a max_concurrency slot counts too), so a read ends "
        "within it; must be below source_timeout (checked at start).",
        exclusive_min=0,
    )
    pool: str = opt("", help="Pool of targets that name none (targets, and target_groups "
                    "or targets file groups without a pool).")
    max_concurrency: int = opt(64, help="Targets scraped at once.", min=1)
    stale_for: Duration = opt(
        Duration(300), help="How long a down target's last reading is served, marked stale.",
        min=0,
    )
    # Caps: a target beyond one is down with the reason, and its body is not read further.
    # A real 8-GPU body is 50-200 KB and a few thousand lines (8 GPUs x 7 MIG instances x
    # ~100 fields is 5,600), so the defaults leave 35-80 times that as headroom while
    # bounding the work: 200k lines parse in about 0.7 s, within the default 3 s deadline.
    max_body_bytes: int = opt(
        16 * 1024 * 1024, help="Largest body read from one target, in bytes (after gzip).",
        min=1024,
    )
    max_lines: int = opt(200_000, help="Most lines read from one target's body.", min=1)
    max_gpus: int = opt(
        64, help="Most GPUs one target may describe (MIG instances are not GPUs: at most 7 "
        "per GPU); the densest nodes hold 8-16 GPUs.", min=1,
    )
