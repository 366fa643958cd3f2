"""A GPU process's owner, read from ``/proc``: cgroup, then the pod's name, then the rank.

:class:`ProcessOwners` resolves a PID that NVML reports to an :class:`Owner` or an
:class:`Unattributed` with a stated reason (:data:`REASONS`), never an exception:

- ``/proc/PID/cgroup`` gives the pod UID and container id, or the Slurm job, step and task
  (:mod:`exporter.attribution.cgroup`);
- the kubelet's log directories name them: ``/var/log/pods/<namespace>_<pod>_<uid>`` and
  ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log`` (the names the kubelet
  writes for every container; none of the three names may hold ``_``). The owner's ``job``
  is then ``<namespace>/<pod>``, the name the PodResources join gives the same pod; where
  the directories are not mounted it is the pod's UID;
- ``/proc/PID/environ`` gives the training rank (``RANK``, else ``SLURM_PROCID``, else
  ``LOCAL_RANK``) when it is readable (the same user, or CAP_SYS_PTRACE), else no rank.

NVML reports PIDs of the host's PID namespace. In another one (a container without
``hostPID``) those numbers name other processes or none: every process is then
``pid_namespace``, without reading anything. The namespace is the host's when
``/proc/self/ns/pid`` is ``pid:[4026531836]`` (PROC_PID_INIT_INO, fixed by the kernel).

Every file is read through :func:`exporter.bounded_file.read_bounded`; a directory listing
stops at :data:`MAX_ENTRIES`. A PID's owner is cached until the PID is no longer on any GPU
(:meth:`ProcessOwners.forget_except`): a cgroup does not change while a process computes, and
the environment it started with never does. A reused PID must first leave every GPU's list,
so a new process is not given the old one's owner unless it takes the same PID between two
collections. Thread-safe: the GPUs' workers call it at once.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from exporter.attribution.cgroup import HOST, POD, SLURM, CgroupOwner, owner_of
from exporter.bounded_file import Wording, read_bounded

HOST_PID_NAMESPACE = "pid:[4026531836]"  # PROC_PID_INIT_INO (include/linux/proc_ns.h)
MAX_CGROUP_BYTES = 64 * 1024  # v1 lists about 13 lines; a path is at most 4 KiB
MAX_ENVIRON_BYTES = 1024 * 1024  # the kernel's ARG_MAX share is smaller by default
MAX_ENTRIES = 20_000  # entries read from one log directory (the kubelet's maxPods is 110)
MAX_RANK = 10_000_000
MAX_NAME = 253
RANK_VARIABLES = (b"RANK", b"SLURM_PROCID", b"LOCAL_RANK")

# Why a process has no owner: the values of gpufleet_gpu_processes_unattributed's `reason`.
PID_NAMESPACE = "pid_namespace"  # this exporter is not in the host's PID namespace
PROCESS_GONE = "process_gone"  # no /proc/PID: it exited, or /proc is another namespace's
PROC_UNREADABLE = "proc_unreadable"  # /proc/PID/cgroup refused (permissions) or unreadable
REASONS = (PID_NAMESPACE, PROCESS_GONE, PROC_UNREADABLE)


class ProcReadError(Exception):
    """One /proc file could not be read; the message is the OS's reason."""


_WORDING = Wording(ProcReadError, cannot_read="{reason}", over_limit="over the limit",
                   grew_over_limit="over the limit")
_NO_SUCH = os.strerror(errno.ENOENT)
_NO_PROCESS = os.strerror(errno.ESRCH)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who a process belongs to, as the families label it."""

    kind: str  # "pod", "slurm" or "host"
    job: str = ""  # "<namespace>/<pod>" (else the pod's UID), or the Slurm job id
    container: str = ""  # the pod's container name ("" when unnamed)
    step: str = ""  # the Slurm step
    rank: str = ""  # the training rank, "" when unknown


@dataclass(frozen=True, slots=True)
class Unattributed:
    reason: str  # one of REASONS


Attribution = Owner | Unattributed


@dataclass
class _PodNames:
    """Pod UID -> (namespace, pod) and container id -> container name, from the kubelet's
    log directories, listed again only when a UID or container id is not in them yet."""

    pods_dir: Path
    containers_dir: Path
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)
    listed_at: int = -1  # the collection that last listed them: at most once per collection

    def name(self, owner: CgroupOwner, collection: int) -> tuple[str, str]:
        """(job, container) of a pod's process: ("<namespace>/<pod>", name), or the UID."""
        if (owner.pod_uid not in self.pods or owner.container_id not in self.containers) \
                and self.listed_at != collection:
            self.listed_at = collection
            self._list()
        pod = self.pods.get(owner.pod_uid)
        job = f"{pod[0]}/{pod[1]}" if pod else owner.pod_uid
        return job, self.containers.get(owner.container_id, "")

    def _list(self) -> None:
        pods: dict[str, tuple[str, str]] = {}
        for name in _entries(self.pods_dir):
            parts = name.split("_")
            if len(parts) == 3 and all(_name_ok(p) for p in parts):
                pods[parts[2].lower()] = (parts[0], parts[1])
        containers: dict[str, str] = {}
        for name in _entries(self.containers_dir):
            head, _, container_id = name.removesuffix(".log").rpartition("-")
            parts = head.split("_")
            if len(container_id) == 64 and len(parts) == 3 and all(_name_ok(p) for p in parts):
                containers[container_id] = parts[2]
        self.pods, self.containers = pods, containers


def _entries(directory: Path) -> list[str]:
    names: list[str] = []
    try:
        with os.scandir(directory) as listing:
            for entry in listing:
                if len(names) >= MAX_ENTRIES:
                    break
                names.append(entry.name)
    except OSError:
        return []  # not mounted here: pods are named by their UID
    return names


def _name_ok(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME and name.isprintable()


def rank_of(environ: bytes) -> str:
    """The training rank in a process's environment (NUL-separated ``NAME=value``), or ""."""
    found: dict[bytes, bytes] = {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in RANK_VARIABLES and name not in found:
            found[name] = value
    for name in RANK_VARIABLES:
        value = found.get(name, b"")
        if value.isdigit() and len(value) <= 8 and int(value) <= MAX_RANK:
            return str(int(value))
    return ""


@dataclass
class ProcessOwners:
    """Resolves NVML's PIDs to owners through ``proc`` (``/proc``, or a test's fake tree)."""

    proc: Path = Path("/proc")
    pods_dir: Path = Path("/var/log/pods")
    containers_dir: Path = Path("/var/log/containers")
    _cache: dict[int, Attribution] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _names: _PodNames | None = None
    _namespace: str | None = None  # why every PID is unattributed, else "" (checked once)
    collection: int = 0

    def __post_init__(self) -> None:
        self._names = _PodNames(self.pods_dir, self.containers_dir)

    def namespace_reason(self) -> str:
        """PID_NAMESPACE when this process is outside the host's PID namespace, else ""."""
        if self._namespace is None:
            try:
                link = os.readlink(self.proc / "self" / "ns" / "pid")
            except OSError:
                link = HOST_PID_NAMESPACE  # no namespaces to read (an old kernel): the host's
            self._namespace = "" if link == HOST_PID_NAMESPACE else PID_NAMESPACE
        return self._namespace

    def owner(self, pid: int) -> Attribution:
        """``pid``'s owner, cached; never raises."""
        with self._lock:
            known = self._cache.get(pid)
        if known is not None:
            return known
        found = self._resolve(pid)
        with self._lock:
            self._cache[pid] = found
        return found

    def forget_except(self, pids: set[int]) -> None:
        """Drop the owners of PIDs no longer on a GPU; the next collection begins."""
        with self._lock:
            for pid in [p for p in self._cache if p not in pids]:
                del self._cache[pid]
            self.collection += 1

    def _resolve(self, pid: int) -> Attribution:
        reason = self.namespace_reason()
        if reason:
            return Unattributed(reason)
        if not 0 < pid < 2 ** 22 + 1:  # PID_MAX_LIMIT: anything else is no PID of ours
            return Unattributed(PROCESS_GONE)
        base = self.proc / str(pid)
        try:
            text = read_bounded(base / "cgroup", MAX_CGROUP_BYTES, _WORDING)
        except ProcReadError as exc:
            gone = str(exc) in (_NO_SUCH, _NO_PROCESS)
            return Unattributed(PROCESS_GONE if gone else PROC_UNREADABLE)
        cgroup = owner_of(text.decode("utf-8", "replace"))
        try:
            rank = rank_of(read_bounded(base / "environ", MAX_ENVIRON_BYTES, _WORDING))
        except ProcReadError:
            rank = ""  # another user's process: no rank, the owner still counts
        if cgroup.kind == POD:
            assert self._names is not None
            with self._lock:
                job, container = self._names.name(cgroup, self.collection)
            return Owner(POD, job, container, rank=rank)
        if cgroup.kind == SLURM:
            return Owner(SLURM, cgroup.job, step=cgroup.step, rank=rank)
        return Owner(HOST, rank=rank)


__all__ = ["MAX_ENTRIES", "PID_NAMESPACE", "PROCESS_GONE", "PROC_UNREADABLE", "REASONS",
           "Attribution", "Owner", "ProcessOwners", "Unattributed", "rank_of"]
