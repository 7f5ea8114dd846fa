"""Figures learned online, in constant time and memory per observation: a line y ≈ a + b·x
by least squares weighted towards recent observations (exponential forgetting), and a prior
line it falls back on until it has seen enough."""

from __future__ import annotations

from dataclasses import dataclass

MIN_SAMPLES = 3
"""Observations before a fit is trusted over its prior."""


@dataclass(frozen=True, slots=True)
class Line:
    """y = intercept + slope·x: what is assumed before anything is measured."""

    intercept: float
    slope: float = 0.0

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


class LinearFit:
    """y ≈ a + b·x, fitted to the observations so far, each weighing `decay` times the one
    after it: with `memory` n, the last n observations carry about two thirds of the weight.

    Times grow with the work and the load they depend on, never shrink: the slope is kept at
    0 or more. Where the observations hardly vary in x (a server always seen with one
    request running), the slope is the prior's and only the level is learned.
    """

    __slots__ = ("_decay", "_sx", "_sxx", "_sxy", "_sy", "_w", "samples")

    def __init__(self, memory: int = 50) -> None:
        self._decay = 1.0 - 1.0 / memory
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self.samples = 0

    def add(self, x: float, y: float) -> None:
        d = self._decay
        self._w = self._w * d + 1.0
        self._sx = self._sx * d + x
        self._sy = self._sy * d + y
        self._sxx = self._sxx * d + x * x
        self._sxy = self._sxy * d + x * y
        self.samples += 1

    def line(self, prior: Line) -> Line:
        """The fitted line, or `prior` until `MIN_SAMPLES` observations."""
        if self.samples < MIN_SAMPLES:
            return prior
        w = self._w
        mean_x, mean_y = self._sx / w, self._sy / w
        spread = self._sxx / w - mean_x * mean_x
        if spread > 1e-9 * (1.0 + mean_x * mean_x):
            slope = max(0.0, (self._sxy / w - mean_x * mean_y) / spread)
        else:
            slope = prior.slope
        return Line(mean_y - slope * mean_x, slope)

    def predict(self, x: float, prior: Line) -> float:
        return max(0.0, self.line(prior).at(x))


class Average:
    """A mean weighted towards recent observations (an exponentially weighted moving
    average), or the prior until `MIN_SAMPLES`."""

    __slots__ = ("_alpha", "samples", "value")

    def __init__(self, memory: int = 50) -> None:
        self._alpha = 1.0 / memory
        self.value = 0.0
        self.samples = 0

    def add(self, y: float) -> None:
        self.samples += 1
        # The first observations weigh as a plain mean would, so one early outlier fades.
        weight = max(self._alpha, 1.0 / self.samples)
        self.value += weight * (y - self.value)

    def get(self, prior: float) -> float:
        return self.value if self.samples >= MIN_SAMPLES else prior
