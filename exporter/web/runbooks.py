"""``GET /runbooks``: docs/runbooks.md as one HTML page, so a notification's ``runbook_url``
(``<external_url>/runbooks#<anchor>``, exporter/alerting/) always resolves, with no wiki.

The page is package data (``exporter/runbooks.md``, a link to docs/runbooks.md in the
checkout, copied by ``pip install`` as the threshold table is) and is rendered once per
process by a small Markdown subset: the one the runbooks are written in (headings,
paragraphs, lists, fenced code, tables, inline code, bold, links). Every heading gets the
anchor GitHub would give it (``## GpuPowerHigh`` is ``#gpupowerhigh``): the table's
``runbook`` anchors are those. Links to other files of the repository stay relative:
they lead nowhere here, and their text still says where to look.
"""

from __future__ import annotations

import html
import re
from functools import cache
from importlib import resources

from aiohttp import web

PATH = "/runbooks"
PACKAGED = "runbooks.md"

_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")
_LIST = re.compile(r"^(\s*)(?:[-*]|\d+\.)\s+(.*)$")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> anchor("GpuPowerHigh"), anchor("Drain the node: Slurm & Kubernetes")
    ('gpupowerhigh', 'drain-the-node-slurm--kubernetes')
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def inline(text: str) -> str:
    """Escaped text with `code`, **bold** and [links](url)."""
    out, at = [], 0
    for match in _INLINE.finditer(text):
        out.append(html.escape(text[at:match.start()]))
        code, bold, label, url = match.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{html.escape(bold)}</strong>")
        else:
            out.append(f'<a href="{html.escape(url, quote=True)}">{html.escape(label)}</a>')
        at = match.end()
    out.append(html.escape(text[at:]))
    return "".join(out)


def render(markdown: str, title: str = "gpufleet runbooks") -> str:
    """The page: the Markdown subset above as HTML, one block at a time."""
    body: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
            body.append(f"<pre><code>{html.escape(chr(10).join(lines[i + 1:end]))}</code></pre>")
            i = end + 1
            continue
        if heading := re.match(r"^(#{1,6})\s+(.*)$", line):
            level, text = len(heading.group(1)), heading.group(2)
            body.append(f'<h{level} id="{anchor(text)}">{inline(text)}</h{level}>')
            i += 1
            continue
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in cells) + "</tr>")
                i += 1
            body.append("<table>" + "".join(rows) + "</table>")
            continue
        if _LIST.match(line):
            items: list[str] = []
            while i < len(lines) and lines[i].strip():
                item = _LIST.match(lines[i])
                if item and not item.group(1):
                    items.append(item.group(2))
                elif items:  # a continuation line, or a nested item, joins the item above
                    items[-1] += " " + lines[i].strip()
                i += 1
            body.append("<ul>" + "".join(f"<li>{inline(t)}</li>" for t in items) + "</ul>")
            continue
        if not line.strip():
            i += 1
            continue
        paragraph = []
        while (i < len(lines) and lines[i].strip() and not lines[i].startswith(("```", "#", "|"))
               and not _LIST.match(lines[i])):
            paragraph.append(lines[i].strip())
            i += 1
        body.append(f"<p>{inline(' '.join(paragraph))}</p>")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


@cache
def page() -> bytes:
    """The packaged runbooks as HTML, rendered once per process."""
    text = resources.files("exporter").joinpath(PACKAGED).read_text(encoding="utf-8")
    return render(text).encode()


async def handler(request: web.Request) -> web.Response:
    return web.Response(body=page(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "max-age=300"})


def add_route(app: web.Application) -> None:
    app.router.add_get(PATH, handler)
