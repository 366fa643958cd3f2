"""``gpufleet load``'s files: DIR/load.csv (a row per pool and hour) and DIR/load.png (a panel per pool)."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

from exporter.pool_load.backtest import POLICIES, PoolReplay

COLUMNS = ("pool", "hour", "demand_gpus", "demand_ratio", "ratio_mean", "ratio_stddev", "ratio_p95",
           "change_rolling_std", "change_cusum",
           "static_gpus", "reactive_gpus", "reactive_provisioned_gpus",
           "predictive_gpus", "predictive_provisioned_gpus")
COLOURS = {"static": "#7f7f7f", "reactive": "#1f77b4", "predictive": "#d62728"}


def _g(x: float) -> str:
    return f"{x:.6g}"


def write_csv(pools: Sequence[PoolReplay], hours: Sequence[int], path: str | os.PathLike[str]) -> None:
    """Capacity columns are GPUs ready to serve in the hour; *_provisioned adds those booting."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for p in pools:
            flags = {name: dict(points) for name, points in p.changes.items()}
            r, q = p.runs["reactive"], p.runs["predictive"]
            static = p.runs["static"].ready
            for i, hour in enumerate(hours):
                out.writerow((p.pool, hour, _g(p.demand[i]), _g(p.ratio[i]), _g(p.mean[i]),
                              _g(p.stddev[i]), _g(p.p95[i]), flags["rolling_std"].get(i, ""),
                              flags["cusum"].get(i, ""), _g(static[i]), _g(r.ready[i]),
                              _g(r.committed[i]), _g(q.ready[i]), _g(q.committed[i])))


def plot(pools: Sequence[PoolReplay], hours: Sequence[int], path: str | os.PathLike[str],
         title: str = "") -> None:
    """Demand, each policy's ready capacity and the CUSUM change points, a panel per pool."""
    from exporter.extras import require

    matplotlib = require("matplotlib", "the plot")  # gpufleet[replay]
    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(pools), 1, figsize=(15, 2.6 * len(pools)), sharex=True,
                             constrained_layout=True, squeeze=False)
    days = [h / 24 for h in hours]
    for ax, p in zip(axes[:, 0], pools, strict=True):
        ax.plot(days, p.demand, color="black", linewidth=0.6, label="demand")
        for policy in POLICIES:
            ax.plot(days, p.runs[policy].ready, color=COLOURS[policy], linewidth=0.8,
                    label=f"{policy} capacity")
        for index, direction in p.changes["cusum"]:
            ax.axvline(days[index], color="#2ca02c" if direction == "up" else "#9467bd",
                       linewidth=0.3, alpha=0.5)
        ax.set_ylabel("GPUs")
        ax.set_title(p.pool, loc="left", fontsize=10)
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=4)
    axes[-1, 0].set_xlabel("day (change points: CUSUM, green up, purple down)")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=90)
    plt.close(fig)
