"""Drift within a measured window: did the server change while it was being measured?

The window's successful requests, ordered by send time, are compared early against late on their median TTFT and
TPOT. A closed loop's first ``concurrency`` requests (sent together into an idle server: the ramp) and its last
``concurrency`` (answered while the batch drains) are left out first, since a steady server differs there by
construction.

**The unit of observation is a block, not a request.** The C requests a closed loop has in flight share the
server's batch: whatever that batch meets (a scheduler hiccup, a prefill beside it, a preemption) moves all of
them together, so C consecutive requests are one observation, not C. Seen on 1x H200 (tiny MoE, c=16, 100-request
windows): a per-request test read "drift" in 7 of 12 windows, three at the smallest p an exact test of 17 against 17
requests can give (every late request slower than every early one, or faster: ×0.72, ×1.47, ×1.59), the others
×0.89 to ×1.11, in both directions: as whole batches moving would, not as a warming or tiring server would. So
the steady requests are cut into blocks of C consecutive ones (an open loop: as many as it has in flight on average, by
Little's law; 1 when they do not overlap), each block's median is one observation, and the first and the last
quarter of the blocks are compared, widened to `MIN_QUARTER` blocks each when a quarter holds fewer (halves at 10
blocks); a window with fewer than ``2 * MIN_QUARTER`` blocks is not checked, and says so.

A latency *drifted* when a two-sided Mann-Whitney rank test of the two parts gives p < `DRIFT_ALPHA` (exact for
small parts, the normal approximation with tie correction beyond `EXACT_MAX_PAIRS` pairs) *and* the medians differ
by more than the minimum effect (the profile's tolerance of that latency, else `DEFAULT_MIN_EFFECT`): the window's
own spread says the change is real, and it is large enough to matter. Seen on 1x H200 (vLLM 0.26): the first window
at a new concurrency met Triton's just-in-time compiles of new batch shapes (TTFT 745 ms cold, 35 ms warm); the
warm pass (`pytest_moeperf.serving.load.warm`) is meant to prevent that, this check tells when it did not.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_moeperf.judging import stats
from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, latency_samples

__all__ = ["DEFAULT_MIN_EFFECT", "DRIFT_ALPHA", "MIN_QUARTER", "Drift", "DriftCheck", "check_drift", "in_flight",
           "rank_test"]

DRIFT_ALPHA = 0.01
DEFAULT_MIN_EFFECT = 0.05
#: the smallest part, in blocks: an exact two-sided test of 5 against 5 can reach p = 2/252 = 0.008 < `DRIFT_ALPHA`
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
    """The window's drift check: a comparison per latency, or why there is none (``skipped``). ``part`` blocks of
    ``block`` requests each, early against late, out of ``blocks``."""

    part: int
    block: int = 1
    blocks: int = 0
    checks: tuple[Drift, ...] = ()
    skipped: str = ""

    @property
    def drifted(self) -> tuple[Drift, ...]:
        return tuple(d for d in self.checks if d.drifted)

    def compared(self) -> str:
        """What was compared, in words: ``first vs last 11 of 46 requests`` or ``… 5 of 16 blocks of 16 requests``."""
        if self.block == 1:
            return f"first vs last {self.part} of {self.blocks} requests"
        return f"first vs last {self.part} of {self.blocks} blocks of {self.block} requests, each block one observation"

    def reason(self) -> str | None:
        """The INCONCLUSIVE reason for the window's client-timed metrics, or None when nothing drifted."""
        moved = self.drifted
        if not moved:
            return None
        return (f"the window drifted: {self.compared()}: {'; '.join(d.describe() for d in moved)}, beyond the "
                f"rank test's p < {moved[0].alpha:g} and the minimum effect (the server changed while it was "
                f"measured)")

    def facts(self) -> dict[str, JSONScalar]:
        if self.skipped:
            return {"drift": f"not checked: {self.skipped}"}
        facts: dict[str, JSONScalar] = {"drift": "drifted" if self.drifted else f"none ({self.compared()})"}
        for d in self.checks:
            facts[f"drift_{d.metric}_ratio"] = round(d.ratio, 4)
            facts[f"drift_{d.metric}_p"] = float(f"{d.p:.3g}")
        return facts


def in_flight(outcomes: Sequence[RequestOutcome]) -> int:
    """How many requests the window had in flight on average (Little's law: the requests' summed time over the
    window's span), rounded, at least 1."""
    ok = [o for o in outcomes if o.success]
    if not ok:
        return 1
    span = max(o.start_s + o.latency_s for o in ok) - min(o.start_s for o in ok)
    return max(1, round(sum(o.latency_s for o in ok) / span)) if span > 0 else 1


def check_drift(outcomes: Sequence[RequestOutcome], *, ramp: int, min_effects: Mapping[str, float | None],
                block: int = 1, alpha: float = DRIFT_ALPHA) -> DriftCheck:
    """Compare the early and the late blocks of the steady part of a window: ``ramp`` requests are left out at each
    end and the rest cut into blocks of ``block`` consecutive requests (both a closed loop's concurrency; for an
    open loop no ramp and `in_flight` requests a block), each block's median one observation."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    ok = sorted((o for o in outcomes if o.success), key=lambda o: o.start_s)
    steady = ok[ramp:len(ok) - ramp] if ramp > 0 else ok
    blocks = [steady[i:i + block] for i in range(0, len(steady) - block + 1, block)]
    part = max(len(blocks) // 4, MIN_QUARTER)
    if 2 * part > len(blocks):
        unit = "requests" if block == 1 else f"blocks of {block} requests (requests in flight together share a " \
                                             f"batch: a block is one observation)"
        after = f" after {ramp} ramp request(s) at each end" if ramp else ""
        return DriftCheck(part, block, len(blocks), skipped=(
            f"{len(ok)} requests leave {len(blocks)} {unit}{after}; the check needs {2 * MIN_QUARTER}"))
    medians = [latency_samples(b) for b in blocks]
    checks = []
    for metric in DRIFT_METRICS:
        a = [stats.median(m[metric]) for m in medians[:part] if m[metric]]
        b = [stats.median(m[metric]) for m in medians[-part:] if m[metric]]
        if len(a) < MIN_QUARTER or len(b) < MIN_QUARTER:
            continue
        effect = min_effects.get(metric)
        checks.append(Drift(metric, stats.median(a), stats.median(b), rank_test(a, b),
                            DEFAULT_MIN_EFFECT if effect is None else effect, alpha))
    return DriftCheck(part, block, len(blocks), tuple(checks))
