"""The ``prometheus`` source: the whole fleet from a Prometheus server's HTTP API.

Large sites already scrape every GPU node into Prometheus (and Thanos or Mimir
scale that past one machine), so cluster mode reads the fleet from there rather
than fanning out to the nodes itself.

Cost is per metric family, never per node: a handful of instant queries, each a
``__name__`` regex over families that share their labels, read a 10k-GPU fleet
(``bench/prometheus_source.py`` measures it against one query per node). All
queries are evaluated at the same ``time``, so the snapshot is one instant.

What it reads (``metrics: gpufleet``): the families per-node gpufleet exporters
serve. Identity comes from ``last_over_time(gpufleet_gpu_info[lost_after])``, so
a GPU whose exporter stopped answering stays in the snapshot, marked stale with
no values, until ``lost_after`` passes. A GPU is also stale when its exporter
says so (``gpufleet_gpu_stale``) or its newest sample is older than
``max_sample_age`` (remote-write lag, a stalled federation).

Failures: a query for identity, nodes or allocations that fails fails the read
(the collector keeps the last good snapshot, stale). A failed query for values,
MIG or targets leaves those fields absent and counts in
``gpufleet_source_parse_errors_total``: partial data, never made-up data.

Labels: Prometheus renames an exporter's ``job`` and ``instance`` labels to
``exported_job``/``exported_instance`` unless the scrape sets ``honor_labels``;
both spellings are read.

Pending jobs are exported only as per-pool totals, so they cannot be rebuilt
job by job here; demand comes from the Slurm source.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from exporter.config import PrometheusSource as PrometheusConfig
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    MigInstance,
    Node,
    Placement,
    SourceStatus,
)
from exporter.sources import Clock, SourceStartupError

log = logging.getLogger(__name__)

# Per-GPU value families and the Gpu field each fills. Sources may not import the
# exposition table (data flows one way), so the names are listed here; the
# round-trip test through a real Prometheus keeps the two in step.
GPU_VALUES: dict[str, tuple[str, type]] = {
    "gpufleet_gpu_up": ("up", bool),
    "gpufleet_gpu_stale": ("stale", bool),
    "gpufleet_gpu_utilization_ratio": ("utilization_ratio", float),
    "gpufleet_gpu_memory_used_bytes": ("memory_used_bytes", int),
    "gpufleet_gpu_memory_total_bytes": ("memory_total_bytes", int),
    "gpufleet_gpu_temperature_celsius": ("temperature_celsius", float),
    "gpufleet_gpu_power_watts": ("power_watts", float),
    "gpufleet_gpu_power_limit_watts": ("power_limit_watts", float),
    "gpufleet_gpu_energy_joules_total": ("energy_joules", float),
    "gpufleet_gpu_nvlink_transmit_bytes_total": ("nvlink_transmit_bytes", float),
    "gpufleet_gpu_nvlink_receive_bytes_total": ("nvlink_receive_bytes", float),
    "gpufleet_gpu_nvlink_capacity_bytes_per_second": ("nvlink_capacity_bytes_per_second", float),
}
ALLOCATION_FAMILIES = (
    "gpufleet_gpu_allocation_info",
    "gpufleet_allocation_cpu_cores",
    "gpufleet_allocation_gpu_share_ratio",
)
MIG_FAMILIES = (
    "gpufleet_gpu_mig_instance_info",
    "gpufleet_gpu_mig_memory_total_bytes",
    "gpufleet_gpu_mig_memory_used_bytes",
)
NODE_FAMILIES = ("gpufleet_node_info", "gpufleet_node_cpu_cores")

# Value families split in three queries of similar size: Prometheus evaluates
# them in parallel while we decode the previous answer.
_VALUE_GROUPS = (
    tuple(GPU_VALUES)[:4],
    tuple(GPU_VALUES)[4:8],
    tuple(GPU_VALUES)[8:],
)

# Without these the snapshot would be wrong, not just thinner: fail the read.
REQUIRED = ("identity", "nodes", "allocations")


class PrometheusQueryError(Exception):
    """One query failed; the message names the query and why, never a credential."""


def _matchers(selector: str) -> str:
    return f", {selector}" if selector else ""


def build_queries(config: PrometheusConfig) -> dict[str, str]:
    """Query name -> PromQL, one per group of families sharing their labels."""
    sel = _matchers(config.selector)
    inner = config.selector
    window = f"{int(config.lost_after)}s"

    def names(families: Sequence[str]) -> str:
        return "|".join(families)

    queries = {
        "identity": f"last_over_time(gpufleet_gpu_info{{{inner}}}[{window}])",
        "freshness": f"timestamp(gpufleet_gpu_up{{{inner}}})",
        "nodes": f'{{__name__=~"{names(NODE_FAMILIES)}"{sel}}}',
        "allocations": f'{{__name__=~"{names(ALLOCATION_FAMILIES)}"{sel}}}',
        "mig": f'{{__name__=~"{names(MIG_FAMILIES)}"{sel}}}',
        "targets": (
            f"up and on (job, instance) last_over_time(gpufleet_build_info{{{inner}}}[{window}])"
        ),
    }
    for number, group in enumerate(_VALUE_GROUPS):
        queries[f"values{number}"] = f'{{__name__=~"{names(group)}"{sel}}}'
    return queries


def _label(labels: Mapping[str, str], name: str) -> str:
    """An exporter's own label, whether or not the scrape honoured it."""
    return labels.get(f"exported_{name}", labels.get(name, ""))


def _value(sample: Mapping[str, Any]) -> float | None:
    value = float(sample["value"][1])
    return None if value != value else value  # NaN is absence, never a value


@dataclass(frozen=True, slots=True)
class _Result:
    name: str
    series: list[dict[str, Any]] | None  # None: the query failed
    error: str = ""


def build_snapshot(
    taken_at: float, results: Mapping[str, _Result], max_sample_age: float, source: str
) -> tuple[FleetSnapshot, int]:
    """A snapshot from decoded query results; also the number of failed optional queries."""
    failed = [r for r in results.values() if r.series is None]
    for result in failed:
        if result.name in REQUIRED:
            raise PrometheusQueryError(result.error)

    def series(name: str) -> list[dict[str, Any]]:
        return results[name].series or [] if name in results else []

    # identity: every GPU seen within lost_after
    identity: dict[tuple[str, int], dict[str, Any]] = {}
    for sample in series("identity"):
        labels = sample["metric"]
        key = (labels.get("node", ""), int(labels.get("gpu", "0")))
        identity[key] = {
            "node": key[0], "index": key[1], "uuid": labels.get("uuid", ""),
            "model": labels.get("model", ""), "pool": labels.get("pool", ""),
        }
    # without the freshness answer, age is unknown: mark nothing stale for age alone
    ages_known = results.get("freshness") is not None and results["freshness"].series is not None
    fresh: dict[tuple[str, int], float] = {}
    for sample in series("freshness"):
        labels = sample["metric"]
        fresh[(labels.get("node", ""), int(labels.get("gpu", "0")))] = float(sample["value"][1])
    values: dict[tuple[str, int], dict[str, Any]] = {}
    for number in range(len(_VALUE_GROUPS)):
        for sample in series(f"values{number}"):
            labels = sample["metric"]
            key = (labels.get("node", ""), int(labels.get("gpu", "0")))
            target = GPU_VALUES.get(labels.get("__name__", ""))
            value = _value(sample)
            if target is None or value is None or key not in identity:
                continue
            attr, kind = target
            values.setdefault(key, {})[attr] = bool(value) if kind is bool else kind(value)

    mig: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for sample in series("mig"):
        labels = sample["metric"]
        key = (labels.get("node", ""), int(labels.get("gpu", "0")))
        instance = int(_label(labels, "instance"))
        entry = mig.setdefault(key, {}).setdefault(
            instance, {"profile": labels.get("profile", ""), "total": None, "used": None})
        name, value = labels.get("__name__", ""), _value(sample)
        if name == "gpufleet_gpu_mig_memory_total_bytes" and value is not None:
            entry["total"] = int(value)
        elif name == "gpufleet_gpu_mig_memory_used_bytes" and value is not None:
            entry["used"] = int(value)

    gpus = []
    for key in sorted(identity):
        fields = dict(identity[key])
        fields.update(values.get(key, {}))
        sampled_at = fresh.get(key)
        if ages_known and (sampled_at is None or taken_at - sampled_at > max_sample_age):
            # the exporter stopped answering (its series went stale) or its data lags
            fields["stale"] = True
        instances = mig.get(key, {})
        fields["mig"] = tuple(
            MigInstance(i, e["profile"], e["total"], e["used"]) for i, e in sorted(instances.items())
        )
        gpus.append(Gpu(**fields))

    nodes_info: dict[str, dict[str, str]] = {}
    cpu_cores: dict[str, float] = {}
    for sample in series("nodes"):
        labels = sample["metric"]
        if labels.get("__name__") == "gpufleet_node_info":
            nodes_info[labels.get("node", "")] = labels
        else:
            value = _value(sample)
            if value is not None:
                cpu_cores[labels.get("node", "")] = value
    nodes = tuple(
        Node(name, labels.get("model", ""), cpu_cores.get(name, 0.0), labels.get("pool", ""),
             labels.get("generation", ""), int(labels.get("gpus", "0")))
        for name, labels in sorted(nodes_info.items())
    )

    allocations = _allocations(series("allocations"))
    statuses = tuple(
        SourceStatus(source, up=_value(s) == 1.0, duration_seconds=0.0, last_success_time=None,
                     target=s["metric"].get("instance", ""))
        for s in sorted(series("targets"), key=lambda s: s["metric"].get("instance", ""))
    )
    snapshot = FleetSnapshot(taken_at, nodes, tuple(gpus), allocations, (), statuses)
    return snapshot, len(failed)


def _allocations(samples: Sequence[Mapping[str, Any]]) -> tuple[Allocation, ...]:
    gpus: dict[str, dict[str, list[int]]] = {}  # job -> node -> GPU indices
    meta: dict[str, Mapping[str, str]] = {}
    cpus: dict[tuple[str, str], float] = {}
    shares: dict[tuple[str, str], float] = {}
    for sample in samples:
        labels = sample["metric"]
        name = labels.get("__name__", "")
        job, node = _label(labels, "job"), labels.get("node", "")
        if name == "gpufleet_gpu_allocation_info":
            gpus.setdefault(job, {}).setdefault(node, []).append(int(labels.get("gpu", "0")))
            meta.setdefault(job, labels)
            continue
        value = _value(sample)
        if value is None:
            continue
        if name == "gpufleet_allocation_cpu_cores":
            cpus[(job, node)] = value
        elif name == "gpufleet_allocation_gpu_share_ratio":
            shares[(job, node)] = value
    for job, node in cpus:  # placements holding CPUs but no GPU
        gpus.setdefault(job, {}).setdefault(node, [])
    out = []
    for job in sorted(gpus):
        labels = meta.get(job, {})
        placements = tuple(
            Placement(node, tuple(sorted(indices)), shares.get((job, node), 1.0),
                      cpus.get((job, node), 0.0))
            for node, indices in sorted(gpus[job].items())
        )
        out.append(Allocation(job, placements, namespace=labels.get("namespace", ""),
                              pod=labels.get("pod", ""),
                              priority=int(labels.get("priority", "0") or 0)))
    return tuple(out)


def _secret(path: str, env: str, what: str) -> str:
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise SourceStartupError(f"sources.prometheus.{what}_file: cannot read {path}: "
                                     f"{exc.strerror}") from None
    if env:
        value = os.environ.get(env)
        if value is None:
            raise SourceStartupError(f"sources.prometheus.{what}_env: ${env} is not set")
        return value.strip()
    return ""


def auth_headers(config: PrometheusConfig) -> dict[str, str]:
    """Authorization for a secured endpoint, read fresh so rotated tokens are picked up."""
    token = _secret(config.bearer_token_file, config.bearer_token_env, "bearer_token")
    if token:
        return {"Authorization": f"Bearer {token}"}
    if config.basic_auth_username:
        password = _secret(config.basic_auth_password_file, config.basic_auth_password_env,
                           "basic_auth_password")
        raw = f"{config.basic_auth_username}:{password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}
    return {}


def _where(url: str) -> str:
    """The URL without user info, safe for logs and errors."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass
class PrometheusFleetSource:
    config: PrometheusConfig
    clock: Clock
    name: str = "prometheus"
    queries_made: int = 0  # for bench/prometheus_source.py
    _session: aiohttp.ClientSession | None = None
    _parse_errors: int = 0
    _queries: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._queries = build_queries(self.config)
        self._endpoint = self.config.url.rstrip("/") + "/api/v1/query"

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.query_timeout),
            )
        return self._session

    async def _query(self, name: str, expr: str, at: float, headers: dict[str, str]) -> bytes:
        session = self._ensure_session()
        form = {"query": expr, "time": f"{at:.3f}", "timeout": f"{self.config.query_timeout:g}s"}
        self.queries_made += 1
        where = _where(self.config.url)
        try:
            async with session.post(self._endpoint, data=form, headers=headers) as resp:
                body = await resp.read()
                if resp.status in (401, 403):
                    raise PrometheusQueryError(
                        f"{where}: HTTP {resp.status} {resp.reason} (check the bearer token or "
                        "basic auth of sources.prometheus)")
                if resp.status != 200:
                    raise PrometheusQueryError(f"{where}: query {name}: {_api_error(resp, body)}")
                return body
        except TimeoutError:
            raise PrometheusQueryError(
                f"{where}: query {name}: no answer within {self.config.query_timeout:g}s"
            ) from None
        except aiohttp.ClientError as exc:
            raise PrometheusQueryError(f"{where}: query {name}: {type(exc).__name__}: {exc}") \
                from None

    async def _fetch(self, name: str, expr: str, at: float, headers: dict[str, str]):
        try:
            return name, await self._query(name, expr, at, headers), ""
        except PrometheusQueryError as exc:
            return name, None, str(exc)

    async def read(self) -> FleetSnapshot:
        at = self.clock()
        headers = auth_headers(self.config)
        answers = await asyncio.gather(
            *(self._fetch(name, expr, at, headers) for name, expr in self._queries.items())
        )
        loop = asyncio.get_running_loop()
        # decoding 100k+ series is CPU work: keep it off the loop that serves /metrics
        snapshot, failed = await loop.run_in_executor(None, self._decode_and_build, answers, at)
        self._parse_errors += failed
        status = SourceStatus(self.name, up=True, duration_seconds=0.0, last_success_time=at,
                              parse_errors=self._parse_errors)
        return FleetSnapshot(snapshot.taken_at, snapshot.nodes, snapshot.gpus,
                             snapshot.allocations, (), (status, *snapshot.sources))

    def _decode_and_build(self, answers, at: float) -> tuple[FleetSnapshot, int]:
        results: dict[str, _Result] = {}
        for name, body, error in answers:
            if body is None:
                results[name] = _Result(name, None, error)
                if name not in REQUIRED:
                    log.warning("prometheus query failed; its fields are left out",
                                extra={"source": self.name, "query": name, "err": error})
                continue
            try:
                payload = json.loads(body)
                data = payload["data"]
                if data["resultType"] != "vector":
                    raise ValueError(f"result type {data['resultType']}, expected vector")
                for warning in payload.get("warnings") or []:
                    # Thanos/Mimir: some store did not answer; the data may be partial
                    log.warning("prometheus answered with a warning",
                                extra={"source": self.name, "query": name, "err": warning})
                results[name] = _Result(name, data["result"])
            except (ValueError, KeyError, TypeError) as exc:
                results[name] = _Result(name, None, f"query {name}: unexpected answer: {exc}")
        started = time.perf_counter()
        built = build_snapshot(at, results, self.config.max_sample_age, self.name)
        log.debug("prometheus snapshot built", extra={
            "source": self.name, "gpus": len(built[0].gpus),
            "build_seconds": round(time.perf_counter() - started, 4)})
        return built

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _api_error(resp: aiohttp.ClientResponse, body: bytes) -> str:
    try:
        payload = json.loads(body)
        return f"HTTP {resp.status}: {payload.get('errorType', '')}: {payload.get('error', '')}"
    except ValueError:
        return f"HTTP {resp.status} {resp.reason}"


def build(config: PrometheusConfig, clock: Clock) -> PrometheusFleetSource:
    parts = urlsplit(config.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceStartupError(
            f"sources.prometheus.url: must be an http(s) URL, got {_where(config.url)!r}")
    if (config.bearer_token_file or config.bearer_token_env) and config.basic_auth_username:
        raise SourceStartupError(
            "sources.prometheus: set a bearer token or basic auth, not both")
    if (config.basic_auth_password_file or config.basic_auth_password_env) \
            and not config.basic_auth_username:
        raise SourceStartupError(
            "sources.prometheus.basic_auth_username: required with a basic-auth password")
    if config.metrics == "dcgm":
        raise SourceStartupError(
            "sources.prometheus.metrics: dcgm needs exporter/sources/dcgm_mapping.py, "
            "which this build lacks; use metrics: gpufleet")
    auth_headers(config)  # a missing token file or variable stops the start, not the first read
    return PrometheusFleetSource(config, clock)
