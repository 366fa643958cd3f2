"""A plan as Kubernetes objects: Koordinator ``PodMigrationJob``s or ``policy/v1`` Evictions.

``gpufleet plan`` (:mod:`exporter.cli.plan`) prints what this renders. Pure functions: a
typed plan (:func:`exporter.advisor.wire.plan_from_json` reads one) and the time in, YAML
documents out.

Koordinator (``--format koordinator``), one ``PodMigrationJob`` per move, cluster-scoped,
``spec.mode: ReservationFirst``: Koordinator's migration controller first creates a
``Reservation`` from ``spec.reservationOptions.template``, waits until the scheduler has
placed it, and only then evicts ``spec.podRef``; the replacement pod (made by the pod's
owner) takes the reserved resources. So the destination is held before the source is
given up. What the template says, and why:

- ``spec.template`` is the pod the reservation stands for. Koordinator uses a given
  template as it is (``pkg/descheduler/controllers/migration/reservation/util.go``,
  ``CreateOrUpdateReservationOptions``): it copies the old pod's spec only when there is
  none, and then nothing pins the destination. The plan knows the destination and the
  GPUs and CPUs; it does not know the pod's memory, image or other tolerations. So the
  template holds node affinity to ``to.node`` (``matchFields metadata.name``, which the
  controller extends with ``NotIn`` the old node), one container requesting the plan's
  GPUs (``nvidia.com/gpu``, or Koordinator's ``koordinator.sh/gpu-core`` and
  ``gpu-memory-ratio`` in percent for a shared GPU) and CPUs, and a toleration of the
  ``nvidia.com/gpu`` taint that GPU nodes commonly carry. ``owners`` is left out: the
  controller fills it from the old pod's controller.
- ``checkpoint_then_migrate`` renders ``spec.paused: true``: the job must checkpoint
  first; whoever triggers the checkpoint unpauses the job (``kubectl patch pmj NAME
  --type merge -p '{"spec":{"paused":false}}'``). ``migrate`` starts at once.
- ``spec.ttl`` is what is left of the plan's life (``expires_at`` minus now): a plan must
  not be acted on after it expires, and Koordinator aborts a job past its TTL.

Evictions (``--format eviction``), one per move: ``policy/v1`` ``Eviction`` of the old pod,
which honours PodDisruptionBudgets. An Eviction cannot say where the replacement goes,
and the apiserver keeps nothing of it once the pod is evicted, so the destination rides
as annotations that only an admission webhook on ``pods/eviction`` (or whoever applies
the stream) sees: ``gpufleet.io/destination-node-affinity`` is a ``v1.NodeAffinity`` in
JSON, ready to put in the replacement pod's ``spec.affinity.nodeAffinity``. Not
reservation-first: the old pod goes before anything holds the destination. Evictions
are created with ``kubectl create --raw /api/v1/namespaces/NS/pods/POD/eviction``
(a subresource: ``kubectl apply`` does not know the kind); each document's comment
gives the path.

``wait_until`` moves render no object in either format: the planner says "not yet"
(the job is younger than its minimum age), and the next plan carries the move as a real
one. A comment in the stream says so, with the time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import yaml

from exporter.advisor.plan import CompactionPlan, Migration
from exporter.advisor.wire import PlanFormatError

PMJ_API_VERSION = "scheduling.koordinator.sh/v1alpha1"
ANNOTATION = "gpufleet.io/"
GPU_RESOURCE = "nvidia.com/gpu"
# Koordinator's GPU share resources: percent of one GPU (apis/extension/device_share.go)
KOORD_GPU_CORE = "koordinator.sh/gpu-core"
KOORD_GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
# the taint the GPU Operator docs and the managed clouds (GKE, AKS) put on GPU nodes
GPU_TOLERATION = MappingProxyType({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})

# Kubernetes' own name rules (apimachinery validation: IsDNS1123Subdomain / Label)
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(f"^{_LABEL}$")
DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


# libyaml's emitter where PyYAML was built with it: the pure-Python one took 2 ms an object
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class RenderError(PlanFormatError):
    """The plan cannot become valid Kubernetes objects; the message names the move and field."""


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document of the stream: comment lines above it, and the object (None: a
    comment only, for a move that renders no object)."""

    comments: tuple[str, ...]
    obj: dict[str, Any] | None


# --- checks and small helpers -----------------------------------------------------------


def _check_names(order: int, m: Migration) -> None:
    where = f"migrations[order {order}]"
    if len(m.namespace) > 63 or not DNS_LABEL.match(m.namespace):
        raise RenderError(f"{where}.namespace: not a Kubernetes namespace: {m.namespace[:80]!r}")
    if len(m.pod) > 253 or not DNS_SUBDOMAIN.match(m.pod):
        raise RenderError(f"{where}.pod: not a Kubernetes pod name: {m.pod[:80]!r}")
    for side, endpoint in (("from", m.source), ("to", m.destination)):
        if len(endpoint.node) > 253 or not DNS_SUBDOMAIN.match(endpoint.node):
            raise RenderError(f"{where}.{side}.node: not a Kubernetes node name: {endpoint.node[:80]!r}")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gpus(gpus: Iterable[int]) -> str:
    return ",".join(map(str, gpus))


def _quantity(cpus: float) -> str:
    """A CPU quantity as Kubernetes writes it: whole CPUs plain, others in millicores."""
    millis = round(cpus * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def node_affinity(node: str) -> dict[str, Any]:
    """A ``v1.NodeAffinity`` that requires ``node``: by ``metadata.name`` (a field, so no
    label is assumed; ``kubernetes.io/hostname`` may differ from the node's name)."""
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


def _annotations(plan: CompactionPlan, plan_id: str, order: int, m: Migration) -> dict[str, str]:
    return {
        f"{ANNOTATION}plan-id": plan_id,
        f"{ANNOTATION}order": str(order),
        f"{ANNOTATION}job": m.job,
        f"{ANNOTATION}action": m.action,
        f"{ANNOTATION}from": f"{m.source.node}:{_gpus(m.source.gpus)}",
        f"{ANNOTATION}to": f"{m.destination.node}:{_gpus(m.destination.gpus)}",
        f"{ANNOTATION}gpu-seconds-since-checkpoint": f"{m.cost_gpu_seconds:g}",
        f"{ANNOTATION}expires-at": _iso(plan.expires_at),
        **({f"{ANNOTATION}reason": m.reason} if m.reason else {}),
    }


def _resources(m: Migration) -> dict[str, Any]:
    gpus = len(m.destination.gpus)
    if not gpus:
        extended = {}  # a CPU-only job: no GPU resource to ask for
    elif m.gpu_share >= 1.0:
        extended = {GPU_RESOURCE: str(gpus)}
    else:
        percent = str(max(1, round(100 * m.gpu_share)) * gpus)
        extended = {KOORD_GPU_CORE: percent, KOORD_GPU_MEMORY_RATIO: percent}
    requests = dict(extended)
    if m.cpus > 0:
        requests["cpu"] = _quantity(m.cpus)
    # extended resources must have requests equal to limits; CPU gets a request only
    return {"requests": requests, "limits": dict(extended)}


def _waiting(order: int, m: Migration) -> Document:
    when = _iso(m.wait_until) if m.wait_until is not None else "later"
    return Document((
        f"order {order}: {m.namespace}/{m.pod} ({m.job}) to {m.destination.node}: wait_until {when}.",
        "Not rendered: the job is younger than the planner's minimum age; the next plan carries",
        "this move as a real one.",
    ), None)


def _moves(plan: CompactionPlan) -> Iterable[tuple[int, Migration]]:
    for order, m in enumerate(plan.migrations, start=1):
        _check_names(order, m)
        yield order, m


def _ttl_seconds(plan: CompactionPlan, now: float) -> int:
    left = int(plan.expires_at - now)
    if left <= 0:
        raise RenderError(f"plan {plan.plan_id} expired at {_iso(plan.expires_at)}")
    return left


# --- the renderers ----------------------------------------------------------------------


def render_koordinator(plan: CompactionPlan, now: float) -> list[Document]:
    """One ``PodMigrationJob`` per move (reservation first); a comment for ``wait_until``."""
    ttl = _ttl_seconds(plan, now)
    plan_id = plan.plan_id  # a hash of every move: once, not per move (10,000 moves took over 3 min)
    documents: list[Document] = []
    for order, m in _moves(plan):
        if m.action == "wait_until":
            documents.append(_waiting(order, m))
            continue
        labels = {f"{ANNOTATION}plan-id": plan_id}
        spec: dict[str, Any] = {
            "mode": "ReservationFirst",
            **({"paused": True} if m.action == "checkpoint_then_migrate" else {}),
            "ttl": f"{ttl}s",
            "podRef": {"apiVersion": "v1", "kind": "Pod", "namespace": m.namespace, "name": m.pod},
            "reservationOptions": {"template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "affinity": {"nodeAffinity": node_affinity(m.destination.node)},
                        "tolerations": [dict(GPU_TOLERATION)],
                        "containers": [{"name": "reserved", "resources": _resources(m)}],
                    },
                }},
            }},
        }
        obj = {
            "apiVersion": PMJ_API_VERSION, "kind": "PodMigrationJob",
            "metadata": {"name": f"gpufleet-{plan_id}-{order}", "labels": labels,
                         "annotations": _annotations(plan, plan_id, order, m)},
            "spec": spec,
        }
        note = (f"order {order}: {m.action} {m.namespace}/{m.pod} ({m.job}) "
                f"{m.source.node}:{_gpus(m.source.gpus)} -> {m.destination.node}:{_gpus(m.destination.gpus)}")
        extra = ("paused until the job has checkpointed: unpause with kubectl patch pmj "
                 f"gpufleet-{plan_id}-{order} --type merge -p '{{\"spec\":{{\"paused\":false}}}}'",)
        documents.append(Document((note, *(extra if m.action == "checkpoint_then_migrate" else ())), obj))
    return documents


def render_evictions(plan: CompactionPlan, now: float) -> list[Document]:
    """One ``policy/v1`` Eviction per move, with the destination as an annotation hint."""
    _ttl_seconds(plan, now)  # an expired plan is not acted on in any format
    plan_id = plan.plan_id
    documents: list[Document] = []
    for order, m in _moves(plan):
        if m.action == "wait_until":
            documents.append(_waiting(order, m))
            continue
        annotations = _annotations(plan, plan_id, order, m)
        annotations[f"{ANNOTATION}destination-node-affinity"] = json.dumps(
            node_affinity(m.destination.node), separators=(",", ":"))
        obj = {"apiVersion": "policy/v1", "kind": "Eviction",
               "metadata": {"name": m.pod, "namespace": m.namespace, "annotations": annotations}}
        comments = [
            f"order {order}: {m.action} {m.namespace}/{m.pod} ({m.job}) "
            f"{m.source.node}:{_gpus(m.source.gpus)} -> {m.destination.node}:{_gpus(m.destination.gpus)}",
            f"kubectl create --raw /api/v1/namespaces/{m.namespace}/pods/{m.pod}/eviction -f <this, as JSON>",
        ]
        if m.action == "checkpoint_then_migrate":
            comments.append("checkpoint the job first: the eviction stops it at once "
                            "(after its grace period)")
        documents.append(Document(tuple(comments), obj))
    return documents


def _comment(line: str) -> str:
    """One comment line. Comments carry names from the plan (jobs, scopes); a line break in
    one would end the comment and put what follows (``---`` and an object of the sender's
    choosing) into the stream ``kubectl apply`` reads, so every line break becomes a space."""
    return "# " + " ".join(line.splitlines()) + "\n"


def to_yaml(documents: Iterable[Document], header: Iterable[str] = ()) -> str:
    """A multi-document YAML stream for ``kubectl apply -f -``: each object's comments open
    its document; a move without an object is a comment between documents, never an empty
    document."""
    parts = [_comment(line) for line in header]
    for doc in documents:
        comments = [_comment(line) for line in doc.comments]
        if doc.obj is None:  # between documents: no empty document for kubectl to meet
            parts += comments
            continue
        parts += ["---\n", *comments]
        parts.append(yaml.dump(doc.obj, Dumper=_DUMPER, sort_keys=False, default_flow_style=False,
                               width=1000))  # one line per annotation
    return "".join(parts)


__all__ = ["Document", "RenderError", "node_affinity", "render_evictions", "render_koordinator",
           "to_yaml"]
