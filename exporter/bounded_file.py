"""The one bounded file reader: a file, a pipe or stdin read to a byte limit, never past it.

Every file a user names is hostile input: ``/dev/zero``, a 10 GB log or a FIFO nobody
writes to. :func:`read_bounded` reads at most one byte past the limit, refuses a regular
file whose size is already over it before reading anything, and words each refusal as
its caller's users know it (:class:`Wording`: the CLI names its flag, the web config
the dotted key), as one line in the caller's error class.

A leaf module (it imports only :mod:`exporter.errors`), so any command or loader may use it.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.errors import UsageError


@dataclass(frozen=True)
class Wording:
    """How one caller words the refusals. Each template is ``str.format``-ed with ``path``,
    ``limit`` (the bytes allowed), ``size`` (a regular file's, known before reading),
    ``reason`` (the OS's) and whatever the caller passes to :func:`read_bounded` (the
    defaults want ``setting``: the flag or key that sets the limit)."""

    error: type[Exception]
    cannot_read: str = "{path}: cannot read: {reason}"
    over_limit: str = "{path}: {size} bytes, over the {limit}-byte limit ({setting})"
    # found while reading: a pipe or a device has no size, and a file may grow after fstat
    grew_over_limit: str = "{path}: over the {limit}-byte limit ({setting})"
    # None: pipes and devices are read (up to the limit); else they are refused with this
    not_regular: str | None = None

    def fail(self, template: str, **fields: Any) -> Exception:
        return self.error(template.format(**fields))


# a command's file: its flag or config key named, exit 2
USAGE = Wording(UsageError)


def read_bounded(path: str | Path, limit: int, wording: Wording, *, dash_is_stdin: bool = False,
                 **context: Any) -> bytes:
    """At most ``limit`` bytes of ``path`` (``-``: stdin, when ``dash_is_stdin``), else
    ``wording.error`` with the matching template filled from ``context`` too."""
    fields = {"path": path, "limit": limit, **context}
    try:
        if dash_is_stdin and str(path) == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            data = _read(path, limit, wording, fields)
    except OSError as exc:
        raise wording.fail(wording.cannot_read, reason=exc.strerror or exc, **fields) from None
    if len(data) > limit:
        raise wording.fail(wording.grew_over_limit, **fields)
    return data


def _read(path: str | Path, limit: int, wording: Wording, fields: dict[str, Any]) -> bytes:
    # opened without blocking: a FIFO nobody writes to would hang open() for good (a token
    # file renamed over by one stopped the event loop). Reads then block again, so a pipe
    # with a writer (``--config <(...)``) is read to its end; one without reads as empty
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            if wording.not_regular is not None:
                raise wording.fail(wording.not_regular, **fields)
            os.set_blocking(file.fileno(), True)
        elif info.st_size > limit:
            raise wording.fail(wording.over_limit, size=info.st_size, **fields)
        return file.read(limit + 1)


__all__ = ["USAGE", "Wording", "read_bounded"]
