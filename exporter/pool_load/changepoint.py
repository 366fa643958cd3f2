"""Online change-point detectors on a pool's demand ratio: the reference's rolling std, and CUSUM.

Both read one sample at a time and say, at that sample, whether the load just
changed regime and in which direction ("up" or "down"); neither looks ahead, so
what they flag offline is what they would have flagged live.

- :class:`RollingStd` is the reference practice: the standard deviation of the
  last ``window`` samples rising through ``threshold`` flags a change (once per
  crossing; a jump keeps the window's std high for ``window`` samples). Its
  direction is the sign of the window's second half mean minus its first half's.
- :class:`Cusum` is the two-sided CUSUM (Page 1954): the mean and spread of the
  regime are learnt from its first ``warmup`` samples, then the standardised
  excursions beyond ``drift`` accumulate on each side and an alarm is raised when
  one side passes ``threshold``; the detector then learns the new regime. The
  spread has a floor (``min_sigma``, in ratio units) so that a flat regime (an
  idle pool: std 0) does not alarm on the first wobble.

bench/changepoints.py compares both against the offline optimum (PELT) on the
six Alibaba pools; docs/load.md has the table. The better one runs live.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

DIRECTIONS = ("up", "down")


@dataclass
class RollingStd:
    # tuned on the six Alibaba pools (bench/changepoints.py): 2 hours, i.e. half the
    # last step; a 6-hour window (the reference's shape) scored lower, docs/load.md
    window: int = 2  # samples
    threshold: float = 0.07  # std of the demand ratio that flags a change
    _values: deque[float] = field(default_factory=deque)
    _above: bool = False

    def step(self, x: float) -> str | None:
        self._values.append(x)
        if len(self._values) > self.window:
            self._values.popleft()
        if len(self._values) < self.window:
            return None
        values = np.fromiter(self._values, float, len(self._values))
        above = float(values.std()) > self.threshold
        fired = above and not self._above
        self._above = above
        if not fired:
            return None
        half = self.window // 2
        return "up" if values[half:].mean() >= values[:half].mean() else "down"


@dataclass
class Cusum:
    # tuned on the six Alibaba pools (bench/changepoints.py, docs/load.md): a regime there
    # is hours long and jumps by a fifth of capacity or more, so a short warm-up and a
    # spread floor of 0.15 of capacity alarm on a 0.225 shift within one sample
    drift: float = 0.5  # standardised slack per sample (half the shift to detect, in sigmas)
    threshold: float = 1.0  # standardised sum that alarms
    warmup: int = 3  # samples that set a regime's mean and spread
    min_sigma: float = 0.15  # floor of the spread, in demand-ratio units
    _learn: list[float] = field(default_factory=list)
    _mean: float = 0.0
    _sigma: float = 1.0
    _up: float = 0.0
    _down: float = 0.0

    def step(self, x: float) -> str | None:
        if len(self._learn) < self.warmup:
            self._learn.append(x)
            if len(self._learn) == self.warmup:
                values = np.asarray(self._learn)
                self._mean = float(values.mean())
                self._sigma = max(float(values.std()), self.min_sigma)
                self._up = self._down = 0.0
            return None
        z = (x - self._mean) / self._sigma
        self._up = max(0.0, self._up + z - self.drift)
        self._down = max(0.0, self._down - z - self.drift)
        if self._up <= self.threshold and self._down <= self.threshold:
            return None
        direction = "up" if self._up > self.threshold else "down"
        self._learn = [x]  # the new regime starts here
        self._up = self._down = 0.0
        return direction


def detect(detector: RollingStd | Cusum, values: np.ndarray) -> list[tuple[int, str]]:
    """Run ``detector`` over ``values``: (index, direction) of each alarm."""
    out: list[tuple[int, str]] = []
    for i, x in enumerate(np.asarray(values, dtype=float)):
        if not math.isfinite(x):
            continue
        direction = detector.step(float(x))
        if direction is not None:
            out.append((i, direction))
    return out
