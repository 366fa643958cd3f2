"""The optional parts of gpufleet and the pip extra each needs (issue 30, a lean node).

``pip install gpufleet`` installs what node mode needs (NVML, the exposition); the rest is
an extra, installed where it is used:

    gpufleet[analysis]      numpy: the fragmentation analysis, the advisor, the simulated
                            fleet (so serve with any of them: cluster mode), and analyze,
                            replay, load, simulate and plan
    gpufleet[cluster]       the kubernetes source's credentials (kubernetes_asyncio)
    gpufleet[podresources]  the kubelet's PodResources API on a node (grpcio, protobuf)
    gpufleet[replay]        the PNGs of ``gpufleet replay`` and ``gpufleet load`` (matplotlib)
    gpufleet[dashboards]    ``gpufleet dashboards``, the Grafana generator (grafanalib)
    gpufleet[all]           all of them

A leaf module: the CLI, the sources and the plots call :func:`require` where they
import the package, so a missing one is one line naming the extra, never a traceback.
numpy is imported at the top of some thirty modules, so it is not required one import at a
time: the CLI turns the import's failure into the same line (:func:`not_installed`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from exporter.errors import UsageError

# the extra that installs each optional top-level module
EXTRA_OF = {
    "numpy": "analysis",
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


# what a command needs a package for, where "gpufleet COMMAND" alone would mislead
NEEDED_BY = {
    ("serve", "numpy"): "gpufleet serve with analysis, the advisor or sources.sim (node mode has none)",
}


def not_installed(exc: BaseException, command: str | None, what: str | None = None) -> str | None:
    """The missing-extra line when ``exc`` is a failed import of an extra's package (met
    by ``command``, the gpufleet command that ran, or by ``what`` needs it), else None."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if not name:
        return None
    for module in EXTRA_OF:  # "google" fails for google.protobuf when no google.* is installed
        if name == module or name.startswith(module + ".") or module.startswith(name + "."):
            if what is None:
                what = NEEDED_BY.get((command or "", module),
                                     f"gpufleet {command}" if command else "gpufleet")
            return missing(module, what)
    return None


def check_command(command: str | None) -> None:
    """:class:`MissingExtra` when ``command`` needs a package that is not installed."""
    for module, what in COMMAND_NEEDS.get(command or "", ()):
        require(module, what)
