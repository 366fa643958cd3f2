"""Issue 32, Build 3: a flooding upstream logs one line per interval and per source, with
the count of the lines held back (exporter/logs.py, PerSourceLimit)."""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator

from exporter import logs
from exporter.logs import PerSourceLimit


@contextlib.contextmanager
def _queued_logging() -> Iterator[None]:
    """serve's logging (queued, rate-limited) for the block; the root logger as it was after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        logs.setup("info", "logfmt", queued=True)
        yield
    finally:
        logs._stop_writer()
        root.handlers[:] = handlers
        root.setLevel(level)


WATCH = "exporter.sources.kubernetes.informer"


def _record(name: str, msg: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_a_flooding_source_logs_once_per_interval_with_the_count_held_back():
    now = [0.0]
    limit = PerSourceLimit(interval=10.0, clock=lambda: now[0])
    passed = []
    for i in range(1000):  # a watch broken every 5 ms for 5 s, each error its own text
        now[0] = i * 0.005
        record = _record(WATCH, "kubernetes watch broken; retrying", source="kubernetes",
                         err=f"ClientPayloadError {i}")
        if limit.filter(record):
            passed.append(record)
    assert len(passed) == 1 and not hasattr(passed[0], "not_logged_since_last_line")
    assert limit.held_back == 999
    now[0] = 10.0
    later = _record(WATCH, "kubernetes watch broken; retrying", source="kubernetes")
    assert limit.filter(later)
    assert later.not_logged_since_last_line == 999
    # another source, another target, another GPU and another message each have their own line
    assert limit.filter(_record(WATCH, "kubernetes watch broken; retrying", source="other"))
    assert limit.filter(_record("exporter.sources.dcgm.source", "dcgm target down", target="a"))
    assert limit.filter(_record("exporter.sources.dcgm.source", "dcgm target down", target="b"))
    assert limit.filter(_record("exporter.sources.nvml.source", "GPU read failed", gpu=1))
    assert limit.filter(_record("exporter.sources.nvml.source", "GPU read failed", gpu=2))
    # loggers outside the sources are not limited
    assert all(limit.filter(_record("exporter.collect", "source read failed", source="kubernetes"))
               for _ in range(100))


def test_the_keys_remembered_are_bounded():
    now = [0.0]
    limit = PerSourceLimit(interval=10.0, clock=lambda: now[0], keys=100)
    assert sum(limit.filter(_record(WATCH, "x", target=f"t{i}")) for i in range(500)) == 100
    now[0] = 11.0  # the old keys expire and make room
    assert limit.filter(_record(WATCH, "x", target="new"))
    assert len(limit._seen) == 1


def test_serve_logging_limits_a_source_flood_written_to_stderr(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with _queued_logging():
        log = logging.getLogger("exporter.sources.slurm.source")
        for i in range(2000):  # one bad record after another in one read
            log.warning("slurm record skipped", extra={"source": "slurm", "err": f"record {i}"})
        logging.getLogger("exporter.collect").warning("source read failed",
                                                      extra={"source": "slurm"})
    lines = stream.getvalue().splitlines()
    assert sum('msg="slurm record skipped"' in line for line in lines) == 1
    assert sum('msg="source read failed"' in line for line in lines) == 1


def test_the_lines_not_written_are_served_by_reason_while_serve_logs(monkeypatch):
    """gpufleet_log_lines_dropped_total: the queue's drops and the rate limit's held-back
    lines of the installed queued logging; 0 without it (the golden exposition's)."""
    from exporter.cli.serve import log_families

    def served() -> dict[str, float]:
        (family,) = log_families()
        assert family.name == "gpufleet_log_lines_dropped_total"
        return {dict(labels)["reason"]: value for labels, value in family.samples}

    assert served() == {"queue_full": 0.0, "rate_limited": 0.0}
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with _queued_logging():
        for _ in range(30):
            logging.getLogger(WATCH).warning("kubernetes watch broken; retrying",
                                             extra={"source": "kubernetes"})
        assert served() == {"queue_full": 0.0, "rate_limited": 29.0}
    assert served() == {"queue_full": 0.0, "rate_limited": 0.0}


def test_a_flood_of_malformed_requests_logs_one_error_line(monkeypatch):
    """Issue 32, finding 17: aiohttp logs each malformed request at ERROR ("Error handling
    request from %s", the client's address an argument): 20,000 lines in 10 s before."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with _queued_logging():
        server = logging.getLogger("aiohttp.server")
        for i in range(20_000):
            server.error("Error handling request from %s", f"10.0.{i // 256}.{i % 256}")
    lines = stream.getvalue().splitlines()
    assert sum('msg="Error handling request from 10.0.0.0"' in line for line in lines) == 1
    assert len(lines) == 1
