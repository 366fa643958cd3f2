"""Options of the ``prometheus`` source (``sources.prometheus``), apart from :mod:`.prometheus`
so that reading the config does not import aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter import metrics as catalogue
from exporter.options import Duration, opt


@dataclass(frozen=True)
class PrometheusSource:
    enabled: bool = opt(False, help="Read the whole fleet from a Prometheus server.")
    url: str = opt("http://127.0.0.1:9090", help="Base URL of Prometheus (or Thanos/Mimir).",
                   url=True)
    metrics: str = opt(
        "gpufleet", help="Whose metrics to read: per-node gpufleet exporters or dcgm-exporter.",
        choices=("gpufleet", "dcgm"),
    )
    selector: str = opt(
        "", help='Label matchers added to every query, e.g. job="gpufleet-nodes".'
    )
    allocation_selector: str = opt(
        "", help="Label matchers naming the scheduler's exporter (cluster-mode gpufleet reading "
        "Slurm or Kubernetes), e.g. job=\"gpufleet-cluster\", or instance=\"host:9874\" where "
        "its scrape honours labels: its allocations count on any node (one more query). "
        "Other allocations count only from the target serving their node's identity.",
    )
    query_timeout: Duration = opt(
        Duration(5), help="Longest one query may take (sent to Prometheus too).", exclusive_min=0
    )
    max_sample_age: Duration = opt(
        Duration(120), help="A GPU whose newest sample is older is marked stale.",
        exclusive_min=0,
    )
    lost_after: Duration = opt(
        Duration(600), help="A node not scraped for this long is dropped; until then, stale.",
        exclusive_min=0,
    )
    gpu_telemetry: bool = opt(
        False, help="Read back every per-GPU value family (temperature, power limit, energy, "
        "NVLink) each read, to re-export with exposition.per_gpu: true. Off: only what "
        "analysis, health and the advisor use (up, stale, utilisation, memory, power); the "
        "TSDB already holds the rest.",
    )
    node_summaries: bool = opt(
        True, help=f"Read the nodes' {catalogue.NODE_GPUS.name} (GPUs by state, one series a node, "
        f"which node mode serves) instead of each GPU's {catalogue.GPU_UP.name} and "
        f"{catalogue.GPU_STALE.name}; each GPU's are read as well when a summary is missing or old "
        "or a node has a GPU not up: the same snapshot from fewer series. Where memory total is "
        f"read for every GPU (the first read), the nodes' {catalogue.NODE_GPU_MEMORY_TOTAL_BYTES.name} "
        f"stands in for each GPU's {catalogue.GPU_MEMORY_TOTAL_BYTES.name} in the same way. A "
        "summary counts only from the scrape target (job, instance) that serves the node's "
        "identity; another's is ignored and counted as a parse error.",
    )
    identity_refresh: Duration = opt(
        Duration(300), help=f"GPU identity ({catalogue.GPU_INFO.name}) is read again after this long, "
        f"and at once whenever the GPUs answering {catalogue.GPU_UP.name} are not the ones it lists.",
        exclusive_min=0,
    )
    gzip: bool = opt(
        False, help="Ask for gzipped answers: less network, more CPU; worth it across a WAN."
    )
    max_in_flight: int = opt(
        4, help="Queries sent at once; more costs Prometheus CPU, fewer leaves it idle.", min=1
    )
    # Caps, checked before an answer is decoded (issue 32): past one, the read fails, the
    # source is down with the reason and the last good view is served stale. Sized for
    # the 108,800-GPU fleet docs/performance.md claims: its largest answer (identity) is
    # ~32 MB and 108,800 series, a read ~1.9 M series in all with gpu_telemetry (18 queries of
    # about one series per GPU; 7 without it, identity only now and then). docs/reliability.md
    # has the figures.
    max_answer_bytes: int = opt(
        64 * 2 ** 20, help="Largest answer to one query, in bytes (after gzip); larger fails "
        "the read.", min=1,
    )
    max_series: int = opt(
        2_000_000, help="Most series the answers of one read may hold together; more fails "
        "the read.", min=1,
    )
    max_gpus: int = opt(
        150_000, help="Most GPUs (identity series) the fleet may list; more fails the read.",
        min=1,
    )
    bearer_token_file: str = opt("", help="File holding a bearer token (re-read every read).")
    bearer_token_env: str = opt("", help="Environment variable holding a bearer token.")
    basic_auth_username: str = opt("", help="Basic-auth user name.")
    basic_auth_password_file: str = opt("", help="File holding the basic-auth password.")
    basic_auth_password_env: str = opt(
        "", help="Environment variable holding the basic-auth password."
    )
