"""Drift within a measured window: did the server change while it was being measured?

The window's successful requests, ordered by send time, are split into quarters; the first and the last quarter
are compared on their median TTFT and TPOT. A closed loop's first ``concurrency`` requests (sent together into an
idle server: the ramp) and its last ``concurrency`` (answered while the batch drains) are left out first, since a
steady server differs there by construction. A quarter must hold at least `MIN_QUARTER` requests.

A latency *drifted* when a two-sided Mann-Whitney rank test of the two quarters gives p < `DRIFT_ALPHA` (exact
for small quarters, the normal approximation with tie correction beyond `EXACT_MAX_PAIRS` pairs) *and* the
medians differ by more than the minimum effect (the profile's tolerance of that latency, else
`DEFAULT_MIN_EFFECT`): the window's own spread says the change is real, and it is large enough to matter. Seen on
1x H200 (vLLM 0.26): the first window at a new concurrency met Triton's just-in-time compiles of new batch shapes
(TTFT 745 ms cold, 35 ms warm); the warm pass (`pytest_moeperf.serving.warm`) is meant to prevent that, this check
tells when it did not.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_moeperf.judging import stats
from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.serving.metrics import RequestOutcome, latency_samples

__all__ = ["DEFAULT_MIN_EFFECT", "DRIFT_ALPHA", "MIN_QUARTER", "Drift", "DriftCheck", "check_drift", "rank_test"]

DRIFT_ALPHA = 0.01
DEFAULT_MIN_EFFECT = 0.05
#: the smallest quarter: an exact two-sided test of 5 against 5 can reach p = 2/252 = 0.008 < `DRIFT_ALPHA`
MIN_QUARTER = 5
EXACT_MAX_PAIRS = 400
DRIFT_METRICS = ("ttft", "tpot")


def rank_test(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided Mann-Whitney p-value that ``x`` and ``y`` come from one distribution."""
    n, m = len(x), len(y)
    if not n or not m:
        raise ValueError("rank test of an empty sample")
    if n * m <= EXACT_MAX_PAIRS:
        return min(1.0, 2.0 * min(stats.mann_whitney_greater(x, y), stats.mann_whitney_greater(y, x)))
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks: list[float] = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2.0 + 1.0
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    u = sum(r for r, (_, side) in zip(ranks, pooled, strict=True) if side == 0) - n * (n + 1) / 2.0
    total = n + m
    var = n * m / 12.0 * ((total + 1) - ties / (total * (total - 1)))
    if var <= 0:
        return 1.0
    z = max(0.0, abs(u - n * m / 2.0) - 0.5) / math.sqrt(var)
    return min(1.0, 2.0 * (1.0 - statistics.NormalDist().cdf(z)))


@dataclass(frozen=True)
class Drift:
    """One latency's first- against last-quarter comparison."""

    metric: str
    first_ms: float  # median of the first quarter
    last_ms: float
    p: float
    min_effect: float
    alpha: float = DRIFT_ALPHA

    @property
    def ratio(self) -> float:
        return self.last_ms / self.first_ms if self.first_ms else math.inf

    @property
    def drifted(self) -> bool:
        return self.p < self.alpha and abs(self.ratio - 1.0) > self.min_effect

    def describe(self) -> str:
        return (f"{self.metric.upper()} {self.first_ms:.4g} -> {self.last_ms:.4g} ms "
                f"(x{self.ratio:.3f}, p = {self.p:.3g})")


@dataclass(frozen=True)
class DriftCheck:
    """The window's drift check: a comparison per latency, or why there is none (``skipped``)."""

    quarter: int
    checks: tuple[Drift, ...] = ()
    skipped: str = ""

    @property
    def drifted(self) -> tuple[Drift, ...]:
        return tuple(d for d in self.checks if d.drifted)

    def reason(self) -> str | None:
        """The INCONCLUSIVE reason for the window's client-timed metrics, or None when nothing drifted."""
        moved = self.drifted
        if not moved:
            return None
        return (f"the window drifted: first vs last quarter ({self.quarter} requests each) "
                f"{'; '.join(d.describe() for d in moved)}, beyond the rank test's p < {moved[0].alpha:g} and "
                f"the minimum effect (the server changed while it was measured)")

    def facts(self) -> dict[str, JSONScalar]:
        if self.skipped:
            return {"drift": f"not checked: {self.skipped}"}
        facts: dict[str, JSONScalar] = {
            "drift": "drifted" if self.drifted else f"none (first vs last quarter, {self.quarter} requests each)"}
        for d in self.checks:
            facts[f"drift_{d.metric}_ratio"] = round(d.ratio, 4)
            facts[f"drift_{d.metric}_p"] = float(f"{d.p:.3g}")
        return facts


def check_drift(outcomes: Sequence[RequestOutcome], *, ramp: int, min_effects: Mapping[str, float | None],
                alpha: float = DRIFT_ALPHA) -> DriftCheck:
    """Compare the first and last quarter (by send time) of the steady part of a window: ``ramp`` requests are
    left out at each end (a closed loop's concurrency; 0 for an open loop)."""
    ok = sorted((o for o in outcomes if o.success), key=lambda o: o.start_s)
    steady = ok[ramp:len(ok) - ramp] if ramp > 0 else ok
    quarter = len(steady) // 4
    if quarter < MIN_QUARTER:
        return DriftCheck(quarter, skipped=f"{len(ok)} requests leave quarters of {quarter} (< {MIN_QUARTER}) "
                                           f"after {ramp} ramp request(s) at each end")
    first, last = latency_samples(steady[:quarter]), latency_samples(steady[-quarter:])
    checks = []
    for metric in DRIFT_METRICS:
        a, b = first[metric], last[metric]
        if len(a) < MIN_QUARTER or len(b) < MIN_QUARTER:
            continue
        effect = min_effects.get(metric)
        checks.append(Drift(metric, stats.median(a), stats.median(b), rank_test(a, b),
                            DEFAULT_MIN_EFFECT if effect is None else effect, alpha))
    return DriftCheck(quarter, tuple(checks))
