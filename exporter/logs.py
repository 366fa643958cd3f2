"""One line per event, as logfmt or JSON. Never a secret: callers pass no tokens here."""

from __future__ import annotations

import json
import logging
import sys
import time

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


def setup(level: str = "info", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs every request at info; one line per scrape is noise at fleet scale
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
