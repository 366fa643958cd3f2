"""How long the event loop stood still while some work ran: a 10 ms ticker beside it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def longest_stall(work: Awaitable[T]) -> tuple[T, float]:
    """``work``'s result, and the longest gap (seconds) between ticks while it ran."""
    gaps: list[float] = [0.0]
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        result = await work
    finally:
        done.set()
        await ticker
    return result, max(gaps)
