"""Waiting that a cancellation cannot cut short.

``await`` returns as soon as the awaiting task is cancelled, but what it waited
for may go on: a worker thread cannot be stopped, and a killed child stays a
zombie, its pipes open, until someone reaps it. Cancelled mid-``await``, a task
would end while its store write is still landing or its child still lives,
and whoever stopped the task would see half of what it did. ``complete`` waits
for such work to finish however often the task is cancelled meanwhile, then
lets the cancellation go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def complete(work: Awaitable[T]) -> T:
    """Await ``work`` to its end, even through cancellations; then re-raise the first of them.

    ``work`` runs as its own task, which a cancellation of the caller does not
    reach. Returns its result, or raises its exception, when nobody cancelled
    the caller meanwhile; otherwise raises the caller's ``CancelledError`` once
    ``work`` is done. Only for work that ends on its own, and soon.
    """
    future = asyncio.ensure_future(work)
    cancelled: asyncio.CancelledError | None = None
    while not future.done():
        try:
            await asyncio.wait((future,))  # unlike wait_for, never cancels ``future``
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not future.cancelled():
            future.exception()  # retrieved: no "exception was never retrieved" later
        raise cancelled
    return future.result()
