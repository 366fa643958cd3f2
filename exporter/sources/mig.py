"""MIG arithmetic: how much of a GPU a MIG profile holds.

Shared by every source that sees MIG instances by profile name: dcgm's
``GPU_I_PROFILE`` label, the Kubernetes source's GPU Operator labels and
resources (``nvidia.com/mig-3g.40gb``), and node mode's PodResources.
"""

from __future__ import annotations

import re

# A100/H100/H200/B200 have 7 compute slices; a "3g.40gb" instance holds 3/7 of
# the GPU. (The A30 has 4; its shares come out low, which we accept over guessing.)
MIG_COMPUTE_SLICES = 7
_SLICES = re.compile(r"^(\d+)g\.")


def mig_slices(profile: str) -> int:
    """Compute slices a MIG profile holds ("2g.20gb" → 2, "1g.10gb+me" → 1); a profile not
    of that form counts as the smallest, 1."""
    match = _SLICES.match(profile)
    return min(MIG_COMPUTE_SLICES, max(1, int(match.group(1)))) if match else 1


def mig_share(profile: str) -> float:
    """Share of the whole GPU a MIG profile holds, from its compute slices ("2g.20gb" → 2/7)."""
    return mig_slices(profile) / MIG_COMPUTE_SLICES
