"""The bearer check of the API: one copy, read by the advisor's POSTs and by serve's guarded
GETs alike. A leaf module (aiohttp and the standard library only), because a node's
install has no numpy and the advisor's modules load it."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable

from aiohttp import web

Token = bytes | Callable[[], bytes | None] | None


async def current_token(token_source: Token) -> bytes | None:
    """The token now. A callable reads a file (advisor.token_file, rotated): in a thread, so
    a file that is slow or hostile (a FIFO swapped in) never stalls the event loop."""
    if callable(token_source):
        return await asyncio.to_thread(token_source)
    return token_source


def token_problem(token: bytes | None, request: web.Request) -> str | None:
    """None when ``request`` presents ``token`` as its bearer, else the reason for a 401."""
    if not token:  # an empty token would match a blank bearer
        return ("the advisor has no usable token (set GPUFLEET_ADVISOR_TOKEN or "
                "advisor.token_file, non-blank)")
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    presented = presented.strip()  # str.strip: Unicode whitespace too, U+00A0 included
    if scheme.lower() != "bearer" or not presented:
        return "missing bearer token"
    if not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), token):
        return "wrong bearer token"
    return None
