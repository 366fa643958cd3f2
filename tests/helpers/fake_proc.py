"""A fake ``/proc`` tree (and the kubelet's log directories) for the attribution tests.

The cgroup files hold paths as real nodes write them (recorded from a kubelet 1.29 node with
containerd 1.7 under each cgroup driver, and from Slurm 23.02 with cgroup/v1 and cgroup/v2):
the tests parse the same text ``/proc/PID/cgroup`` gives there. ``environ`` is NUL-separated
``NAME=value`` as the kernel gives it; ``ns/pid`` is a symbolic link to ``pid:[inode]``.
Nothing is patched: :class:`~exporter.attribution.proc.ProcessOwners` is pointed at the tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOST_PID_NS = "pid:[4026531836]"
CONTAINER_PID_NS = "pid:[4026532578]"

# -- recorded cgroup files -------------------------------------------------------------------------
# kubelet, systemd driver, cgroup v2 (burstable pod, containerd)
K8S_SYSTEMD_V2 = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope\n")
# kubelet, systemd driver, cgroup v2, guaranteed pod (no QoS slice), CRI-O
K8S_SYSTEMD_V2_GUARANTEED_CRIO = "0::/kubepods.slice/kubepods-pod{uid_}.slice/crio-{cid}.scope\n"
# kubelet, cgroupfs driver, cgroup v2 (besteffort pod)
K8S_CGROUPFS_V2 = "0::/kubepods/besteffort/pod{uid}/{cid}\n"
# kubelet, systemd driver, cgroup v1 (one line per hierarchy)
K8S_SYSTEMD_V1 = "".join(
    f"{n}:{ctl}:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{{uid_}}.slice/"
    "cri-containerd-{cid}.scope\n"
    for n, ctl in ((12, "pids"), (11, "hugetlb"), (10, "memory"), (9, "cpu,cpuacct"),
                   (8, "devices"), (1, "name=systemd"))) + "0::/\n"
# kubelet, cgroupfs driver, cgroup v1
K8S_CGROUPFS_V1 = "".join(
    f"{n}:{ctl}:/kubepods/burstable/pod{{uid}}/{{cid}}\n"
    for n, ctl in ((11, "memory"), (10, "devices"), (4, "cpu,cpuacct"), (1, "name=systemd")))
# the same, seen from a container with a private cgroup namespace (relative path)
K8S_SYSTEMD_V2_CGROUPNS = (
    "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/"
    "cri-containerd-{cid}.scope\n")
# Slurm cgroup/v1 (task/cgroup plugin): uid, job, step, task
SLURM_V1 = "".join(
    f"{n}:{ctl}:/slurm/uid_1000/job_{{job}}/step_{{step}}/task_{{task}}\n"
    for n, ctl in ((10, "memory"), (8, "devices"), (5, "cpuset"), (4, "freezer"))) \
    + "1:name=systemd:/system.slice/slurmd.service\n"
# Slurm cgroup/v2 (slurmstepd's scope)
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_{job}/step_{step}/user/task_{task}\n"
# a host process: a login session, and a system service
HOST_SESSION = "0::/user.slice/user-1000.slice/session-4.scope\n"
HOST_SERVICE_V1 = "11:memory:/system.slice/nvidia-persistenced.service\n0::/\n"


def uid_underscored(uid: str) -> str:
    return uid.replace("-", "_")


@dataclass
class FakeProc:
    """A directory laid out as ``/proc`` plus ``var/log/pods`` and ``var/log/containers``."""

    root: Path

    def __post_init__(self) -> None:
        (self.proc / "self" / "ns").mkdir(parents=True, exist_ok=True)
        self.pid_namespace(HOST_PID_NS)
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.containers_dir.mkdir(parents=True, exist_ok=True)

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def pods_dir(self) -> Path:
        return self.root / "var" / "log" / "pods"

    @property
    def containers_dir(self) -> Path:
        return self.root / "var" / "log" / "containers"

    def pid_namespace(self, link: str) -> None:
        path = self.proc / "self" / "ns" / "pid"
        if path.is_symlink():
            path.unlink()
        os.symlink(link, path)

    def process(self, pid: int, cgroup: str, environ: dict[str, str] | None = None,
                readable: bool = True, environ_readable: bool = True) -> None:
        """A process; ``readable`` False: its cgroup file cannot be read."""
        base = self.proc / str(pid)
        base.mkdir(parents=True, exist_ok=True)
        env = b"".join(f"{k}={v}".encode() + b"\0" for k, v in (environ or {}).items())
        # refused reads: a directory where the file is (EISDIR), since the tests may run as
        # root, whom mode 000 does not stop; the reader's path is the same (OSError on read)
        if readable:
            (base / "cgroup").write_text(cgroup)
        else:
            (base / "cgroup").mkdir()
        if environ_readable:
            (base / "environ").write_bytes(env)
        else:
            (base / "environ").mkdir()

    def pod(self, namespace: str, name: str, uid: str,
            containers: dict[str, str] | None = None) -> None:
        """The kubelet's log directories of a pod: container name -> container id."""
        (self.pods_dir / f"{namespace}_{name}_{uid}").mkdir(exist_ok=True)
        for container, cid in (containers or {}).items():
            link = self.containers_dir / f"{name}_{namespace}_{container}-{cid}.log"
            if not link.is_symlink():
                os.symlink(f"/var/log/pods/{namespace}_{name}_{uid}/{container}/0.log", link)

    def pod_process(self, pid: int, layout: str, namespace: str, name: str, uid: str,
                    container: str, cid: str, environ: dict[str, str] | None = None) -> None:
        """A process of a pod's container, its cgroup written in ``layout``."""
        self.pod(namespace, name, uid, {container: cid})
        self.process(pid, layout.format(uid=uid, uid_=uid_underscored(uid), cid=cid), environ)

    def slurm_process(self, pid: int, layout: str, job: int, step: str, task: int,
                      environ: dict[str, str] | None = None) -> None:
        self.process(pid, layout.format(job=job, step=step, task=task), environ)


def pod_uid(n: int) -> str:
    return f"3f0c5b0a-{n:04x}-4c5d-9e8f-0123456789ab"


def container_id(n: int) -> str:
    return f"{n:02x}" * 32
