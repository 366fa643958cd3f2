"""One cycle: every collected snapshot goes through the same stages, in one fixed order, to
one frozen :class:`Frame`; ``gpufleet serve`` and ``gpufleet simulate`` both run it.

    snapshot -> table -> analysis -> load -> health -> advisor -> Frame

Each stage (:mod:`exporter.cycle.stages`) is a small object that holds its own state between
cycles and is run only by :func:`run_cycle`, in the one worker thread a cycle runs in, so no
stage needs a lock against another. A stage reads the frame the stages before it made and
returns it with its own result set (:func:`dataclasses.replace`): a frame is never mutated.

What leaves a frame is its exposition (:func:`exposition`, a pure function of the frame once
:func:`with_exposition` has taken the stages' families) and its side effects
(:mod:`exporter.cycle.effects`: the durable store and the webhook), nothing else.
"""

from __future__ import annotations

from exporter.cycle.frame import (
    BLIND_SAFE,
    RENDER_ORDER,
    Frame,
    Stage,
    exposition,
    run_cycle,
    runs,
    with_exposition,
)

__all__ = ["BLIND_SAFE", "RENDER_ORDER", "Frame", "Stage", "exposition", "run_cycle", "runs",
           "with_exposition"]
