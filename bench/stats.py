"""Percentiles and the distributions kept for plots."""

from __future__ import annotations

import math
import statistics
from typing import Any

CDF_POINTS = 101  # the 0th to the 100th percentile


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, `q` in [0, 1]."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def distribution(values: list[float]) -> dict[str, Any]:
    """p50, p99, mean and max, and every percentile (for the CDF plots), in ms."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    cdf = [percentile(ordered, i / (CDF_POINTS - 1)) for i in range(CDF_POINTS)]
    return {
        "count": len(values),
        "p50": round(percentile(ordered, 0.5), 4),
        "p99": round(percentile(ordered, 0.99), 4),
        "mean": round(statistics.fmean(ordered), 4),
        "max": round(ordered[-1], 4),
        "cdf": [round(v, 4) for v in cdf],
    }
