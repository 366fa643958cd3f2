from __future__ import annotations

import json
import logging
import sys
import threading
import time

from exporter import logs
from exporter.logs import JsonFormatter, LogfmtFormatter


def _record(msg: str, **extra) -> logging.LogRecord:
    record = logging.LogRecord("gpufleet.test", logging.WARNING, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_logfmt_quotes_what_needs_quoting():
    line = LogfmtFormatter().format(_record("source read failed", source="dcgm",
                                            err='HTTP 500: "bad"\nbody'))
    assert "\n" not in line
    assert "level=warning" in line and "logger=gpufleet.test" in line
    assert 'msg="source read failed"' in line and "source=dcgm" in line
    assert 'err="HTTP 500: \\"bad\\"\\nbody"' in line


def test_json_is_one_object():
    line = JsonFormatter().format(_record("collected", gpus=1088))
    event = json.loads(line)
    assert event["msg"] == "collected" and event["gpus"] == 1088 and event["level"] == "warning"


class StalledStream:
    """A stderr nobody reads: every write waits until ``flowing`` is set."""

    def __init__(self) -> None:
        self.flowing = threading.Event()
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.flowing.wait()
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_stalled_stderr_costs_the_logger_nothing_and_drops_are_counted(monkeypatch):
    """Issue 32, finding 3: with stderr a pipe nobody read, each log call blocked the event
    loop; 318 ERROR lines froze /-/healthy and /metrics for over 20 s."""
    stream = StalledStream()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    before = logs.dropped_lines()
    try:
        logs.setup("info", "logfmt", queued=True)
        log = logging.getLogger("gpufleet.test")
        started = time.monotonic()
        for n in range(logs.QUEUE_LINES + 5_000):
            log.error("malformed request", extra={"n": n})
        took = time.monotonic() - started
        assert took < 5, f"logging waited on the stalled stream: {took:.1f}s"
        # the queue holds QUEUE_LINES; the writer holds one more, stuck in write()
        dropped = logs.dropped_lines() - before
        assert 4_990 <= dropped <= 5_000
        stream.flowing.set()
        logs._stop_writer()
        lines = "".join(stream.text).splitlines()
        assert len(lines) == logs.QUEUE_LINES + 5_000 - dropped + 1
        assert lines[0].endswith("n=0")
        assert lines[-1].startswith("ts=") and f"dropped={dropped}" in lines[-1]
    finally:
        stream.flowing.set()
        logs._stop_writer()
        root.handlers[:], level = saved
        root.setLevel(level)
