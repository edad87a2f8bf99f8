"""The second fault sweep (issue 30), its bad-input holes: each reproduced through real pytest sessions or processes.

A value that cannot mean what it says (a string or bool where a number belongs, a tolerance of 2 meant as 2 %, a
unit of None) is refused where it enters, naming where and what, and fails only what it belongs to.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LAT = """
import os

def test_lat(perf):
    perf.record("latency", [float(os.environ.get("V", "100"))] * 20, unit="us")

def test_other(perf):
    perf.record("other", [5.0] * 20, unit="us")
"""
KEY = "test_h.py::test_lat::latency"


def _baseline(pytester: pytest.Pytester) -> Path:
    found = list((pytester.path / "baselines").glob("*/test_h.json"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("field", ["summary", "run"])
@pytest.mark.parametrize("value", ["NaN", "inf", "1e999", "100", True, None, [100]])
def test_item3_a_baseline_number_that_is_no_finite_number_fails_its_test(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch, field: str, value: object) -> None:
    """``"NaN"`` read as float('nan') made every later run INCONCLUSIVE, a tenfold regression included, exit 0."""
    pytester.makepyfile(test_h=LAT)
    for _ in range(3):
        assert run_moeperf("--moeperf-update", "--moeperf-history", "off").ret == pytest.ExitCode.OK
    path = _baseline(pytester)
    doc = json.loads(path.read_text())
    metric = doc["metrics"][KEY]
    (metric["summary"] if field == "summary" else metric["runs"][1])["median"] = value
    path.write_text(json.dumps(doc, indent=2))
    content = path.read_bytes()

    monkeypatch.setenv("V", "1000")
    for args in ((), ("--moeperf-update",)):
        result = run_moeperf("--moeperf-history", "off", *args)
        assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
        name = "summary.median" if field == "summary" else "runs[1].median"
        out = result.stdout.str()
        assert "baseline unusable" in out and f"{path}: metric {KEY!r}: {name} must be a finite number, got " \
            f"{value!r} (left untouched)" in out, out
        assert path.read_bytes() == content


BAD_RECORD = """
def test_bad(perf):
    perf.record("first", [1.0] * 5, unit="us")
    perf.record("x", [1.0] * 5, unit="us", {arg}={value})

def test_good(perf):
    perf.record("y", [2.0] * 5, unit="us")
"""


@pytest.mark.parametrize("arg", ["tolerance", "abs_tolerance"])
@pytest.mark.parametrize("value", ["float('nan')", "float('inf')", "-0.1"])
def test_item4_a_bad_threshold_argument_fails_that_test_only(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, arg: str, value: str) -> None:
    """``tolerance=float('nan')`` was an INTERNALERROR (exit 3) at the call report: later tests did not run and an
    update wrote nothing."""
    pytester.makepyfile(test_h=BAD_RECORD.format(arg=arg, value=value))
    result = run_moeperf("--moeperf-update")
    result.assert_outcomes(passed=1, failed=1)
    shown = "nan" if "nan" in value else "inf" if "inf" in value else value
    result.stdout.fnmatch_lines([f"*perf.record: metric 'x': {arg} must be a finite number >= 0, got {shown}*",
                                 "FAILED test_h.py::test_bad - *"])
    stored = json.loads(_baseline(pytester).read_text())["metrics"]
    assert list(stored) == ["test_h.py::test_good::y"]
