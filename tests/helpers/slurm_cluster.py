"""A real Slurm on loopback for tests: munged, slurmctld and 8 ``slurmd -N`` in one temp dir.

Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` (22.05) run as
root, the way ``data/slurm-samples/`` was captured: nodes gpu-001..004
advertise ``gpu:h200:8`` (partition gpu-h200), gpu-005..008 ``gpu:h100:8``
(partition gpu-h100). Ports are picked free, so runs never collide.

The pitfalls the samples' README lists shape the configuration: ``File=`` is
required for GPU GRES (symlinks to /dev/null work), each slurmd needs its own
``Port=`` and ``%n`` in its spool/PID/log paths, ``SlurmdParameters=
config_overrides`` lets nodes declare more CPUs than the host has, and clients
find the cluster through ``SLURM_CONF``.

Everything is stopped by PID: the daemons we started, and every process that
carries this cluster's marker in its environment (slurmstepd and the job
scripts inherit it), never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "GPUFLEET_SLURM_TEST"
H200_NODES = ("gpu-001", "gpu-002", "gpu-003", "gpu-004")
H100_NODES = ("gpu-005", "gpu-006", "gpu-007", "gpu-008")
NODES = H200_NODES + H100_NODES
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


SLURM_CONF = """\
ClusterName=gpufleettest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket.2
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/slurmd.%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=300
InactiveLimit=0
MinJobAge=300
MailProg=/bin/true
KillWait=1
Waittime=0
MessageTimeout=5

{nodes}
PartitionName=gpu-h200 Nodes=gpu-[001-004] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu-h100 Nodes=gpu-[005-008] MaxTime=INFINITE State=UP
"""

NODE_LINE = (
    "NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=64 Boards=1 "
    "SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1000000 "
    "Gres=gpu:{gres}:8 State=UNKNOWN"
)

GRES_CONF = """\
AutoDetect=off
NodeName=gpu-[001-004] Name=gpu Type=h200 File={root}/dev/nvidia[0-7]
NodeName=gpu-[005-008] Name=gpu Type=h100 File={root}/dev/nvidia[0-7]
"""


@dataclass
class SlurmCluster:
    root: Path
    ctld_port: int = 0
    munged: subprocess.Popen | None = None
    slurmctld: subprocess.Popen | None = None
    slurmds: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients and daemons: finds this cluster and marks its processes."""
        return {**os.environ, "SLURM_CONF": str(self.conf), MARKER: str(self.root)}

    # -- start ------------------------------------------------------------------

    def write_config(self) -> None:
        for sub in ("etc", "munge", "state", "spool", "run", "log", "dev", "jobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        for i in range(8):
            link = self.root / "dev" / f"nvidia{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")  # File= must exist and be a device; a plain file is rejected
        ports = _free_ports(1 + len(NODES))
        self.ctld_port = ports[0]
        lines = [
            NODE_LINE.format(name=name, port=port, gres="h200" if name in H200_NODES else "h100")
            for name, port in zip(NODES, ports[1:], strict=True)
        ]
        self.conf.write_text(SLURM_CONF.format(root=self.root, ctld_port=self.ctld_port,
                                               nodes="\n".join(lines)))
        (self.root / "etc" / "gres.conf").write_text(GRES_CONF.format(root=self.root))
        for name in NODES:
            (self.root / "spool" / f"slurmd.{name}").mkdir(exist_ok=True)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chmod(key, 0o400)

    def _log(self, name: str):
        return (self.root / "log" / f"{name}.out").open("a")

    def start(self, timeout: float = 30.0) -> None:
        self.write_config()
        munge = self.root / "munge"
        self.munged = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge}/munge.socket.2",
             f"--key-file={munge}/munge.key", f"--pid-file={munge}/munged.pid",
             f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"],
            stdout=self._log("munged"), stderr=subprocess.STDOUT, env=self.env,
        )
        self._wait(lambda: (munge / "munge.socket.2").exists(), timeout, "munged socket")
        self.start_controller()
        for name in NODES:
            self.slurmds[name] = subprocess.Popen(
                ["slurmd", "-D", "-N", name, "-f", str(self.conf)],
                stdout=self._log(f"slurmd.{name}"), stderr=subprocess.STDOUT, env=self.env,
            )
        self.wait_idle(timeout)

    def start_controller(self) -> None:
        # no -c: a restarted controller recovers its jobs from StateSaveLocation
        self.slurmctld = subprocess.Popen(
            ["slurmctld", "-D", "-f", str(self.conf)],
            stdout=self._log("slurmctld"), stderr=subprocess.STDOUT, env=self.env,
        )

    def kill_controller(self) -> None:
        """What an outage looks like to clients: slurmctld gone, jobs still on the nodes."""
        if self.slurmctld is not None and self.slurmctld.poll() is None:
            self.slurmctld.send_signal(signal.SIGKILL)
            self.slurmctld.wait()

    def wait_idle(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return len(states) == len(NODES) and all(
                s.rstrip("*") in ("idle", "mix", "alloc") for s in states.values())

        self._wait(ready, timeout, "8 idle Slurm nodes")

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in (self.munged, self.slurmctld, *self.slurmds.values()):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited ({proc.args[0]}): {self.logs()}")
            if predicate():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{what} not ready within {timeout}s: {self.logs()}")

    def logs(self) -> str:
        text = []
        for path in sorted((self.root / "log").glob("*")):
            if path.stat().st_size:
                text.append(f"--- {path.name}\n{path.read_text()[-1500:]}")
        return "\n".join(text)

    # -- clients ------------------------------------------------------------------

    def run(self, *cmd: str, check: bool = True, timeout: float = 20.0) -> str:
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip()}")
        return result.stdout

    def sbatch(self, *args: str) -> str:
        """Submit ``sleep 600`` with these options; returns the job id."""
        out = self.run("sbatch", "--parsable", f"--chdir={self.root / 'jobs'}",
                       "--output=/dev/null", *args, "--wrap", "sleep 600")
        return out.strip().split(";")[0]

    def wait_states(self, expected: dict[str, str], timeout: float = 30.0) -> None:
        def reached() -> bool:
            out = self.run("squeue", "-h", "-o", "%i %T", check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(job) == state for job, state in expected.items())

        self._wait(reached, timeout, f"job states {expected}")

    # -- stop -------------------------------------------------------------------

    def marked_pids(self) -> list[int]:
        """Processes whose environment carries this cluster's marker: slurmstepd and jobs."""
        needle = f"{MARKER}={self.root}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if needle in environ.split(b"\0"):
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        daemons = [p for p in (*self.slurmds.values(), self.slurmctld, self.munged) if p]
        # signal every daemon at once: one by one, slurmd shutdowns add up to seconds each
        for proc in daemons:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in daemons:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in self.marked_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_cluster(root: Path) -> Iterator[SlurmCluster]:
    """A started cluster in ``root``, stopped on exit (the tests' module-scoped fixtures)."""
    import pytest

    from tests.helpers.servers import require_binary

    for binary in BINARIES:
        require_binary(binary)
    if os.geteuid() != 0:
        pytest.fail("the Slurm fixture runs slurmd as root, as in CI; run the tests as root")
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
