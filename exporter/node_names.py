"""What a node name may be: one rule for the sources that read names and the renderers that
put them into commands (``exporter.health.render.node_name`` is its face there).

A node name goes into a command line (``scontrol update NodeName=X``) and a URL path
(``/api/v1/nodes/X``), so it is one plain host name: letters, digits, ``.``, ``_`` and ``-``,
starting with a letter or digit, at most 253 characters. That leaves out every hostlist
expression Slurm would expand into several nodes (``gpu-[1-4]``, ``a,b``, ``a b``), shell and
scontrol syntax, and Unicode digits. Two plain words are Slurm's own and name no single node
in any case: ``ALL`` (every node: ``scontrol update NodeName=ALL`` drains the cluster) and
``DEFAULT`` (slurm.conf's defaults line). A NodeSet name looks like any node name and
cannot be told apart here: ``gpufleet act`` asks Slurm that the name is exactly one node.
"""

from __future__ import annotations

import re

MAX_NODE_NAME = 253  # a DNS name, a Kubernetes node name
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
RESERVED = frozenset({"all", "default"})  # compared in lower case: Slurm reads them so
_SHOWN_CHARS = 80
NOT_A_NODE_NAME = "is not a node name (letters, digits, '.', '_', '-')"


def node_name_problem(name: object) -> str:
    """Why ``name`` is no node name ("" when it is one), to follow the name in a message."""
    if not isinstance(name, str) or not _NODE_NAME.fullmatch(name):
        return NOT_A_NODE_NAME
    if name.lower() in RESERVED:
        return "is reserved by Slurm (it names no single node), not a node name"
    return ""


def is_node_name(name: object) -> bool:
    return not node_name_problem(name)


def same_node(a: str, b: str) -> bool:
    """``a`` and ``b`` name one node: equal without case, or a short name and an FQDN whose
    first label it is (``gpu-005`` and ``gpu-005.cluster.local``)."""
    a, b = a.lower().rstrip("."), b.lower().rstrip(".")
    if a == b:
        return True
    if "." in a and "." not in b:
        a, b = b, a
    return "." not in a and b.partition(".")[0] == a


def shown(name: object) -> str:
    """``name`` for a one-line message: quoted, every control character escaped, bounded."""
    if not isinstance(name, str):
        return repr(name)[:_SHOWN_CHARS]
    text = name
    more = "..." if len(text) > _SHOWN_CHARS else ""
    return f"{text[:_SHOWN_CHARS]!r}{more}"


__all__ = ["MAX_NODE_NAME", "NOT_A_NODE_NAME", "RESERVED", "is_node_name", "node_name_problem",
           "same_node", "shown"]
