"""The two errors a user fixes by editing what they gave us; the CLI prints either on one
line and exits 2.

A leaf module, so that every command module, ``cli.py`` and the config and
threshold-table loaders can import them without importing one another (the
command modules used to take ``UsageError`` from ``cli.py``, which imports them:
a cycle).
"""

from __future__ import annotations


class ConfigError(Exception):
    """A config value is wrong; the message names the key and what is allowed."""


class UsageError(Exception):
    """Bad command-line input: exit 2 with the message."""


__all__ = ["ConfigError", "UsageError"]
