"""The two errors a user fixes by editing what they gave us; the CLI prints either on one
line and exits 2.

A leaf module, so that every command module, ``cli.py`` and the config and
threshold-table loaders can import them without importing one another (the
command modules used to take ``UsageError`` from ``cli.py``, which imports them:
a cycle).
"""

from __future__ import annotations

import re
import reprlib

# what str.splitlines() breaks at: a key read from a file may hold any of them
_LINE_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``\\n``), so an error stays one line."""
    return _LINE_BREAK.sub(lambda m: repr(m.group())[1:-1], text)


QUOTE_LIMIT = 80  # characters of a value an error message quotes (issue 14: a 9**9-item value)


def _bounded_repr() -> reprlib.Repr:
    # reprlib stops at these sizes instead of formatting everything and cutting after: the
    # billion laughs is a list the repr of which never finishes (100% CPU, +45 MB/s)
    shape = reprlib.Repr()
    shape.maxlevel, shape.maxlist, shape.maxdict, shape.maxtuple = 3, 4, 4, 4
    shape.maxstring = shape.maxother = shape.maxlong = QUOTE_LIMIT + 2
    return shape


_REPR = _bounded_repr()


def quoted(value: object) -> str:
    """``repr(value)`` with at most :data:`QUOTE_LIMIT` characters of the value, on one line:
    a longer string is cut and marked (``'xxx…' (300 characters)``), a list or mapping is cut
    at a few items and a few levels, never formatted whole."""
    if isinstance(value, str):
        if len(value) <= QUOTE_LIMIT:
            return one_line(repr(value))
        return one_line(f"{value[:QUOTE_LIMIT]!r}") + f"... ({len(value):,} characters)"
    try:
        text = one_line(_REPR.repr(value))
    except ValueError:  # an int past sys.get_int_max_str_digits() (4,300) has no repr
        return f"an integer of {value.bit_length():,} bits" if isinstance(value, int) else "?"
    return text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT] + "..."


class ConfigError(Exception):
    """A config value is wrong; the message names the key and what is allowed."""


class UsageError(Exception):
    """Bad command-line input: exit 2 with the message."""


__all__ = ["QUOTE_LIMIT", "ConfigError", "UsageError", "one_line", "quoted"]
