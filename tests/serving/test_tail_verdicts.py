"""A tail percentile is judged through the serving wing's verdict hook in a real pytest session: a change of the point
value fails the test only when the window's own order-statistic bound is beyond the threshold too."""

from __future__ import annotations

import pytest

TAIL_TEST = """
import os
from pytest_moeperf.serving.analysis.tails import tail_bound

def test_tail(perf):
    fast, slow, value = (float(x) for x in os.environ["TAIL"].split(","))
    samples = [value] * int(fast) + [2 * value] * int(slow)  # 30 requests: the p90's bounds are ranks 23 and 29
    bound = tail_bound("ttft", samples, 90.0, len(samples))
    perf.record(bound.name, bound.value, unit="ms", better="lower", context=bound.context())
"""


def test_a_tail_fails_only_when_its_bound_is_beyond_the_threshold(  # type: ignore[no-untyped-def]
    pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_tail=TAIL_TEST)
    quiet = ("--moeperf-health", "off", "--moeperf-history", "off", "--moeperf-quiet-floor", "off", "-p", "no:randomly")
    monkeypatch.setenv("TAIL", "30,0,100")
    for _ in range(3):  # a baseline decides once it holds 3 runs
        run_moeperf("--moeperf-update", *quiet).assert_outcomes(passed=1)  # baseline p90: 100 ms
    monkeypatch.setenv("TAIL", "27,3,100")  # three slow requests: the point p90 reads 110 ms (+10 %)
    moved = run_moeperf(*quiet, "-rA")
    moved.assert_outcomes(passed=1)
    moved.stdout.fnmatch_lines(["*ttft_p90_ms: baseline 100 ms (3 runs) -> current 110 ms*-> INCONCLUSIVE: the "
                                "window's 95 % lower bound of the percentile, 100 ms, is within 5.0 % of the baseline"
                                "*"])
    monkeypatch.setenv("TAIL", "30,0,120")  # every request slower: the bound moved too
    slower = run_moeperf(*quiet)
    slower.assert_outcomes(failed=1)
    slower.stdout.fnmatch_lines(["*ttft_p90_ms: baseline 100 ms (3 runs) -> current 120 ms*-> REGRESSED*its 95 % "
                                 "bound 120 is beyond the threshold too*"])
