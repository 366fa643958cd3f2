"""``/``, the landing page (exporter/web/landing.py): every endpoint routed, the version, the
sources' state, the advice and the runbooks, as ``gpufleet serve`` wires the app."""

from __future__ import annotations

import asyncio
import re

import pytest

from exporter import __version__
from exporter.advisor.service import install
from exporter.cli.serve import assemble
from exporter.collect import Collector
from exporter.config import Config
from exporter.sources import SourceReading
from exporter.sources.sim.options import SimSource
from exporter.sources.sim.source import build as sim_source
from exporter.web.landing import runbooks_link
from exporter.web.server import Protection, make_app

START = 1_760_000_000.0
ERROR = "<b>upstream</b> http://prom.internal:9090 said 'no'"


class BrokenSource:
    name = "broken"

    async def read(self) -> SourceReading:
        raise RuntimeError(ERROR)

    async def close(self) -> None:
        return None


async def _page(client) -> str:
    for _ in range(200):
        if (await client.get("/-/ready")).status == 200:
            break
        await asyncio.sleep(0.05)
    response = await client.get("/")
    assert response.status == 200
    assert response.content_type == "text/html"
    return await response.text()


def _links(page: str) -> list[str]:
    return re.findall(r"<a href='([^']*)'>", page)


async def test_the_page_lists_every_endpoint_serve_routes(aiohttp_client, tmp_path, monkeypatch):
    """The app as serve wires it (sim, analysis, advisor): the advisor's routes appear too."""
    monkeypatch.chdir(tmp_path)  # the advisor's outbox
    config = Config(collect_interval=0.05)
    collector, state, advisor = assemble(config, ["sim"], clock=lambda: START)
    assert advisor is not None
    app = make_app(config, collector, state)
    install(app, advisor)
    page = await _page(await aiohttp_client(app))
    assert f"Version {__version__}." in page
    links = _links(page)
    for path in ("/metrics", "/-/healthy", "/-/ready", "/v1/advice", "/v1/snapshot",
                 "/v1/openapi.json"):
        assert path in links, (path, links)
    # POST-only endpoints are listed, not linked (a GET would answer 405)
    assert "<td>/v1/plan</td><td>POST</td>" in page and "/v1/plan" not in links
    assert "<td>/v1/alerts</td><td>POST</td>" in page
    assert "<tr><td>sim</td><td><span class='up'>up</span></td><td></td></tr>" in page
    assert "Advice: <a href='/v1/advice'>/v1/advice</a>" in page
    # the shipped table's runbooks page is relative: named, not a dead link
    assert "Runbooks: docs/runbooks.md in gpufleet's docs" in page


def _app_with_a_broken_source(reads_need_token: bool):
    sim = sim_source(SimSource(seed=1), lambda: START)
    # one collection: the page is read once /-/ready says the first one is done; every 50 ms
    # the simulated fleet was collected again until the test ended (7 s of CPU per test)
    config = Config(collect_interval=3600, source_timeout=0.5)
    collector = Collector([sim, BrokenSource()], config.source_timeout, clock=lambda: START)
    return make_app(config, collector, protection=Protection(reads_need_token=reads_need_token))


async def test_a_down_source_shows_its_reason_escaped(aiohttp_client):
    page = await _page(await aiohttp_client(_app_with_a_broken_source(False)))
    row = re.search(r"<tr><td>broken</td><td><span class='down'>down</span></td><td>(.*?)</td>",
                    page)
    assert row is not None, page
    assert "&lt;b&gt;upstream&lt;/b&gt; http://prom.internal:9090 said &#x27;no&#x27;" in row.group(1)
    assert "<b>upstream</b>" not in page
    assert "the advisor is off" in page  # no advisor routed


async def test_with_reads_behind_the_token_the_reason_stays_behind_it(aiohttp_client):
    page = await _page(await aiohttp_client(_app_with_a_broken_source(True)))
    assert "<span class='down'>down</span>" in page
    assert "prom.internal" not in page
    assert "reason in <a href='/v1/snapshot'>/v1/snapshot</a> (needs the token)" in page


async def test_before_the_first_collection(aiohttp_client):
    sim = sim_source(SimSource(seed=1), lambda: START)
    config = Config(collect_interval=3600)

    class Never:
        name = "never"

        async def read(self) -> SourceReading:
            await asyncio.sleep(30)
            raise AssertionError("unreachable")

        async def close(self) -> None:
            return None

    collector = Collector([sim, Never()], 10.0, clock=lambda: START)
    client = await aiohttp_client(make_app(config, collector))
    response = await client.get("/")
    assert response.status == 200
    assert "No collection finished yet." in await response.text()


@pytest.mark.parametrize(("page", "routed", "shown"), [
    ("https://wiki.example/gpu/runbooks.md",
     set(), "<a href='https://wiki.example/gpu/runbooks.md'>https://wiki.example/gpu/runbooks.md</a>"),
    ("docs/runbooks.md", {"/runbooks"}, "<a href='/runbooks'>/runbooks</a>"),
    ("docs/runbooks.md", set(), "docs/runbooks.md in gpufleet's docs"),
    ("javascript:alert(1)", set(), "javascript:alert(1) in gpufleet's docs"),
])
def test_the_runbooks_are_linked_only_where_a_reader_can_follow(page, routed, shown):
    assert runbooks_link(page, routed).startswith(shown)
