"""A fast, forgiving line parser for Prometheus text exposition (format 0.0.4).

Built for scraping dcgm-exporter: it returns ``(name, labels, value)`` samples
and a count of lines it had to skip, and never raises on bad input. ``# HELP``
and ``# TYPE`` lines are skipped on purpose: dcgm-exporter's types are not to
be trusted (see :mod:`exporter.sources.dcgm.fields`), and a line parser does
not care in which order families come.

Why not ``prometheus_client.parser``: it builds family objects, validates
types and raises on the first bad line, and it is slow (``bench/dcgm_parse.py``
measures both on the same 100k-sample body; figures in
``docs/performance.md``). The fast path here splits label text with ``str``
methods (C code) and only falls back to a character scanner when a label value
holds an escape; label sets that repeat (every field of one GPU carries the
same labels) are parsed once per body.

Returned label dicts may be shared between samples of one body: treat them as
read-only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}

Sample = tuple[str, dict[str, str], float]


@dataclass(slots=True)
class ParseResult:
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0  # lines skipped as unparsable
    first_error: str = ""  # the first bad line, cut short, for a log message


def parse_text(text: str) -> ParseResult:
    """Parse exposition text; bad lines are skipped and counted, never raised."""
    result = ParseResult()
    samples = result.samples
    append = samples.append
    name_ok: dict[str, bool] = {}  # metric names (may hold ':') and label names checked once
    label_ok: dict[str, bool] = {}
    label_sets: dict[str, dict[str, str] | None] = {}
    errors = 0
    first_error = ""
    for line in text.split("\n"):
        if not line:
            continue
        first = line[0]
        if first == "#":
            continue
        if line[-1] == "\r":
            line = line[:-1]
            if not line:
                continue
        if first.isspace():
            line = line.strip()
            if not line or line[0] == "#":
                continue
        brace = line.find("{")
        if brace < 0:
            parts = line.split()
            if not parts:  # only (unicode) whitespace
                continue
            name = parts[0]
            rest = parts[1:]
            labels: dict[str, str] | None = {}
        else:
            name = line[:brace].rstrip()
            close = line.rfind("}")
            if close < brace:
                labels = None
                rest = []
            else:
                body = line[brace + 1:close]
                if body in label_sets:
                    labels = label_sets[body]
                else:
                    labels = label_sets[body] = _parse_labels(body, label_ok)
                rest = line[close + 1:].split()
        ok = name_ok.get(name)
        if ok is None:
            ok = name_ok[name] = _METRIC_NAME.fullmatch(name) is not None
        value = _value(rest) if ok and labels is not None else None
        if value is None:
            errors += 1
            if not first_error:
                first_error = line[:200]
            continue
        append((name, labels, value))  # type: ignore[arg-type]
    result.errors = errors
    result.first_error = first_error
    return result


def _value(rest: list[str]) -> float | None:
    """The sample value from the text after the labels: ``value [timestamp_ms]``."""
    if len(rest) == 1:
        text = rest[0]
    elif len(rest) == 2:
        text = rest[0]
        stamp = rest[1]
        if not (stamp.isdigit() or (stamp[0] == "-" and stamp[1:].isdigit())):
            return None
    else:
        return None
    if "_" in text:  # Python's float() accepts "1_000"; the exposition format does not
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _parse_labels(body: str, known: dict[str, bool]) -> dict[str, str] | None:
    """``a="x",b="y"`` → {"a": "x", "b": "y"}; None if malformed.

    ``known`` caches which names were checked: label names repeat on every line.
    """
    if not body or body.isspace():
        return {}
    if "\\" in body:
        return _parse_labels_escaped(body)
    body = body.strip()
    if body[-1] == ",":  # a trailing comma is allowed
        body = body[:-1].rstrip()
    if not body or body[-1] != '"':
        return None
    labels: dict[str, str] = {}
    # Without backslashes a value cannot contain '"', so '",' only ever ends a pair.
    for pair in body[:-1].split('",'):
        key, sep, value = pair.partition('="')
        if not sep:
            return None
        ok = known.get(key)
        if ok is None:
            ok = known[key] = _LABEL_NAME.fullmatch(key.strip()) is not None
        if not ok or '"' in value:
            return None
        key = key.strip()
        if key in labels:
            return None
        labels[key] = value
    return labels


def _parse_labels_escaped(body: str) -> dict[str, str] | None:
    """The slow path: a character scanner that understands \\\\, \\" and \\n in values."""
    labels: dict[str, str] = {}
    i, n = 0, len(body)
    while i < n:
        while i < n and body[i] in " \t":
            i += 1
        if i >= n:
            break
        eq = body.find("=", i)
        if eq < 0:
            return None
        key = body[i:eq].strip()
        if key in labels or _LABEL_NAME.fullmatch(key) is None:
            return None
        j = eq + 1
        while j < n and body[j] in " \t":
            j += 1
        if j >= n or body[j] != '"':
            return None
        j += 1
        chars: list[str] = []
        while True:
            if j >= n:
                return None  # unterminated value: a truncated line
            c = body[j]
            if c == "\\":
                if j + 1 >= n:
                    return None
                escaped = body[j + 1]
                chars.append(_ESCAPES.get(escaped, "\\" + escaped))
                j += 2
            elif c == '"':
                j += 1
                break
            else:
                chars.append(c)
                j += 1
        labels[key] = "".join(chars)
        while j < n and body[j] in " \t":
            j += 1
        if j < n:
            if body[j] != ",":
                return None
            j += 1
        i = j
    return labels
