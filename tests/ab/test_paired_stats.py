"""The paired statistics of ``moeperf ab`` against values computed by hand (and against the definition: every
sign pattern enumerated)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pytest_moeperf.ab import paired


@pytest.mark.parametrize(("differences", "p"), [
    ([0.1] * 5, 2 / 32),  # the most extreme of 2^5 sign patterns, two-sided: never below 0.05 with 5 pairs
    ([0.01, 0.02, 0.03, 0.04, 0.05, 0.06], 2 / 64),  # 6 pairs: the first n that can reach p < 0.05
    ([-0.01, -0.02, -0.03, -0.04, -0.05, -0.06], 2 / 64),
    # W+ = 1 + 2 + 4 + 5 = 12 of 15; P(W+ >= 12) = P(W+ <= 3): {}, {1}, {2}, {3}, {1, 2} -> 5/32, two-sided 10/32
    ([1, 2, -3, 4, 5], 10 / 32),
    # ties: |d| = 1, 1, 1, 2 -> mid-ranks 2, 2, 2, 4; W+ = 2 + 2 + 4 = 8 of 10: 4 of 16 patterns reach 8 -> 2 x 4/16
    ([1, 1, -1, 2], 0.5),
    ([0, 0, 1, 2, 3, 4, 5, 6], 2 / 64),  # zeros are dropped (Wilcoxon): the same as six positive differences
    ([0.0] * 7, 1.0),
])
def test_signed_rank_p_matches_hand_computed_values(differences: list[float], p: float) -> None:
    assert paired.signed_rank_p(differences) == pytest.approx(p, abs=1e-15)


def test_signed_rank_p_is_the_exact_sign_flip_distribution_of_the_ranks() -> None:
    rng = random.Random(7)
    for n in (3, 7, 10):
        d = [rng.gauss(0.01, 0.02) for _ in range(n)]
        ranks = paired.doubled_ranks([abs(x) for x in d])
        observed = sum(r for r, x in zip(ranks, d, strict=True) if x > 0)
        sums = [sum(r for r, s in zip(ranks, signs, strict=True) if s) for signs in
                itertools.product((0, 1), repeat=n)]
        upper = sum(s >= observed for s in sums) / len(sums)
        lower = sum(s <= observed for s in sums) / len(sums)
        assert paired.signed_rank_p(d) == pytest.approx(min(1.0, 2 * min(upper, lower)))


def test_doubled_mid_ranks() -> None:
    assert paired.doubled_ranks([0.3, 0.1, 0.2, 0.1]) == [8, 3, 6, 3]  # ranks 4, 1.5, 3, 1.5


def test_walsh_averages_and_hodges_lehmann() -> None:
    assert paired.walsh_averages([1, 2, 3]) == [1, 1.5, 2, 2, 2.5, 3]
    assert paired.hodges_lehmann([1, 2, 3]) == 2
    # Walsh averages of 0, 0, 10: 0, 0, 0, 5, 5, 10 -> median 2.5 (the mean, 3.33, follows the outlier further)
    assert paired.hodges_lehmann([0, 0, 10]) == 2.5
    assert paired.hodges_lehmann([0.01 * i for i in range(1, 7)]) == pytest.approx(0.035)


def test_interval_ranks_are_the_signed_rank_tables_critical_values_plus_one() -> None:
    # two-sided 0.05 critical values of the signed-rank statistic: n=6: 0, 7: 2, 8: 3, 9: 5, 10: 8, 11: 10, 12: 13
    assert [paired.interval_rank(n) for n in range(1, 13)] == [None] * 5 + [1, 3, 4, 6, 9, 11, 14]
    assert paired.interval_confidence(6) == pytest.approx(1 - 2 / 64)
    assert paired.interval_confidence(8) == pytest.approx(1 - 2 * 5 / 256)  # W+ <= 3: 5 of 256 patterns


def test_hl_interval_is_the_kth_smallest_and_largest_walsh_average() -> None:
    assert paired.hl_interval([0.01 * i for i in range(1, 7)]) == pytest.approx((0.01, 0.06))  # n=6: k=1
    # n=8, k=4: Walsh averages of 1..8 sorted start 1, 1.5, 2, 2 and end 8, 7.5, 7, 7
    assert paired.hl_interval(list(range(1, 9))) == (2, 7)
    assert paired.hl_interval([0.1] * 5) == (-math.inf, math.inf)  # no 95 % interval from 5 pairs


def test_benjamini_hochberg_by_hand() -> None:
    # sorted 0.01, 0.03, 0.04, 0.5 -> p m / i: 0.04, 0.06, 0.0533, 0.5 -> running minimum from the largest
    assert paired.benjamini_hochberg([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.5])
    assert paired.benjamini_hochberg([1 / 32, 1.0]) == pytest.approx([1 / 16, 1.0])
    assert paired.benjamini_hochberg([]) == []


def test_min_pairs_detectable_and_pairs_needed() -> None:
    assert paired.min_pairs(0.05) == 6
    assert paired.min_pairs(0.01) == 8  # 2 / 2^8 < 0.01 < 2 / 2^7
    assert paired.detectable(0.01, 5) is None
    z = 1.959964 + 0.841621  # z_0.975 + z_0.8
    assert paired.detectable(0.01, 16) == pytest.approx(z * 0.01 / 4, rel=1e-5)
    assert paired.pairs_needed(0.01, 0.01) == math.ceil(z**2)  # 8
    assert paired.pairs_needed(0.001, 0.01) == 6  # never below the fewest pairs that can decide


def test_spread_is_robust() -> None:
    assert paired.spread([0.0, 0.01, -0.01, 0.0, 0.5]) == pytest.approx(1.4826 * 0.01)
    assert paired.spread([0.0, 0.0, 0.0, 0.3]) == pytest.approx(0.15)  # MAD 0: the standard deviation
