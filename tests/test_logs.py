from __future__ import annotations

import json
import logging

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
