"""Pure statistics over samples: no I/O, no pytest."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default 'linear' method)."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def iqr(values: Sequence[float]) -> float:
    return quantile(values, 0.75) - quantile(values, 0.25)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


def stddev(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def median_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 1000,
              seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median (deterministic for a seed)."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (math.nan, math.nan)
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(median([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    alpha = (1.0 - confidence) / 2.0
    return quantile(medians, alpha), quantile(medians, 1.0 - alpha)


@dataclass(frozen=True)
class Summary:
    """The numbers a baseline stores and a report shows for one metric."""

    n: int
    median: float
    mean: float
    min: float
    max: float
    stddev: float
    iqr: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float

    @property
    def rel_spread(self) -> float:
        """IQR over the median: the run-to-run noise a threshold should tolerate."""
        return self.iqr / abs(self.median) if self.median else 0.0


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("summary of no values")
    low, high = median_ci(values)
    return Summary(
        n=len(values), median=median(values), mean=mean(values), min=min(values), max=max(values),
        stddev=stddev(values), iqr=iqr(values), q1=quantile(values, 0.25), q3=quantile(values, 0.75),
        ci_low=low, ci_high=high,
    )


def relative_change(baseline: float, current: float) -> float:
    """(current − baseline) / |baseline|; ±inf when the baseline is zero and the current is not."""
    if baseline == 0:
        return 0.0 if current == 0 else math.copysign(math.inf, current)
    return (current - baseline) / abs(baseline)
