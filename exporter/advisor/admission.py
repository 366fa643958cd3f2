"""``POST /v1/admission``: a mutating admission webhook that steers GPU pods away from fragments.

The Kubernetes apiserver sends an AdmissionReview (``admission.k8s.io/v1``) for each
pod created; the answer always admits the pod. A pod that asks for GPUs gets a JSON
patch adding two ``preferredDuringSchedulingIgnoredDuringExecution`` node affinity
terms, from FGD against the live workload (:mod:`exporter.advisor.steer`): one naming
the node FGD itself would choose for the pod's own ask, one naming the
:data:`~exporter.advisor.steer.PREFERRED_NODES` best in FGD's order, it first. FGD's
choice matches both terms, so it outscores the other named nodes as they outscore
the rest; with one term naming them all alike, the scheduler's own scoring picked
among them, and ``gpufleet simulate`` (``steer-pod-flat`` against ``steer-pod``,
docs/simulate.md) found that got a fraction of FGD's gain. Nodes are named by
``metadata.name``, so no node label is assumed. The scheduler still decides: a
preference only adds to its node scores, and the pod's own required affinity,
selectors and taints still hold.

Nothing here may keep a pod out: a pod that asks for no GPU, a fleet not yet read,
or a pod that fits nowhere now is admitted unchanged; a body that is not an
AdmissionReview is a 400 (the apiserver then applies the webhook's
``failurePolicy``, which the shipped manifest sets to ``Ignore``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from exporter.advisor import steer
from exporter.analysis.index import Report
from exporter.gpu_catalogue import default_catalogue
from exporter.sources.kubernetes.source import pod_record

log = logging.getLogger(__name__)

PATH = "/v1/admission"
API_VERSION = "admission.k8s.io/v1"
# of 1-100, per term: a strong hint that still leaves room for the pod's own terms; FGD's choice
# matches both terms (100), the other named nodes one (50)
PREFERENCE_WEIGHT = 50
MAX_UID = 128
PREFERRED = "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution"


class BadReview(ValueError):
    """The body is no AdmissionReview the webhook can answer."""


def _request(review: Any) -> Mapping[str, Any]:
    if not isinstance(review, dict):
        raise BadReview("the body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(f"not an AdmissionReview of {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID:
        raise BadReview("the request has no uid")
    return request


def _models(report: Report, products: tuple[str, ...]) -> tuple[str, ...]:
    """Catalogue names of the products a pod's nodeSelector names, as the fleet's nodes are
    named by the same catalogue; () when it names none."""
    if not products:
        return ()
    catalogue = default_catalogue()
    # find, not get: a pod's product is the pod author's text, and an unknown one must not be
    # logged and remembered for every request; it matches no node, and the pod gets no patch
    return tuple(dict.fromkeys(spec.name if (spec := catalogue.find(p)) is not None else p
                               for p in products))


def patch_for(pod: Mapping[str, Any], report: Report | None) -> list[dict[str, Any]]:
    """The JSON patch for ``pod``: [] when it asks for no GPU, no fleet is known or it fits
    nowhere now."""
    record = pod_record(pod)
    if record is None or report is None or record.whole <= 0:
        return []
    share = record.fraction if record.fraction is not None else 1.0
    nodes = steer.preferred_nodes(report.state, report.workload, record.cpus, record.whole, share,
                                  _models(report, record.models))
    if not nodes:
        return []
    terms = [_term(nodes[:1]), _term(nodes)]
    spec = pod.get("spec")
    affinity = spec.get("affinity") if isinstance(spec, dict) else None
    if not isinstance(affinity, dict):
        return [{"op": "add", "path": "/spec/affinity",
                 "value": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}}]
    node_affinity = affinity.get("nodeAffinity")
    if not isinstance(node_affinity, dict):
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity",
                 "value": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}]
    if not isinstance(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"), list):
        return [{"op": "add", "path": f"{PREFERRED}", "value": terms}]
    return [{"op": "add", "path": f"{PREFERRED}/-", "value": term} for term in terms]


def _term(nodes: list[str]) -> dict[str, Any]:
    return {"weight": PREFERENCE_WEIGHT, "preference": {"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": nodes}]}}


def answer(body: bytes, current: Callable[[], Report | None]) -> dict[str, Any]:
    """The AdmissionReview answering ``body``; raises :class:`BadReview` for a body that is
    not one. The pod is always allowed."""
    try:
        review = json.loads(body)
    except (ValueError, RecursionError):
        raise BadReview("the body is not JSON") from None
    request = _request(review)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = request.get("kind")
    pod = request.get("object")
    is_pod = isinstance(kind, dict) and kind.get("kind") == "Pod" and kind.get("group", "") == ""
    if is_pod and request.get("operation", "CREATE") == "CREATE" and isinstance(pod, dict):
        try:
            ops = patch_for(pod, current())
        except Exception:  # steering is a hint: a fault here admits the pod unchanged
            log.exception("admission: no preference for this pod")
            ops = []
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops, separators=(",", ":")).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def add_route(app: web.Application, current: Callable[[], Report | None]) -> None:
    """``POST /v1/admission``, answering from ``current()``: the last frame's analysis, or
    None while there is none or the fleet is read blind. No bearer token: the apiserver
    presents none by default, and the answer only ever admits (the body cap is the app's)."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            return web.json_response({"error": f"body too large: {exc.reason}"}, status=413)
        try:
            # FGD over every node: off the loop, so /metrics never waits for a pod
            answer_ = await asyncio.to_thread(answer, body, current)
        except BadReview as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(answer_)

    app.router.add_post(PATH, handle)


__all__ = ["API_VERSION", "PATH", "PREFERENCE_WEIGHT", "BadReview", "add_route", "answer", "patch_for"]
