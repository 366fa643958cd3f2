"""GPU and node health (issue 31): verdicts with hysteresis, remediation with budgets,
renderers for Slurm and Kubernetes, the ``gpufleet act`` receiver, and stragglers.

Everything here is pure analysis of successive snapshots except :mod:`exporter.health.act`,
which runs ``scontrol`` or PATCHes the apiserver. Sources never import this package.
"""
