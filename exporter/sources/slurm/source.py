"""The ``slurm`` source: nodes, GPU allocations and pending demand from a real Slurm.

It runs Slurm's own clients as async subprocesses, each bounded by
``command_timeout``: ``squeue --json`` and ``sinfo --json`` (Slurm 21.08 and
later), or ``scontrol show job -d -o`` and ``scontrol show node -d -o`` where
JSON is missing (``format: auto`` switches once, on the first sign that the
JSON output is unsupported). Parsing lives in :mod:`exporter.sources.slurm.parse`.

Its ``role`` is ``allocation``: it is the scheduler's view (which job holds which
GPU index on which node, with how many CPUs). Enabled with a telemetry source,
the collector joins the two (:mod:`exporter.compose`); alone, it serves the GPU
inventory with allocations and no telemetry.

Parsing runs in a worker thread, in time linear in the output: 100 MB of
``scontrol`` output must not stall the scrapes the event loop serves.

A failing or slow command fails the read. The collector then marks the source
down and keeps serving the last good reading with every GPU stale; the next
successful read replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from exporter.aio import complete
from exporter.gpu_catalogue import Catalogue, default_catalogue
from exporter.sources import Clock, SourceReading, SourceStartupError
from exporter.sources.emptied import EmptiedFleet
from exporter.sources.slurm import children
from exporter.sources.slurm.options import SlurmSource as SlurmConfig
from exporter.sources.slurm.parse import (
    SlurmJob,
    SlurmNode,
    SlurmParseError,
    node_threads,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_json,
    to_snapshot,
)

log = logging.getLogger(__name__)

COMMANDS = ("squeue", "sinfo", "scontrol")


class SlurmCommandError(Exception):
    """A Slurm client failed, timed out or printed an error; one line, names the command."""


class JsonUnsupported(SlurmCommandError):
    """This Slurm's clients cannot write JSON (before 21.08, or no serializer plugin)."""


# stderr of a client that lacks --json: "unrecognized option '--json'" (before 21.08),
# "No serializer" / "data_parser" when the plugin is missing
_NO_JSON_HINTS = ("unrecognized option", "invalid option", "serializer", "data_parser", "--json")

Runner = Callable[[Sequence[str], float, Mapping[str, str]], Awaitable[str]]


# Most of a client's stdout read: 100 MB of scontrol output stalled scrapes for seconds,
# and each byte is held three times over (bytes, text, records) under MemoryMax=1G.
DEFAULT_MAX_OUTPUT_BYTES = SlurmConfig().max_output_bytes
_MAX_STDERR_BYTES = 64 * 1024  # only its first line is ever shown


async def run_command(argv: Sequence[str], timeout: float, env: Mapping[str, str],
                      max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> str:
    """Run one client; its stdout, or :class:`SlurmCommandError`, by ``timeout`` at the latest.

    The child never outlives the call: one that is slow, or whose caller gives up
    on it (a cancellation, such as the collector's ``source_timeout``), is killed
    before the call ends, with whatever it left behind (:mod:`.children`): its
    process group, a ``timeout`` wrapper that moved to a group of its own, a
    ``setsid`` child holding the pipe. The pipes are then closed from this end, so
    the call never waits for a writer it could not kill. A client that answered
    and exited, leaving a child that holds its stdout open, is not slow: its
    answer stands, and the child is killed.
    """
    # The child runs before create_subprocess_exec returns (it still connects the pipes):
    # a cancellation then would lose the only handle on a live child. So the spawn is
    # completed whatever happens, and a child spawned for a cancelled call is killed too.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    spawning = asyncio.ensure_future(asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env=dict(env), start_new_session=True,
    ))
    try:
        proc = await complete(spawning)
    except OSError as exc:
        raise SlurmCommandError(f"{argv[0]}: cannot run: {exc.strerror}") from None
    except asyncio.CancelledError:
        if not spawning.cancelled() and spawning.exception() is None:
            await _stop(spawning.result(), argv)
        raise
    try:
        stdout, stderr = await _answer(proc, deadline, argv, max_bytes)
    except BaseException as exc:  # timed out, cancelled, or anything else: no child left behind
        await _stop(proc, argv)
        if isinstance(exc, _OverCap):
            raise SlurmCommandError(
                f"{' '.join(argv[:3])}: output over max_output_bytes ({max_bytes} bytes); "
                "not read") from None
        if isinstance(exc, TimeoutError):
            raise SlurmCommandError(
                f"{' '.join(argv[:3])}: no answer within {timeout:g}s (slurmctld down or slow?)"
            ) from None
        raise
    if proc.returncode != 0:
        message = stderr.decode(errors="replace").strip().splitlines()
        first = message[0] if message else f"exit status {proc.returncode}"
        error = JsonUnsupported if "--json" in argv and _json_unsupported(first) else \
            SlurmCommandError
        raise error(f"{' '.join(argv[:3])}: {first}")
    return stdout.decode(errors="replace")


# How often the wait for the output looks whether the client has exited, and how long
# its pipes may stay open after it did (output still in the pipe is read meanwhile)
_EXIT_POLL_SECONDS = 0.05
_HELD_PIPE_GRACE_SECONDS = 0.2
# Longest wait for a SIGKILLed child to be reaped, its pipes closed from this end: only a
# process stuck in the kernel (D state) takes longer, and the read does not wait for it
_REAP_SECONDS = 1.0


class _OverCap(Exception):
    """The client's stdout passed max_output_bytes."""


async def _read_capped(stream: asyncio.StreamReader | None, cap: int, fail: bool) -> bytes:
    """``stream`` to its end; past ``cap`` bytes, :class:`_OverCap` (``fail``) or the rest
    read and dropped (stderr, drained so the client never blocks on it)."""
    data = bytearray()
    while stream is not None:
        chunk = await stream.read(256 * 1024)
        if not chunk:
            break
        if fail and len(data) + len(chunk) > cap:
            raise _OverCap
        data += chunk[:max(0, cap - len(data))]
    return bytes(data)


async def _communicate(proc: asyncio.subprocess.Process, max_bytes: int) -> tuple[bytes, bytes]:
    """``proc.communicate()`` with stdout capped before it is all in memory."""
    stdout, stderr = await asyncio.gather(_read_capped(proc.stdout, max_bytes, fail=True),
                                          _read_capped(proc.stderr, _MAX_STDERR_BYTES,
                                                       fail=False))
    await proc.wait()
    return stdout, stderr


async def _answer(proc: asyncio.subprocess.Process, deadline: float,
                  argv: Sequence[str], max_bytes: int) -> tuple[bytes, bytes]:
    """The client's stdout and stderr once it has exited; TimeoutError at ``deadline``.

    ``communicate`` alone ends at end of file, which a child the client left may
    hold off for ever; so the exit is watched too, and pipes still open after it
    are closed here, once their holders are killed.
    """
    loop = asyncio.get_running_loop()
    reading = asyncio.ensure_future(_communicate(proc, max_bytes))
    try:
        exited_at: float | None = None
        while not reading.done():
            now = loop.time()
            if now >= deadline:
                raise TimeoutError
            if exited_at is None and proc.returncode is not None:
                exited_at = now
            if exited_at is not None and now - exited_at >= _HELD_PIPE_GRACE_SECONDS:
                escaped = await _stop(proc, argv)
                log.warning("Slurm client exited, leaving processes that held its output "
                            "open; killed them", extra={"command": " ".join(argv[:3]),
                                                        "pids": ",".join(map(str, escaped))})
                break
            await asyncio.wait((reading,), timeout=min(_EXIT_POLL_SECONDS, deadline - now))
        # closed pipes end communicate with what was read; bounded all the same
        await asyncio.wait((reading,), timeout=_REAP_SECONDS)
        if not reading.done():
            raise TimeoutError
        return reading.result()
    finally:
        if not reading.done():
            reading.cancel()


def _pipe_inodes(transport: asyncio.SubprocessTransport) -> list[int]:
    inodes = []
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd)
        handle = pipe.get_extra_info("pipe") if pipe is not None else None
        if handle is not None and not pipe.is_closing():  # type: ignore[union-attr]
            with contextlib.suppress(OSError, ValueError):
                inodes.append(os.fstat(handle.fileno()).st_ino)
    return inodes


async def _stop(proc: asyncio.subprocess.Process, argv: Sequence[str]) -> list[int]:
    """Kill the child, its group and every escaped process; close the pipes; reap, bounded.

    Even if cancelled again meanwhile. Returns the escaped PIDs killed.
    """
    # asyncio.subprocess.Process does not hand out its transport; closing the pipes from
    # this end is the one way not to wait on a writer that lives on (not killable by us)
    transport: asyncio.SubprocessTransport = proc._transport  # type: ignore[attr-defined]
    # the /proc walk reads a file per process: a thread, not the event loop
    escaped = await complete(asyncio.to_thread(
        children.kill_all, proc.pid, _pipe_inodes(transport), proc.returncode is None))
    # the pipes alone: transport.close() would also poll() the child, reaping it before
    # asyncio's child watcher does, which then reports it "unknown" with returncode 255
    for fd in (0, 1, 2):
        pipe = transport.get_pipe_transport(fd)
        if pipe is not None:
            pipe.close()
    try:
        await complete(asyncio.wait_for(proc.wait(), _REAP_SECONDS))
    except TimeoutError:
        log.warning("Slurm client not reaped within %gs of SIGKILL; left to the child watcher",
                    _REAP_SECONDS, extra={"command": " ".join(argv[:3]), "pid": proc.pid})
    else:
        transport.close()  # the watcher has reaped it: close() no longer polls the child
    return escaped


async def _together(*commands: Awaitable[str]) -> list[str]:
    """Run commands at once. The first to fail cancels the rest, and waits for them
    (their children killed and reaped), before its error goes on: ``asyncio.gather``
    alone would leave them running behind the failed read."""
    tasks = [asyncio.ensure_future(c) for c in commands]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await complete(asyncio.gather(*tasks, return_exceptions=True))
        raise


def _json_unsupported(stderr_line: str) -> bool:
    lowered = stderr_line.lower()
    return any(hint in lowered for hint in _NO_JSON_HINTS)


def _time_zone(name: str) -> dt.tzinfo | None:
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise SourceStartupError(
            f"sources.slurm.time_zone: unknown time zone {name!r} (an IANA name such as UTC)"
        ) from None


@dataclass
class SlurmAllocationSource:
    config: SlurmConfig
    clock: Clock
    runner: Runner = run_command
    catalogue: Catalogue = field(default_factory=default_catalogue)
    name: str = "slurm"
    role: str = "allocation"
    _format: str = ""  # "json" or "text" once known
    _parse_errors: int = 0  # running total: gpufleet_source_parse_errors_total is a counter

    def __post_init__(self) -> None:
        self._format = "" if self.config.format == "auto" else self.config.format
        self._tz = _time_zone(self.config.time_zone)
        self._models = {m.type: m.model for m in self.config.gres_models}
        self._qos = {q.qos: q.priority for q in self.config.qos_priorities}
        env = dict(os.environ)
        if self.config.slurm_conf:
            env["SLURM_CONF"] = self.config.slurm_conf
        self._env = env
        # issue 30: Slurm listing no GPU node after it listed some is a down source, not 0
        self._emptied = EmptiedFleet(self.name, "Slurm listed no GPU node")

    def _argv(self, command: str, *args: str) -> list[str]:
        binary = str(Path(self.config.bin_dir) / command) if self.config.bin_dir else command
        return [binary, *args]

    async def _run(self, command: str, *args: str) -> str:
        argv = self._argv(command, *args)
        if self.runner is run_command:  # a test's runner takes no cap
            return await run_command(argv, self.config.command_timeout, self._env,
                                     self.config.max_output_bytes)
        return await self.runner(argv, self.config.command_timeout, self._env)

    def _skip(self, message: str) -> None:
        self._parse_errors += 1
        log.warning("slurm record skipped", extra={"source": self.name, "err": message})

    async def _read_json(self) -> tuple[list[SlurmNode], list[SlurmJob]]:
        jobs_text, nodes_text = await _together(
            self._run("squeue", "--json"), self._run("sinfo", "--json")
        )
        try:
            nodes = await asyncio.to_thread(parse_sinfo_json, nodes_text, self._skip)
        except SlurmParseError as exc:
            if "no 'nodes'" not in str(exc):
                raise
            # sinfo --json of 23.02+ groups nodes per partition; scontrol lists them plainly
            text = await self._run("scontrol", "show", "node", "-d", "-o")
            nodes = await asyncio.to_thread(parse_scontrol_nodes, text, self._skip)
        jobs = await asyncio.to_thread(parse_squeue_json, jobs_text, node_threads(nodes),
                                       self._skip)
        return nodes, jobs

    async def _read_text(self) -> tuple[list[SlurmNode], list[SlurmJob]]:
        jobs_text, nodes_text = await _together(
            self._run("scontrol", "show", "job", "-d", "-o"),
            self._run("scontrol", "show", "node", "-d", "-o"),
        )
        return await asyncio.to_thread(self._parse_text, nodes_text, jobs_text)

    def _parse_text(self, nodes_text: str, jobs_text: str) -> tuple[list[SlurmNode], list[SlurmJob]]:
        return (parse_scontrol_nodes(nodes_text, self._skip),
                parse_scontrol_jobs(jobs_text, self._tz, self._skip))

    async def read(self) -> SourceReading:
        try:
            if self._format == "text":
                nodes, jobs = await self._read_text()
            else:
                try:
                    nodes, jobs = await self._read_json()
                    self._format = "json"
                except JsonUnsupported as exc:
                    if self._format == "json":  # configured json, or json worked before
                        raise
                    log.info("Slurm clients write no JSON; reading scontrol text instead",
                             extra={"source": self.name, "err": str(exc)})
                    self._format = "text"
                    nodes, jobs = await self._read_text()
        except SlurmParseError as exc:
            raise SlurmCommandError(str(exc)) from None
        self._check_gpus(nodes)
        now = self.clock()
        snapshot = await asyncio.to_thread(to_snapshot, now, nodes, jobs, self._models,
                                           self.catalogue, self._qos)
        return self._emptied.check(SourceReading.of(snapshot, parse_errors=self._parse_errors))

    def _check_gpus(self, nodes: list[SlurmNode]) -> None:
        """Refuse a cluster over ``max_gpus`` before the snapshot is built (a record per GPU):
        the read fails with the reason, and the collector serves the last good view stale."""
        total = sum(g.count for n in nodes for g in n.gres if g.name == "gpu")
        if total > self.config.max_gpus:
            raise SlurmCommandError(
                f"{total} GPUs on {len(nodes)} nodes, over sources.slurm.max_gpus "
                f"({self.config.max_gpus}): not read")

    async def close(self) -> None:
        return None


def build(config: SlurmConfig, clock: Clock) -> SlurmAllocationSource:
    for command in COMMANDS:
        path = Path(config.bin_dir) / command if config.bin_dir else shutil.which(command)
        if config.format == "text" and command != "scontrol":
            continue
        if config.format == "json" and command == "scontrol":
            continue
        if path is None or not os.access(path, os.X_OK):
            where = f"in {config.bin_dir}" if config.bin_dir else "on the PATH"
            raise SourceStartupError(
                f"sources.slurm: {command} not found {where} (install slurm-client, or set "
                "sources.slurm.bin_dir)"
            )
    catalogue = default_catalogue()
    for entry in config.gres_models:
        if not catalogue.get(entry.model).known:
            raise SourceStartupError(
                f"sources.slurm.gres_models: {entry.type} maps to {entry.model!r}, which the "
                f"GPU catalogue lacks (known: {', '.join(catalogue.names())})"
            )
    names = [q.qos for q in config.qos_priorities]
    if len(set(names)) != len(names):
        raise SourceStartupError("sources.slurm.qos_priorities: each qos may be listed once")
    return SlurmAllocationSource(config, clock, catalogue=catalogue)
