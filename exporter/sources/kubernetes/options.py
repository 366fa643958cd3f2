"""Options of the ``kubernetes`` source (``sources.kubernetes``), apart from
:mod:`.kubernetes` so that reading the config imports neither aiohttp nor
kubernetes_asyncio.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.options import Duration, opt


@dataclass(frozen=True)
class KubernetesSource:
    enabled: bool = opt(False, help="Read GPU nodes, pods and DRA claims from a Kubernetes "
                        "apiserver (list, then watch).")
    kubeconfig: str = opt(
        "", help="kubeconfig file, overriding the rest; empty: as kubectl, KUBECONFIG (files "
        "merged in order), else ~/.kube/config, else in-cluster (the pod's service account, "
        "KUBERNETES_SERVICE_HOST/PORT).",
    )
    context: str = opt("", help="kubeconfig context; empty: its current-context.")
    pool_label: str = opt(
        "", help="Node label naming its pool (e.g. cloud.google.com/gke-nodepool); empty, or a "
        "node without it: the pool is the GPU product's catalogue model (H100, A100-80GB).",
    )
    resource_claims: bool = opt(
        True, help="Watch resource.k8s.io/v1 ResourceClaims (DRA); a cluster that does not "
        "serve the API (404) is read without them.",
    )
    resource_slices: bool = opt(
        False, help="Also watch ResourceSlices, to name DRA-claimed GPUs by UUID (needs "
        "get/list/watch on resourceslices too); off: by the device's index only.",
    )
    page_size: int = opt(500, help="Objects per list page (limit/continue).", min=1, max=10_000)
    request_timeout: Duration = opt(
        Duration(10), help="Deadline of one list page, and of opening a watch.",
        exclusive_min=0,
    )
    watch_timeout: Duration = opt(
        Duration(300), help="timeoutSeconds of each watch: the apiserver ends it after this "
        "and it is reopened from the last resourceVersion (no re-list).", min=1,
    )
    sync_timeout: Duration = opt(
        Duration(8), help="How long the first read waits for the first lists; keep it below "
        "source_timeout.", exclusive_min=0,
    )
    # The backoff of client-go's reflector, whose numbers these defaults are: each wait is
    # its step times 1 to 2, so retries from many exporters spread out.
    backoff_initial: Duration = opt(
        Duration(0.8), help="First backoff step: the wait before a list after a 410 Gone, or "
        "a retry after a failed list or watch, is 1-2 x the step.", exclusive_min=0,
    )
    backoff_max: Duration = opt(
        Duration(30), help="Longest backoff step: from backoff_initial, doubling to this (a "
        "wait is at most twice it).", exclusive_min=0,
    )
    backoff_reset: Duration = opt(
        Duration(120), help="The step starts again from backoff_initial after this long "
        "without a wait (a list and watch that lived).", exclusive_min=0,
    )
    # Caps: every object read is bounded before it is parsed. A real pod is 3-20 KB of JSON
    # and etcd refuses objects over 1.5 MiB, so 4 MiB per event never cuts a real object.
    max_objects: int = opt(
        500_000, help="Most objects of one kind (nodes, pods, claims) kept; a list beyond it "
        "fails the read.", min=1,
    )
    # What the source builds grows with the GPUs, about 3 KB each: 20,000 nodes of 64
    # GPUs (1.28 M) passed 4 GB. 100,000 GPUs fit MemoryMax=1G with the rest of the
    # process, and are 12,500 nodes of 8.
    max_gpus: int = opt(
        100_000, help="Most GPUs (and MIG devices) the nodes may hold, summed before the "
        "snapshot is built; beyond it the read fails and the last good view is served stale.",
        min=1,
    )
    max_event_bytes: int = opt(
        4 * 1024 * 1024, help="Largest watch event (one JSON line), in bytes.", min=1024,
    )
    max_page_bytes: int = opt(
        256 * 1024 * 1024, help="Largest list page, in bytes.", min=1024,
    )
