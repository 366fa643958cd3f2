"""Options of the ``slurm`` source (``sources.slurm``), apart from :mod:`.slurm` so that
reading the config does not import its subprocess and parsing machinery.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.options import Duration, opt


@dataclass(frozen=True)
class GresModel:
    type: str = opt(help="GRES type as written in gres.conf, e.g. h200.")
    model: str = opt(help="GPU catalogue name it stands for, e.g. H200.")


# The reference cluster's GRES types; its gpu-a100 partition runs the 80 GB A100.
DEFAULT_GRES_MODELS = (
    GresModel("h200", "H200"),
    GresModel("h100", "H100"),
    GresModel("a100", "A100-80GB"),
    GresModel("b200", "B200"),
)


@dataclass(frozen=True)
class QosPriority:
    qos: str = opt(help="Slurm QOS name, e.g. high.")
    priority: int = opt(help="gpufleet priority of its jobs; advisor.high_priority and above "
                        "are never moved.", min=0, max=2**31 - 1)


# The simulator's QoS classes (exporter/sources/job_hints.py DEFAULT_QOS_PRIORITIES)
DEFAULT_QOS_PRIORITIES = (QosPriority("high", 1000), QosPriority("normal", 100),
                          QosPriority("low", 10))


@dataclass(frozen=True)
class SlurmSource:
    enabled: bool = opt(False, help="Read nodes, allocations and pending jobs from Slurm.")
    format: str = opt(
        "auto", help="squeue/sinfo --json, scontrol text, or JSON falling back to text.",
        choices=("auto", "json", "text"),
    )
    command_timeout: Duration = opt(
        Duration(5), help="Longest a Slurm command may run before the read fails.",
        exclusive_min=0,
    )
    max_output_bytes: int = opt(
        128 * 1024 * 1024, help="Most bytes one Slurm command may print; beyond it the read "
        "fails before parsing and the last good view is served stale.", min=1024,
    )
    # What the snapshot builds grows with the GPUs (a record each, as the Kubernetes
    # source's max_gpus says); a node's own GRES is capped at 1024 GPUs by the parser
    max_gpus: int = opt(
        100_000, help="Most GPUs the nodes may hold, summed before the snapshot is built; "
        "beyond it the read fails and the last good view is served stale.", min=1,
    )
    bin_dir: str = opt("", help="Folder of squeue, sinfo and scontrol; empty: the PATH.")
    slurm_conf: str = opt("", help="SLURM_CONF for the commands; empty: inherited.")
    time_zone: str = opt(
        "", help="Time zone of scontrol's times (IANA name); empty: this machine's."
    )
    gres_models: tuple[GresModel, ...] = opt(
        DEFAULT_GRES_MODELS, help="GRES type to catalogue model; other types are looked up as is."
    )
    qos_priorities: tuple[QosPriority, ...] = opt(
        DEFAULT_QOS_PRIORITIES, help="A job's priority from its QOS (Slurm's own priority orders "
        "the queue, it does not say what must not be disturbed); a QOS not listed is 0."
    )
