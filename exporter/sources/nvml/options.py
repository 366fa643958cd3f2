"""Options of the ``nvml`` source (``sources.nvml``), apart from :mod:`.nvml` so that reading
the config does not import its worker threads and asyncio (nor gRPC, for ``pod_resources``).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter import metrics
from exporter.options import Duration, opt

# exporter.sources.nvml.podresources.DEFAULT_SOCKET, written out so that reading the config does not
# import gRPC; tests/test_nvml_pods.py checks that the two agree
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True)
class NvmlSource:
    enabled: bool = opt(False, help="Read this machine's GPUs through NVML (libnvidia-ml).")
    call_timeout: Duration = opt(
        Duration(2), help="Longest one GPU's NVML reads may take; past it the GPU's last good "
        "sample is served, marked stale.", exclusive_min=0,
    )
    node: str = opt("", help="Node name of this machine; empty: the host name.")
    pool: str = opt("", help="Pool (Slurm partition or node pool) of this machine's GPUs.")
    export_serial: bool = opt(
        False, help="Export each GPU's board serial number as the `serial` label of "
        f"{metrics.GPU_INFO.name}. Off by default: some sites treat serials as asset data.",
    )
    pod_resources: bool = opt(
        False, help="Also read the kubelet's PodResources API (Kubernetes node mode): each pod "
        "holding GPUs is served as an allocation on the GPUs it holds, by UUID.",
    )
    pod_resources_socket: str = opt(
        POD_RESOURCES_SOCKET, help="The kubelet's PodResources socket (mounted read-only from the "
        "node).",
    )
    pod_resources_timeout: Duration = opt(
        Duration(2), help="Longest the kubelet's two calls may take each; keep it well below "
        "source_timeout, or a slow kubelet costs the GPUs' read too.", exclusive_min=0, max=30,
    )
    pod_resources_stale_for: Duration = opt(
        Duration(300), help="How long the kubelet's last answer is served while it does not "
        "answer; then the pods' allocations are dropped.", min=0,
    )
    processes: bool = opt(
        True, help="Read each GPU's processes (memory and SM use) and attribute them to their "
        "pod, Slurm job or the host through /proc (docs/attribution.md). Needs the host's PID "
        "namespace (hostPID in Kubernetes); without it the processes are counted, unattributed.",
    )
    processes_per_gpu: int = opt(
        256, help="Most processes attributed per GPU (those using the most memory); the rest "
        f"are counted in {metrics.GPU_PROCESSES_CUT_TOTAL.name}.", min=1, max=4096,
    )
    processes_interval: Duration = opt(
        Duration(120), help="How often each GPU's processes are read again; in between the "
        "last read is served as it was (a busy node's 48 processes per GPU cost more than all "
        "its other reads together: docs/attribution.md). 0: every collection.", min=0, max=3600,
    )
    proc_root: str = opt(
        "/proc", help="Where the host's /proc is mounted (a container may mount it elsewhere).",
    )
    kubelet_log_root: str = opt(
        "/var/log", help="Where the kubelet's pods/ and containers/ log directories are "
        "mounted: they name a pod's UID and a container's id (else the UID is the job).",
    )
