"""The optional parts of gpufleet and the pip extra each needs (issue 30, a lean node).

``pip install gpufleet`` installs what node mode needs (NVML, the exposition, the
analysis); the rest is an extra, installed where it is used:

    gpufleet[cluster]       the kubernetes source's credentials (kubernetes_asyncio)
    gpufleet[podresources]  the kubelet's PodResources API on a node (grpcio, protobuf)
    gpufleet[replay]        the PNGs of ``gpufleet replay`` and ``gpufleet load`` (matplotlib)
    gpufleet[dashboards]    ``gpufleet dashboards``, the Grafana generator (grafanalib)
    gpufleet[all]           all of them

A leaf module: the CLI, the sources and the plots call :func:`require` where they
import the package, so a missing one is one line naming the extra, never a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from exporter.errors import UsageError

# the extra that installs each optional top-level module
EXTRA_OF = {
    "kubernetes_asyncio": "cluster",
    "grpc": "podresources",
    "google.protobuf": "podresources",
    "matplotlib": "replay",
    "grafanalib": "dashboards",
}


# the commands that write a file with an extra's package, and what needs it: checked before
# the command computes anything, so a missing package costs a second, not a run of minutes
COMMAND_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "replay": (("matplotlib", "gpufleet replay (replay.png)"),),
    "load": (("matplotlib", "gpufleet load (load.png)"),),
    "simulate": (("matplotlib", "gpufleet simulate (timeline.png)"),),
    "dashboards": (("grafanalib", "gpufleet dashboards"),),
}


class MissingExtra(UsageError):
    """An optional package is not installed: the CLI prints the line and exits 2."""


def missing(module: str, what: str) -> str:
    """The one line a user sees: what needs the package and the install that adds it."""
    extra = EXTRA_OF[module]
    return (f"{what} needs {module.split('.')[0]}, which is not installed: "
            f"pip install 'gpufleet[{extra}]' (in a clone of gpufleet: pip install '.[{extra}]')")


def require(module: str, what: str) -> ModuleType:
    """``import module``, or :class:`MissingExtra` naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(missing(module, what)) from None


def check_command(command: str | None) -> None:
    """:class:`MissingExtra` when ``command`` needs a package that is not installed."""
    for module, what in COMMAND_NEEDS.get(command or "", ()):
        require(module, what)
