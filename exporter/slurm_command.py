"""What ``gpufleet act`` runs against Slurm, shared by its drains and its weights: scontrol
with a deadline, the one-node check before any update, and the audit log's append.

Each takes the exception class its caller reports with, so a failure stays one line of
that caller's audit log.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

SCONTROL_TIMEOUT = 30.0  # seconds: a slurmctld that does not answer is a failure, not a hang


def run(argv: list[str], env: Mapping[str, str] | None, error: type[Exception]) -> str:
    """``argv``'s standard output; ``error`` with one line when it cannot run, times out or fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT,
                              check=False, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise error(f"{argv[0]}: {exc}") from None
    if done.returncode != 0:
        command = " ".join([Path(argv[0]).name, *argv[1:3]])
        raise error(f"{command}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def one_node(scontrol: str, name: str, env: Mapping[str, str] | None, error: type[Exception]) -> str:
    """Slurm's one line for node ``name``; ``error`` unless it names exactly that node (a
    NodeSet, or a name Slurm expands, answers several, and ``update`` would take them all)."""
    lines = [line for line in run([scontrol, "show", "node", "-o", name], env, error).splitlines()
             if line.strip()]
    if len(lines) != 1 or lines[0].split(" ", 1)[0] != f"NodeName={name}":
        raise error(f"scontrol show node {name}: answers {len(lines)} node(s), not exactly the "
                    "node of that name (a NodeSet?); not acting")
    return lines[0]


def append(path: Path, data: bytes, error: type[Exception]) -> None:
    """One write at the end of ``path``, a regular file (created if missing): never a wait on a
    FIFO, never a write into a device."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        raise error(f"{path}: cannot write: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{path}: not a regular file")
        os.write(fd, data)
    except OSError as exc:
        raise error(f"{path}: cannot write: {exc.strerror}") from None
    finally:
        os.close(fd)


__all__ = ["SCONTROL_TIMEOUT", "append", "one_node", "run"]
