"""Distribution-free confidence bounds of any quantile from order statistics (`stats.quantile_bound_ranks`,
`stats.quantile_ci`, `stats.quantile_sample_size`), against textbook values and an exact rational computation."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest

from pytest_moeperf.judging import stats


def exact_cdf(n: int, q: Fraction, k: int) -> Fraction:
    """P(Binomial(n, q) <= k), in exact rationals."""
    return sum((comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1)), Fraction(0))


@pytest.mark.parametrize(("q", "confidence", "n"), [
    (0.95, 0.95, 59),  # the "rule of 59": the largest of 59 bounds the 95th percentile at 95 %
    (0.99, 0.95, 299),
    (0.90, 0.95, 29),
    (0.99, 0.99, 459),
    (0.50, 0.95, 5),
])  # fmt: skip
def test_sample_size_is_the_smallest_n_whose_largest_bounds_the_quantile(q: float, confidence: float, n: int) -> None:
    assert stats.quantile_sample_size(q, confidence) == n
    assert 1 - q**n >= confidence > 1 - q ** (n - 1)
    assert stats.quantile_bound_ranks(n, q, confidence)[1] == n  # the largest observation
    assert stats.quantile_bound_ranks(n - 1, q, confidence)[1] is None  # one fewer: no upper bound at all


@pytest.mark.parametrize(("n", "ranks"), [(20, (6, 15)), (100, (40, 61)), (10, (2, 9))])
def test_median_interval_is_the_sign_test_table(n: int, ranks: tuple[int, int]) -> None:
    """95 % two-sided intervals of the median (each end at 97.5 %): the classic tables (e.g. n = 100: X(40)..X(61))."""
    assert stats.quantile_bound_ranks(n, 0.5, 0.975) == ranks
    values = [float(i) for i in range(1, n + 1)]
    assert stats.quantile_ci(values, 0.5, 0.95) == (float(ranks[0]), float(ranks[1]))


def test_quantile_ci_of_the_median_is_median_ci_where_its_rank_exists() -> None:
    for n in range(6, 301):
        values = [float((7 * i) % n) for i in range(n)]  # every value once, shuffled
        assert stats.quantile_ci(values, 0.5) == stats.median_ci(values), n


@pytest.mark.parametrize(("n", "q", "confidence"), [(100, 0.9, 0.95), (37, 0.75, 0.9), (300, 0.99, 0.95),
                                                    (12, 0.25, 0.8)])
def test_bounds_are_the_extreme_ranks_that_keep_the_confidence(n: int, q: float, confidence: float) -> None:
    """Against exact rational binomial tails: X(r) <= ξ_q with P(B >= r) >= conf (r the largest such), and
    X(s) >= ξ_q with P(B <= s - 1) >= conf (s the smallest such)."""
    lower, upper = stats.quantile_bound_ranks(n, q, confidence)
    fq, fc = Fraction(q), Fraction(confidence)
    assert lower is not None and upper is not None
    assert 1 - exact_cdf(n, fq, lower - 1) >= fc > 1 - exact_cdf(n, fq, lower)
    assert exact_cdf(n, fq, upper - 1) >= fc > exact_cdf(n, fq, upper - 2)


def test_a_textbook_tail_bound() -> None:
    """n = 100, the 0.9 quantile, 95 % one-sided: X(85) from below and X(96) from above."""
    assert stats.quantile_bound_ranks(100, 0.9, 0.95) == (85, 96)


def test_too_few_values_leave_an_end_open_not_a_point() -> None:
    low, high = stats.quantile_ci([1.0, 2.0, 3.0, 4.0, 5.0], 0.99)
    assert high is None and low is not None
    assert stats.quantile_ci([], 0.5) == (None, None)


def test_bad_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match="q must be in"):
        stats.quantile_bound_ranks(10, 1.0, 0.95)
    with pytest.raises(ValueError, match="confidence must be in"):
        stats.quantile_bound_ranks(10, 0.5, 1.0)
    with pytest.raises(ValueError):
        stats.quantile_sample_size(0.0, 0.95)
