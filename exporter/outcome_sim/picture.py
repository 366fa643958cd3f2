"""timeline.png: what the jobs waited, over time, per strategy and load.

Each panel is one strategy (a row) at one load (a column): the whole-node
GPU-hours waited since the measured window began, cumulative, split by why the
jobs waited (``blocked.py``: fragmentation-blocked, which a repack could have
started, and capacity-blocked, which no repack could), and their total. Every
seed is a thin line, the median over seeds a bold one. The panels of a column
share their scale, so strategies at one load compare by height.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from exporter.outcome_sim.outcomes import Outcome, Sample

# what each line reads from a sample, and its colour
SERIES: tuple[tuple[str, str], ...] = (("total", "black"), ("fragmentation", "tab:orange"),
                                       ("capacity", "tab:blue"))


def _value(sample: Sample, name: str) -> float:
    if name == "fragmentation":
        return sample.whole_node_waited_fragmentation
    if name == "capacity":
        return sample.whole_node_waited_capacity
    return sample.whole_node_waited_fragmentation + sample.whole_node_waited_capacity


def curves(runs: Sequence[Outcome], name: str) -> tuple[np.ndarray, np.ndarray]:
    """(days, values per run): the runs' samples cut to the shortest, GPU-hours of ``name``."""
    length = min(len(o.samples) for o in runs)
    days = np.array([s.at / 86400 for s in runs[0].samples[:length]])
    return days, np.array([[_value(s, name) for s in o.samples[:length]] for o in runs])


def plot(outcomes: Sequence[Outcome], path: str | os.PathLike[str], title: str,
         skip: Sequence[str] = ()) -> None:
    """A panel per (strategy, load) of the runs with samples, strategies named in ``skip`` left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [o for o in outcomes if o.samples and o.strategy not in skip]
    loads = sorted({o.load for o in shown}) or [0.0]
    strategies = list(dict.fromkeys(o.strategy for o in shown)) or ["(no runs)"]
    size = (4.8 * len(loads), 2.6 * len(strategies) + 0.8)
    fig, axes = plt.subplots(len(strategies), len(loads), figsize=size, squeeze=False, sharex=True,
                             sharey="col")
    for col, load in enumerate(loads):
        for row, strategy in enumerate(strategies):
            ax = axes[row][col]
            runs = [o for o in shown if o.load == load and o.strategy == strategy]
            if runs:
                for name, colour in SERIES:
                    days, values = curves(runs, name)
                    for line in values:
                        ax.plot(days, line, color=colour, linewidth=0.5, alpha=0.35)
                    ax.plot(days, np.median(values, axis=0), color=colour, linewidth=2.0,
                            label=f"{name} (median of {len(runs)})")
            ax.set_title(f"{strategy}, load {load:g}", fontsize=9)
            ax.grid(alpha=0.3)
            if col == 0:
                ax.set_ylabel("whole-node GPU-h waited")
            if row == len(strategies) - 1:
                ax.set_xlabel("day of the measured window")
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{title}\nwhole-node GPU-h waited, cumulative, by why: fragmentation (a repack\n"
                 "could start it), capacity (none could); thin: a seed, bold: the median", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


__all__ = ["SERIES", "curves", "plot"]
