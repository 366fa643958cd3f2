"""The replay as a picture: allocation and fragmentation against arrived workload, a line per policy.

Laid out like the FGD paper's figures: the x axis is the arrived workload in %
of the cluster's GPUs; each line is a policy's mean over its seeds, with the
band between its lowest and highest seed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from exporter.placement.replay import Row

# One colour per policy, the same in every figure; fgd stands out.
COLOURS = {"fgd": "#d62728", "tiered": "#ff7f0e", "bestfit": "#1f77b4", "packing": "#2ca02c",
           "dotprod": "#9467bd", "random": "#7f7f7f", "lookahead": "#8c564b"}
PANELS = (
    ("alloc_pct", "GPU allocation (% of GPUs)"),
    ("frag_pct", "Fragmented GPUs (% of GPUs)"),
    ("frag_ratio_pct", "Fragmentation ratio (% of idle GPUs)"),
)


def plot(rows: Sequence[Row], path: str | os.PathLike[str], title: str = "") -> None:
    """Write the PNG. matplotlib is imported here, so the rest of gpufleet never pays for it."""
    from exporter.extras import require

    matplotlib = require("matplotlib", "the plot")  # gpufleet[replay]
    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r.policy for r in rows))
    seeds = sorted({r.seed for r in rows})
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.6), constrained_layout=True)
    # the end of the allocation curves, where the policies part, enlarged
    zoom = axes[0].inset_axes((0.45, 0.07, 0.52, 0.42))
    for ax, (column, label) in zip(axes, PANELS, strict=True):
        for policy in policies:
            mine = [r for r in rows if r.policy == policy]
            pcts = sorted({r.arrived_pct for r in mine})
            values = np.array([[getattr(r, column) for r in mine if r.arrived_pct == p] for p in pcts])
            _line(ax, policy, pcts, values)
            if column == "alloc_pct":
                _line(zoom, policy, pcts, values)
        ax.set_xlabel("Arrived workload (% of GPUs)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    # the allocation panel: every GPU that arrived was placed, up to 100%
    axes[0].plot([0, 100], [0, 100], color="black", linewidth=0.8, linestyle=":", label="arrived = allocated")
    last = max(r.arrived_pct for r in rows)
    for ax in axes:
        ax.set_xlim(0, last)
    ends = [r.alloc_pct for r in rows if r.arrived_pct == last]
    zoom.set_xlim(max(0, last - 50), last)
    zoom.set_ylim(max(0.0, min(ends) - 2), min(100.0, max(ends) + 1))
    zoom.tick_params(labelsize=8)
    zoom.grid(True, alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8.5)
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    fig.suptitle(f"{title} ({seed_text})" if title else seed_text, fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _line(ax, policy: str, pcts: list[int], values: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    colour = COLOURS.get(policy)
    # tiered is fgd where no job states its memory need: dashed, so both lines show
    style = "--" if policy == "tiered" else "-"
    ax.plot(pcts, values.mean(axis=1), label=policy, color=colour, linewidth=1.6, linestyle=style)
    if values.shape[1] > 1:
        ax.fill_between(pcts, values.min(axis=1), values.max(axis=1), color=colour, alpha=0.2, linewidth=0)


__all__ = ["plot"]
