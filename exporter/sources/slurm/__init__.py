"""The slurm source: inventory, allocations and demand from scontrol and squeue.

source.py runs the commands; parse.py turns their output into records (pure); options.py
declares ``sources.slurm``."""
