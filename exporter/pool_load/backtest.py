"""The backtest ``gpufleet load`` runs: a pool's hourly demand replayed under three scaling
policies, and what each costs.

- static: today's capacity, all the time;
- reactive: :class:`~.scaling.Scaler` fed the demand observed in each hour;
- predictive: the same rule fed the forecast peak (:mod:`.forecast`) over the
  hours until a node ordered now is ready, and acting on one sample (the
  forecast already looks ahead, so waiting for a second sample only adds lag).

Time runs in whole hours. At the end of hour t a policy sees demand up to t and
sets the node count for t + 1: a scale-down takes effect at t + 1 (nodes still
booting are cancelled first), a scale-up's nodes serve from t + 1 + startup.
Demand above the ready capacity is unmet (queued) GPU-hours; ready capacity
above demand is idle; provisioned GPU-hours count booting nodes too, since they
are paid for.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from exporter.pool_load.forecast import forecast_matrix
from exporter.pool_load.scaling import Scaler
from exporter.thresholds import ScalingSettings

POLICIES = ("static", "reactive", "predictive")
HOUR = 3600.0


@dataclass(frozen=True)
class PolicyRun:
    policy: str
    committed: np.ndarray  # [T] GPUs provisioned for each hour (booting included)
    ready: np.ndarray  # [T] GPUs serving in each hour
    unmet_gpu_hours: float
    idle_gpu_hours: float
    provisioned_gpu_hours: float
    actions: int  # changes of the node count
    capped_hours: int  # hours the rule wanted more than max_nodes (or less than min_nodes)


def _account(policy: str, demand: np.ndarray, committed: np.ndarray, ready: np.ndarray,
             actions: int, capped: int) -> PolicyRun:
    unmet = float(np.maximum(demand - ready, 0.0).sum())
    idle = float(np.maximum(ready - demand, 0.0).sum())
    return PolicyRun(policy, committed, ready, unmet, idle, float(committed.sum()), actions, capped)


def static(demand: np.ndarray, capacity_gpus: float) -> PolicyRun:
    flat = np.full(len(demand), float(capacity_gpus))
    return _account("static", demand, flat, flat, 0, 0)


def run_scaler(policy: str, demand: np.ndarray, signal: np.ndarray, settings: ScalingSettings,
               initial_nodes: int) -> PolicyRun:
    """Drive a :class:`Scaler` with ``signal[t]`` (GPUs) at the end of each hour t."""
    n = len(demand)
    # no warm-up guard in a replay: min_samples keeps the live hint from acting on the first
    # few samples after a start; here the rule reads the series from its first hour
    settings = dataclasses.replace(settings, min_samples=1)
    g = settings.node_gpus
    startup_h = math.ceil(settings.startup_s / HOUR - 1e-9)
    scaler = Scaler(settings, initial_nodes)
    ready_nodes = scaler.nodes
    booting: list[tuple[int, int]] = []  # (first hour it serves, nodes), oldest first
    committed = np.empty(n)
    ready = np.empty(n)
    actions = capped = 0
    nodes = scaler.nodes
    for t in range(n):
        # hour t: boots that finished serve now
        while booting and booting[0][0] <= t:
            ready_nodes += booting.pop(0)[1]
        committed[t] = nodes * g
        ready[t] = ready_nodes * g
        hint = scaler.step(t * HOUR, float(signal[t]))
        if hint.reason in ("max_nodes", "min_nodes"):
            capped += 1
        if hint.nodes == nodes:
            continue
        actions += 1
        if hint.nodes > nodes:
            booting.append((t + 1 + startup_h, hint.nodes - nodes))
        else:
            drop = nodes - hint.nodes
            while drop and booting:  # cancel the newest boots first: they serve latest
                when, count = booting.pop()
                if count > drop:
                    booting.append((when, count - drop))
                    drop = 0
                else:
                    drop -= count
            ready_nodes -= drop
        nodes = hint.nodes
    return _account(policy, demand, committed, ready, actions, capped)


@dataclass(frozen=True)
class PredictiveSettings:
    days: int = 14  # days of daily profile
    trend_weight: float = 0.5
    down: float = 0.35  # scale down below this forecast ratio (the reactive rule: 0.3)
    hysteresis: int = 1
    cooldown_down_s: float = 3 * 3600.0


def replay_pool(demand: np.ndarray, capacity_gpus: float, settings: ScalingSettings,
                predictive: PredictiveSettings = PredictiveSettings()) -> dict[str, PolicyRun]:
    """The three policies on one pool; reactive and predictive start at today's node count."""
    demand = np.asarray(demand, dtype=float)
    initial = math.ceil(capacity_gpus / settings.node_gpus - 1e-9)
    startup_h = math.ceil(settings.startup_s / HOUR - 1e-9)
    horizon = min(24, startup_h + 1)
    peak = forecast_matrix(demand, horizon, predictive.days, predictive.trend_weight).max(axis=1)
    return {
        "static": static(demand, capacity_gpus),
        "reactive": run_scaler("reactive", demand, demand, settings, initial),
        "predictive": run_scaler("predictive", demand, peak,
                                 dataclasses.replace(settings, hysteresis=predictive.hysteresis,
                                                     down=predictive.down,
                                                     cooldown_down_s=predictive.cooldown_down_s),
                                 initial),
    }


@dataclass(frozen=True)
class PoolReplay:
    """Everything ``gpufleet load`` writes for one pool."""

    pool: str
    capacity_gpus: float
    settings: ScalingSettings
    demand: np.ndarray  # [T] GPUs
    ratio: np.ndarray  # [T] demand / today's capacity
    mean: np.ndarray  # [T] trailing-window statistics of the ratio
    stddev: np.ndarray
    p95: np.ndarray
    changes: dict[str, list[tuple[int, str]]]  # detector -> (hour index, direction)
    runs: dict[str, PolicyRun]


def replay_series(pool: str, demand: np.ndarray, capacity_gpus: float, settings: ScalingSettings,
                  window: int, predictive: PredictiveSettings = PredictiveSettings()) -> PoolReplay:
    from exporter.pool_load.changepoint import Cusum, RollingStd, detect
    from exporter.pool_load.stats import rolling_stats

    demand = np.asarray(demand, dtype=float)
    # a pool with no GPUs today has no ratio; its statistics read the demand against one GPU
    ratio = demand / capacity_gpus if capacity_gpus > 0 else demand.copy()
    mean, std, p95 = rolling_stats(ratio, window)
    changes = {"rolling_std": detect(RollingStd(), ratio), "cusum": detect(Cusum(), ratio)}
    runs = replay_pool(demand, capacity_gpus, settings, predictive)
    return PoolReplay(pool, capacity_gpus, settings, demand, ratio, mean, std, p95, changes, runs)
