"""The ``kubernetes`` source: who holds which GPU, from the apiserver (issue 18).

Its ``role`` is ``allocation``, like Slurm: it is the scheduler's view. It keeps
informers (:mod:`exporter.sources.kubernetes.informer`: list, then watch; never polls) on

- **nodes**: GPU Feature Discovery's labels (``nvidia.com/gpu.product``, ``.count``,
  ``.memory``, ``.replicas``, ``nvidia.com/mig.strategy``, ``nvidia.com/mig-<profile>
  .count``/``.memory``) and the device plugin's capacity (``nvidia.com/gpu``,
  ``nvidia.com/gpu.shared``, ``nvidia.com/mig-<profile>``);
- **pods** that ask for GPUs (those resources, or DRA ``resourceClaims``);
- **ResourceClaims** (``resource.k8s.io/v1``): the exact devices in
  ``status.allocation.devices.results``;
- optionally **ResourceSlices**, which name each DRA device's UUID.

What it makes of them (pure: :func:`to_snapshot`):

- **GPUs** per node: ``nvidia.com/gpu.count`` physical GPUs of the product's catalogue
  model, MIG instances laid out from the profile counts (largest first, as
  ``nvidia-smi -L`` lists them), each GPU up while the node is Ready.
- **Allocations**, one per pod that holds GPUs (a pod is what Kubernetes moves or
  evicts). A whole GPU is share 1, a MIG slice ``<g>g`` is g/7 of its GPU, a
  time-sliced replica 1/``nvidia.com/gpu.replicas``, a HAMi ``nvidia.com/gpucores`` or
  KAI ``gpu-fraction`` request that fraction.
- **Which** GPU: the apiserver knows it only for DRA (the claim names the device:
  ``gpu-1`` is index 1, and its ResourceSlice gives the UUID). For the device plugin
  it knows only how many; the kubelet knows which (the PodResources API, node mode).
  Here such pods are given the node's lowest free indices, oldest pod first, and
  time-sliced replicas the least shared GPU (the NVIDIA device plugin's preferred
  allocation spreads replicas): counts, shares and fragmentation are exact, the
  index is nominal, and composition with telemetry (UUIDs) replaces it where known.
- **The job** is the pod's owner: the ``jobset.sigs.k8s.io/jobset-name``,
  ``training.kubeflow.org/job-name``, ``batch.kubernetes.io/job-name`` or KAI
  pod-group label, else its controller (a ReplicaSet less its ``pod-template-hash``
  is the Deployment), else the pod. As ``namespace/name``; when one owner has
  several GPU pods, each pod's allocation is ``namespace/owner/pod`` so that every
  allocation keeps its own key (the advisor and the alerts key on it).
- ``spec.priority`` (the PriorityClass value) is the priority, ``priorityClassName``
  the qos, the namespace the account, ``status.startTime`` the start, and the
  ``gpu-memory-required`` / ``gpufleet.io/last-checkpoint`` annotations the memory
  need and checkpoint (:mod:`exporter.sources.job_hints`).
- **Pending** pods that ask for GPUs and have no node are demand, grouped per job;
  a DRA claim not yet allocated counts its requested devices.

Down and stale: an informer whose list or watch fails (apiserver down, 403, 5xx)
marks the read failed with the apiserver's message, and the collector serves the
last good reading, stale, as for every source; the informer meanwhile retries and
resumes from its resourceVersion.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import os
import re
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypedDict

from exporter.extras import missing
from exporter.gpu_catalogue import Catalogue, default_catalogue
from exporter.snapshot import (
    Allocation,
    FleetSnapshot,
    Gpu,
    Interruption,
    JobRequest,
    MigInstance,
    Node,
    Placement,
)
from exporter.sources import Clock, SourceReading, SourceStartupError, job_hints
from exporter.sources.emptied import EmptiedFleet
from exporter.sources.kubernetes import kubeconfig
from exporter.sources.kubernetes.options import KubernetesSource as KubernetesConfig
from exporter.sources.mig import MIG_COMPUTE_SLICES as MIG_SLICES
from exporter.sources.mig import mig_slices as _slices

log = logging.getLogger(__name__)

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu.shared"  # time-slicing with renameByDefault
MIG_PREFIX = "nvidia.com/mig-"
HAMI_CORES = "nvidia.com/gpucores"  # HAMi: percent of each GPU's cores
KAI_FRACTION = "gpu-fraction"  # KAI scheduler (run.ai) annotation: a fraction of one GPU
GPU_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
JOB_LABELS = ("jobset.sigs.k8s.io/jobset-name", "training.kubeflow.org/job-name",
              "batch.kubernetes.io/job-name", "job-name", "pod-group.scheduling.run.ai/name")
MAX_LABEL = 253  # longest label value or name Kubernetes accepts; longer is not read

_PROFILE = re.compile(r"([1-7])g\.[0-9]+gb(?:\+[a-z]+)?")
_DRA_DEVICE = re.compile(r"gpu-([0-9]{1,3})(?:-mig-.*)?")



class KubernetesError(Exception):
    """The apiserver refused or failed a call: the read fails, the last good one is served."""


# -- shapes: the fields read, which the informer's decoder keeps (it skips the rest) --------------

class _Meta(TypedDict, total=False):  # the API's camelCase names
    name: Any
    namespace: Any
    resourceVersion: Any
    labels: Any
    annotations: Any
    ownerReferences: Any
    creationTimestamp: Any


class _NodeStatus(TypedDict, total=False):
    capacity: Any
    allocatable: Any
    conditions: Any


class _NodeSpec(TypedDict, total=False):
    unschedulable: Any


class NodeShape(TypedDict, total=False):
    metadata: _Meta
    spec: _NodeSpec
    status: _NodeStatus


class _Container(TypedDict, total=False):
    resources: Any


class _PodSpec(TypedDict, total=False):
    nodeName: Any
    containers: list[_Container]
    initContainers: list[_Container]
    priority: Any
    priorityClassName: Any
    resourceClaims: Any
    nodeSelector: Any


class _PodStatus(TypedDict, total=False):
    phase: Any
    startTime: Any
    conditions: Any  # DisruptionTarget: the pod is being preempted or evicted
    resourceClaimStatuses: Any


class PodShape(TypedDict, total=False):
    metadata: _Meta
    spec: _PodSpec
    status: _PodStatus


# -- records: what is kept of each object ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class KubeNode:
    name: str
    product: str  # nvidia.com/gpu.product, less -SHARED / -MIG-<profile>
    gpus: int  # physical GPUs
    memory_bytes: int | None
    replicas: int  # time-slicing replicas per GPU (1: not shared)
    mig_single: str  # MIG profile of every device under the single strategy, "" otherwise
    mig: tuple[tuple[str, int, int | None], ...]  # (profile, count, memory bytes), mixed strategy
    cpus: float
    pool: str  # value of the configured pool label, "" without one
    ready: bool
    cordoned: bool = False  # spec.unschedulable: what a drain (gpufleet act's included) sets


@dataclass(frozen=True, slots=True)
class KubePod:
    namespace: str
    name: str
    node: str  # "" while unscheduled
    whole: int  # nvidia.com/gpu (or .shared): devices the device plugin gives
    mig: tuple[tuple[str, int], ...]  # nvidia.com/mig-<profile>: count
    fraction: float | None  # HAMi gpucores / KAI gpu-fraction: share of each GPU
    claims: tuple[str, ...]  # ResourceClaim names it uses (same namespace)
    cpus: float
    owner: str  # the job, as "kind/name" or a label's value
    priority: int
    priority_class: str
    start_time: float | None
    created: float | None
    hints: job_hints.JobHints
    models: tuple[str, ...]  # products its nodeSelector asks for (pending demand)
    pool: str  # the pool its nodeSelector asks for
    disruption: Interruption | None = None  # its DisruptionTarget condition, while True


@dataclass(frozen=True, slots=True)
class KubeClaim:
    namespace: str
    name: str
    devices: tuple[tuple[str, str, str], ...]  # allocated (driver, pool, device)
    requested: int  # GPU devices asked for (ExactCount), for demand while unallocated


@dataclass(frozen=True, slots=True)
class SliceDevice:
    index: int
    uuid: str
    model: str  # productName as NVML says it
    profile: str  # MIG profile, "" for a whole GPU


@dataclass(frozen=True, slots=True)
class KubeSlice:
    node: str
    driver: str
    pool: str
    devices: tuple[tuple[str, SliceDevice], ...]  # device name -> what it is


_EMPTY: Mapping[str, Any] = {}


def _map(value: Any) -> Mapping[str, Any]:
    # decoded JSON is a dict: that check is a pointer compare, the Mapping ABC's is not
    # (685,000 ABC checks cost 0.26 s of a 50,000-pod first read)
    if isinstance(value, dict):
        return value
    return value if isinstance(value, Mapping) else _EMPTY


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= MAX_LABEL else ""


def _count(value: Any) -> int:
    """A whole-number quantity ("8"); anything else 0. Extended resources are integers."""
    if isinstance(value, int) and not isinstance(value, bool):
        return max(0, min(value, 1_000_000))
    if isinstance(value, str) and value.isdigit() and len(value) <= 7:
        return int(value)
    return 0


_CPU = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,9})?)(m?)")


def _cpu(value: Any) -> float:
    """A CPU quantity ("500m", "2", "1.5"); 0 when it does not parse."""
    match = _CPU.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return 0.0
    return float(match.group(1)) / (1000 if match.group(2) else 1)


def _time(value: Any) -> float | None:
    """An RFC 3339 timestamp ("2026-03-10T03:40:22Z")."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def _product(label: str) -> tuple[str, str]:
    """GFD's product label -> (product, MIG profile of the single strategy)."""
    product = label.removesuffix("-SHARED")
    product, _, profile = product.partition("-MIG-")
    return product, profile if _PROFILE.fullmatch(profile) else ""


def node_record(obj: Mapping[str, Any], pool_label: str = "") -> KubeNode | None:
    """What the source keeps of a Node; None for a node with no NVIDIA GPU."""
    meta = _map(obj.get("metadata"))
    labels = _map(meta.get("labels"))
    status = _map(obj.get("status"))
    capacity = _map(status.get("capacity"))
    allocatable = _map(status.get("allocatable")) or capacity
    name = _str(meta.get("name"))
    product, single = _product(_str(labels.get("nvidia.com/gpu.product")))
    count = _count(labels.get("nvidia.com/gpu.count"))
    replicas = max(1, _count(labels.get("nvidia.com/gpu.replicas")))
    whole = _count(capacity.get(GPU)) or _count(capacity.get(GPU_SHARED))
    mig: list[tuple[str, int, int | None]] = []
    for key, value in capacity.items():
        profile = key[len(MIG_PREFIX):] if isinstance(key, str) and key.startswith(MIG_PREFIX) \
            else ""
        if _PROFILE.fullmatch(profile) and _count(value):
            mib = _count(labels.get(f"{MIG_PREFIX}{profile}.memory"))
            mig.append((profile, _count(value), mib * 2**20 if mib else None))
    mig.sort(key=lambda m: (-_slices(m[0]), m[0]))
    if single:
        # under the single strategy gpu.count and the capacity count MIG devices
        devices = count or whole
        per_gpu = max(1, MIG_SLICES // _slices(single))
        gpus = math.ceil(devices / per_gpu)
    elif count:
        gpus = count
    else:
        gpus = whole // replicas
    if not name or (gpus == 0 and not mig and not product):
        return None
    mib = _count(labels.get("nvidia.com/gpu.memory"))
    conditions = _list(status.get("conditions"))
    ready = any(_map(c).get("type") == "Ready" and _map(c).get("status") == "True"
                for c in conditions)
    return KubeNode(
        name=name, product=product, gpus=min(gpus, 64), memory_bytes=mib * 2**20 if mib else None,
        replicas=replicas if replicas > 1 else 1, mig_single=single, mig=tuple(mig),
        cpus=_cpu(allocatable.get("cpu")),
        pool=_str(labels.get(pool_label)) if pool_label else "", ready=ready,
        cordoned=_map(obj.get("spec")).get("unschedulable") is True)


def _owner(meta: Mapping[str, Any], labels: Mapping[str, Any]) -> str:
    for label in JOB_LABELS:
        value = _str(labels.get(label))
        if value:
            return value
    for ref in _list(meta.get("ownerReferences")):
        ref = _map(ref)
        if ref.get("controller") is True:
            kind, name = _str(ref.get("kind")), _str(ref.get("name"))
            template_hash = _str(labels.get("pod-template-hash"))
            if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
                return name[: -len(template_hash) - 1]  # the Deployment
            if name:
                return name
    return _str(meta.get("name"))


def _requests(containers: Iterable[Any]) -> dict[str, Any]:
    """limits, else requests, of each container, summed: extended resources are in both."""
    total: dict[str, Any] = {}
    for container in containers:
        resources = _map(_map(container).get("resources"))
        wanted = {**_map(resources.get("requests")), **_map(resources.get("limits"))}
        for key, value in wanted.items():
            if key == "cpu":
                total["cpu"] = total.get("cpu", 0.0) + _cpu(value)
            elif isinstance(key, str):
                total[key] = total.get(key, 0) + _count(value)
    return total


def _asks_for_gpus(spec: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
    """A quick look before the full reading: any NVIDIA resource, a claim or a KAI fraction.
    Three pods in five of the bench's cluster ask for none; this look costs them a third
    of a full reading."""
    if spec.get("resourceClaims") or _map(meta.get("annotations")).get(KAI_FRACTION):
        return True
    for key in ("containers", "initContainers"):
        for container in _list(spec.get(key)):
            resources = _map(_map(container).get("resources"))
            for part in ("limits", "requests"):
                for name in _map(resources.get(part)):
                    if isinstance(name, str) and name.startswith("nvidia.com/"):
                        return True
    return False


def pod_record(obj: Mapping[str, Any]) -> KubePod | None:
    """What the source keeps of a Pod; None for one that asks for no GPU or has finished."""
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    if not _asks_for_gpus(spec, meta):
        return None  # most pods of a cluster: nothing more is read of them
    wanted = _requests(_list(spec.get("containers")))
    init = _requests(_list(spec.get("initContainers"))) if spec.get("initContainers") else {}
    if init:  # an init container runs before the others: the pod needs the larger of the two
        wanted = {k: max(wanted.get(k, 0), init.get(k, 0)) for k in {*wanted, *init}}
    whole = _count(wanted.get(GPU)) + _count(wanted.get(GPU_SHARED))
    mig = tuple(sorted((k[len(MIG_PREFIX):], _count(v)) for k, v in wanted.items()
                       if k.startswith(MIG_PREFIX) and _PROFILE.fullmatch(k[len(MIG_PREFIX):])
                       and _count(v)))
    claims = tuple(dict.fromkeys(
        name for name in (
            *(_str(_map(c).get("resourceClaimName")) for c in _list(spec.get("resourceClaims"))),
            *(_str(_map(c).get("resourceClaimName"))
              for c in _list(status.get("resourceClaimStatuses"))))
        if name))
    annotated = _map(meta.get("annotations"))
    fraction: float | None = None
    cores = _count(wanted.get(HAMI_CORES))
    kai = annotated.get(KAI_FRACTION)
    if whole and 0 < cores < 100:
        fraction = cores / 100
    elif isinstance(kai, str) and kai:
        try:
            value = float(kai[:20])
        except ValueError:
            value = 0.0
        if 0 < value < 1:
            fraction, whole = value, max(whole, 1)
    if not whole and not mig and not claims:
        return None  # most pods of a cluster: nothing more is read of them
    annotations = {k: v for k, v in annotated.items() if isinstance(v, str)}
    labels = _map(meta.get("labels"))
    selector = _map(spec.get("nodeSelector"))
    product = _product(_str(selector.get("nvidia.com/gpu.product")))[0]
    priority = spec.get("priority")
    return KubePod(
        namespace=_str(meta.get("namespace")), name=_str(meta.get("name")),
        node=_str(spec.get("nodeName")), whole=whole, mig=mig, fraction=fraction,
        claims=claims, cpus=float(wanted.get("cpu", 0.0)), owner=_owner(meta, labels),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        priority_class=_str(spec.get("priorityClassName")),
        start_time=_time(status.get("startTime")), created=_time(meta.get("creationTimestamp")),
        hints=job_hints.from_annotations(annotations),
        models=(product,) if product else (), pool="",
        disruption=_disruption(_list(status.get("conditions"))))


# The reasons of a pod's DisruptionTarget condition (Kubernetes 1.26+; 1.25 wrote
# PreemptionByKubeScheduler) as gpufleet's causes (exporter/preemption/watch.py)
DISRUPTION_CAUSES: Mapping[str, str] = MappingProxyType({
    "PreemptionByScheduler": "preemption", "PreemptionByKubeScheduler": "preemption",
    "EvictionByEvictionAPI": "eviction", "TerminationByKubelet": "kubelet",
    "DeletionByTaintManager": "taint", "DeletionByPodGC": "gc",
})


def _disruption(conditions: list[Any]) -> Interruption | None:
    """The pod's DisruptionTarget condition, while its status is True: the scheduler (or the
    eviction API, the kubelet, the taint manager, the pod GC) is stopping it, and since when."""
    for condition in conditions[:32]:  # a pod has a handful; a hostile list is not walked
        condition = _map(condition)
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            reason = _str(condition.get("reason"))
            return Interruption(DISRUPTION_CAUSES.get(reason, "other"),
                                _time(condition.get("lastTransitionTime")))
    return None


def claim_record(obj: Mapping[str, Any]) -> KubeClaim | None:
    meta = _map(obj.get("metadata"))
    spec = _map(_map(obj.get("spec")).get("devices"))
    requested = 0
    for request in _list(spec.get("requests")):
        exactly = _map(_map(request).get("exactly")) or _map(request)
        if _str(exactly.get("deviceClassName")) in GPU_DEVICE_CLASSES and \
                exactly.get("allocationMode", "ExactCount") == "ExactCount":
            requested += _count(exactly.get("count", 1))
    results = _list(_map(_map(_map(obj.get("status")).get("allocation")).get("devices"))
                    .get("results"))
    devices = tuple((_str(_map(r).get("driver")), _str(_map(r).get("pool")),
                     _str(_map(r).get("device"))) for r in results[:64])
    name = _str(meta.get("name"))
    if not name:
        return None
    return KubeClaim(_str(meta.get("namespace")), name, devices, requested)


def _attribute(attributes: Mapping[str, Any], name: str) -> str:
    value = _map(attributes.get(name))
    return _str(value.get("string") or value.get("version") or "")


def slice_record(obj: Mapping[str, Any]) -> KubeSlice | None:
    """The GPUs and MIG devices of a ResourceSlice; None for a slice of other devices."""
    spec = _map(obj.get("spec"))
    devices: list[tuple[str, SliceDevice]] = []
    for device in _list(spec.get("devices"))[:512]:
        device = _map(device)
        name = _str(device.get("name"))
        attributes = _map(device.get("attributes"))
        kind = _attribute(attributes, "type")
        match = _DRA_DEVICE.fullmatch(name)
        index_attr = _map(attributes.get("index")).get("int")
        if kind not in ("gpu", "mig") or match is None:
            continue
        index = index_attr if isinstance(index_attr, int) else int(match.group(1))
        devices.append((name, SliceDevice(
            index=index, uuid=_attribute(attributes, "uuid"),
            model=_attribute(attributes, "productName"),
            profile=_attribute(attributes, "profile") if kind == "mig" else "")))
    if not devices:
        return None
    pool = _map(spec.get("pool"))
    return KubeSlice(_str(spec.get("nodeName")), _str(spec.get("driver")),
                     _str(pool.get("name")), tuple(devices))


# -- the snapshot ------------------------------------------------------------------------------

@dataclass
class _NodeLayout:
    """Which share of each GPU of one node is taken while pods are given GPUs."""

    node: KubeNode
    free: list[float]  # per GPU index
    whole_taken: list[bool]
    replicas_used: list[int]
    mig_free: dict[str, list[int]] = field(default_factory=dict)  # profile -> [gpu index per free instance]

    def take_whole(self, count: int) -> list[int]:
        got = [i for i, free in enumerate(self.free) if free >= 1.0 and not self.whole_taken[i]]
        got = got[:count]
        for i in got:
            self.free[i] = 0.0
            self.whole_taken[i] = True
        return got

    def take_replicas(self, count: int) -> list[int]:
        got = []
        for _ in range(count):
            candidates = [i for i in range(len(self.free))
                          if self.replicas_used[i] < self.node.replicas and not self.whole_taken[i]]
            if not candidates:
                break
            i = min(candidates, key=lambda g: (self.replicas_used[g], g))
            self.replicas_used[i] += 1
            self.free[i] = max(0.0, self.free[i] - 1 / self.node.replicas)
            got.append(i)
        return got

    def take_fraction(self, count: int, share: float) -> list[int]:
        got = [i for i, free in enumerate(self.free) if free >= share - 1e-9]
        got = got[:count]
        for i in got:
            self.free[i] -= share
        return got

    def take_mig(self, profile: str, count: int) -> list[int]:
        free = self.mig_free.get(profile, [])
        got, self.mig_free[profile] = free[:count], free[count:]
        for i in got:
            self.free[i] = max(0.0, self.free[i] - _slices(profile) / MIG_SLICES)
        return got


def _mig_layout(node: KubeNode) -> list[list[tuple[str, int | None]]]:
    """The MIG instances of each GPU: (profile, memory), largest first, packed into 7 slices."""
    per_gpu: list[list[tuple[str, int | None]]] = [[] for _ in range(node.gpus)]
    used = [0] * node.gpus
    if node.mig_single:
        per = max(1, MIG_SLICES // _slices(node.mig_single))
        total = node.gpus * per
        for n in range(total):
            per_gpu[n // per].append((node.mig_single, None))
        return per_gpu
    for profile, count, memory in node.mig:
        for _ in range(count):
            fits = [g for g in range(node.gpus) if used[g] + _slices(profile) <= MIG_SLICES]
            if not fits:
                break
            g = fits[0]
            used[g] += _slices(profile)
            per_gpu[g].append((profile, memory))
    return per_gpu


def _group_owners(pods: Iterable[KubePod]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for pod in pods:
        key = (pod.namespace, pod.owner)
        counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass(frozen=True, slots=True)
class _NodePart:
    """One node's share of the snapshot: it depends on that node's records only, so a read
    after a change rebuilds only the nodes whose records changed (:func:`to_snapshot`)."""

    node: Node
    gpus: tuple[Gpu, ...]
    held: tuple[tuple[KubePod, tuple[Placement, ...]], ...]  # each pod holding GPUs here
    unplaced: int


# what a node's part is made from; equal inputs make an equal part
_PartKey = tuple[KubeNode, tuple[KubePod, ...], tuple[tuple[tuple[str, str, str], ...], ...],
                 tuple[str, ...], tuple[tuple[str, str], ...]]


def _node_part(node: KubeNode, pods: tuple[KubePod, ...],
               dra: tuple[tuple[tuple[str, str, str], ...], ...], uuids: tuple[str, ...],
               profiles: Mapping[str, str], catalogue: Catalogue) -> _NodePart:
    """``pods`` in the order they are given GPUs (oldest first), ``dra[i]`` the allocated
    (driver, pool, device) of ``pods[i]``'s claims, ``uuids`` per GPU index ("" unknown),
    ``profiles`` the MIG profile of each DRA device name of the node's pool."""
    spec = catalogue.get(node.product.replace("-", " ")) if node.product else None
    model = spec.name if spec is not None else "unknown"
    pool = node.pool or model
    out_node = Node(node.name, model, node.cpus, pool,
                    spec.architecture if spec is not None else "unknown", node.gpus,
                    drained=node.cordoned)
    migs = _mig_layout(node) if (node.mig or node.mig_single) else [[] for _ in range(node.gpus)]
    at = _NodeLayout(node, [1.0] * node.gpus, [False] * node.gpus, [0] * node.gpus)
    gpus = []
    for index in range(node.gpus):
        instances = tuple(MigInstance(i, profile, memory)
                          for i, (profile, memory) in enumerate(migs[index]))
        for profile, _ in migs[index]:
            at.mig_free.setdefault(profile, []).append(index)
        gpus.append(Gpu(node.name, index, uuids[index] if index < len(uuids) else "", model,
                        pool, memory_total_bytes=node.memory_bytes, up=node.ready,
                        mig=instances))
    unplaced = 0
    held: list[list[tuple[int, float]]] = [[] for _ in pods]
    # DRA first: the claim names the device, so those GPUs are not free for the others
    for n, devices in enumerate(dra):
        for driver, _, device_name in devices:
            match = _DRA_DEVICE.fullmatch(device_name)
            if driver not in GPU_DEVICE_CLASSES or match is None:
                continue
            index = int(match.group(1))
            if index >= len(at.free):
                unplaced += 1
                continue
            # a MIG device: its profile's slices when its ResourceSlice says, else one
            profile = profiles.get(device_name, "")
            share = 1.0 if "-mig-" not in device_name else _slices(profile) / MIG_SLICES
            at.free[index] = max(0.0, at.free[index] - share)
            at.whole_taken[index] = share >= 1.0
            held[n].append((index, share))
    for n, pod in enumerate(pods):
        got = held[n]
        if pod.whole:
            if node.mig_single:
                indices = at.take_mig(node.mig_single, pod.whole)
                share = _slices(node.mig_single) / MIG_SLICES
            elif pod.fraction is not None:
                indices, share = at.take_fraction(pod.whole, pod.fraction), pod.fraction
            elif node.replicas > 1:
                indices, share = at.take_replicas(pod.whole), 1 / node.replicas
            else:
                indices, share = at.take_whole(pod.whole), 1.0
            got += [(i, share) for i in indices]
            unplaced += pod.whole - len(indices)
        for profile, count in pod.mig:
            indices = at.take_mig(profile, count)
            got += [(i, _slices(profile) / MIG_SLICES) for i in indices]
            unplaced += count - len(indices)
    out_held = []
    for pod, parts in zip(pods, held, strict=True):
        if not parts:
            continue
        # one placement per share size: a pod holding a whole GPU and a MIG slice (DRA) is rare
        by_share: dict[float, list[int]] = {}
        for index, share in parts:
            by_share.setdefault(share, []).append(index)
        out_held.append((pod, tuple(
            Placement(pod.node, tuple(sorted(indices)), share, pod.cpus if n == 0 else 0.0)
            for n, (share, indices) in enumerate(sorted(by_share.items(), reverse=True)))))
    return _NodePart(out_node, tuple(gpus), tuple(out_held), unplaced)


def to_snapshot(
    taken_at: float,
    nodes: Iterable[KubeNode],
    pods: Iterable[KubePod],
    claims: Mapping[str, KubeClaim],
    slices: Iterable[KubeSlice],
    catalogue: Catalogue,
    parts: dict[str, tuple[_PartKey, _NodePart]] | None = None,
) -> tuple[FleetSnapshot, int]:
    """The cluster as a snapshot, and how many GPU requests could not be laid out (a pod asking
    for more than its node has: the view is mid-change, or a count label is wrong).

    ``parts`` (kept by the caller between calls) remembers each node's part with what it
    was made from: a node whose node record, pods, claims and slices are unchanged is not
    laid out again. The result is the same with or without it; at 5,000 nodes it is what
    keeps a read after a few changes cheap.
    """
    parts = {} if parts is None else parts
    uuids: dict[str, list[str]] = {}
    profiles: dict[str, dict[str, str]] = {}  # pool -> DRA device name -> its MIG profile
    for piece in slices:
        for device_name, device in piece.devices:
            if device.uuid and not device.profile and 0 <= device.index < 64:
                row = uuids.setdefault(piece.node or piece.pool, [])
                row.extend([""] * (device.index + 1 - len(row)))
                row[device.index] = device.uuid
            if device.profile:
                profiles.setdefault(piece.pool, {})[device_name] = device.profile
    by_node: dict[str, list[KubePod]] = {}
    waiting: list[KubePod] = []
    for pod in pods:
        if pod.node:
            by_node.setdefault(pod.node, []).append(pod)
        else:
            waiting.append(pod)
    owners = _group_owners(p for group in by_node.values() for p in group)
    unplaced = 0
    out_nodes: list[Node] = []
    out_gpus: list[Gpu] = []
    held: list[tuple[KubePod, tuple[Placement, ...]]] = []
    seen: set[str] = set()
    for node in sorted(nodes, key=lambda n: n.name):
        seen.add(node.name)
        on_node = tuple(sorted(by_node.get(node.name, ()), key=lambda p: (
            p.start_time or p.created or 0.0, p.namespace, p.name)))
        dra = tuple(tuple(device for name in pod.claims
                          for device in _claim_devices(claims, pod.namespace, name))
                    for pod in on_node)
        node_uuids = tuple(uuids.get(node.name, ()))
        node_profiles = tuple(sorted(profiles.get(node.name, {}).items()))
        key: _PartKey = (node, on_node, dra, node_uuids, node_profiles)
        cached = parts.get(node.name)
        if cached is not None and cached[0] == key:
            part = cached[1]
        else:
            part = _node_part(node, on_node, dra, node_uuids, dict(node_profiles), catalogue)
            parts[node.name] = (key, part)
        out_nodes.append(part.node)
        out_gpus.extend(part.gpus)
        held.extend(part.held)
        unplaced += part.unplaced
    for name in [n for n in parts if n not in seen]:
        del parts[name]  # a node gone: forget its part
    for name, group in by_node.items():
        if name not in seen:
            unplaced += sum(1 for p in group if p.whole or p.mig)
    allocations = []
    for pod, placements in held:
        shared_owner = owners.get((pod.namespace, pod.owner), 0) > 1
        job = f"{pod.namespace}/{pod.owner}" + (f"/{pod.name}" if shared_owner else "")
        allocations.append(Allocation(
            job=job, placements=placements, namespace=pod.namespace, pod=pod.name,
            priority=pod.priority, qos=pod.priority_class, account=pod.namespace,
            start_time=pod.start_time, last_checkpoint_time=pod.hints.last_checkpoint_time,
            gpu_memory_need_bytes=pod.hints.gpu_memory_need_bytes, interrupted=pod.disruption))
    # a waiting pod names a product; its pool is the one its nodes are in (with pool_label
    # set, pools are that label's values, not product names): a product whose nodes sit in
    # several pools, or none, keeps its name
    pools_of: dict[str, set[str]] = {}
    for made in out_nodes:
        pools_of.setdefault(made.model, set()).add(made.pool)
    pool_of = {model: next(iter(pools)) for model, pools in pools_of.items() if len(pools) == 1}
    pending = _pending(waiting, claims, catalogue, pool_of)
    snapshot = FleetSnapshot(taken_at, tuple(out_nodes), tuple(out_gpus),
                             tuple(sorted(allocations, key=lambda a: a.job)), pending)
    return snapshot, unplaced


def _claim_devices(claims: Mapping[str, KubeClaim], namespace: str,
                   name: str) -> tuple[tuple[str, str, str], ...]:
    claim = claims.get(f"{namespace}/{name}")
    return claim.devices if claim is not None else ()


def _pending(waiting: Iterable[KubePod], claims: Mapping[str, KubeClaim],
             catalogue: Catalogue, pool_of: Mapping[str, str] | None = None) -> tuple[JobRequest, ...]:
    """Unscheduled pods asking for GPUs, one request per job (a gang waits whole)."""
    jobs: dict[str, dict[str, Any]] = {}
    for pod in waiting:
        gpus = float(pod.whole) + sum(_slices(p) / MIG_SLICES * n for p, n in pod.mig)
        share = pod.fraction if pod.fraction is not None else 1.0
        for claim_name in pod.claims:
            claim = claims.get(f"{pod.namespace}/{claim_name}")
            if claim is not None and not claim.devices:
                gpus += claim.requested
        if gpus <= 0:
            continue
        job = jobs.setdefault(f"{pod.namespace}/{pod.owner}", {
            "gpus": 0.0, "pods": 0, "cpus": 0.0, "priority": pod.priority, "share": share,
            "submit": pod.created, "models": pod.models})
        job["gpus"] += gpus
        job["pods"] += 1
        job["cpus"] += pod.cpus
        job["priority"] = max(job["priority"], pod.priority)
        if pod.created is not None and (job["submit"] is None or pod.created < job["submit"]):
            job["submit"] = pod.created
    return tuple(
        JobRequest(job=name, gpu_count=math.ceil(j["gpus"]), gpu_share=j["share"], cpus=j["cpus"],
                   node_count=j["pods"], models=models,
                   pool=(pool_of or {}).get(models[0], models[0]) if models else "",
                   priority=j["priority"], submit_time=j["submit"])
        for name, j in sorted(jobs.items())
        # a nodeSelector on the product asks for that pool (pools are products by default)
        for models in [tuple(catalogue.resolve(m.replace("-", " ")) for m in j["models"])])


# -- the source --------------------------------------------------------------------------------

@dataclass
class KubernetesAllocationSource:
    config: KubernetesConfig
    clock: Clock
    catalogue: Catalogue = field(default_factory=default_catalogue)
    service_account: Path = SERVICE_ACCOUNT
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    name: str = "kubernetes"
    role: str = "allocation"
    # the kubeconfig files and context build() chose (kubeconfig.choose); None: choose at start
    kubeconfig_choice: kubeconfig.KubeconfigChoice | None = None
    _informers: Any = None  # kube_informer.InformerSet once started
    _session: Any = None
    _reading: SourceReading | None = None
    _revisions: tuple[int, ...] = ()
    _parse_errors: int = 0
    _unplaced: int = 0  # GPU requests the last rebuild could not lay out
    _skipped: int = 0  # objects the informers dropped as too deep to decode, so far
    _start_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _parts: dict[str, Any] = field(default_factory=dict)  # to_snapshot's per-node memo
    # issue 30: no GPU node after a list that had some is a down source, not an empty fleet
    _emptied: EmptiedFleet = field(default_factory=lambda: EmptiedFleet(
        "kubernetes", "the apiserver lists no node with a GPU"))

    async def _endpoint(self) -> Any:
        """The apiserver's URL, TLS and token, loaded by kubernetes_asyncio's own loaders
        (exec plugins, client certificates, in-cluster token refresh)."""
        from kubernetes_asyncio import config as kube_config
        from kubernetes_asyncio.client import Configuration

        from exporter.sources.kubernetes.informer import Endpoint

        configuration = Configuration()
        loader: Any = None
        chosen = self.kubeconfig_choice
        try:
            if chosen is None:
                chosen = kubeconfig.choose(self.config, self.environ)
            if not chosen.in_cluster:
                # load_kube_config's own steps, with kubectl's context (the first file's
                # current-context, where the merger would take the last one's)
                from kubernetes_asyncio.config.kube_config import (
                    ENV_KUBECONFIG_PATH_SEPARATOR,
                    KubeConfigLoader,
                    KubeConfigMerger,
                )

                merged = KubeConfigMerger(ENV_KUBECONFIG_PATH_SEPARATOR.join(chosen.files))
                loader = KubeConfigLoader(config_dict=merged.config, config_base_path=None,
                                          active_context=chosen.context)
                await loader.load_and_set(configuration)
            else:
                kube_config.load_incluster_config(
                    client_configuration=configuration,
                    token_filename=str(self.service_account / "token"),
                    cert_filename=str(self.service_account / "ca.crt"),
                    environ=self.environ)
        except (kube_config.ConfigException, OSError, ValueError, TypeError, KeyError,
                SourceStartupError) as exc:
            if isinstance(exc, SourceStartupError):
                raise KubernetesError(str(exc)[:300]) from None
            origin = chosen.origin if chosen is not None else kubeconfig.IN_CLUSTER.origin
            raise KubernetesError(f"{origin}: {str(exc)[:300]}") from None
        context: Any = None
        host = str(configuration.host or "")
        if host.startswith("https"):
            if not configuration.verify_ssl:
                context = False
            else:
                context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
                if configuration.cert_file:
                    context.load_cert_chain(configuration.cert_file, configuration.key_file)

        async def authorization() -> str | None:
            # An exec plugin's token expires (EKS: 15 min); the loader runs the plugin again
            # once its expirationTimestamp has passed, else returns at once. (In a pod, the
            # configuration's own hook re-reads the rotated service account token.)
            if loader is not None and "exec" in (loader._user or {}):
                try:
                    await loader.load_from_exec_plugin()
                except (kube_config.ConfigException, OSError, ValueError) as exc:
                    raise KubernetesError(f"sources.kubernetes.kubeconfig: exec plugin: "
                                          f"{str(exc)[:200]}") from None
                configuration.api_key["BearerToken"] = loader.token
            value: str | None = await configuration.get_api_key_with_prefix("BearerToken")
            return value

        return Endpoint(host.rstrip("/"), context, authorization)

    async def _start(self) -> None:
        from exporter import http_client
        from exporter.sources.kubernetes.informer import Informer, InformerSet, Limits

        endpoint = await self._endpoint()
        c = self.config
        limits = Limits(page_size=c.page_size, request_timeout=c.request_timeout,
                        watch_timeout=c.watch_timeout, backoff_initial=c.backoff_initial,
                        backoff_max=c.backoff_max, backoff_reset=c.backoff_reset,
                        max_objects=c.max_objects, max_event_bytes=c.max_event_bytes,
                        max_page_bytes=c.max_page_bytes)
        self._session = http_client.client_session()
        informers: list[Informer[Any]] = [
            Informer(self._session, endpoint, NODES, lambda obj: node_record(obj, c.pool_label),
                     limits, "nodes", NodeShape),
            Informer(self._session, endpoint, PODS, pod_record, limits, "pods", PodShape),
        ]
        if c.resource_claims:
            informers.append(Informer(self._session, endpoint, CLAIMS, claim_record, limits,
                                      "resourceclaims"))
        if c.resource_slices:
            informers.append(Informer(self._session, endpoint, SLICES, slice_record, limits,
                                      "resourceslices"))
        self._informers = InformerSet(informers)
        self._informers.start()

    async def read(self) -> SourceReading:
        async with self._start_lock:
            if self._informers is None:
                await self._start()
        informers = self._informers.informers
        if not await self._informers.synced(self.config.sync_timeout):
            waiting = [i for i in informers if not i.synced.is_set()]
            # the lists may have ended as the wait did: then none is waiting
            why = waiting[0].error if waiting else "the lists ended as the wait did"
            raise KubernetesError(f"no first list within sync_timeout "
                                  f"({self.config.sync_timeout:g}s): {why}")
        down = [i for i in informers if not i.healthy and not i.not_served]
        if down:
            raise KubernetesError(down[0].error)
        skipped = sum(i.stats.skipped for i in informers)
        revisions = (*(i.revision for i in informers), skipped)
        if self._reading is None or revisions != self._revisions:
            # each object skipped is counted once, as it is dropped
            self._parse_errors += skipped - self._skipped
            self._skipped = skipped
            by_name = {i.name: i for i in informers}
            nodes = list(by_name["nodes"].store.values())
            self._check_gpus(nodes)
            claims = by_name.get("resourceclaims")
            slices = by_name.get("resourceslices")
            # Built in a worker thread: 300,000 pods took one scrape 9.7 s on the event loop.
            # The thread gets copies, since watch events change the stores on the loop
            # meanwhile; ``_parts`` is this method's alone (reads are never concurrent).
            pods = list(by_name["pods"].store.values())
            claim_view = dict(claims.store) if claims is not None else {}
            slice_view = list(slices.store.values()) if slices is not None else []
            snapshot, unplaced = await asyncio.to_thread(
                self._build, self.clock(), nodes, pods, claim_view, slice_view)
            # counted and logged as they appear: a pod stuck beyond its node's GPUs is laid
            # out again by every rebuild, and would count again each time
            if unplaced > self._unplaced:
                self._parse_errors += unplaced - self._unplaced
                log.warning("GPU requests beyond what their nodes have",
                            extra={"source": self.name, "err": f"{unplaced} not laid out"})
            self._unplaced = unplaced
            self._reading = SourceReading.of(snapshot, parse_errors=self._parse_errors)
            self._revisions = revisions
        return self._emptied.check(self._reading)

    def _check_gpus(self, nodes: Sequence[KubeNode]) -> None:
        """Refuse a cluster over ``max_gpus`` before building anything of it.

        Memory grows with the GPUs built, not with the node records kept: 20,000 nodes
        labelled with 64 GPUs each passed 4 GB. Over the cap the read fails with the
        reason, and the collector serves the last good view stale.
        """
        total = sum(n.gpus + sum(count for _, count, _ in n.mig) for n in nodes)
        if total > self.config.max_gpus:
            raise KubernetesError(
                f"{total} GPUs on {len(nodes)} nodes, over sources.kubernetes.max_gpus "
                f"({self.config.max_gpus}): not read")

    def _build(self, taken_at: float, nodes: list[KubeNode], pods: list[KubePod],
               claims: dict[str, KubeClaim], slices: list[KubeSlice]) -> tuple[FleetSnapshot, int]:
        from exporter.sources.kubernetes.informer import paused_gc

        # a burst of allocation (kube_informer says why); the event loop runs meanwhile,
        # with collection off for as long as this build takes
        with paused_gc():
            return to_snapshot(taken_at, nodes, pods, claims, slices, self.catalogue,
                               self._parts)

    async def close(self) -> None:
        if self._informers is not None:
            await self._informers.stop()
            self._informers = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def build(config: KubernetesConfig, clock: Clock,
          service_account: Path = SERVICE_ACCOUNT,
          environ: Mapping[str, str] | None = None) -> KubernetesAllocationSource:
    environ = dict(os.environ) if environ is None else environ
    try:
        import aiohttp  # noqa: F401
        import kubernetes_asyncio  # noqa: F401
    except ImportError:
        raise SourceStartupError(missing("kubernetes_asyncio", "sources.kubernetes")) from None
    chosen = kubeconfig.choose(config, environ)  # kubectl's order: option, KUBECONFIG, ~/.kube
    if chosen.in_cluster:
        if not environ.get("KUBERNETES_SERVICE_HOST") or not environ.get("KUBERNETES_SERVICE_PORT"):
            raise SourceStartupError(
                "sources.kubernetes.kubeconfig: empty, and this is not a pod "
                "(KUBERNETES_SERVICE_HOST/PORT unset): name a kubeconfig file (KUBECONFIG is "
                "unset and there is no ~/.kube/config)")
        if not (service_account / "token").is_file():
            raise SourceStartupError(
                f"sources.kubernetes.kubeconfig: empty, and there is no service account token at "
                f"{service_account / 'token'} (automountServiceAccountToken off?)")
    if config.sync_timeout <= 0:
        raise SourceStartupError("sources.kubernetes.sync_timeout: must be above 0")
    return KubernetesAllocationSource(config, clock, service_account=service_account,
                                      environ=environ, kubeconfig_choice=chosen)
