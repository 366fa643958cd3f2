"""Which kubeconfig the kubernetes source reads: kubectl's order (issue 30).

kubectl, client-go and the Python client all look in the same places, and an SRE
expects gpufleet to as well:

1. ``sources.kubernetes.kubeconfig``, when set: that file alone (kubectl's
   ``--kubeconfig``), overriding the three below;
2. ``KUBECONFIG``: a list of files (``:``-separated; ``;`` on Windows) merged in
   order. As in client-go, files that do not exist are skipped, the first file to
   name a cluster, user or context wins it, and ``current-context`` is the first
   file's that sets one;
3. ``~/.kube/config``, when it exists;
4. in-cluster: the pod's service account (``KUBERNETES_SERVICE_HOST/PORT``).

What is chosen is checked when the source is built (each file readable, YAML, at most
1 MiB; the context one of the merged contexts), so a wrong one stops ``serve`` with a
line naming where it came from; the loading itself is kubernetes_asyncio's
(:class:`KubeConfigMerger` keeps each entry's file, so relative certificate paths
resolve against the file that names them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.sources import SourceStartupError
from exporter.sources.kubernetes.options import KubernetesSource as KubernetesConfig

MAX_BYTES = 1024 * 1024
OPTION = "sources.kubernetes.kubeconfig"


@dataclass(frozen=True, slots=True)
class KubeconfigChoice:
    files: tuple[str, ...]  # merged in this order; () means in-cluster
    context: str  # the context to use (kubectl's rules); "" in-cluster
    origin: str  # where the choice came from, the prefix of its errors

    @property
    def in_cluster(self) -> bool:
        return not self.files


IN_CLUSTER = KubeconfigChoice((), "", f"{OPTION} (in-cluster)")


def _fail(origin: str, message: str) -> SourceStartupError:
    return SourceStartupError(f"{origin}: {message}")


def _read(path: Path, origin: str) -> Mapping[str, Any]:
    from exporter.yamlfile import load_mapping

    class _StartupError(SourceStartupError):
        def __init__(self, message: str) -> None:
            super().__init__(f"{origin}: {message}")

    try:
        if path.stat().st_size > MAX_BYTES:
            raise _fail(origin, f"{path} is over 1 MiB")
    except OSError as exc:
        raise _fail(origin, f"cannot read {path}: {exc.strerror}") from None
    return load_mapping(path, "the kubeconfig", _StartupError)


def _names(data: Mapping[str, Any], key: str) -> list[str]:
    entries = data.get(key)
    return [str(e.get("name")) for e in entries if isinstance(e, Mapping) and e.get("name")] \
        if isinstance(entries, list) else []


def _checked(files: list[Path], origin: str, context: str, described: str) -> KubeconfigChoice:
    """The files merged as kubectl does: the context asked for, or the first current-context."""
    contexts: list[str] = []
    current = ""
    for path in files:
        data = _read(path, origin)
        contexts += [name for name in _names(data, "contexts") if name not in contexts]
        current = current or str(data.get("current-context") or "")
    wanted = context or current
    if not wanted:
        raise SourceStartupError(f"sources.kubernetes.context: {described} has no current-context; "
                                 "name one")
    if wanted not in contexts:
        raise SourceStartupError(f"sources.kubernetes.context: {wanted!r} is not a context of "
                                 f"{described} (it has: {', '.join(contexts) or 'none'})")
    return KubeconfigChoice(tuple(str(p) for p in files), wanted, origin)


def choose(config: KubernetesConfig, environ: Mapping[str, str]) -> KubeconfigChoice:
    """The kubeconfig files to read, in kubectl's order, checked; IN_CLUSTER when none.

    ``environ`` is the process environment (a test's own): ``KUBECONFIG`` and ``HOME``.
    """
    if config.kubeconfig:
        path = Path(config.kubeconfig)
        return _checked([path], OPTION, config.context, str(path))
    listed = environ.get("KUBECONFIG", "")
    if listed:
        paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
        present = [p for p in paths if p.exists()]
        if not present:
            raise _fail("KUBECONFIG", f"none of its files exists ({listed[:300]})")
        return _checked(present, "KUBECONFIG", config.context, f"KUBECONFIG ({listed[:300]})")
    home = environ.get("HOME", "")
    if home and (Path(home) / ".kube" / "config").exists():
        path = Path(home) / ".kube" / "config"
        return _checked([path], "~/.kube/config", config.context, str(path))
    return IN_CLUSTER
