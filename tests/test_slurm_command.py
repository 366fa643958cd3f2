"""``run_command``, the slurm source's one subprocess: no child outlives the call.

No Slurm here: shell scripts stand in for the clients. A child of ours must be
gone, reaped, not a zombie; a wrapper's own child, which init reaps, dead.
Callers give up on a command in three ways: the command's own ``command_timeout``,
a cancellation from outside (the collector's ``source_timeout`` is a
``wait_for``), and a sibling command failing first inside one read.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.sources.slurm import children
from exporter.sources.slurm.options import SlurmSource as SlurmConfig
from exporter.sources.slurm.source import SlurmAllocationSource, SlurmCommandError, run_command
from tests.helpers.stall import LoopWitness


@contextlib.contextmanager
def unraisable() -> Iterator[list[sys.UnraisableHookArgs]]:
    """What reaches sys.unraisablehook inside the block, garbage collection included.

    A child left behind keeps its transport, whose ``__del__`` then fails with "Event
    loop is closed" once ``asyncio.run`` has closed the loop.
    """
    caught: list[sys.UnraisableHookArgs] = []
    previous, sys.unraisablehook = sys.unraisablehook, caught.append
    try:
        yield caught
        gc.collect()
    finally:
        sys.unraisablehook = previous


def _gone(pid: int) -> bool:
    """True once ``pid`` is reaped: a zombie still answers signal 0."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _dead(pid: int) -> bool:
    """Reaped, or a zombie: for a grandchild, which init (not this process) reaps."""
    try:
        return _gone(pid) or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def spawned(monkeypatch) -> Iterator[list[asyncio.subprocess.Process]]:
    """Every child run_command starts, as asyncio hands it over: its PID known from the start."""
    children: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def recording(*args, **kwargs) -> asyncio.subprocess.Process:
        proc = await spawn(*args, **kwargs)
        children.append(proc)
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
    yield children
    _kill([c.pid for c in children])


def _script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "client"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return [str(script)]


def _ends_marked(tmp_path: Path) -> str:
    """Shell words for a process that sleeps 20 s, then marks that it ran to its end.

    The shell running them is the one holder of the client's pipes (the sleep writes
    elsewhere), so a call that waited for it (its pipes, its group) instead of killing it
    returns only after the mark is written: the mark, not the call's duration, tells the
    two apart. 20 s: far more than a kill takes on a loaded machine, far less than any
    deadline here."""
    return f"sleep 20 >/dev/null 2>&1; echo ran > {tmp_path}/ran"


def _ran_to_its_end(tmp_path: Path) -> bool:
    return (tmp_path / "ran").exists()


def _pids(*paths: Path) -> list[int]:
    deadline = time.monotonic() + 10
    while not all(p.exists() and p.read_text().strip() for p in paths):
        assert time.monotonic() < deadline, "the client never wrote its pid"
        time.sleep(0.01)
    return [int(p.read_text()) for p in paths]


def _kill(pids: list[int]) -> None:
    for pid in pids:  # only if the code under test left them: the test's own children
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_command_its_caller_gives_up_on_is_killed_and_reaped(tmp_path, spawned):
    """The collector's wait_for (source_timeout) cancels run_command mid-communicate."""
    argv = _script(tmp_path, "exec sleep 30")

    async def give_up() -> None:
        with pytest.raises(TimeoutError):  # the caller's timeout, not command_timeout
            await asyncio.wait_for(run_command(argv, 30, os.environ), 1.0)

    with unraisable() as caught:
        asyncio.run(give_up())
    (child,) = spawned
    assert child.returncode == -signal.SIGKILL  # killed: not waited for until it ended itself
    assert _gone(child.pid), "the cancelled command's child lives on"
    assert caught == []


def test_a_cancelled_command_takes_its_whole_process_group(tmp_path):
    """A wrapper's own children hold the pipes too: cancel() must not wait 120 s for them.

    Under a CPU hog (make test-stress) the script can write its pids before
    create_subprocess_exec has returned, so the cancel also lands mid-spawn."""
    argv = _script(tmp_path, f"echo $$ > {tmp_path}/pid\n({_ends_marked(tmp_path)}) &\n"
                             f"echo $! > {tmp_path}/child\nwait")
    pids: list[int] = []

    async def cancel() -> None:
        task = asyncio.create_task(run_command(argv, 30, os.environ))
        pids.extend(await asyncio.to_thread(_pids, tmp_path / "pid", tmp_path / "child"))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        task.cancel()  # cancelled again while it reaps: nothing is skipped

    try:
        with unraisable() as caught:
            asyncio.run(cancel())
        child, grandchild = pids
        assert _gone(child), "the cancelled command's child lives on"
        deadline = time.monotonic() + 5  # SIGKILL is delivered at once, but not synchronously
        while not _dead(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _dead(grandchild), "the wrapper's child lives on"
        assert not _ran_to_its_end(tmp_path), "the cancel waited for the wrapper's child"
        assert caught == []
    finally:
        _kill(pids)


def test_a_command_cancelled_while_it_spawns_is_killed_with_its_group(tmp_path):
    """Cancelled at its first suspension, inside create_subprocess_exec: the child already runs
    (it is forked before the pipes connect). asyncio would kill the wrapper alone and wait for
    the pipes its child holds (120 s); run_command completes the spawn, then kills the group."""
    argv = _script(tmp_path, f"({_ends_marked(tmp_path)}) &\necho $! > {tmp_path}/child\nwait")

    async def cancel() -> None:
        task = asyncio.create_task(run_command(argv, 30, os.environ))
        await asyncio.sleep(0)  # the task runs up to its first await: forked, pipes not connected
        await asyncio.to_thread(_pids, tmp_path / "child")  # the group is there, holding the pipes
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    grandchild: list[int] = []
    try:
        with unraisable() as caught:
            asyncio.run(cancel())
        assert caught == []
        assert not _ran_to_its_end(tmp_path), "the cancel waited for the spawned command's group"
        child = tmp_path / "child"
        if child.exists() and child.read_text().strip():  # killed before it got there: no group
            grandchild.append(int(child.read_text()))
            deadline = time.monotonic() + 5  # SIGKILL is delivered at once, not synchronously
            while not _dead(grandchild[0]) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _dead(grandchild[0]), "the spawned command's group lives on"
    finally:
        _kill(grandchild)


def test_a_slow_command_is_killed_reaped_and_named(tmp_path, spawned):
    argv = _script(tmp_path, "exec sleep 30")
    with unraisable() as caught, pytest.raises(SlurmCommandError, match=r"no answer within 0.3s"):
        asyncio.run(run_command(argv, 0.3, os.environ))
    (child,) = spawned
    assert child.returncode == -signal.SIGKILL and _gone(child.pid)
    assert caught == []


def test_a_failed_command_stops_the_one_run_beside_it(tmp_path):
    """squeue fails at once: sinfo, started with it, must not run on behind the failed read."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(  # fails once sinfo runs
        f"#!/bin/sh\nwhile [ ! -s {tmp_path}/pid ]; do sleep 0.01; done\n"
        "echo 'squeue: error: Invalid user' >&2\nexit 1\n")
    (bin_dir / "sinfo").write_text(
        f"#!/bin/sh\necho $$ > {tmp_path}/pid\n{_ends_marked(tmp_path)}\n")
    for command in ("squeue", "sinfo"):
        (bin_dir / command).chmod(0o755)
    src = SlurmAllocationSource(SlurmConfig(enabled=True, format="json", bin_dir=str(bin_dir),
                                            command_timeout=30), time.time)

    async def read_and_look() -> tuple[int, bool]:
        with pytest.raises(SlurmCommandError, match="Invalid user"):
            await src.read()
        pid = _pids(tmp_path / "pid")[0]  # sinfo started before squeue's failure came back
        # looked at before asyncio.run ends: its shutdown cancels any task left behind
        return pid, _gone(pid)

    pid = 0
    try:
        with unraisable() as caught:
            pid, gone = asyncio.run(read_and_look())
        assert gone, "sinfo lives on after the read failed"
        assert not _ran_to_its_end(tmp_path), "the failed read waited for sinfo"
        assert caught == []
    finally:
        _kill([pid] if pid else [])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _run(work) -> list[sys.UnraisableHookArgs]:
    """``asyncio.run(work)``; what reached sys.unraisablehook meanwhile."""
    with unraisable() as caught:
        asyncio.run(work)
        return caught


def _wait_dead(pids: list[int]) -> list[int]:
    """Those of ``pids`` still alive 5 s on (SIGKILL lands at once, not synchronously)."""
    deadline = time.monotonic() + 5
    while any(not _dead(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if not _dead(p)]


@pytest.mark.parametrize("escape", [
    # the common site wrapper: timeout puts itself in a process group of its own
    "timeout 60 sh -c 'echo $$ > {tmp}/escaped; {ends}' &",
    # a child that leaves the session: not in the group, and holding the pipe
    "setsid sh -c 'echo $$ > {tmp}/escaped; {ends}' &",
])
def test_a_slow_command_ends_at_its_deadline_with_what_escaped_its_group(tmp_path, escape):
    """Issue 32, finding 1: killpg missed the escaped child, and waiting for the pipe it held
    to close froze the read for 60 s, cancellation and all."""
    argv = _script(tmp_path, escape.format(tmp=tmp_path, ends=_ends_marked(tmp_path)) + "\nwait")
    fds = _open_fds()
    escaped: list[int] = []

    async def run() -> None:
        with pytest.raises(SlurmCommandError, match=r"no answer within 1s"):
            await run_command(argv, 1.0, os.environ)

    try:
        caught = _run(run())
        escaped = _pids(tmp_path / "escaped")
        assert _wait_dead(escaped) == [], "the escaped child lives on"
        assert not _ran_to_its_end(tmp_path), "the read waited for the escaped child"
        assert _open_fds() == fds, "the read left file descriptors open"
        assert caught == []
    finally:
        _kill(escaped)


def test_a_cancelled_read_is_not_held_by_a_child_that_escaped_its_group(tmp_path):
    """The collector's source_timeout cancels the read: the cancel ends it, not the pipe."""
    argv = _script(tmp_path, f"setsid sh -c 'echo $$ > {tmp_path}/escaped; "
                             f"{_ends_marked(tmp_path)}' &\nwait")
    escaped: list[int] = []

    async def give_up() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run_command(argv, 30, os.environ), 1.0)

    try:
        caught = _run(give_up())
        escaped = _pids(tmp_path / "escaped")
        assert _wait_dead(escaped) == []
        assert not _ran_to_its_end(tmp_path), "the cancel waited for the escaped child"
        assert caught == []
    finally:
        _kill(escaped)


def test_no_process_of_a_tree_runs_on_while_it_is_killed_child_first(tmp_path, monkeypatch):
    """What the cancel kills in one pass is stopped first: a shell whose ``sleep`` is killed
    before it would otherwise wake and run its next command before its own SIGKILL lands (the
    order of a set of PIDs is any). Here every SIGKILL is followed by 0.3 s, the sleep's
    first: killed one by one, the shell writes its mark in between."""
    shell = subprocess.Popen(
        ["sh", "-c", f"sleep 20 >/dev/null 2>&1 & echo $! > {tmp_path}/child; wait; "
                     f"echo ran > {tmp_path}/ran"], start_new_session=True)
    (child,) = _pids(tmp_path / "child")
    signalled = os.kill

    def slowly(pid: int, number: int) -> None:
        signalled(pid, number)
        if number == signal.SIGKILL:
            time.sleep(0.3)

    monkeypatch.setattr(os, "kill", slowly)
    try:
        children.kill([child, shell.pid])
        monkeypatch.undo()
        assert shell.wait(timeout=10) == -signal.SIGKILL
        assert _wait_dead([child]) == []
        assert not _ran_to_its_end(tmp_path), "the shell ran on after its sleep was killed"
    finally:
        monkeypatch.undo()
        _kill([child, shell.pid])
        with contextlib.suppress(subprocess.TimeoutExpired):
            shell.wait(timeout=5)


def test_a_command_that_answered_and_exited_is_not_slow_for_the_child_it_left(tmp_path):
    """Issue 32, finding 12: the client printed its answer and exited 0, leaving a child that
    holds stdout. The answer stands (it was "no answer within 5s"); the child and the fds go,
    and the answer does not wait for the child: the child would end (writing its mark) well
    before the command's own deadline, so a read held by its pipe returns only after that."""
    argv = _script(tmp_path, f"echo answer\nsetsid sh -c 'echo $$ > {tmp_path}/escaped; "
                             f"{_ends_marked(tmp_path)}' &\n"
                             f"while [ ! -s {tmp_path}/escaped ]; do sleep 0.01; done\nexit 0")
    fds = _open_fds()
    escaped: list[int] = []
    try:
        with unraisable() as caught:
            out = asyncio.run(run_command(argv, 60.0, os.environ))
        escaped = _pids(tmp_path / "escaped")
        assert out == "answer\n"
        assert _wait_dead(escaped) == [], "the child the client left lives on"
        assert not _ran_to_its_end(tmp_path), "the answer waited for the child the client left"
        assert _open_fds() == fds
        assert caught == []
    finally:
        _kill(escaped)


def test_parsing_runs_off_the_event_loop(monkeypatch):
    """Issue 32, finding 10: 100 MB of scontrol output stalled scrapes for 7-12 s while it
    parsed on the loop. The parse must run off the loop: while it runs, the loop still answers."""
    from exporter.sources.slurm import source as slurm_source
    samples = Path(__file__).parent.parent / "data" / "slurm-samples"
    texts = {"job": (samples / "scontrol_show_job_d_o.txt").read_text(),
             "node": (samples / "scontrol_show_node_d_o.txt").read_text()}
    witness = LoopWitness()
    monkeypatch.setattr(slurm_source, "parse_scontrol_nodes", witness.wrap(slurm_source.parse_scontrol_nodes))

    async def runner(argv, timeout, env) -> str:
        return texts[argv[2]]

    src = SlurmAllocationSource(SlurmConfig(enabled=True, format="text"), time.time,
                                runner=runner)

    reading = asyncio.run(witness.watch(src.read()))
    assert len(reading.gpus) > 0
    assert witness.turned == [True], "scontrol's output was parsed on the event loop, which stood still"


def test_output_past_max_output_bytes_fails_the_read_before_it_is_all_in_memory(tmp_path,
                                                                                  spawned):
    """Build 2 of issue 32: 100 MB of scontrol output was read whole, then parsed."""
    argv = _script(tmp_path, "exec yes 'NodeName=n1 word word word'")  # endless output
    with unraisable() as caught, pytest.raises(  # endless output: without the cap, never
            SlurmCommandError, match=r"output over max_output_bytes \(1048576 bytes\); not read"):
        asyncio.run(run_command(argv, 30, os.environ, max_bytes=1024 * 1024))
    (child,) = spawned
    assert _gone(child.pid)
    assert caught == []
    exact = _script(tmp_path, "head -c 1048576 /dev/zero")  # at the cap: read whole
    assert len(asyncio.run(run_command(exact, 30, os.environ, max_bytes=1024 * 1024))) == 1048576


def test_the_source_passes_its_max_output_bytes(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nhead -c 5000 /dev/zero\n")
    (bin_dir / "scontrol").chmod(0o755)
    src = SlurmAllocationSource(SlurmConfig(enabled=True, format="text", bin_dir=str(bin_dir),
                                            max_output_bytes=4096), time.time)
    with pytest.raises(SlurmCommandError, match=r"over max_output_bytes \(4096 bytes\)"):
        asyncio.run(src.read())


def _fake_scontrol(bin_dir: Path, nodes: str) -> None:
    """A ``scontrol`` that lists ``nodes`` (show node) and no job (show job)."""
    bin_dir.mkdir()
    (bin_dir / "nodes.txt").write_text(nodes)
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\nif [ "$2" = node ]; then cat {bin_dir / "nodes.txt"}; fi\n')
    (bin_dir / "scontrol").chmod(0o755)


def _node(name: str, gres: str) -> str:
    return (f"NodeName={name} CPUTot=64 Gres={gres} State=IDLE ThreadsPerCore=1 "
            "Partitions=gpu-h100\n")


def test_the_snapshots_gpus_are_capped_by_max_gpus(tmp_path):
    """As the Kubernetes source's max_gpus: the nodes' GPUs summed before the snapshot is
    built, and over the cap the read fails with the reason (the last good view is served)."""
    bin_dir = tmp_path / "bin"
    _fake_scontrol(bin_dir, "".join(_node(f"gpu-{i}", "gpu:h100:8") for i in range(3)))
    config = SlurmConfig(enabled=True, format="text", bin_dir=str(bin_dir), max_gpus=16)
    with pytest.raises(SlurmCommandError) as caught:
        asyncio.run(SlurmAllocationSource(config, time.time).read())
    assert str(caught.value) == "24 GPUs on 3 nodes, over sources.slurm.max_gpus (16): not read"
    at_cap = SlurmConfig(enabled=True, format="text", bin_dir=str(bin_dir), max_gpus=24)
    assert len(asyncio.run(SlurmAllocationSource(at_cap, time.time).read()).gpus) == 24


def test_one_node_claiming_two_million_gpus_is_skipped_not_built(tmp_path):
    bin_dir = tmp_path / "bin"
    _fake_scontrol(bin_dir, _node("gpu-001", "gpu:h100:8")
                   + _node("gpu-666", ",".join(["gpu:h100:1024"] * 2000)))
    src = SlurmAllocationSource(SlurmConfig(enabled=True, format="text", bin_dir=str(bin_dir)),
                                time.time)
    reading = asyncio.run(src.read())
    assert {g.node for g in reading.gpus} == {"gpu-001"} and len(reading.gpus) == 8
    assert reading.parse_errors == 1
