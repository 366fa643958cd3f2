"""Proof that the event loop kept turning while a blocking call ran, without timing it.

The call, wrapped, waits for a task on the loop to answer. Run off the loop (in a worker
thread), it gets the answer at once; run on the loop, it waits in vain, since it holds the
very loop that would answer, and records that. No clock decides the verdict: the wait's
limit only bounds how long a wrong build takes to fail.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
NO_ANSWER_AFTER = 30.0  # seconds a call on the loop waits before recording that it blocked it


class LoopWitness:
    """Wrap the blocking call with :meth:`wrap`, run the work with :meth:`watch`; then
    :attr:`turned` holds, per call, whether the loop answered while it ran."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self._answered = threading.Event()
        self.turned: list[bool] = []

    def wrap(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def waiting(*args: Any, **kwargs: Any) -> Any:
            self._asked.set()
            self.turned.append(self._answered.wait(NO_ANSWER_AFTER))
            return call(*args, **kwargs)
        return waiting

    async def watch(self, work: Awaitable[T]) -> T:
        async def answer() -> None:
            while not self._asked.is_set():
                await asyncio.sleep(0.005)
            self._answered.set()

        answering = asyncio.create_task(answer())
        try:
            return await work
        finally:
            answering.cancel()
