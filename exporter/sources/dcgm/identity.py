"""Which node a dcgm-exporter target may speak for: a node is who its target is.

A body names its node in its ``Hostname`` label, and a drain follows that name, so a target
that names another node (or ``ALL``) would have that node drained. A target speaks only for
its own node:

- **Its node is known** when the target's configuration names it (``labels.node`` in the
  targets file, ``node`` of a target group), or when the URL's host is a host name (not an
  IP address, not ``localhost``): the body's ``Hostname`` must be that node, compared
  without case and with a short name matching the first label of a fully qualified one
  (dcgm-exporter reports the node's name, which is short where the URL is an FQDN, or the
  reverse). A configured node also names the node in the snapshot, whatever the spelling
  of ``Hostname``; a host name leaves the node named as ``Hostname`` spells it.
- **Its node is unknown** when the URL's host is an address: nothing ties an address to a
  name here (the dcgm-exporter of a Kubernetes pod is reached at the pod's address), so the
  body is held to what can be checked: it names one node, which is a node name, and no
  other target's node (:func:`conflicts`).

Every body must name exactly one node, and that name must be a node name
(:mod:`exporter.node_names`: no ``ALL``, no hostlist). A refused body is not used at all:
the target is down with the reason, and its last good reading is forgotten.

Two targets naming one node are one node reached by two addresses when they show the same
GPUs (the same UUIDs), and are merged as before. With different GPUs they are a conflict:
a target whose node is known keeps the node and every target whose node is unknown is
refused; when no claimant's node is known, all are refused, since nothing says which one
is lying (the node's readings stop rather than a lie being believed). Targets whose
configuration names the same node are all kept: the configuration says so.

Left to configuration: a target reached by address can still impersonate a node that no
other target serves, or another address-only target with copied UUIDs. Give such targets
``labels.node`` (or list them by host name) to close that.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from exporter.node_names import node_name_problem, same_node, shown
from exporter.snapshot import Allocation, Gpu, Node

MAX_NAMED = 3  # node names quoted in a refusal
REFUSED = "refused: "  # how every refusal's reason begins


@dataclass(frozen=True, slots=True)
class Identity:
    """The node a target may speak for: ``node`` "" while it is unknown (an address)."""

    node: str
    configured: bool  # named by the configuration, not only by the URL's host


def identity(host: str, configured: str) -> Identity:
    """A target's :class:`Identity` from its URL's host and its configured node ("" none)."""
    if configured:
        return Identity(configured, True)
    return Identity(host if names_a_host(host) else "", False)


def names_a_host(host: str) -> bool:
    """True if a URL's ``host`` is a host's name: not an IP address, not the loopback name."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False
    except ValueError:
        pass
    name = host.lower().rstrip(".")
    return bool(name) and name != "localhost" and not name.endswith(".localhost") \
        and name != "localhost.localdomain"


def claim(known: Identity, names: Collection[str]) -> tuple[str, str]:
    """The node a body names, given the node names of its GPUs: ``(node, "")``, or
    ``("", why)`` when the body is refused."""
    if len(names) != 1:
        listed = ", ".join(shown(n) for n in sorted(names)[:MAX_NAMED])
        more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
        return "", (f"{REFUSED}the body names {len(names)} nodes ({listed}{more}); a target "
                    "speaks for its own node only")
    (name,) = names
    problem = node_name_problem(name)
    if problem:
        return "", f"{REFUSED}Hostname {shown(name)} {problem}"
    if known.node and not same_node(name, known.node):
        where = "its configured node" if known.configured else "the host of its URL"
        return "", (f"{REFUSED}Hostname {shown(name)} is not this target's node "
                    f"{shown(known.node)} ({where})")
    return (known.node if known.configured else name), ""


@dataclass(frozen=True, slots=True)
class Part:
    """One target's reading as the conflict check sees it."""

    target: str  # its URL
    known: Identity
    node: str
    uuids: frozenset[str]


def conflicts(parts: Sequence[Part]) -> dict[str, str]:
    """Target URL -> why it is refused, for the targets that name a node another target
    names with other GPUs (see the module's docstring for who keeps the node)."""
    groups: dict[str, list[Part]] = {}
    for part in parts:
        groups.setdefault(part.node.lower().rstrip("."), []).append(part)
    # a short name and the FQDNs it is the first label of are one node (same_node)
    for name in [n for n in groups if "." not in n]:
        for other in [n for n in groups if "." in n and n.partition(".")[0] == name]:
            groups[name] += groups.pop(other)
    refused: dict[str, str] = {}
    for claimants in groups.values():
        if len({p.uuids for p in claimants}) < 2:
            continue  # one target, or one node reached by several addresses
        known = [p for p in claimants if p.known.node]
        vouched = {p.uuids for p in known}
        for part in claimants:
            if part.known.node or part.uuids in vouched:
                continue  # its own node, or the same GPUs as a target whose node it is
            others = [p.target for p in (known or claimants) if p is not part]
            kept = "kept by the target whose node it is" if known else "none of them is used"
            more = f" and {len(others) - 1} more" if len(others) > 1 else ""
            refused[part.target] = (f"{REFUSED}node {shown(part.node)} is also named by "
                                    f"{others[0]}{more} with other GPUs (a conflict; {kept})")
    return refused


def renamed(node: str, nodes: Sequence[Node], gpus: Sequence[Gpu],
            allocations: Sequence[Allocation]) -> tuple[tuple[Node, ...], tuple[Gpu, ...],
                                                         tuple[Allocation, ...]]:
    """One node's records with the node called ``node`` (a target's configured name)."""
    def placements(a: Allocation) -> Allocation:
        return dataclasses.replace(a, placements=tuple(
            dataclasses.replace(p, node=node) for p in a.placements))

    return (tuple(dataclasses.replace(n, name=node) for n in nodes),
            tuple(dataclasses.replace(g, node=node) for g in gpus),
            tuple(placements(a) for a in allocations))


__all__ = ["REFUSED", "Identity", "Part", "claim", "conflicts", "identity", "names_a_host", "renamed"]
