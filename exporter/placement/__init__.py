"""Placement: which node and GPUs a task goes to, by policy, and what a policy costs on a trace.

:mod:`.engine`'s :class:`~.engine.Placer` places one :class:`~.task.Task` at
a time on a working copy of a :class:`~exporter.analysis.state.FleetState`
(``fgd``, ``bestfit``, ``packing``, ``dotprod``, ``random``, ``tiered``; see
:mod:`.policies`, which score nodes from a :class:`~.policies.NodeView`, not the placer);
:mod:`.replay` replays a pod trace through it, the way the FGD paper
evaluates policies, and :mod:`.plot` draws the result. The simulated fleet
places its jobs with the engine, and the advisor checks its moves with it.
"""

from exporter.placement.engine import POLICIES, Placement, Placer
from exporter.placement.task import Task

__all__ = ["POLICIES", "Placement", "Placer", "Task"]
