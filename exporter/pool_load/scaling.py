"""A recommended node count per pool: the 0.8/0.3 rule, with hysteresis, cooldown and bounds.

The reference autoscaling profile scales up when the demand ratio (GPUs asked
for, allocated plus pending, over the pool's GPUs) is above 0.8 and down when
it is below 0.3, between 4 and 32 nodes. A rule that acts on one sample flaps
on this load (the Alibaba H800 pool moves by 1,400 GPUs in an hour and back),
so :class:`Scaler`, per pool:

- acts only when the ratio stayed out of the band for ``hysteresis`` samples in
  a row, and not before it has read ``min_samples`` samples (a hint from the first
  few samples after a start reads a window that holds almost nothing);
- sizes the pool so that the demand it saw would sit at the ``target`` ratio
  (KEDA's and the HPA's ``ceil(metric / target)``), clamped to ``[min_nodes,
  max_nodes]``; the band between down and up is the hysteresis that keeps the
  new size from acting again at once;
- holds back a *reversal* only: a scale-up waits ``cooldown_up`` after the last
  scale-down, a scale-down ``cooldown_down`` after the last scale-up. A hint in the
  same direction as the last is never held back (a pool still saturated after one
  scale-up asks for more at once, as the cluster autoscaler scales up without delay);
- live, where nobody may follow the hint: a recommendation that differs from the
  pool's size holds while the pool stays out of the band on its side, and is
  withdrawn (back to the pool's size) once the pool has stayed inside the band for
  ``dwell``, or at once when the pool leaves the band on the other side. One
  in-band sample between saturated ones no longer withdraws a scale-up. A pending
  scale-down rises at once with a demand that rises below the band.

The same class serves the live hint (times are the snapshot's, in seconds; the
tracker passes the pool's size) and ``gpufleet load``'s replay (hours times 3,600;
the recommendation is what is provisioned). The predictive policy feeds it a
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
    _samples: int = 0  # samples read so far
    _last_up: float = -math.inf
    _last_down: float = -math.inf
    _inside_since: float | None = None  # when the pool's current run inside the band began
    reason: str = field(default="hold")
    acted: str = "hold"  # the reason of the last change (what a recommendation nobody followed says)

    def idle(self, utilization: float | None, memory_used: float | None) -> bool:
        """The pool's GPUs do little: what they hold is no reason to add more (unknown: not idle)."""
        s = self.settings
        if utilization is None or utilization >= s.idle_utilization:
            return False
        return memory_used is None or memory_used < s.memory_pressure

    def step(self, now: float, demand_gpus: float, utilization: float | None = None,
             memory_used: float | None = None, pool_nodes: int | None = None,
             pool_gpus: float | None = None) -> Hint:
        """Read one sample of demand (GPUs asked for) at ``now`` seconds and recommend a size.

        ``utilization`` and ``memory_used`` are the pool's mean ratios now (None: not read);
        an idle pool above the band holds instead of scaling up. ``pool_nodes`` and
        ``pool_gpus`` are the nodes and GPUs the pool has now (live: the recommendation may
        not have been followed); None: the recommendation is what the pool has (the replay).
        """
        s = self.settings
        self._samples += 1
        nodes_now = self.nodes if pool_nodes is None else pool_nodes
        capacity = pool_gpus if pool_gpus is not None else nodes_now * s.node_gpus
        # no GPUs (min_nodes 0): any demand is above every threshold
        ratio = demand_gpus / capacity if capacity > 0 else (math.inf if demand_gpus > 0 else 0.0)
        idle = ratio > s.up and self.idle(utilization, memory_used)
        side = "up" if ratio > s.up and not idle else ("down" if ratio < s.down else "inside")
        if side == "up":
            self._above, self._below = self._above + 1, 0
        elif side == "down":
            self._above, self._below = 0, self._below + 1
        else:  # idle counts as inside: the hysteresis counts busy samples only
            self._above = self._below = 0
        if side != "inside":
            self._inside_since = None
        elif self._inside_since is None:
            self._inside_since = now
        before = self.nodes
        if self.nodes != nodes_now:
            # a recommendation nobody followed yet: it holds while the pool stays out of the
            # band on its side; withdrawn after `dwell` inside, at once on the other side
            pending = "up" if self.nodes > nodes_now else "down"
            inside_for = 0.0 if self._inside_since is None else now - self._inside_since
            if (inside_for >= s.dwell_s) if side == "inside" else (side != pending):
                self.nodes = nodes_now
            elif side == "down":
                # a scale-down rises at once with a demand that rises below the band: a
                # hint under what the demand needs now would strand work (it falls again
                # only by the rule, after its hysteresis)
                self.nodes = max(self.nodes, s.clamp(s.nodes_for(demand_gpus))[0])
        acted = False
        ready = self._samples >= s.min_samples
        # a cooldown holds back a reversal only: an up after a down, a down after an up
        if (ready and self._above >= s.hysteresis
                and (self._last_up >= self._last_down or now - self._last_down >= s.cooldown_up_s)):
            wanted, bound = s.clamp(s.nodes_for(demand_gpus))
            if wanted > self.nodes:
                self.nodes, self.reason, acted = wanted, bound or "up", True
                self._last_up = now
                self._above = 0
        elif (ready and self._below >= s.hysteresis
                and (self._last_down >= self._last_up or now - self._last_up >= s.cooldown_down_s)):
            wanted, bound = s.clamp(s.nodes_for(demand_gpus))
            if wanted < self.nodes:
                self.nodes, self.reason, acted = wanted, bound or "down", True
                self._last_down = now
                self._below = 0
        if acted:
            self.acted = self.reason
        else:
            # holding at the current size: say so, or name the bound that keeps the rule
            # from acting (the size stays what it is, whichever side of the bound)
            if side == "up" and s.max_nodes is not None and self.nodes >= s.max_nodes:
                self.reason = "max_nodes"
            elif side == "down" and self.nodes <= s.min_nodes:
                self.reason = "min_nodes"
            else:
                self.reason = "hold"
        return Hint(self.nodes, self.reason, ratio, self.nodes != before, idle)
