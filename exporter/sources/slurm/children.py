"""Find and kill what a Slurm client left behind, through /proc.

Killing the client's process group is not enough. ``timeout 60 scontrol``, a
common site wrapper, moves itself into its own process group; a ``setsid``
child leaves the session; either keeps the client's stdout open, and a pipe
reader waits for it. So at the deadline every process that descends from the
client, shares its session, or holds one of its pipes is killed by PID. The
descendants are listed before anything is killed: once the client dies, its
children are handed to init and the parent links that name them are gone; the
pipe holders are found again afterwards, for a child forked meanwhile.

Only on Linux (/proc); elsewhere the lists are empty and the process group
kill is all there is.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

PROC = Path("/proc")


def _stats() -> Iterator[tuple[int, int, int]]:
    """(pid, parent pid, session id) of every process /proc shows."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(PROC):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
            fields = stat.rsplit(")", 1)[1].split()
            yield int(entry.name), int(fields[1]), int(fields[3])


def related(root: int) -> set[int]:
    """PIDs that descend from ``root`` or share its session (``root`` itself excluded)."""
    children: dict[int, list[int]] = {}
    found: set[int] = set()
    for pid, parent, session in _stats():
        children.setdefault(parent, []).append(pid)
        if session == root:  # the client leads its own session (start_new_session)
            found.add(pid)
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(root)
    found.discard(os.getpid())
    return found


def pipe_holders(inodes: Iterable[int]) -> set[int]:
    """PIDs, other than this process, with a file descriptor on one of these pipes."""
    wanted = {f"pipe:[{inode}]" for inode in inodes}
    me = os.getpid()
    holders: set[int] = set()
    if not wanted:
        return holders
    with contextlib.suppress(OSError):
        for entry in os.scandir(PROC):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                fds = os.scandir(Path(entry.path, "fd"))
            except OSError:  # gone, or another user's
                continue
            with fds:
                for fd in fds:
                    try:
                        if os.readlink(fd.path) in wanted:
                            holders.add(int(entry.name))
                            break
                    except OSError:
                        continue
    return holders


def _signal(pids: Iterable[int], number: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, number)


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each of ``pids``, every one stopped (SIGSTOP) first: killed one by one, a
    parent would wake to a child's end and run on before its own SIGKILL lands (a shell's
    next command after ``sleep``), whichever order the PIDs come in."""
    pids = tuple(pids)
    _signal(pids, signal.SIGSTOP)
    _signal(pids, signal.SIGKILL)


def kill_all(root: int, inodes: Iterable[int], root_alive: bool) -> list[int]:
    """Kill ``root``'s group and everything :func:`related` to it or holding its pipes.

    Returns the escaped PIDs killed (outside the group kill), for the log line.
    ``root_alive`` is False once ``root`` is reaped: its PID, and so its group id,
    may then belong to someone else.
    """
    inodes = tuple(inodes)
    escaped = (related(root) if root_alive else set()) | pipe_holders(inodes)
    _signal(escaped, signal.SIGSTOP)  # none of them runs on while the group dies
    if root_alive:
        for number in (signal.SIGSTOP, signal.SIGKILL):  # the group too, as kill() says
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(root, number)
    _signal(escaped, signal.SIGKILL)  # stopped above
    late = pipe_holders(inodes) - escaped  # forked between the listing and the kill
    kill(late)
    return sorted(escaped | late)
