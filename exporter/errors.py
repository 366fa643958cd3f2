"""The two errors a user fixes by editing what they gave us; the CLI prints either on one
line and exits 2.

A leaf module, so that every command module, ``cli.py`` and the config and
threshold-table loaders can import them without importing one another (the
command modules used to take ``UsageError`` from ``cli.py``, which imports them:
a cycle).
"""

from __future__ import annotations

import re

# what str.splitlines() breaks at: a key read from a file may hold any of them
_LINE_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``\\n``), so an error stays one line."""
    return _LINE_BREAK.sub(lambda m: repr(m.group())[1:-1], text)


class ConfigError(Exception):
    """A config value is wrong; the message names the key and what is allowed."""


class UsageError(Exception):
    """Bad command-line input: exit 2 with the message."""


__all__ = ["ConfigError", "UsageError", "one_line"]
