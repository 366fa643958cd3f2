"""What ``gpufleet act`` runs against Slurm, shared by its drains and its weights: scontrol
with a deadline, the one-node check before any update, and the audit log's append and read.

Each takes the exception class its caller reports with, so a failure stays one line of
that caller's audit log.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

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


# a job id as Slurm prints it: JOBID, or an array task JOBID_TASK; anything else on
# scontrol's command line could name more than one job ("ALL")
_JOB_ID = re.compile(r"[0-9]+(?:_[0-9]+)?")


def is_job_id(text: str) -> bool:
    """Whether ``text`` is one Slurm job id, and nothing scontrol would expand to others."""
    return _JOB_ID.fullmatch(text) is not None


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


def lines(stream: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """Each line of ``stream``, or None for one over ``limit`` bytes (skipped a piece at a
    time): never more than ``limit`` + 1 bytes in memory."""
    while chunk := stream.readline(limit + 1):
        if len(chunk) <= limit or chunk.endswith(b"\n"):
            yield chunk
            continue
        while (chunk := stream.readline(limit + 1)) and not chunk.endswith(b"\n"):
            pass
        yield None


def audit_records(path: Path, limit: int, error: type[Exception]) -> Iterator[dict[str, Any]]:
    """Each JSON object of the audit log at ``path``, oldest first; nothing when it does not
    exist; ``error`` when it is not a regular file. A line over ``limit`` bytes or cut by a
    crash is no record and is passed over."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not hang the start
    except FileNotFoundError:
        return
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as log:
        if not stat.S_ISREG(os.fstat(log.fileno()).st_mode):
            raise error(f"{path}: not a regular file")
        for line in lines(log, limit):
            try:
                record = json.loads(line) if line is not None else None
            except ValueError:
                continue  # a line cut by a crash
            if isinstance(record, dict):
                yield record


__all__ = ["SCONTROL_TIMEOUT", "append", "audit_records", "lines", "one_node", "run"]
