"""The start as the unit, through real pytest sessions: a test whose round is a start (``pytest_moeperf_round_unit``)
is never confirmed in-process, ``--moeperf-starts S`` runs it in S child sessions while the other tests run in the
session itself, an update stores one run per start, and the verdicts and the summary count the starts judged and set
aside. The servers are stood in for by each process's pid: a child session is a start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# A conftest that says which tests measure a start (as the serving wing does for tests on launched servers), and a
# test of each kind. Every call appends its process id to calls.txt; MOEPERF_TEST_SCALE scales the samples, and a
# start named in MOEPERF_TEST_ASIDE ("2/3") declares its window degenerate.
CONFTEST = """
def pytest_moeperf_round_unit(config, item):
    return "server start" if item.get_closest_marker("start") else None

def pytest_configure(config):
    config.addinivalue_line("markers", "start: the test measures a server start")
"""
TESTS = """
import os, pytest

def called():
    with open("calls.txt", "a") as handle:
        handle.write(f"{os.getpid()} {os.environ.get('MOEPERF_ROUND', '-')} "
                     f"{os.environ.get('MOEPERF_SERVE_CACHE', '-')}\\n")

def scale():
    return float(os.environ.get("MOEPERF_TEST_SCALE", "1.0"))

@pytest.mark.start
def test_window(perf):
    called()
    aside = os.environ.get("MOEPERF_TEST_ASIDE")
    if aside and os.environ.get("MOEPERF_ROUND") == aside:
        perf.inconclusive("the window drifted: TPOT 1.0 -> 1.3 ms")
    perf.record("tpot_ms", [2.0 * scale(), 2.01 * scale(), 1.99 * scale()], unit="ms")

def test_kernel(perf):
    called()
    perf.record("time", [10.0, 10.1, 9.9], unit="us")
"""


def calls(pytester: pytest.Pytester, caches: list[str] | None = None) -> list[tuple[str, str]]:
    """(pid, MOEPERF_ROUND) of every call since the last look; ``caches`` gets each call's MOEPERF_SERVE_CACHE."""
    path = pytester.path / "calls.txt"
    found = [line.split() for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    if caches is not None:
        caches += [f[2] for f in found]
    return [(f[0], f[1]) for f in found]


def runs(pytester: pytest.Pytester, name: str) -> int:
    (path,) = (pytester.path / "baselines").glob("*/test_on_starts.json")
    return len(json.loads(path.read_text())["metrics"][f"test_on_starts.py::{name}"]["runs"])


@pytest.fixture
def units(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_on_starts=TESTS)
    return pytester


def test_one_start_is_not_confirmed_by_windows_of_itself(units: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(3):
        assert run_moeperf("--moeperf-update", "--moeperf-starts", "1").ret == pytest.ExitCode.OK
    calls(units)
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.5")
    result = run_moeperf("--moeperf-starts", "1", "-k", "test_window")
    assert len(calls(units)) == 1, "a re-run on the same start is not another round"
    result.stdout.fnmatch_lines([
        "*test_on_starts.py::test_window::tpot_ms*+50.0 %*INCONCLUSIVE",
        "INCONCLUSIVE *tpot_ms: every round is worse than the threshold, but 1 round(s) against 3 stored runs cannot "
        "reach p < 0.05: 4 rounds can; 1 server start judged, 0 set aside — the confirmation budget (0 more "
        "round(s)) ended it, not the evidence: raise --moeperf-starts (each server start is one observation: a "
        "re-run in this process would measure the same server start again, not an independent round)"])
    assert result.ret == pytest.ExitCode.OK


def test_starts_run_in_child_sessions_and_an_update_stores_one_run_each(units: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                                        run_moeperf) -> None:
    result = run_moeperf("--moeperf-update", "--moeperf-starts", "3", "--moeperf-deadline", "600")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*1 test(s) measure a start: 3 start(s) of them*",
                                 "moeperf: round 1/3 (start 1) ...", "moeperf: round 3/3 (start 3) (* s): *1 passed*",
                                 "baselines updated: 2 metric(s)",
                                 "moeperf: 3 windows on up to 3 server starts a test; 0 set aside in whole or in part"])
    caches: list[str] = []
    seen = calls(units, caches)
    parent = [pid for pid, round_of in seen if round_of == "-"]
    starts = [(pid, round_of) for pid, round_of in seen if round_of != "-"]
    assert len(parent) == 1, "the ordinary test runs once, in the session itself"
    assert sorted(r for _, r in starts) == ["1/3", "2/3", "3/3"]
    assert len({pid for pid, _ in starts} | set(parent)) == 4, "each start is a process of its own"
    # no pytest cache (-p no:cacheprovider): the starts share one folder for their servers' models and compile caches
    assert len(set(caches) - {"-"}) == 1 and caches.count("-") == 1
    assert runs(units, "test_window::tpot_ms") == 3, "one stored run per start"
    assert runs(units, "test_kernel::time") == 1


def test_a_regression_needs_enough_starts_and_a_set_aside_start_is_counted(units: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_moeperf("--moeperf-update", "--moeperf-starts", "3").ret == pytest.ExitCode.OK
    calls(units)
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.5")
    monkeypatch.setenv("MOEPERF_TEST_ASIDE", "2/4")
    # 3 stored runs: the rank test needs 4 starts; start 2 of 4 is set aside, and no confirmation start follows
    short = run_moeperf("--moeperf-starts", "4", "-k", "test_window")
    assert short.ret == pytest.ExitCode.OK, short.stdout.str()
    assert len(calls(units)) == 4, "the starts asked for, no more"
    short.stdout.fnmatch_lines([
        "INCONCLUSIVE test_on_starts.py::test_window::tpot_ms: every round is worse than the threshold, but 3 round(s) "
        "against 3 stored runs cannot reach p < 0.05: 4 rounds can; 3 server starts judged, 1 set aside: start 2/4: "
        "window: the window drifted: TPOT 1.0 -> 1.3 ms — its 4 start(s) (--moeperf-starts) ended it, not the "
        "evidence: raise --moeperf-starts",
        "moeperf: 4 windows on up to 4 server starts a test; 1 set aside in whole or in part (drift 1)"])
    monkeypatch.setenv("MOEPERF_TEST_ASIDE", "2/5")
    result = run_moeperf("--moeperf-starts", "5", "-k", "test_window", "--moeperf-report", "report.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["test_on_starts.py::test_window::tpot_ms * +50.0 % * 4  REGRESSED"])
    assert len(calls(units)) == 5
    (record,) = json.loads((units.path / "report.json").read_text())["moeperf"]["records"]
    assert record["verdict"]["reason"].endswith("4 server starts judged, 1 set aside: start 2/5: window: the window "
                                                "drifted: TPOT 1.0 -> 1.3 ms")


def test_rounds_and_starts_combine_as_the_larger_for_tests_that_measure_a_start(  # type: ignore[no-untyped-def]
        units: pytest.Pytester, run_moeperf) -> None:
    result = run_moeperf("--moeperf-update", "--moeperf-rounds", "2", "--moeperf-starts", "3")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*1 test(s) measure a start (--moeperf-starts 3): 1 more round(s) of them*"])
    assert runs(units, "test_window::tpot_ms") == 3
    assert runs(units, "test_kernel::time") == 2


def test_the_deadline_counts_from_the_session_across_its_starts(units: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                                run_moeperf) -> None:
    # the session's own test uses up its 5 s; a child counting from its own start would still have them
    slow = TESTS.replace('perf.record("time"', 'import time; time.sleep(6)\n    perf.record("time"')
    Path(units.path / "test_on_starts.py").write_text(slow)
    run_moeperf("--moeperf-starts", "2", "--moeperf-deadline", "5", "--moeperf-report", "report.json")
    assert [r for _, r in calls(units)] == ["-"], "no start begins: the session's time is up"
    tests = json.loads((units.path / "report.json").read_text())["moeperf"]["tests"]
    assert "round 1/2 (start 1) not begun: --moeperf-deadline has passed" in tests["test_on_starts.py::test_window"]


def test_a_start_that_cannot_end_before_the_deadline_is_not_begun_and_the_starts_done_are_stored(  # type: ignore[no-untyped-def]
        units: pytest.Pytester, run_moeperf) -> None:
    """A batch interrupts its step at the deadline (plus its grace): a start cut there loses every start of the
    session (nothing written; on a 1x H200 a 324 s first start was lost so). A start that the previous one shows
    cannot end in what is left is not begun, and an update stores the starts done."""
    slow = TESTS.replace("    called()\n    aside", "    import time; time.sleep(8)\n    called()\n    aside")
    Path(units.path / "test_on_starts.py").write_text(slow)
    result = run_moeperf("--moeperf-update", "--moeperf-starts", "3", "--moeperf-deadline", "14",
                         "--moeperf-report", "report.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["moeperf: round 1/3 (start 1) (* s): *1 passed*",
                                 "moeperf: round 2/3 (start 2) not begun: * s of --moeperf-deadline left, and a round "
                                 "of these tests took * s",
                                 "baselines updated: 2 metric(s)*"])
    assert sorted(r for _, r in calls(units)) == ["-", "1/3"]
    assert runs(units, "test_window::tpot_ms") == 1, "the start done is stored"
    doc = json.loads((units.path / "report.json").read_text())["moeperf"]
    # start 1 measured the test: a start not begun leaves its verdicts on one start (said), not the test unmeasured
    # (on 1x H200 a batch of 2 warm starts of 3 read 'cut', its 23 tests "skipped by the deadline")
    assert doc["tests"]["test_on_starts.py::test_window"] == ""
    assert any("its verdicts rest on 1 round(s)" in w for w in doc["warnings"])


FAMILY = """
import os, pytest

@pytest.mark.start
@pytest.mark.parametrize("case", ["a", "b", "c", "new"])
def test_window(perf, case):
    if case == "new" and not os.environ.get("WITH_NEW"):
        pytest.skip("added later")
    scale = float(os.environ.get("MOEPERF_TEST_SCALE", "1.0")) if case == "new" else 1.0
    scale *= float(os.environ.get("MOEPERF_TEST_SCALE_ALL", "1.0"))
    perf.record("tpot_ms", [2.0 * scale, 2.01 * scale, 1.99 * scale], unit="ms")
"""


def test_one_start_against_a_family_spread_is_not_a_verdict(units: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A case with fewer than 3 stored runs is judged on its family's spread, learned from starts; one start beyond
    it is one observation of the start-to-start noise (+39 % between two starts on 1x H200): INCONCLUSIVE, raise
    --moeperf-starts; two starts that agree decide."""
    Path(units.path / "test_on_starts.py").write_text(FAMILY)
    assert run_moeperf("--moeperf-update", "--moeperf-starts", "3").ret == pytest.ExitCode.OK
    monkeypatch.setenv("WITH_NEW", "1")
    assert run_moeperf("--moeperf-update", "--moeperf-starts", "1", "-k", "new").ret == pytest.ExitCode.OK
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.5")
    one = run_moeperf("--moeperf-starts", "1", "-k", "new")
    assert one.ret == pytest.ExitCode.OK, one.stdout.str()
    one.stdout.fnmatch_lines(["*test_window?new?::tpot_ms*+50.0 %*(family)*INCONCLUSIVE",
                              "INCONCLUSIVE *test_window?new?::tpot_ms: one server start is worse than the threshold; "
                              "against fewer than 3 stored runs a second server start must agree*raise "
                              "--moeperf-starts*"])
    two = run_moeperf("--moeperf-starts", "2", "-k", "new")
    assert two.ret == pytest.ExitCode.TESTS_FAILED, two.stdout.str()
    two.stdout.fnmatch_lines(["*test_window?new?::tpot_ms*+50.0 %*(family)*2*REGRESSED"])


def test_one_start_decides_a_gross_change(units: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The x10 hole: one server start is one round, and a x10 regression on it read INCONCLUSIVE (few-rounds)
    against 3 stored runs and exited 0. x3 beyond every one of at least 3 stored runs of this host decides; against
    one stored run and its family's spread a second start must still agree."""
    Path(units.path / "test_on_starts.py").write_text(FAMILY)
    assert run_moeperf("--moeperf-update", "--moeperf-starts", "3").ret == pytest.ExitCode.OK
    monkeypatch.setenv("WITH_NEW", "1")
    assert run_moeperf("--moeperf-update", "--moeperf-starts", "1", "-k", "new").ret == pytest.ExitCode.OK
    monkeypatch.setenv("MOEPERF_TEST_SCALE_ALL", "10")
    one = run_moeperf("--moeperf-starts", "1")
    assert one.ret == pytest.ExitCode.TESTS_FAILED, one.stdout.str()
    one.stdout.fnmatch_lines(["*tpot_ms: baseline 2 ms (3 runs)*REGRESSED: 1 round(s) against 3 stored runs cannot "
                              "reach p < 0.05, but every round is 10.00x worse than every stored run: a gross "
                              "change*1 server start judged*"])
    one.stdout.fnmatch_lines(["INCONCLUSIVE *test_window?new?::tpot_ms: one server start is worse than the "
                              "threshold; against fewer than 3 stored runs a second server start must agree*"])
    monkeypatch.setenv("MOEPERF_TEST_SCALE_ALL", "2.5")  # within x3: one start is not a verdict
    assert run_moeperf("--moeperf-starts", "1").ret == pytest.ExitCode.OK


def test_a_start_s_changed_workload_fails_the_session_naming_it_and_an_update_re_records_it(  # type: ignore[no-untyped-def]
        units: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    # The start children judge without --moeperf-update (their parent writes): they leave a changed workload to
    # the parent, which names it and fails; under --moeperf-update it re-records the starts.
    workload = '    perf.context(workload=os.environ.get("WORKLOAD") or None)\n'
    units.makepyfile(test_on_starts=TESTS.replace('    perf.record("tpot_ms"', workload + '    perf.record("tpot_ms"'))
    assert run_moeperf("--moeperf-update", "--moeperf-starts", "2").ret == pytest.ExitCode.OK
    monkeypatch.setenv("WORKLOAD", "longer prompts")
    result = run_moeperf("--moeperf-starts", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*tpot_ms: workload changed: baseline None, now 'longer prompts'*"])
    assert run_moeperf("--moeperf-update", "--moeperf-starts", "2").ret == pytest.ExitCode.OK
    assert runs(units, "test_window::tpot_ms") == 2  # the re-record kept none of the old starts
