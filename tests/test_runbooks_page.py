"""Issue 29: ``gpufleet serve`` serves the runbooks at /runbooks, so an alert's absolute
``runbook_url`` (``<external_url>/runbooks#<anchor>``) resolves with no wiki."""

from __future__ import annotations

import re

from aiohttp import web

from exporter.thresholds import load_thresholds
from exporter.web import runbooks
from tests.helpers import REPO


async def test_runbooks_page_has_an_anchor_for_every_alert_of_the_table(aiohttp_client):
    app = web.Application()
    runbooks.add_route(app)
    client = await aiohttp_client(app)
    resp = await client.get("/runbooks")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    page = await resp.text()
    ids = set(re.findall(r' id="([^"]+)"', page))
    table = load_thresholds(REPO / "rules" / "thresholds.yaml")
    assert {row.runbook for row in table.alerts} <= ids
    # the commands a pager's reader copies come through whole, escaped
    assert "<code>kubectl cordon &lt;node&gt;</code>" in page
    assert "<script" not in page


def test_the_packaged_runbooks_are_the_docs_page():
    """exporter/runbooks.md links to docs/runbooks.md, as the table links to rules/: one copy."""
    packaged = REPO / "exporter" / runbooks.PACKAGED
    assert packaged.is_symlink()
    assert packaged.read_text() == (REPO / "docs" / "runbooks.md").read_text()


def test_markdown_is_escaped_and_rendered():
    page = runbooks.render("## Gpu <Lost>\n\nRun `a < b` **now**, see [x](y.md).\n\n"
                           "- one\n  more\n- two\n\n```sh\necho <hi>\n```\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert '<h2 id="gpu-lost">Gpu &lt;Lost&gt;</h2>' in page
    assert "<p>Run <code>a &lt; b</code> <strong>now</strong>, see <a href=\"y.md\">x</a>.</p>" in page
    assert "<ul><li>one more</li><li>two</li></ul>" in page
    assert "<pre><code>echo &lt;hi&gt;</code></pre>" in page
    assert "<table><tr><td>a</td><td>b</td></tr><tr><td>1</td><td>2</td></tr></table>" in page
