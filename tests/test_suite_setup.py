"""What tests/conftest.py sets up for every test process."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest


def test_asyncio_run_takes_no_repr_of_its_result():
    """On Python 3.11 ``asyncio.run`` puts SIGINT's handler back after each run through
    ``signal.signal``, which formats the repr of asyncio's own handler, and with it the full
    repr of the run's result (a 2 MB snapshot's cost 34 ms a run). Under the suite's handler
    (conftest's ``pytest_configure``) asyncio leaves SIGINT alone; Ctrl-C still raises
    KeyboardInterrupt."""
    shown = []

    class Big:
        def __repr__(self) -> str:
            shown.append(1)
            return "Big()"

    async def make() -> Big:
        return Big()

    assert isinstance(asyncio.run(make()), Big)
    assert shown == []
    handler = signal.getsignal(signal.SIGINT)
    # a run started in the background ignores SIGINT (the shell's doing), and asyncio then
    # leaves it alone as well
    if threading.current_thread() is threading.main_thread() and handler is not signal.SIG_IGN:
        assert callable(handler) and handler is not signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)
