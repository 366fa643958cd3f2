"""One line per event, as logfmt or JSON. Never a secret: callers pass no tokens here.

``serve`` logs through a bounded queue: each line is formatted where it is logged,
then a writer thread writes it. Written from the event loop, a stderr nobody reads
(a full pipe) blocked the loop on the first line past the pipe's buffer: 64 KB of
ERROR lines made ``/-/healthy`` and ``/metrics`` time out for over 20 s. When the
queue is full a line is dropped and counted (:func:`dropped_lines`), and the writer
says how many once it catches up. The batch commands write directly: a line there
is never worth more than the run, and they end right after.

``serve`` also rate-limits what the sources and aiohttp's server log
(:class:`PerSourceLimit`): an upstream that fails the same way over and over (a watch
broken every few milliseconds, a Slurm answer of a million bad records, 19 Prometheus
queries each with a warning), or a flood of malformed requests, logs one line per
interval and per source, the next one saying how many were not logged, as the
connection gate's lines do.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

# lines waiting for the writer; about 3 MB of typical lines, dropped beyond
QUEUE_LINES = 10_000
# at exit, how long the lines still queued may take to be written (a stuck stderr: dropped)
EXIT_FLUSH_SECONDS = 2.0

# a source's same line (logger, message, source, target, GPU) at most once per this
SOURCE_LINE_INTERVAL = 10.0
# keys remembered at most; past it those older than the interval are forgotten
SOURCE_LINE_KEYS = 4096

# attributes every LogRecord has; anything else came in through ``extra=``
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            fields[key] = value
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        fields["err"] = f"{type(exc).__name__}: {exc}"
    return fields


def _logfmt_value(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\\\n\t'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


_dropped = 0
_dropped_lock = threading.Lock()


def dropped_lines() -> int:
    """Lines dropped so far because the queue was full (stderr slower than the logging)."""
    return _dropped


def not_written() -> dict[str, int]:
    """What ``gpufleet_log_lines_dropped_total`` serves: the lines the installed queued
    logging (serve's) has not written, by reason, since :func:`setup` installed it; 0 when
    none is installed (the batch commands, the golden exposition)."""
    if _writer is None:
        return {"queue_full": 0, "rate_limited": 0}
    return {"queue_full": _dropped - _writer.started_with,
            "rate_limited": _limit.held_back if _limit is not None else 0}


def _count_drop() -> None:
    global _dropped
    with _dropped_lock:
        _dropped += 1


# the loggers whose lines an upstream or a client can multiply: the sources', and aiohttp's
# server, which logs each malformed request at ERROR ("Error handling request from %s":
# 20,000 unauthenticated requests were 20,000 lines, 10.2 MB, in 10 s; issue 32, finding 17)
LIMITED_LOGGERS = ("exporter.sources.", "aiohttp.server")


class PerSourceLimit(logging.Filter):
    """At most one line per ``interval`` seconds for each (logger, message, source, target,
    GPU) of the loggers named by ``prefixes`` (the sources, aiohttp's server); the line after
    a quiet spell carries ``not_logged_since_last_line``, the count of those held back. Other
    loggers pass. The message is the template (``record.msg``), so the values in ``extra``
    or the arguments (an error's text, a client's address) do not make every line a new key."""

    def __init__(self, interval: float = SOURCE_LINE_INTERVAL,
                 prefixes: tuple[str, ...] = LIMITED_LOGGERS,
                 clock: Callable[[], float] = time.monotonic, keys: int = SOURCE_LINE_KEYS) -> None:
        super().__init__()
        self.interval, self.prefixes, self.clock, self.keys = interval, prefixes, clock, keys
        self._seen: dict[tuple[object, ...], list[float]] = {}  # key -> [logged at, held back]
        self._lock = threading.Lock()
        self.held_back = 0  # lines not logged, in all

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        key = (record.name, record.msg, getattr(record, "source", None),
               getattr(record, "target", None), getattr(record, "gpu", None))
        now = self.clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.interval:
                entry[1] += 1
                self.held_back += 1
                return False
            if entry is None and len(self._seen) >= self.keys:
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.interval}
                if len(self._seen) >= self.keys:  # all recent: a flood of keys, held back too
                    self.held_back += 1
                    return False
            held = int(entry[1]) if entry is not None else 0
            self._seen[key] = [now, 0]
        if held:
            record.not_logged_since_last_line = held
        return True


class QueuedLines(logging.handlers.QueueHandler):
    """Formats each record where it is logged and queues the line; never waits.

    The line, not the record, is queued: the formatter needs ``extra`` fields and the
    exception, which QueueHandler's own ``prepare`` strips.
    """

    def __init__(self, lines: queue.Queue[str | None]) -> None:
        super().__init__(lines)

    def prepare(self, record: logging.LogRecord) -> str:  # type: ignore[override]
        return self.format(record)

    def enqueue(self, record: logging.LogRecord | str) -> None:  # type: ignore[override]
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            _count_drop()


class LineWriter:
    """The thread that writes queued lines to ``stream``, and stops (flushing) at exit."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter,
                 size: int = QUEUE_LINES) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue(size)
        self.stream = stream
        self.formatter = formatter
        self._reported = self.started_with = _dropped
        self._thread = threading.Thread(target=self._run, name="log writer", daemon=True)
        self._thread.start()

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            if self.lines.empty():
                self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr: nothing to tell it
            pass

    def _run(self) -> None:
        while True:
            line = self.lines.get()
            if line is not None:
                self._write(line)
            if (line is None or self.lines.empty()) and _dropped != self._reported:
                dropped, self._reported = _dropped - self._reported, _dropped
                record = logging.LogRecord(__name__, logging.WARNING, __file__, 0,
                                           "log lines dropped: stderr too slow", (), None)
                record.dropped = dropped
                self._write(self.formatter.format(record))
            if line is None:
                return

    def stop(self, timeout: float = EXIT_FLUSH_SECONDS) -> None:
        """Write what is queued, for ``timeout`` at most, then stop the thread."""
        deadline = time.monotonic() + timeout
        while self._thread.is_alive():
            try:
                self.lines.put(None, timeout=0.05)
                break
            except queue.Full:
                if time.monotonic() > deadline:
                    return
        self._thread.join(max(0.0, deadline - time.monotonic()))


_writer: LineWriter | None = None
_limit: PerSourceLimit | None = None


def _stop_writer() -> None:
    global _writer, _limit
    writer, _writer, _limit = _writer, None, None
    if writer is not None:
        writer.stop()


def setup(level: str = "info", fmt: str = "logfmt", queued: bool = False) -> None:
    """Log to stderr at ``level``; ``queued`` (serve) through the writer thread, the sources'
    lines rate-limited (:class:`PerSourceLimit`)."""
    _stop_writer()
    formatter = JsonFormatter() if fmt == "json" else LogfmtFormatter()
    handler: logging.Handler
    if queued:
        global _writer, _limit
        _writer = LineWriter(sys.stderr, formatter)
        handler = QueuedLines(_writer.lines)
        _limit = PerSourceLimit()
        handler.addFilter(_limit)
        atexit.register(_stop_writer)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs every request at info; one line per scrape is noise at fleet scale
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
