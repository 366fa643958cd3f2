"""Remediation actions as the scheduler takes them: ``scontrol`` for Slurm, a node patch for
Kubernetes (issue 31, Build 2).

Slurm: a drain is ``scontrol update NodeName=X State=DRAIN Reason="gpufleet: <reason>"``,
a resume ``scontrol update NodeName=X State=RESUME``. The ``gpufleet:`` prefix is how a
resume tells gpufleet's drain from an operator's (``gpufleet act`` resumes only its own).

Kubernetes: a drain cordons the node (``spec.unschedulable``) and adds the taint
``gpufleet.io/gpu-unhealthy=<reason>:NoSchedule``, the full reason in an annotation; a
resume removes both, and uncordons only a node gpufleet cordoned (annotation
``gpufleet.io/cordoned``). Each is a JSON merge patch (RFC 7386) that carries the node's
``metadata.resourceVersion``: the apiserver refuses it with 409 Conflict when the node
changed since it was read, so the taint list (which a merge patch replaces whole) never
drops a taint someone else added meanwhile.

A GPU reset and a replacement are advice for a human or a site's own automation: neither
scheduler has a verb for them, so they render to no command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from exporter.health.remediation import Drain, Event, Resume
from exporter.node_names import node_name_problem, shown

REASON_PREFIX = "gpufleet: "
TAINT_KEY = "gpufleet.io/gpu-unhealthy"
REASON_ANNOTATION = "gpufleet.io/gpu-unhealthy-reason"
CORDONED_ANNOTATION = "gpufleet.io/cordoned"
MERGE_PATCH = "application/merge-patch+json"
_REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 .,;:/_()+=%#-]")  # nothing a shell or scontrol reads
_WORD = re.compile(r"[A-Za-z0-9_./-]+(=[A-Za-z0-9_.-]+)?")  # scontrol (or its path), State=DRAIN
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
MAX_LABEL_VALUE = 63


class RenderError(ValueError):
    """An event no scheduler command can be made from (a bad node name)."""


def node_name(name: str) -> str:
    """``name`` if it is one node's name (it goes into a command line and a URL path): no
    hostlist expression, no ``ALL`` in any case (:mod:`exporter.node_names`, the one rule).
    Every renderer and ``gpufleet act`` asks this; the message is one line whatever the
    name holds."""
    problem = node_name_problem(name)
    if problem:
        raise RenderError(f"node: {shown(name)} {problem}")
    return name


def slurm_reason(reason: str) -> str:
    """The drain reason as Slurm keeps it: prefixed, with nothing a shell would expand."""
    return REASON_PREFIX + _REASON_UNSAFE.sub("_", reason).strip()


def slurm_argv(event: Event) -> list[str] | None:
    """The ``scontrol`` arguments for ``event``; None: Slurm has no verb for it."""
    if isinstance(event, Drain):
        return ["scontrol", "update", f"NodeName={node_name(event.node)}", "State=DRAIN",
                f"Reason={slurm_reason(event.reason)}"]
    if isinstance(event, Resume):
        return ["scontrol", "update", f"NodeName={node_name(event.node)}", "State=RESUME"]
    return None


def slurm_command_text(argv: list[str]) -> str:
    """The command as an operator would type it: ``Reason="gpufleet: XID 79 on GPU 3"``.

    Every word but the reason is a bare node name (:func:`node_name`) or keyword, and the
    reason holds no quote, ``$``, backtick, backslash or newline (:func:`slurm_reason`), so
    this is also exactly what a shell would run: checked here again, word by word, since
    this text is what an operator pastes. :class:`RenderError` for any other word.
    """
    words = []
    for word in argv:
        key, _, value = word.partition("=")
        if key == "Reason":
            if not value.startswith(REASON_PREFIX) or _REASON_UNSAFE.search(value):
                raise RenderError(f"reason: {shown(value)} is not a reason gpufleet writes")
            words.append(f'{key}="{value}"')
            continue
        if key == "NodeName":
            node_name(value)
        elif not _WORD.fullmatch(word):
            raise RenderError(f"command: {shown(word)} is not a word gpufleet writes")
        words.append(word)
    return " ".join(words)


def taint_value(reason: str) -> str:
    """A taint's value is a label value: 63 characters of ``[A-Za-z0-9_.-]``, alphanumeric ends."""
    value = _LABEL_UNSAFE.sub("-", reason)[:MAX_LABEL_VALUE]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def kubernetes_patch(event: Event, node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch taking ``node`` (as read from the apiserver) to the state ``event``
    asks for; None: Kubernetes has no verb for it."""
    if not isinstance(event, Drain | Resume):
        return None
    if node_name(event.node) != node.get("metadata", {}).get("name"):
        raise RenderError(f"node: the event is for {event.node}, the node read is "
                          f"{shown(node.get('metadata', {}).get('name'))}")
    meta = node["metadata"]
    spec = node.get("spec") or {}
    annotations = meta.get("annotations") or {}
    others = [t for t in spec.get("taints") or () if t.get("key") != TAINT_KEY]
    patch_meta: dict[str, Any] = {"resourceVersion": meta["resourceVersion"]}
    if isinstance(event, Drain):
        patch_meta["annotations"] = {REASON_ANNOTATION: slurm_reason(event.reason)}
        if not spec.get("unschedulable") or annotations.get(CORDONED_ANNOTATION) == "true":
            patch_meta["annotations"][CORDONED_ANNOTATION] = "true"
        taint = {"key": TAINT_KEY, "value": taint_value(event.reason), "effect": "NoSchedule"}
        return {"metadata": patch_meta, "spec": {"unschedulable": True, "taints": [*others, taint]}}
    # a merge patch deletes a key set to null
    patch_meta["annotations"] = {REASON_ANNOTATION: None, CORDONED_ANNOTATION: None}
    patch_spec: dict[str, Any] = {"taints": others or None}
    if annotations.get(CORDONED_ANNOTATION) == "true":
        patch_spec["unschedulable"] = None  # uncordon only what gpufleet cordoned
    return {"metadata": patch_meta, "spec": patch_spec}


__all__ = ["CORDONED_ANNOTATION", "MERGE_PATCH", "REASON_ANNOTATION", "REASON_PREFIX", "TAINT_KEY",
           "RenderError", "kubernetes_patch", "node_name", "slurm_argv", "slurm_command_text",
           "slurm_reason", "taint_value"]
