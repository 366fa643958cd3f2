"""What a job says about itself: its GPU-memory need and its last checkpoint (issue 17).

Schedulers know how many GPUs a job holds, never how much of each GPU's memory it
needs or when it last saved its work; the advisor's tier rule and move cost need
both. Sites state them by convention, and every source reads them through this one
module so the conventions cannot drift apart:

- Kubernetes pod annotations ``gpu-memory-required: 100Gi`` (the reference cluster's
  scheduler key) and ``gpufleet.io/last-checkpoint: 2026-12-01T00:00:00Z`` (or unix
  seconds), which the kubernetes source reads with :func:`from_annotations`.
- A Slurm job's ``Comment`` (``sbatch --comment``) holding the same keys as
  ``key=value`` pairs separated by ``;``, ``,`` or spaces, e.g.
  ``gpu-memory-required=100Gi;last-checkpoint=1764547200``; :func:`from_comment`.

A requested GRES type (``gpu:h200:8``) is not a need: it limits the models a job may
move to (``Allocation.allowed_models``) and says nothing about how much memory it uses.

Priority is on one scale for every source (``Allocation.priority``): how much a job
must not be disturbed, with ``advisor.high_priority`` (1000) and above never moved.
The simulator's kinds are on it; a Kubernetes PriorityClass value is taken as it is (0
without one), so a site whose movable pods have classes of 1000 or more sets
``advisor.high_priority`` above them. Slurm's own job priority is not on it: it is
a queue order (``priority/basic`` counts down by submission from just under 2^32,
4294901759 for the first job of data/slurm-samples; ``priority/multifactor`` sums
weighted age, fair-share, size, partition and QOS factors), so every real Slurm job
was "high".
What Slurm says about a job's importance is its QOS, which :func:`slurm_priority`
maps through ``sources.slurm.qos_priorities`` (default: ``high`` 1000, ``normal``
100, ``low`` 10, as the simulator's QoS classes); a QOS not listed, or none, is 0.

All pure, all bounded: a value that does not parse is ignored (the job then states
nothing), never guessed and never an error that hides the job.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

MEMORY_KEY = "gpu-memory-required"
CHECKPOINT_KEY = "last-checkpoint"
CHECKPOINT_ANNOTATION = "gpufleet.io/last-checkpoint"

# A comment or annotation is free text a user wrote: read only the first 4 KiB of it
# (Slurm caps a comment at 8 KiB in 22.05) and values of at most 40 characters.
MAX_TEXT = 4096
MAX_VALUE = 40
# The largest GPU today has 288 GB; a stated need above 64 TiB per GPU is a typo.
MAX_NEED_BYTES = 64 * 2**40

# Kubernetes resource.Quantity suffixes (binary and decimal); "" is bytes
_SUFFIX = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
           "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(?:[eE]([0-9]{1,2}))?([KMGTP]i|[kKMGTP])?")
_PAIR = re.compile(r"([A-Za-z0-9_./-]{1,64})=([^\s;,]{0,64})")


# The simulator's QoS classes on gpufleet's priority scale (exporter/fleet_sim/jobs.py)
DEFAULT_QOS_PRIORITIES: Mapping[str, int] = {"high": 1000, "normal": 100, "low": 10}


def slurm_priority(qos: str, qos_priorities: Mapping[str, int] = DEFAULT_QOS_PRIORITIES) -> int:
    """A Slurm job's priority on gpufleet's scale: its QOS's, 0 for a QOS not listed.

    Slurm's numeric priority is deliberately not used: it orders the queue and says
    nothing about how disruptive a move is (module docstring).
    """
    return qos_priorities.get(qos.strip(), 0)


@dataclass(frozen=True, slots=True)
class JobHints:
    gpu_memory_need_bytes: int | None = None  # per GPU
    last_checkpoint_time: float | None = None  # unix seconds


def parse_quantity(text: str) -> int | None:
    """``100Gi`` -> 107374182400, ``80G`` -> 80000000000, ``1.5e3M``; None when not a size.

    Kubernetes' quantity syntax, less the milli suffix (no memory is a fraction of a byte).
    """
    text = text.strip()
    if not text or len(text) > MAX_VALUE:
        return None
    match = _QUANTITY.fullmatch(text)
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    value = float(number) * 10 ** int(exponent or 0) * _SUFFIX[suffix or ""]
    if not math.isfinite(value) or value <= 0 or value > MAX_NEED_BYTES:
        return None
    return int(value)


def parse_time(text: str) -> float | None:
    """Unix seconds (``1764547200``) or ISO 8601 with a zone (``2026-12-01T00:00:00Z``).

    A time without a zone is refused: the job's clock and ours may not share one.
    """
    text = text.strip()
    if not text or len(text) > MAX_VALUE:
        return None
    if re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,9})?", text):
        return float(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp()


def from_pairs(pairs: Mapping[str, str], memory_key: str = MEMORY_KEY,
               checkpoint_key: str = CHECKPOINT_KEY) -> JobHints:
    memory = pairs.get(memory_key)
    checkpoint = pairs.get(checkpoint_key)
    return JobHints(parse_quantity(memory) if memory is not None else None,
                    parse_time(checkpoint) if checkpoint is not None else None)


def from_comment(comment: str, memory_key: str = MEMORY_KEY,
                 checkpoint_key: str = CHECKPOINT_KEY) -> JobHints:
    """The hints in a Slurm job comment; the first occurrence of a key wins."""
    pairs: dict[str, str] = {}
    for key, value in _PAIR.findall(comment[:MAX_TEXT]):
        pairs.setdefault(key, value)
    return from_pairs(pairs, memory_key, checkpoint_key)


def from_annotations(annotations: Mapping[str, str]) -> JobHints:
    """The hints in a pod's annotations (``metadata.annotations``)."""
    memory = annotations.get(MEMORY_KEY)
    checkpoint = annotations.get(CHECKPOINT_ANNOTATION)
    return JobHints(parse_quantity(memory) if isinstance(memory, str) else None,
                    parse_time(checkpoint) if isinstance(checkpoint, str) else None)
