"""A bench's share of the CPU on a machine others use: ``--priority NICE``."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def prioritise(nice: int) -> None:
    """This process and what it starts from now on at ``nice``, in a session of its own.

    With autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``), the kernel
    shares the CPU between sessions first and weighs a process's nice only within its
    session: a ``nice -n -15`` engine still gets one session's share against every other
    terminal's work. A session's own nice is its autogroup's (``/proc/self/autogroup``)."""
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except PermissionError:
            sys.exit("--priority: this process leads its process group and cannot start a "
                     "session; run the bench under `setsid`")
    autogroup = Path("/proc/self/autogroup")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        if autogroup.exists():
            autogroup.write_text(f"{nice}\n")
    except OSError as error:
        sys.exit(f"--priority {nice}: {error.strerror} (a negative nice needs root)")
    group = autogroup.read_text().strip() if autogroup.exists() else "no autogroup"
    print(f"priority: nice {nice}, session {os.getsid(0)}, {group}", flush=True)
