"""``--moeperf-confirm-at``: confirmation at the session's end (the default) through real pytest sessions: a test
that crossed its threshold is confirmed after the session's other tests, all such tests in one fresh process a
confirmation, and reported then (its verdict as at its call: a regression fails it, in the JUnit XML too); an
interrupted session still reports the tests it held; ``call`` confirms each test right after its call."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from importlib import metadata

import pytest

# Two tests slow in the session's own process when SLOW names them (x1.5), x1 in a child session (MOEPERF_ROUND set)
# unless STAY_SLOW names them; each call writes "<test> <pid>" to calls.txt, in order.
TIMELINE = """
import os
from pathlib import Path

CHILD = bool(os.environ.get("MOEPERF_ROUND"))

def measure(perf, name):
    with Path("calls.txt").open("a") as handle:
        handle.write(f"{name} {os.getpid()}\\n")
    slow = name in os.environ.get("STAY_SLOW", "").split(",") or (
        not CHILD and name in os.environ.get("SLOW", "").split(","))
    s = 1.5 if slow else 1.0
    perf.record("latency", [10.0 * s, 10.1 * s, 9.9 * s, 10.0 * s, 10.05 * s], unit="ms")

def test_a(perf):
    measure(perf, "a")

def test_b(perf):
    measure(perf, "b")

def test_c(perf):
    measure(perf, "c")
    if os.environ.get("INTERRUPT_AT_C") and not CHILD:
        raise KeyboardInterrupt
"""


def timeline(pytester: pytest.Pytester) -> list[tuple[str, str]]:
    path = pytester.path / "calls.txt"
    lines = [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return lines  # type: ignore[return-value]


@pytest.fixture
def recorded(pytester: pytest.Pytester, run_moeperf):  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_t=TIMELINE)
    pytester.makeini("[pytest]\nmoeperf_history = off\n")
    for _ in range(3):
        assert run_moeperf("--moeperf-update").ret == pytest.ExitCode.OK
    timeline(pytester)
    return run_moeperf


def test_tests_that_crossed_are_confirmed_after_the_others_in_one_process_each_time(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, recorded, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLOW", "a,b")  # the session's process slow for a and b: a machine's minute, not the code
    result = recorded("-v")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    calls = timeline(pytester)
    parent = calls[0][1]
    assert [c for c, _ in calls[:3]] == ["a", "b", "c"] and {p for _, p in calls[:3]} == {parent}
    rest = calls[3:]
    assert rest and all(p != parent for _, p in rest), "confirmed in fresh processes, after test c"
    assert [c for c, _ in rest[:2]] == ["a", "b"] and rest[0][1] == rest[1][1], "one process confirms both"
    out = result.stdout.str()
    assert out.index("test_t.py::test_c PASSED") < out.index("test_t.py::test_a PASSED"), "a is reported at the end"
    result.stdout.fnmatch_lines(["moeperf: 2 test(s) crossed a threshold: confirming them now, apart from their "
                                 "calls, in up to 3 fresh process(es)",
                                 "moeperf: 2 tests: confirmation 1/3 in a fresh process*"])
    result.stdout.fnmatch_lines(["test_t.py::test_a::latency *10 *10 *+0.0 % *3 *PASS"])


def test_a_regression_that_stays_fails_its_test_at_the_end_and_in_the_junit_xml(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, recorded, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("STAY_SLOW", "b")
    result = recorded("--junitxml", "junit.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=2, failed=1)
    assert [c for c, _ in timeline(pytester)] == ["a", "b", "c", "b", "b", "b"], "b alone, 3 confirmations"
    result.stdout.fnmatch_lines(["*latency: baseline 10 ms (3 runs) -> current 15 ms (n=20, 4 rounds)*REGRESSED*"])
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    assert cases["test_b"].find("failure") is not None and cases["test_a"].find("failure") is None
    assert "regressed against baselines" in (cases["test_b"].find("failure").get("message") or "")  # type: ignore[union-attr]


def test_an_interrupted_session_still_reports_the_tests_it_held(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, recorded, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLOW", "a")
    monkeypatch.setenv("INTERRUPT_AT_C", "1")  # a subprocess: an in-process session would pass Ctrl-C on to ours
    plugin = () if any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(group="pytest11")) else (
        "-p", "pytest_moeperf.plugin")
    result = pytester.runpytest_subprocess(*plugin, "-p", "no:cacheprovider", "--moeperf-baselines",
                                           str(pytester.path / "baselines"), "--moeperf-health", "off",
                                           "--moeperf-canary", "off", "-v")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert [c for c, _ in timeline(pytester)] == ["a", "b", "c"], "no confirmation after the interrupt"
    result.stdout.fnmatch_lines(["*test_t.py::test_a PASSED*"])
    result.stdout.fnmatch_lines(["INCONCLUSIVE test_t.py::test_a::latency: *the session was interrupted*"])


def test_confirm_at_call_confirms_each_test_right_after_its_call(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, recorded, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLOW", "a")
    result = recorded("--moeperf-confirm-at", "call")
    assert result.ret == pytest.ExitCode.OK
    calls = [c for c, _ in timeline(pytester)]
    assert calls[0] == "a" and calls[1] == "a" and calls[-2:] == ["b", "c"], calls
    assert "crossed a threshold: confirming them now" not in result.stdout.str()


def test_a_bad_value_names_the_choices(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_t=TIMELINE)
    result = run_moeperf("--moeperf-confirm-at", "later")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--moeperf-confirm-at*expected end or call, got 'later'*"])
