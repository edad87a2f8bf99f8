"""The paired judge's rule on hand-made pairs: PASS inside ±δ, REGRESSED / IMPROVED when significant after the
false-discovery control and beyond δ, INCONCLUSIVE with a cause that says whether more pairs can help; the A/A
calibration on top of it."""

from __future__ import annotations

import math

import pytest

from pytest_moeperf.ab import calibration
from pytest_moeperf.ab.verdicts import MetricPairs, Observation, Pair, budget_ended, decidable, judge_all
from pytest_moeperf.judging.thresholds import Threshold
from pytest_moeperf.judging.verdict import Cause, Status
from pytest_moeperf.ledger import HealthReport, Measurement, Record, Round

KEY = "suites/test_x.py::test_case::time"


def record(unit: str = "ms", better: str = "lower", tolerance: float = 0.05, abs_tolerance: float = 0.0,
           name: str = "time") -> Record:
    metric = Measurement("suites/test_x.py::test_case", name, (1.0,), unit, better)  # type: ignore[arg-type]
    return Record(metric, (Round((1.0,)),), Threshold(tolerance=tolerance, abs_tolerance=abs_tolerance))


def metric(base_values: list[float], head_values: list[float], key: str = KEY, **policy: object) -> MetricPairs:
    name = key.rpartition("::")[2]
    rec = record(name=name, **policy)  # type: ignore[arg-type]
    pairs = [Pair(i + 1, Observation(b), Observation(h)) for i, (b, h) in
             enumerate(zip(base_values, head_values, strict=True))]
    return MetricPairs(key, rec, rec, pairs)


BASE = [10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.02, 9.98]


def scaled(factor: float, n: int = 6, wiggle: float = 0.002) -> list[float]:
    """Head values: base × factor, each pair's ratio moved by a different small amount."""
    return [b * factor * (1 + wiggle * ((i % 3) - 1)) for i, b in enumerate(BASE[:n])]


def test_a_ten_percent_slowdown_in_six_pairs_is_regressed() -> None:
    verdict = judge_all([metric(BASE[:6], scaled(1.10))])[KEY].verdict
    assert verdict.status is Status.REGRESSED
    assert verdict.change == pytest.approx(0.10, abs=0.003)
    assert verdict.reference == pytest.approx(10.0, abs=0.03)  # the median of base's process medians
    assert verdict.runs == 6 and len(verdict.round_medians) == 6
    assert verdict.mde is not None and verdict.mde < 0.01
    assert "p = 0.0312" in verdict.spread and verdict.noise_source == "pairs"


def test_higher_is_better_a_gain_is_improved_and_a_loss_regressed() -> None:
    assert judge_all([metric(BASE[:6], scaled(1.10), better="higher")])[KEY].verdict.status is Status.IMPROVED
    assert judge_all([metric(BASE[:6], scaled(0.90), better="higher")])[KEY].verdict.status is Status.REGRESSED


def test_an_interval_inside_the_minimum_effect_passes() -> None:
    verdict = judge_all([metric(BASE[:6], scaled(1.01))])[KEY].verdict
    assert verdict.status is Status.PASS
    assert "inside ±5 %" in verdict.reason and "a real change" in verdict.reason  # significant, but small


def test_the_base_sides_minimum_effect_and_abs_tolerance_are_the_policy() -> None:
    assert judge_all([metric(BASE[:6], scaled(1.10), tolerance=0.2)])[KEY].verdict.status is Status.PASS
    loose = metric(BASE[:6], scaled(1.10), abs_tolerance=1.5)  # 10 % of 10 ms is within 1.5 ms
    assert judge_all([loose])[KEY].verdict.status is Status.PASS


def test_five_pairs_cannot_decide_and_more_pairs_can() -> None:
    verdict = judge_all([metric(BASE[:5], scaled(1.10, n=5))])[KEY].verdict
    assert verdict.status is Status.INCONCLUSIVE and verdict.cause == Cause.FEW_ROUNDS
    assert "at least 6" in verdict.reason and decidable(verdict)
    ended = budget_ended(verdict, 5)
    assert ended.cause == Cause.BUDGET and "--max-pairs 5" in ended.reason and not decidable(ended)


def test_false_discovery_control_needs_more_pairs_when_other_metrics_did_not_move() -> None:
    other = "suites/test_x.py::test_other::gbps"
    six = judge_all([metric(BASE[:6], scaled(1.10)), metric(BASE[:6], BASE[:6], key=other)])
    slow = six[KEY]
    assert slow.evidence is not None and slow.evidence.p == pytest.approx(1 / 32)
    assert slow.q == pytest.approx(1 / 16)  # p x 2 metrics / rank 1
    assert slow.verdict.status is Status.INCONCLUSIVE and decidable(slow.verdict)
    assert "not significant" in slow.verdict.reason
    assert six[other].verdict.status is Status.PASS
    eight = judge_all([metric(BASE, scaled(1.10, n=8)), metric(BASE[:6], BASE[:6], key=other)])
    assert eight[KEY].q == pytest.approx(2 / 256 * 2)
    assert eight[KEY].verdict.status is Status.REGRESSED


def test_a_real_change_whose_interval_reaches_past_the_minimum_effect_is_inconclusive() -> None:
    head = [b * math.exp(0.01 * (i + 1)) for i, b in enumerate(BASE[:6])]  # log ratios 0.01 … 0.06
    verdict = judge_all([metric(BASE[:6], head)])[KEY].verdict
    assert verdict.status is Status.INCONCLUSIVE and verdict.cause == Cause.NOISE
    assert "a real change" in verdict.reason and decidable(verdict)


def test_metrics_on_one_side_only_and_changed_units() -> None:
    rec = record()
    only_head = MetricPairs(KEY, None, rec, [Pair(1, None, Observation(1.0))])
    only_base = MetricPairs(KEY + "2", rec, None, [Pair(1, Observation(1.0), None)])
    changed = MetricPairs(KEY + "3", record(unit="ms"), record(unit="us"), [Pair(1, Observation(1.0),
                                                                                  Observation(1000.0))])
    out = judge_all([only_head, only_base, changed])
    assert out[KEY].verdict.status is Status.NEW and "only head" in out[KEY].verdict.reason
    assert out[KEY + "2"].verdict.status is Status.MISSING
    assert out[KEY + "3"].verdict.status is Status.INCONCLUSIVE and not decidable(out[KEY + "3"].verdict)
    assert "unit or direction changed" in out[KEY + "3"].verdict.reason


def test_pairs_that_cannot_decide_are_left_out_and_named() -> None:
    found = metric(BASE[:6], scaled(1.10))
    found.pairs.append(Pair(7, Observation(None, "health: foreign CPU load"), Observation(11.0)))
    verdict = judge_all([found])[KEY].verdict
    assert verdict.status is Status.REGRESSED and verdict.runs == 6
    assert "pair 7 (base: health: foreign CPU load)" in verdict.reason
    sick = MetricPairs(KEY, record(), record(), [Pair(1, Observation(None, "health: steal"), Observation(1.0))])
    verdict = judge_all([sick])[KEY].verdict
    assert verdict.status is Status.INCONCLUSIVE and verdict.cause == Cause.HEALTH and not decidable(verdict)


def test_a_ratio_of_zero_is_undefined_but_two_zeros_are_no_change() -> None:
    zeros = judge_all([metric([0.0] * 6, [0.0] * 6)])[KEY].verdict
    assert zeros.status is Status.PASS
    undefined = judge_all([metric([0.0], [1.0])])[KEY].verdict
    assert undefined.status is Status.INCONCLUSIVE and undefined.cause == Cause.ZERO_BASELINE


def test_observation_is_the_median_of_the_usable_rounds() -> None:
    from pytest_moeperf.ab.verdicts import observation

    rec = record()
    sick = HealthReport(False, ("steal 20 %",))
    rounds = (Round((1.0, 2.0, 9.0)), Round((100.0,), health=sick))
    assert observation(Record(rec.metric, rounds)).value == 2.0
    assert observation(Record(rec.metric, rounds[1:])) == Observation(None, "health: steal 20 %")


def test_calibration_counts_false_alarms_and_names_noisy_metrics() -> None:
    quiet = metric(BASE[:6], scaled(1.0))
    noisy_head = [b * f for b, f in zip(BASE[:6], (1.08, 0.93, 1.07, 0.92, 1.09, 0.94), strict=True)]
    noisy = metric(BASE[:6], noisy_head, key="suites/test_x.py::test_noisy::time")
    alarm = metric(BASE, scaled(1.10, n=8), key="suites/test_x.py::test_alarm::time")  # q = 3 x 2/256
    found = calibration.calibrate(judge_all([quiet, noisy, alarm]))
    assert found.judged == 3 and found.false_alarms == ("suites/test_x.py::test_alarm::time",)
    assert found.rate == pytest.approx(1 / 3)
    assert [n.key for n in found.named] == ["suites/test_x.py::test_noisy::time"]
    (named,) = found.named
    assert named.noise > 0.05 and named.pairs_needed is not None and named.pairs_needed > 6
    section = calibration.section(found)
    assert section.rows[0][0] == named.key
    assert "1 false alarm(s) in 3 metric(s) (33.3 %)" in calibration.lines(found)[0]


def test_looks_double_the_pairs_and_share_alpha() -> None:
    from pytest_moeperf.ab import adaptive

    assert adaptive.looks(10, 20) == [10, 20]
    assert adaptive.looks(6, 20) == [6, 12, 20]
    assert adaptive.looks(8, 8) == [8]
    assert adaptive.alpha_per_look(0.05, 10, 20) == pytest.approx(0.025)
    assert adaptive.alpha_per_look(0.05, 6, 20) == pytest.approx(0.05 / 3)
