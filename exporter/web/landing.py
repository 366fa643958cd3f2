"""``/``: the landing page, as node_exporter has one: what this process serves, and its state.

A person who opens the exporter's address sees the version, every endpoint the app
really routes (read from the router, so an endpoint added elsewhere, the advisor's,
appears without an edit here), each source with its state, and links to the advice and
the runbooks. Everything shown is escaped: a source's error can carry any text.

A source's error text can name hosts and paths; when GET ``/v1/*`` needs the advisor's
token (``api.require_token_for_reads``), ``/`` shows only up or down and points to
``/v1/snapshot`` for the reason, so the page leaks no more than ``/metrics`` does.
"""

from __future__ import annotations

import html
import logging
import re

from aiohttp import web

from exporter import __version__
from exporter.snapshot import SourceStatus

log = logging.getLogger(__name__)

# What each endpoint is, for the page; an endpoint not listed is shown without a line.
ENDPOINTS: dict[str, str] = {
    "/metrics": "Prometheus exposition of the fleet, rendered once per collection",
    "/-/healthy": "200 while the process runs",
    "/-/ready": "200 once a snapshot is served, collection is not stalled and no source is "
                "blind (reads no GPU, or under half of what it listed)",
    "/v1/advice": "the advisor's decision, its reasons and scaling hints (JSON)",
    "/v1/snapshot": "the current fleet snapshot (JSON; input of gpufleet analyze --snapshot)",
    "/v1/openapi.json": "the JSON API's OpenAPI description",
    "/v1/plan": "what-if plan for a given fleet (POST, bearer token)",
    "/v1/alerts": "Alertmanager's webhook (POST, bearer token)",
}
_ABSOLUTE = re.compile(r"^https?://", re.IGNORECASE)
_STYLE = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
          "td,th{padding:.2em .8em;text-align:left;border-bottom:1px solid #ddd}"
          ".up{color:#070}.down{color:#b00}")


def _routes(app: web.Application) -> list[tuple[str, tuple[str, ...]]]:
    """(path, methods) of every plain route of ``app``, in the order they were added."""
    methods: dict[str, list[str]] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path")
        if path is None or path == "/" or route.method == "HEAD":
            continue
        methods.setdefault(path, [])
        if route.method not in methods[path]:
            methods[path].append(route.method)
    return [(path, tuple(m)) for path, m in methods.items()]


def _source_row(status: SourceStatus, show_errors: bool) -> str:
    name = status.source + (f" ({status.target})" if status.target else "")
    state = "<span class='up'>up</span>" if status.up else "<span class='down'>down</span>"
    if status.up or not status.error:
        why = ""
    elif show_errors:
        why = html.escape(status.error)
    else:
        why = "reason in <a href='/v1/snapshot'>/v1/snapshot</a> (needs the token) and the log"
    return f"<tr><td>{html.escape(name)}</td><td>{state}</td><td>{why}</td></tr>"


def runbooks_link(page: str, routed: set[str]) -> str:
    """The runbooks as a link where the reader can follow it: an absolute URL, or this
    process's own ``/runbooks``; a relative page (the default ``docs/runbooks.md``)
    resolves only beside the docs, so it is named, not linked."""
    if _ABSOLUTE.match(page):
        return f"<a href='{html.escape(page, quote=True)}'>{html.escape(page)}</a>"
    if "/runbooks" in routed:
        return "<a href='/runbooks'>/runbooks</a>"
    return (f"{html.escape(page)} in gpufleet's docs (set <code>runbook_base_url</code> or "
            "<code>external_url</code> in the threshold table to link it here)")


def render(app: web.Application, sources: tuple[SourceStatus, ...] | None, show_errors: bool,
           runbook_page: str) -> str:
    routes = _routes(app)
    routed = {path for path, _ in routes}
    rows = []
    for path, methods in routes:
        shown = html.escape(path)
        cell = f"<a href='{shown}'>{shown}</a>" if "GET" in methods else shown
        rows.append(f"<tr><td>{cell}</td><td>{html.escape(', '.join(methods))}</td>"
                    f"<td>{html.escape(ENDPOINTS.get(path, ''))}</td></tr>")
    if sources is None:
        source_part = "<p>No collection finished yet.</p>"
    elif not sources:
        source_part = "<p>No source enabled.</p>"
    else:
        source_part = ("<table><tr><th>source</th><th>state</th><th>why down</th></tr>"
                       + "".join(_source_row(s, show_errors) for s in sources) + "</table>")
    advice = ("<a href='/v1/advice'>/v1/advice</a>" if "/v1/advice" in routed
              else "the advisor is off (<code>advisor.enabled</code>, <code>analysis.enabled</code>)")
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>gpufleet</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>gpufleet</h1><p>Version {html.escape(__version__)}. Prometheus exporter, "
        "fragmentation analyzer and rebalancing advisor for GPU fleets.</p>"
        "<h2>Endpoints</h2><table><tr><th>path</th><th>methods</th><th>what</th></tr>"
        + "".join(rows) + "</table>"
        "<h2>Sources</h2>" + source_part
        + f"<h2>Advice and runbooks</h2><ul><li>Advice: {advice}</li>"
        f"<li>Runbooks: {runbooks_link(runbook_page, routed)}</li></ul>"
        "</body></html>"
    )


def packaged_runbook_page() -> str:
    """The installed threshold table's runbooks page; a table that does not load must not
    break ``/`` (the serving path reports it where it matters)."""
    from exporter.errors import ConfigError
    from exporter.thresholds import load_thresholds

    try:
        return load_thresholds().runbook_page
    except ConfigError:
        log.debug("threshold table not loaded for the landing page", exc_info=True)
        return "docs/runbooks.md"
