"""Committed generated artefacts (rules, dashboards): write them atomically, or check for drift.

The generators render every file in memory first, so a bad input writes
nothing; ``--check`` compares byte for byte and writes nothing either.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from exporter.bounded_file import USAGE, read_bounded
from exporter.errors import UsageError


def differs(path: Path, text: str) -> bool:
    """Whether ``path`` holds other bytes than ``text``: read by the bounded reader, never
    past one byte more than ``text`` (a FIFO or /dev/zero at ``--out`` is out of date)."""
    expected = text.encode()
    try:
        return read_bounded(path, len(expected), USAGE, setting="--check") != expected
    except UsageError:  # missing, unreadable or longer: out of date too
        return True


def write_atomically(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode())
        os.chmod(temp, 0o644)
        os.replace(temp, path)  # readers see the old file or the new one, never half of one
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def check_or_write(files: Mapping[str, str], out: Path, *, check: bool, what: str,
                   command: str) -> int:
    """``--check``: exit 1 naming every file that differs. Otherwise write them all. Exit code."""
    if check:
        stale = [str(out / name) for name, text in files.items() if differs(out / name, text)]
        if stale:
            print(f"gpufleet: out of date: {', '.join(stale)} (run `{command}` and commit the "
                  "result)", file=sys.stderr)
            return 1
        print(f"{len(files)} {what} in {out} are up to date: "
              f"{', '.join(str(out / name) for name in files)}")
        return 0
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_atomically(out / name, text)
    except OSError as exc:
        print(f"gpufleet: cannot write {what} into {out}: {exc.strerror}", file=sys.stderr)
        return 1
    for name in files:
        print(f"wrote {out / name}")
    return 0
