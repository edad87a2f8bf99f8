"""Machine shift: a whole family of metrics that moved together is reported, with its relative outliers, and no
verdict changes. Pure units, then a real pytest session against baselines it recorded itself."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_moeperf.judging.shift import family_views, in_moved_families, shift_notes, shift_sections, sign_test_p
from pytest_moeperf.judging.stats import summarize
from pytest_moeperf.judging.verdict import Cause, Status, Verdict


def _verdict(case: str, change: float, *, name: str = "time", better: str = "lower", allowed: float = 0.05,
             status: Status = Status.PASS, family: str = "suites/gemm/test_gemm.py") -> Verdict:
    return Verdict(f"{family}::test_gemm[{case}]::{name}", name, "us", better, status, summarize([1.0 + change]),
                   (1.0 + change,), reference=1.0, runs=10, change=change, mde=allowed)


def test_sign_test_is_the_exact_binomial() -> None:
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(8, 0) == pytest.approx(2 / 256)
    assert sign_test_p(5, 5) == 1.0
    assert sign_test_p(9, 1) == pytest.approx(2 * 11 / 1024)


def _moved(verdicts: list[Verdict], stored: dict | None = None) -> list:  # type: ignore[type-arg]
    return [f for f in family_views(verdicts, stored) if f.moved]


def test_a_sub_family_of_eight_that_moved_is_a_moved_family_where_its_whole_family_is_not() -> None:
    bf16 = [_verdict(f"b{i}", 0.12, status=Status.REGRESSED if i == 0 else Status.PASS) for i in range(8)]
    int4 = [_verdict(f"i{i}", 0.01 * (-1) ** i) for i in range(8)]
    subfamilies = {v.key: "dtype=bf16" for v in bf16} | {v.key: "dtype=int4" for v in int4}
    views = family_views([*bf16, *int4], None, subfamilies)
    assert [(f.subfamily, f.cases, f.moved) for f in views] == [("", 16, False), ("dtype=bf16", 8, True),
                                                                  ("dtype=int4", 8, False)]
    (changed,) = in_moved_families({v.key: v for v in [*bf16, *int4]}, views, subfamilies=subfamilies).values()
    assert changed.key == bf16[0].key and "family time [dtype=bf16] moved +12.0 % (8 of 8 cases)" in changed.reason
    assert "likely the machine" in changed.reason and changed.status is Status.REGRESSED
    (section,) = shift_sections(views)
    assert section.rows[0][0] == "suites/gemm/test_gemm.py [dtype=bf16]"
    # seven cases one way cannot reach p < 0.01; a sub-family that is its whole family is no second view
    assert [f.subfamily for f in family_views(bf16[:7] + int4, None, subfamilies)] == ["", "dtype=int4"]
    assert [f.subfamily for f in family_views(bf16, None, subfamilies)] == [""]


def test_a_family_that_moved_together_is_found_with_its_relative_outlier() -> None:
    moved = [_verdict(f"c{i}", -0.20 + 0.01 * (i % 3)) for i in range(9)]
    odd = _verdict("odd", -0.02)  # inside its 5 % in absolute terms, +22 % against the family's -20 %
    quiet = [_verdict(f"q{i}", 0.02 * (-1) ** i, name="tflops", better="higher") for i in range(10)]
    views = family_views([*moved, odd, *quiet])
    assert [(f.name, f.moved) for f in views] == [("tflops", False), ("time", True)]
    (shift,) = [f for f in views if f.moved]
    assert (shift.family, shift.name, shift.cases, shift.same_direction) == ("suites/gemm/test_gemm.py", "time", 10, 10)
    assert shift.word == "better" and shift.median_change == pytest.approx(-0.19)
    assert shift.median_relative is None  # no stored runs: the absolute thresholds judge the relative change
    assert [o.key.split("[")[1].split("]")[0] for o in shift.outliers] == ["odd"]
    (section,) = shift_sections(views)
    assert section.title.startswith("Machine shift")
    assert section.rows[0][:4] == ("suites/gemm/test_gemm.py", "time", "10 of 10 better", "-19.0 %")
    assert "test_gemm[odd] +21.0 % (relative threshold 5.0 %)" in section.note
    (line,) = shift_notes(views)
    assert "1 metric family moved together (test_gemm.py time -19.0 % (10 of 10))" in line
    assert "1 relative outlier(s)" in line


def test_a_gross_change_in_a_moved_family_stays_decided_unless_the_code_is_the_runs_own() -> None:
    """A x10 regression of every case against this host's runs of another commit is the code: it stays REGRESSED.
    Against runs of this very code, whatever moved the whole family is the machine, a gross move too."""
    gross = [dataclasses.replace(_verdict(f"c{i}", 9.0, status=Status.REGRESSED), cause=Cause.GROSS)
             for i in range(9)]
    views = family_views(gross)
    other_code = in_moved_families({v.key: v for v in gross}, views)
    assert {(v.status, v.cause) for v in other_code.values()} == {(Status.REGRESSED, Cause.GROSS)}
    same = in_moved_families({v.key: v for v in gross}, views, same={v.key for v in gross})
    assert {(v.status, v.cause) for v in same.values()} == {(Status.INCONCLUSIVE, Cause.MACHINE)}


def test_relative_thresholds_come_from_stored_runs_with_each_runs_family_move_divided_out() -> None:
    # 12 cases, 6 stored runs in 2 updates; each run moves the whole family (0.8 .. 1.2) and each case by +-1 %
    moves = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0]
    stored = {f"suites/gemm/test_gemm.py::test_gemm[c{i}]::time": [
        ("d1" if r < 3 else "d2", 100.0 * move * (1.0 + 0.01 * ((i + r) % 3 - 1))) for r, move in enumerate(moves)]
        for i in range(12)}
    # the absolute threshold learned from such runs is wide (the family moves): say 40 %
    family = [_verdict(f"c{i}", -0.15, allowed=0.40) for i in range(11)]
    against = _verdict("c11", +0.05, allowed=0.40)  # +5 %: PASS in absolute terms, +23.5 % against the family
    (view,) = family_views([*family, against], stored)
    assert view.moved and view.median_relative is not None and view.median_relative < 0.10  # the cases' own noise
    (outlier,) = view.outliers
    assert outlier.key.endswith("[c11]::time") and outlier.relative == pytest.approx(1.05 / 0.85 - 1, abs=0.01)
    # without the stored runs the same case hides inside the 40 % absolute threshold
    assert [f.outliers for f in family_views([*family, against])] == [()]


def test_too_few_cases_a_small_move_or_mixed_directions_are_no_shift() -> None:
    assert family_views([_verdict(f"c{i}", -0.3) for i in range(7)]) == []  # fewer than 8 cases
    assert _moved([_verdict(f"c{i}", -0.04) for i in range(20)]) == []  # below the 5 % minimum
    assert _moved([_verdict(f"c{i}", 0.3 * (-1) ** i) for i in range(20)]) == []
    regressed = [_verdict(f"c{i}", 0.2) for i in range(9)] + [_verdict("bad", 0.9, status=Status.REGRESSED)]
    (shift,) = _moved(regressed)
    assert shift.word == "worse" and shift.outliers == ()  # a REGRESSED case is already a verdict
    assert shift_sections([]) == [] and shift_notes([]) == []


CASES = """
import os, pytest

@pytest.mark.parametrize("case", range(10))
def test_kernel(perf, case):
    scale = float(os.environ.get("SCALE", "1"))
    if case == 9:
        scale = float(os.environ.get("SCALE_9", scale))
    perf.record("time", [s * scale for s in (100.0, 100.5, 99.5, 100.2, 99.8)], unit="us")
"""


def test_a_session_on_a_faster_machine_reports_the_shift_and_keeps_its_verdicts(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_cases=CASES)
    for _ in range(3):  # three stored runs: a baseline that knows its noise
        run_moeperf("--moeperf-update", "--moeperf-health", "off").assert_outcomes(passed=10)
    monkeypatch.setenv("SCALE", "0.8")  # every case 20 % faster: the machine, not the code
    monkeypatch.setenv("SCALE_9", "0.97")  # one case only 3 % faster: inside its threshold, +21 % relative
    report = pytester.path / "report.json"
    result = run_moeperf(f"--moeperf-report={report}", "--moeperf-health", "off")  # the box may be busy
    result.assert_outcomes(passed=10)
    result.stdout.fnmatch_lines([
        "*test_cases.py::test_kernel?9?::time*PASS",
        "Machine shift: whole families moved together",
        "*test_cases.py*time*10 of 10 better*-20.0 %*",
        "*Relative outliers: test_cases.py time: test_kernel?9? +21.2 % (relative threshold 5.0 %)*",
        "moeperf: machine shift: 1 metric family moved together (test_cases.py time -20.0 % (10 of 10)); 9 IMPROVED "
        "and 0 REGRESSED verdicts are in them: look at the machine before re-recording or bisecting; 1 relative "
        "outlier(s); see*",
    ])
    doc = json.loads(report.read_text())
    (section,) = [s for s in doc["moeperf"]["sections"] if s["title"].startswith("Machine shift")]
    assert section["rows"][0][2] == "10 of 10 better"
    verdicts = {r["verdict"]["key"].split("::")[1]: r["verdict"] for r in doc["moeperf"]["records"]}
    assert verdicts["test_kernel[9]"]["status"] == "PASS" and verdicts["test_kernel[0]"]["status"] == "IMPROVED"
    assert "family time moved -20.0 % (10 of 10 cases): likely the machine" in verdicts["test_kernel[0]"]["reason"]


def _git(pytester: pytest.Pytester, *args: str) -> None:
    import subprocess
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=pytester.path, check=True,
                   capture_output=True)


def test_a_family_that_moved_as_a_whole_on_the_code_of_every_stored_run_is_the_machine(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30 item 15: a same-box A/A flagged a case REGRESSED while its whole family moved +8.8 %: the machine,
    since nothing else changed. On the code, software and environment of every stored run a moved family's verdicts
    are INCONCLUSIVE (machine): the code is the checkout's files on disk less the baselines (so the commit that
    stores them, or a tree dirty with them, is still that code) and what --moeperf-code-exclude names; with another
    file changed, or another environment, they stand."""
    pytester.makepyfile(test_cases=CASES)
    _git(pytester, "init", "-q")
    _git(pytester, "add", "test_cases.py")
    _git(pytester, "commit", "-q", "-m", "cases")
    for _ in range(3):
        run_moeperf("--moeperf-update", "--moeperf-health", "off").assert_outcomes(passed=10)
    _git(pytester, "add", "baselines")  # the update workflow commits its baselines: a new commit, the same code
    _git(pytester, "commit", "-q", "-m", "baselines")
    monkeypatch.setenv("SCALE", "1.2")  # every case 20 % slower: what the VM did, code unchanged
    same = run_moeperf("--moeperf-health", "off", "--moeperf-history", "off")
    assert same.ret == pytest.ExitCode.OK, same.stdout.str()
    same.stdout.fnmatch_lines(["INCONCLUSIVE test_cases.py::test_kernel?0?::time:*family time moved +20.0 % (10 of 10 "
                               "cases), and every stored run is of this run's code, software and environment: the "
                               "machine moved, not the code*"])
    monkeypatch.setenv("SCALE", "1.0")
    monkeypatch.setenv("SCALE_9", "1.5")  # one case alone, same code: no family moved, its REGRESSED fails the session
    alone = run_moeperf("--moeperf-health", "off", "--moeperf-history", "off")
    assert alone.ret == pytest.ExitCode.TESTS_FAILED, alone.stdout.str()
    alone.stdout.fnmatch_lines(["*test_kernel?9?::time*+50.0 %*REGRESSED*"])
    monkeypatch.delenv("SCALE_9")
    monkeypatch.setenv("SCALE", "1.2")
    pytester.makefile(".txt", notes="a change")
    _git(pytester, "add", "notes.txt")  # staged, not committed: part of the code on disk
    other = run_moeperf("--moeperf-health", "off", "--moeperf-history", "off")
    assert other.ret == pytest.ExitCode.TESTS_FAILED, other.stdout.str()
    other.stdout.fnmatch_lines(["moeperf: machine shift: 1 metric family moved together (test_cases.py time +20.0 % "
                                "(10 of 10)); 0 IMPROVED and 10 REGRESSED verdicts are in them*"])
    # a path declared not code (docs, notes): the runs' code again, committed or not
    excluded = run_moeperf("--moeperf-health", "off", "--moeperf-history", "off", "--moeperf-code-exclude", "*.txt")
    assert excluded.ret == pytest.ExitCode.OK, excluded.stdout.str()
    _git(pytester, "commit", "-q", "-m", "notes")
    pytester.makeini("[pytest]\nmoeperf_code_exclude = notes.txt\n    docs\n")
    assert run_moeperf("--moeperf-health", "off", "--moeperf-history", "off").ret == pytest.ExitCode.OK
    monkeypatch.setenv("MOEPERF_INJECT", "anything")  # another environment, the runs' code: not the same code
    assert run_moeperf("--moeperf-health", "off", "--moeperf-history", "off").ret == pytest.ExitCode.TESTS_FAILED
