"""A recommended node count per pool: the 0.8/0.3 rule, with hysteresis, cooldown and bounds.

The reference autoscaling profile scales up when the demand ratio (GPUs asked
for, allocated plus pending, over the pool's GPUs) is above 0.8 and down when
it is below 0.3, between 4 and 32 nodes. A rule that acts on one sample flaps
on this load (the Alibaba H800 pool moves by 1,400 GPUs in an hour and back),
so :class:`Scaler` acts only when the ratio stayed out of the band for
``hysteresis`` samples in a row and the last action in that direction is at
least ``cooldown`` old. When it acts it sizes the pool so that the demand it
saw would sit at the ``target`` ratio (KEDA's and the HPA's ``ceil(metric /
target)``), clamped to ``[min_nodes, max_nodes]``; the band between down and
up is the hysteresis that keeps the new size from acting again at once.

The same class serves the live hint (times are the snapshot's, in seconds) and
``gpufleet load``'s replay (hours times 3,600). The predictive policy feeds it a
forecast instead of the observed demand (:mod:`.forecast`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from exporter.thresholds.scaling import ScalingSettings

# the reasons a hint gives, in the order the docs list them; a label value, so a closed set
REASONS = ("hold", "up", "down", "min_nodes", "max_nodes")


@dataclass(frozen=True, slots=True)
class Hint:
    nodes: int  # the recommended node count
    reason: str  # one of REASONS
    ratio: float  # the demand ratio the decision read (demand / current nodes' GPUs)
    changed: bool  # the recommendation differs from the previous one
    idle: bool = False  # above the band, but the pool's GPUs are idle: no scale-up


@dataclass
class Scaler:
    """The 0.8/0.3 rule's state for one pool: the current recommendation and its history."""

    settings: ScalingSettings
    nodes: int  # the current recommendation (what is, or will be, provisioned)
    _above: int = 0
    _below: int = 0
    _last_up: float = -math.inf
    _last_action: float = -math.inf
    reason: str = field(default="hold")
    acted: str = "hold"  # the reason of the last change (what a recommendation nobody followed says)

    def idle(self, utilization: float | None, memory_used: float | None) -> bool:
        """The pool's GPUs do little: what they hold is no reason to add more (unknown: not idle)."""
        s = self.settings
        if utilization is None or utilization >= s.idle_utilization:
            return False
        return memory_used is None or memory_used < s.memory_pressure

    def step(self, now: float, demand_gpus: float, utilization: float | None = None,
             memory_used: float | None = None) -> Hint:
        """Read one sample of demand (GPUs asked for) at ``now`` seconds and recommend a size.

        ``utilization`` and ``memory_used`` are the pool's mean ratios now (None: not read);
        an idle pool above the band holds instead of scaling up.
        """
        s = self.settings
        capacity = self.nodes * s.node_gpus
        # no nodes (min_nodes 0): any demand is above every threshold
        ratio = demand_gpus / capacity if capacity > 0 else (math.inf if demand_gpus > 0 else 0.0)
        idle = ratio > s.up and self.idle(utilization, memory_used)
        if idle:
            self._above = self._below = 0  # the hysteresis counts busy samples only
        elif ratio > s.up:
            self._above, self._below = self._above + 1, 0
        elif ratio < s.down:
            self._above, self._below = 0, self._below + 1
        else:
            self._above = self._below = 0
        before = self.nodes
        if self._above >= s.hysteresis and now - self._last_up >= s.cooldown_up_s:
            wanted, bound = s.clamp(s.nodes_for(demand_gpus))
            if wanted > self.nodes:
                self.nodes, self.reason = wanted, bound or "up"
                self._last_up = self._last_action = now
                self._above = 0
        elif self._below >= s.hysteresis and now - self._last_action >= s.cooldown_down_s:
            wanted, bound = s.clamp(s.nodes_for(demand_gpus))
            if wanted < self.nodes:
                self.nodes, self.reason = wanted, bound or "down"
                self._last_action = now
                self._below = 0
        changed = self.nodes != before
        if changed:
            self.acted = self.reason
        else:
            # holding at the current size: say so, or name the bound that keeps the rule
            # from acting (the size stays what it is, whichever side of the bound)
            if ratio > s.up and not idle and s.max_nodes is not None and self.nodes >= s.max_nodes:
                self.reason = "max_nodes"
            elif ratio < s.down and self.nodes <= s.min_nodes:
                self.reason = "min_nodes"
            else:
                self.reason = "hold"
        return Hint(self.nodes, self.reason, ratio, changed, idle)
