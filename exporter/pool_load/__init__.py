"""Load of a GPU pool over time: window statistics, change points and scaling hints (issue 20).

``stats`` computes what the recording rules compute, ``changepoint`` flags regime
changes online, ``scaling`` turns a demand series into a recommended node count,
``series`` reads a demand CSV and a capacity table; ``tracker`` follows the pools of each
served snapshot, and ``backtest`` runs the three scaling policies over a series for
``gpufleet load``.
"""
