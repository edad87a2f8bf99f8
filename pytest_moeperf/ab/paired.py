"""Pure paired statistics for ``moeperf ab``: no I/O, no pytest.

Each pair is one base process and one head process run back to back; its difference is ``d = log(head / base)``.
On the differences of one metric:

* **Wilcoxon signed-rank test**, two-sided: the exact sign-flip permutation distribution of the signed (mid)ranks,
  counted for every n (no normal approximation, no Monte Carlo: the distribution of the positive rank sum is
  built by counting sign patterns, in integer arithmetic). Zero differences are dropped (Wilcoxon's rule); ties
  among the others get mid-ranks, and the count runs over doubled mid-ranks so it stays exact.
* **Hodges–Lehmann estimate**: the median of the Walsh averages ``(d_i + d_j) / 2``, ``i <= j``.
* **Confidence interval** (distribution-free, the inversion of the signed-rank test): the ``k``-th smallest and
  ``k``-th largest Walsh average, ``k`` the largest rank with ``P(W+ <= k - 1) <= alpha / 2`` under no ties.
  Fewer than 6 pairs cannot give a 95 % interval (``2 / 2^5 > 0.05``): the interval is then unbounded.
* **Benjamini–Hochberg** adjusted p-values (q-values) across the metrics of a run.
* **Minimum detectable effect** for the pairs run: the change the test detects with 80 % power at ``alpha``,
  ``(z_{1 - alpha/2} + z_{0.8}) * sigma / sqrt(n)`` (normal approximation; ``sigma`` the robust spread of the
  differences, 1.4826 × MAD, or their standard deviation when the MAD is 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from pytest_moeperf.judging import stats

ALPHA = 0.05
POWER = 0.8


def null_counts(scores: Sequence[int]) -> list[int]:
    """``counts[s]``: how many of the ``2^n`` sign patterns of ``scores`` give a positive-score sum of ``s``."""
    counts = [1]
    for score in scores:
        grown = counts + [0] * score
        for total, ways in enumerate(counts):
            if ways:
                grown[total + score] += ways
        counts = grown
    return counts


def doubled_ranks(values: Sequence[float]) -> list[int]:
    """Twice the mid-ranks of ``values`` (ties share the mean of their ranks; doubled, every rank is an integer)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = start + end + 2  # (start + 1 + end + 1) / 2, doubled
        start = end + 1
    return ranks


def signed_rank_p(differences: Sequence[float]) -> float:
    """The two-sided exact p-value of the Wilcoxon signed-rank test that the differences are centred on 0
    (1.0 when every difference is 0)."""
    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 1.0
    scores = doubled_ranks([abs(d) for d in nonzero])
    observed = sum(s for s, d in zip(scores, nonzero, strict=True) if d > 0)
    counts = null_counts(scores)
    total = 1 << len(nonzero)
    upper = sum(counts[observed:])
    lower = sum(counts[:observed + 1])
    return min(1.0, 2 * min(upper, lower) / total)


def walsh_averages(differences: Sequence[float]) -> list[float]:
    """The ``n(n+1)/2`` Walsh averages ``(d_i + d_j) / 2`` for ``i <= j``, sorted."""
    d = list(differences)
    return sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))


def hodges_lehmann(differences: Sequence[float]) -> float:
    """The Hodges–Lehmann estimate of the centre of the differences: the median of their Walsh averages."""
    if not differences:
        raise ValueError("Hodges-Lehmann estimate of no differences")
    return stats.median(walsh_averages(differences))


def interval_rank(n: int, alpha: float = ALPHA) -> int | None:
    """``k``: the interval is the ``k``-th smallest to the ``k``-th largest Walsh average, the largest ``k`` with
    ``P(W+ <= k - 1) <= alpha / 2`` for ``n`` untied pairs; None when even ``k = 1`` is too likely (too few
    pairs for a ``1 - alpha`` interval)."""
    if n < 1:
        return None
    counts = null_counts(list(range(1, n + 1)))
    total = 1 << n
    below, k = 0, 0
    for ways in counts:
        if 2 * (below + ways) > alpha * total:  # P(W+ <= k) > alpha / 2: k + 1 is one too far
            break
        below += ways
        k += 1
    return k or None


def interval_confidence(n: int, alpha: float = ALPHA) -> float | None:
    """The confidence the interval of `interval_rank` really has (at least ``1 - alpha``)."""
    k = interval_rank(n, alpha)
    if k is None:
        return None
    return 1 - 2 * sum(null_counts(list(range(1, n + 1)))[:k]) / (1 << n)


def hl_interval(differences: Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """The distribution-free ``1 - alpha`` confidence interval of the centre (``(-inf, inf)`` with too few
    pairs)."""
    k = interval_rank(len(differences), alpha)
    if k is None:
        return -math.inf, math.inf
    walsh = walsh_averages(differences)
    return walsh[k - 1], walsh[len(walsh) - k]


def min_pairs(alpha: float = ALPHA) -> int:
    """The fewest pairs whose most extreme outcome gives a two-sided p-value of at most ``alpha``
    (``2 / 2^n <= alpha``: 6 at 0.05)."""
    n = 1
    while 2 / (1 << n) > alpha:
        n += 1
    return n


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (q-values), in the order given: ``q_(i) = min_{j >= i} p_(j) m / j``,
    capped at 1. A metric is a discovery at false-discovery rate ``alpha`` when its q-value is at most ``alpha``."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [1.0] * m
    running = 1.0
    for position in range(m - 1, -1, -1):
        i = order[position]
        running = min(running, pvalues[i] * m / (position + 1))
        adjusted[i] = min(1.0, running)
    return adjusted


def spread(differences: Sequence[float]) -> float:
    """The robust spread of one pair's difference: 1.4826 × MAD, or the standard deviation when the MAD is 0."""
    if len(differences) < 2:
        return 0.0
    robust = stats.MAD_TO_SIGMA * stats.mad(differences)
    return robust if robust > 0 else stats.stddev(differences)


def detectable(sigma: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest shift of the log ratio the test detects with ``power`` at ``alpha`` with ``n`` pairs whose
    differences spread by ``sigma`` (None: ``n`` is below `min_pairs`, nothing is detectable)."""
    if n < min_pairs(alpha):
        return None
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sigma / math.sqrt(n)


def pairs_needed(sigma: float, effect: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """How many pairs make ``effect`` (a log ratio) detectable with ``power`` at ``alpha``."""
    if effect <= 0:
        raise ValueError(f"effect must be > 0, got {effect}")
    z = NormalDist()
    n = math.ceil(((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sigma / effect) ** 2)
    return max(n, min_pairs(alpha))


@dataclass(frozen=True)
class Paired:
    """One metric's paired evidence: ``n`` pairs of log ratios head/base."""

    differences: tuple[float, ...]
    p: float  # two-sided signed-rank p-value
    estimate: float  # Hodges-Lehmann, log ratio
    low: float  # confidence interval of the log ratio (may be -inf)
    high: float  # (may be inf)
    sigma: float  # robust spread of one pair's log ratio
    mde: float | None  # detectable log-ratio shift at these pairs (None: too few pairs)

    @property
    def n(self) -> int:
        return len(self.differences)


def paired(differences: Sequence[float], alpha: float = ALPHA) -> Paired:
    """The paired evidence of one metric's log ratios."""
    if not differences:
        raise ValueError("no pairs")
    d = tuple(differences)
    low, high = hl_interval(d, alpha)
    sigma = spread(d)
    return Paired(d, signed_rank_p(d), hodges_lehmann(d), low, high, sigma, detectable(sigma, len(d), alpha))
