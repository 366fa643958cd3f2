"""The owner of a process, from its ``/proc/PID/cgroup`` text: pure, no file access.

The layouts recognised are the ones the kubelet and Slurm write (recorded from real nodes in
``tests/helpers/fake_proc.py``):

- kubelet, systemd cgroup driver: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid, "-" written "_">.slice/cri-containerd-<id>.scope`` (also
  ``crio-``, ``docker-``; the guaranteed class has no QoS slice);
- kubelet, cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>``;
- Slurm, cgroup v1: ``/slurm/uid_<uid>/job_<id>/step_<id>/task_<n>``; cgroup v2:
  ``/system.slice/slurmstepd.scope/job_<id>/step_<id>/user/task_<n>``. ``step_batch``,
  ``step_extern`` and ``step_interactive`` are steps too.

cgroup v1 lists one line per hierarchy (``12:memory:/...``), v2 one (``0::/...``); the
first line naming a pod or a job wins. Under a private cgroup namespace the path is relative
(``/../../kubepods-...``): the patterns match anywhere in it. Anything else (a system service,
a login session) is the host's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

POD = "pod"
SLURM = "slurm"
HOST = "host"

_POD_SYSTEMD = re.compile(r"kubepods(?:-[a-z]+)?-pod([0-9a-fA-F_]{36})\.slice")
_POD_CGROUPFS = re.compile(r"/pod([0-9a-fA-F-]{36})(?=/|$)")
_CONTAINER_SCOPE = re.compile(r"/(?:cri-containerd|crio|docker)-([0-9a-f]{64})\.scope(?=/|$)")
_CONTAINER_PLAIN = re.compile(r"/([0-9a-f]{64})(?=/|$)")
_SLURM_JOB = re.compile(r"/job_(\d{1,20})(?=/|$)")
_SLURM_STEP = re.compile(r"/step_([a-z0-9]{1,20})(?=/|$)")
_SLURM_TASK = re.compile(r"/task_(\d{1,9})(?=/|$)")


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """What a cgroup path says: a pod (its UID, the container's id), a Slurm job (job, step,
    task), or the host."""

    kind: str  # POD, SLURM or HOST
    pod_uid: str = ""  # with "-", as the apiserver writes it
    container_id: str = ""  # 64 hex digits; "" for a pod's own cgroup (its pause process)
    job: str = ""  # Slurm job id
    step: str = ""  # "0", "batch", "extern", "interactive"; "" outside a step
    task: str = ""  # Slurm task id on this node; "" without per-task cgroups


HOST_OWNER = CgroupOwner(HOST)


def owner_of_path(path: str) -> CgroupOwner | None:
    """The pod or Slurm job a cgroup path belongs to; None for neither."""
    pod = _POD_SYSTEMD.search(path)
    uid = pod.group(1).replace("_", "-") if pod else ""
    if not uid:
        plain = _POD_CGROUPFS.search(path)
        if plain and "kubepods" in path[:plain.start()]:
            uid = plain.group(1)
    if uid:
        container = _CONTAINER_SCOPE.search(path) or _CONTAINER_PLAIN.search(path)
        return CgroupOwner(POD, pod_uid=uid.lower(),
                           container_id=container.group(1) if container else "")
    job = _SLURM_JOB.search(path)
    if job:
        rest = path[job.end():]
        step = _SLURM_STEP.search(rest)
        task = _SLURM_TASK.search(rest)
        return CgroupOwner(SLURM, job=job.group(1), step=step.group(1) if step else "",
                           task=task.group(1) if task else "")
    return None


def owner_of(text: str) -> CgroupOwner:
    """The owner named by ``/proc/PID/cgroup``'s lines (v1 or v2); the host's if none does."""
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")  # hierarchy id, controllers, path (the path may hold ":")
        found = owner_of_path(path.strip())
        if found is not None:
            return found
    return HOST_OWNER


__all__ = ["HOST", "HOST_OWNER", "POD", "SLURM", "CgroupOwner", "owner_of", "owner_of_path"]
