"""Never green while blind: a source that reads no GPU, or under half of the fleet it listed
before, makes gpufleet not ready with the reason, and nothing derived from the whole fleet
(the fragmentation index, the pools' load and hints, the advisor's decision) is exported."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.error
import urllib.request

import pytest

from exporter.cli.serve import assemble
from exporter.collect import Collector
from exporter.config import Config
from exporter.sources import SourceReading
from exporter.sources.sim.options import SimSource
from exporter.sources.sim.source import build as sim_source
from exporter.web.server import STATE, Reload, make_app

START = 1_760_000_000.0

# families derived from the whole fleet, one of each stage that is left out when blind
DERIVED = ("gpufleet_cluster_fragmentation_index", "gpufleet_pool_fragmentation_index",
           "gpufleet_pool_recommended_nodes", "gpufleet_advisor_decision_info")

LAST_EVALUATION = ("gpufleet_pool_idle_allocated_gpus", "gpufleet_pool_right_sizing_gpus",
                   "gpufleet_advisor_plan_migrations")


class Shrinking:
    """The seed-1 simulated fleet (1,088 GPUs), of which a read lists only the first ``keep``
    GPUs (all of them while ``keep`` is None), as a backend that is still filling does."""

    name = "fleet"

    def __init__(self) -> None:
        self.inner = sim_source(SimSource(seed=1), lambda: START)
        self.keep: int | None = None

    async def read(self) -> SourceReading:
        reading = await self.inner.read()
        if self.keep is None:
            return reading
        return dataclasses.replace(reading, gpus=reading.gpus[:self.keep])

    async def close(self) -> None:
        return None


class Empty:
    """A source that answers, up, with no GPU (an empty cluster, a backend not yet filled)."""

    name = "empty"

    async def read(self) -> SourceReading:
        return SourceReading()

    async def close(self) -> None:
        return None


def _serving(source, advisor: bool = True):
    """serve's app (its stages, as assemble wires them) over ``source``, collected by hand
    (collect_interval is an hour: the background loop's first collection is the only other)."""
    config = Config(collect_interval=3600, source_timeout=5)
    config = dataclasses.replace(config, advisor=dataclasses.replace(config.advisor, enabled=advisor,
                                                                     outbox=""))
    collector, state, _ = assemble(config, ["sim"], clock=lambda: START)
    collector = Collector([source], config.source_timeout, clock=lambda: START)
    return make_app(config, collector, state)


async def _collect(client) -> tuple[int, str, str]:
    """One collection now; then /-/ready's status and text, and /metrics' text."""
    from exporter.exposition import LabelCache
    from exporter.web.server import collect_once

    while client.app[STATE].collections < 1:  # the loop's first collection: not beside ours
        await asyncio.sleep(0.05)
    await collect_once(client.app, LabelCache())
    ready = await client.get("/-/ready")
    metrics = await client.get("/metrics")
    return ready.status, await ready.text(), await metrics.text()


def _has(text: str, family: str) -> bool:
    return f"\n{family}{{" in text or f"\n{family} " in text


async def test_a_partial_reading_is_down_not_ready_and_derives_nothing(aiohttp_client):
    source = Shrinking()
    app = _serving(source)
    client = await aiohttp_client(app)
    status, body, text = await _collect(client)
    assert status == 200 and body == "gpufleet is ready.\n"
    assert all(_has(text, f) for f in DERIVED)
    assert all(f"# HELP {f} " in text for f in LAST_EVALUATION)
    assert 'gpufleet_source_up{source="fleet"} 1.0' in text

    source.keep = 400  # 400 of 1,088: under half
    status, body, text = await _collect(client)
    reason = ("partial: read 400 GPUs, under 50% of the 1088 it listed before (SIGHUP accepts "
              "a fleet that really shrank)")
    assert (status, body) == (503, f"gpufleet is not ready: source fleet is {reason}.\n")
    assert [d for d in DERIVED if _has(text, d)] == []
    # nor are the advisor's sums of its last evaluation, made of another snapshot
    assert [f for f in LAST_EVALUATION if f"# HELP {f} " in text] == []
    # and an Alertmanager notification does not evaluate the last fleet seen as if it were now
    advisor_stage = client.app[STATE].cycle.stage("advisor")
    assert advisor_stage.evaluate_last("alertmanager") is None
    assert 'gpufleet_source_up{source="fleet"} 0.0' in text
    # what was read is served as it is: 400 GPUs, fresh
    assert text.count("\ngpufleet_gpu_up{") == 400
    snapshot = client.app[STATE].current.snapshot
    assert snapshot.sources[0].error == reason and not any(g.stale for g in snapshot.gpus)

    source.keep = 600  # over half again: the whole picture is back
    status, body, text = await _collect(client)
    assert status == 200 and all(_has(text, f) for f in DERIVED)
    assert advisor_stage.evaluate_last("alertmanager") is not None

    # a fleet that really shrank: SIGHUP forgets the sizes, and 400 is the fleet
    source.keep = 400
    assert (await _collect(client))[0] == 503
    outcomes = Reload(client.app[STATE]).run_once()
    assert outcomes["fleet sizes"] == "forgot fleet 1088"
    status, body, text = await _collect(client)
    assert status == 200 and all(_has(text, f) for f in DERIVED)


async def test_a_source_that_reads_no_gpu_is_not_ready_and_exports_no_index(aiohttp_client):
    app = _serving(Empty(), advisor=False)
    client = await aiohttp_client(app)
    status, body, text = await _collect(client)
    # an empty fleet from the start keeps the source up (nothing was lost: no page), but
    # gpufleet is not ready, and no index of 0 reads as an unfragmented fleet
    assert (status, body) == (503, "gpufleet is not ready: source empty reads no GPU.\n")
    assert 'gpufleet_source_up{source="empty"} 1.0' in text
    assert [d for d in DERIVED[:3] if _has(text, d)] == []


async def test_a_failed_read_with_nothing_to_serve_is_blind_a_stale_fleet_is_not(aiohttp_client):
    source = Shrinking()
    app = _serving(source, advisor=False)
    client = await aiohttp_client(app)

    async def fail() -> SourceReading:
        raise ConnectionError("refused")

    read = source.read
    source.read = fail  # type: ignore[method-assign]
    status, body, _ = await _collect(client)
    assert (status, body) == (503, "gpufleet is not ready: source fleet reads no GPU: "
                                   "ConnectionError: refused.\n")
    source.read = read  # type: ignore[method-assign]
    assert (await _collect(client))[0] == 200
    source.read = fail  # type: ignore[method-assign]
    # its last good reading, served stale: the fleet is known, only not fresh
    status, _, text = await _collect(client)
    assert status == 200 and _has(text, DERIVED[0])
    assert 'gpufleet_source_up{source="fleet"} 0.0' in text


# -- cluster mode over a real Prometheus ----------------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    """Status and text; (0, "") while nothing listens yet."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except urllib.error.URLError:
        return 0, ""


@pytest.mark.slow
def test_a_wrong_selector_is_not_ready_with_the_reason_and_has_no_index(
        exporter_factory, prometheus_factory):
    import yaml

    node = exporter_factory(config="collect_interval: 1s\nadvisor: {enabled: false}\n")
    prom = prometheus_factory(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "gpufleet-nodes", "scrape_interval": "1s",
                            "scrape_timeout": "1s",
                            "static_configs": [{"targets": [f"127.0.0.1:{node.port}"]}]}]}))
    prom.wait_for("gpufleet_gpu_info", lambda r: len(r) == 128, timeout=60)  # the small fleet

    def cluster(selector: str, ready: bool):
        return exporter_factory(ready=ready, config=f"""
collect_interval: 1s
advisor: {{enabled: false}}
sources:
  sim: {{enabled: false}}
  prometheus: {{enabled: true, url: "{prom.url}", selector: '{selector}'}}
""")

    wrong = cluster('job="gpufleet-nodez"', ready=False)
    right = cluster('job="gpufleet-nodes"', ready=True)  # ready: 200 once it reads the fleet
    deadline = time.monotonic() + 60
    status, body = _get(f"{wrong.url}/-/ready")
    while "reads no GPU" not in body and time.monotonic() < deadline:
        time.sleep(0.2)
        status, body = _get(f"{wrong.url}/-/ready")
    assert status == 503
    assert body.startswith("gpufleet is not ready: source prometheus reads no GPU: ")
    assert 'job="gpufleet-nodez"' in body
    text = _get(f"{wrong.url}/metrics")[1]
    assert 'gpufleet_source_up{source="prometheus"} 0.0' in text
    assert not _has(text, "gpufleet_cluster_fragmentation_index")
    assert not _has(text, "gpufleet_pool_recommended_nodes")
    # the same fleet under the right selector: ready, with its index
    assert _get(f"{right.url}/-/ready") == (200, "gpufleet is ready.\n")
    assert _has(_get(f"{right.url}/metrics")[1], "gpufleet_cluster_fragmentation_index")
