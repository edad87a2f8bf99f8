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


@pytest.mark.parametrize(("args", "message"), [
    (("--moeperf-tolerance", "2"), "argument --moeperf-tolerance: a fraction in [[]0, 1) such as 0.05 is expected: 2 "
                                   "means 200 %; for 2 % give 0.02 (or 2%)"),
    (("--moeperf-tolerance", "1"), "argument --moeperf-tolerance: *1 means 100 %; for 1 % give 0.01 (or 1%)"),
    (("--moeperf-tolerance", "150%"), "argument --moeperf-tolerance: a percentage below 100 % is expected, got 150%"),
    (("--moeperf-tolerance", "true"), "argument --moeperf-tolerance: expected a number, got 'true'"),
    (("--moeperf-quiet-floor", "3"), "argument --moeperf-quiet-floor: *3 means 300 %; for 3 % give 0.03 (or 3%)"),
    (("--moeperf-quiet-floor", "nan"), "argument --moeperf-quiet-floor: must be a finite number >= 0, got nan"),
])
def test_item5_a_tolerance_of_one_or_more_is_refused_suggesting_the_fraction(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, args: tuple[str, str], message: str) -> None:
    """``--moeperf-tolerance 2`` (meant: 2 %) was 200 %: a -99 % busbw read PASS."""
    pytester.makepyfile(test_h=LAT)
    result = run_moeperf(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])
    pytester.makeini(f"[pytest]\nmoeperf_{args[0][10:].replace('-', '_')} = {args[1]}\n")
    ini = run_moeperf()
    assert ini.ret == pytest.ExitCode.USAGE_ERROR
    ini.stderr.fnmatch_lines([f"*ini option moeperf_{args[0][10:].replace('-', '_')}: "
                              f"{message.split(': ', 1)[1]}*"])


def test_item5_a_percent_form_is_the_fraction(pytester: pytest.Pytester) -> None:
    from pytest_moeperf.settings import resolve

    assert resolve(pytester.parseconfig("--moeperf-tolerance", "2%")).tolerance == pytest.approx(0.02)
    assert resolve(pytester.parseconfig("--moeperf-tolerance", "0.02")).tolerance == pytest.approx(0.02)
    assert resolve(pytester.parseconfig("--moeperf-quiet-floor", "2.5 %")).quiet_floor == pytest.approx(0.025)


@pytest.mark.parametrize(("where", "code", "message"), [
    ("marker", "@pytest.mark.moeperf_threshold(tolerance=True)",
     "bad marker: moeperf_threshold: tolerance must be a number, got True"),
    ("marker", "@pytest.mark.moeperf_threshold(2)",
     "bad marker: moeperf_threshold: tolerance: a fraction in [[]0, 1) such as 0.05 is expected: 2 means 200 %"),
    ("marker", "@pytest.mark.moeperf_threshold(noise_k=False)",
     "bad marker: moeperf_threshold: noise_k must be a number, got False"),
    ("marker", "@pytest.mark.moeperf_threshold(abs_tolerance=True)",
     "bad marker: moeperf_threshold: abs_tolerance must be a number, got True"),
    ("record", "tolerance=True", "perf.record: metric 't': tolerance must be a number, got True"),
    ("record", "tolerance=2", "perf.record: metric 't': tolerance: a fraction in [[]0, 1) such as 0.05 is expected: "
                              "2 means 200 %; for 2 % give 0.02"),
    ("record", "abs_tolerance=True", "perf.record: metric 't': abs_tolerance must be a number, got True"),
    ("record", "tolerance='0.05'", "perf.record: metric 't': tolerance must be a number, got '0.05'"),
])
def test_item5_bools_and_tolerances_of_one_or_more_fail_that_test(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, where: str, code: str, message: str) -> None:
    """``tolerance=True`` in the marker read as 100 %."""
    marker, arg = (code, "") if where == "marker" else ("", ", " + code)
    pytester.makepyfile(test_h=f"""
        import pytest

        {marker}
        def test_bad(perf):
            perf.record("t", [1.0] * 5, unit="us"{arg})

        def test_fine(perf):
            perf.record("t", [1.0] * 5, unit="us")
    """)
    result = run_moeperf()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, **({"errors": 1} if where == "marker" else {"failed": 1}))
    result.stdout.fnmatch_lines([f"*{message}*"])


NOISE_RUNS = ("must be at least 3, got {k}: a baseline learns its between-run noise from 3 or more runs of a host, "
              "and with fewer kept it can never fail anything")


@pytest.mark.parametrize("k", ["1", "2"])
def test_item6_fewer_noise_runs_than_the_judge_needs_are_refused(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, capsys: pytest.CaptureFixture[str], k: str) -> None:
    """``--moeperf-noise-runs 2`` kept 2 runs a host: every verdict said 'record at least 3' and none could fail."""
    from pytest_moeperf.cli import main

    pytester.makepyfile(test_h=LAT)
    result = run_moeperf("--moeperf-noise-runs", k)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*argument --moeperf-noise-runs: {NOISE_RUNS.format(k=k)}*"])
    pytester.makeini(f"[pytest]\nmoeperf_noise_runs = {k}\n")
    ini = run_moeperf()
    assert ini.ret == pytest.ExitCode.USAGE_ERROR
    ini.stderr.fnmatch_lines([f"*ini option moeperf_noise_runs: {NOISE_RUNS.format(k=k)}*"])
    with pytest.raises(SystemExit) as exited:
        main(["baselines", "merge", str(pytester.path), "--keep", k])
    assert exited.value.code == 2
    assert f"argument --keep: {NOISE_RUNS.format(k=k)}" in capsys.readouterr().err


BAD_CALLS = {  # perf.record's arguments -> what the failing test says
    '"123", unit="us"': "samples must be a number or a sequence of numbers, got a str: '123'",
    'True, unit="us"': "samples must be a number or a sequence of numbers, got a bool: True",
    '[1.0, True], unit="us"': "sample 2 must be a number, got True",
    '[1.0, "2"], unit="us"': "sample 2 must be a number, got '2'",
    '[1.0, None], unit="us"': "sample 2 must be a number, got None",
    '{"a": 1.0}, unit="us"': "samples must be a number or a sequence of numbers, got a dict",
    "1.0, unit=None": "unit must be a non-empty str such as 'us', got None",
    '1.0, unit=""': "unit must be a non-empty str such as 'us', got ''",
    '1.0, unit="us", better=None': "better must be 'lower' or 'higher', got None",
    '1.0, unit="us", better="faster"': "better must be 'lower' or 'higher', got 'faster'",
    '1.0, unit="us", context={"shape": [1, 2]}': "context 'shape' must be a str, number, bool or None, got list",
}


def test_item10_bad_samples_unit_and_direction_fail_that_test(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                              run_moeperf) -> None:
    """``perf.record("x", "123", unit="us")`` stored samples 1, 2, 3; ``unit=None`` stored 'None' and failed every
    later run with "baseline 'None', now None"."""
    tests = [f"def test_bad{i}(perf):\n    perf.record('x', {call})\n" for i, call in enumerate(BAD_CALLS)]
    pytester.makepyfile(test_h="\n".join(tests) + "\ndef test_fine(perf):\n    perf.record('x', 1.0, unit='us')\n")
    result = run_moeperf("--moeperf-update")
    result.assert_outcomes(passed=1, failed=len(BAD_CALLS))
    out = result.stdout.str()
    for i, message in enumerate(BAD_CALLS.values()):
        assert f"perf.record: metric 'x': {message}" in out, (i, message)
    stored = json.loads(_baseline(pytester).read_text())["metrics"]
    assert list(stored) == ["test_h.py::test_fine::x"]


def _moeperf(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``moeperf ARGS`` in-process: exit status (argparse's SystemExit included), stdout, stderr."""
    from pytest_moeperf.cli import main

    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_item11_a_budget_with_no_measured_term_is_an_error(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                           run_moeperf, capsys: pytest.CaptureFixture[str]) -> None:
    """``moeperf budget`` with no source printed a table of dashes and 'Modelled step time: 0 us', exit 0."""
    rc, out, err = _moeperf(capsys, "budget")
    assert rc == 2 and "Modelled" not in out
    assert "moeperf budget: error: give the measured numbers: --from-report PATH (a run's --moeperf-report) or " \
           "--baselines DIR --fingerprint SLUG" in err, err
    rc, out, err = _moeperf(capsys, "budget", "--allreduce-us", "10", "--topology", "2x-h200-nvlink")
    assert rc == 2 and "give the measured numbers" in err and "Modelled" not in out

    pytester.makepyfile(test_h=LAT)  # a report and baselines that hold no GEMM or all-reduce of the model
    run_moeperf("--moeperf-update", "--moeperf-report", "r.json").assert_outcomes(passed=2)
    slug = _baseline(pytester).parent.name
    for source in (["--from-report", str(pytester.path / "r.json")],
                   ["--baselines", str(pytester.path / "baselines"), "--fingerprint", slug]):
        for extra in ((), ("--allreduce-us", "10", "--topology", "2x-h200-nvlink")):
            rc, out, err = _moeperf(capsys, "budget", *source, *extra)
            assert rc == 2 and "Modelled" not in out, (source, extra, out)
            where = f"report {pytester.path / 'r.json'}" if source[0] == "--from-report" else f"baselines {slug}"
            assert f"moeperf budget: {where} holds no measured GEMM (metric 'time', us) or all-reduce (metric " \
                   f"'latency_<mode>', us) of kimi-k2.5 at TP {2 if extra else 8}: nothing to model" in err, err


UNITS = """
def test_lat(perf):
    perf.record("latency", [100.0, 100.5, 101.0], unit="us")
    perf.record("busbw", [300.0, 301.0], unit="GB/s", better="higher")
    perf.record("share", [12.5], unit="%")
"""


def test_item13_pytest_benchmark_compare_shows_times_in_seconds_and_no_other_unit_as_one(
        pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    """A 100 us latency showed as '100.02 s' in ``pytest-benchmark compare``, and 300 GB/s as 300 s."""
    import subprocess
    import sys

    from pytest_moeperf.history.records import records_from_report
    from pytest_moeperf.reports.document import benchmark_metrics

    pytester.makepyfile(test_u=UNITS)
    for name in ("a.json", "b.json"):
        run_moeperf("--moeperf-report", name, "--moeperf-history", "off").assert_outcomes(passed=1)
    shown = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", "a.json", "b.json"],
                           cwd=pytester.path, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "Name (time in us)" in shown and "test_lat::latency (a)" in shown and "100.5000" in shown, shown
    assert "busbw" not in shown and "share" not in shown, shown

    doc = json.loads((pytester.path / "a.json").read_text())
    (latency,) = doc["benchmarks"]
    assert latency["stats"]["median"] == pytest.approx(100.5e-6) and latency["extra_info"]["unit"] == "us"
    expected = {"latency": ("us", 100.5, 0.5), "busbw": ("GB/s", 300.5, 0.5), "share": ("%", 12.5, 0.0)}
    assert {m: (u, median) for _, m, u, _, median in benchmark_metrics(doc)} == {
        m: (u, median) for m, (u, median, _) in expected.items()}  # exactly: as measured, no unit round trip
    _, history = records_from_report(doc)
    assert {r.name: (r.unit, r.median, r.iqr) for r in history} == expected

    # a report written before (no report_schema): every metric in benchmarks, stats in its own unit
    old = json.loads(json.dumps(doc))
    old["benchmarks"] = [{**b, "stats": {**b["extra_info"].pop("metric_stats"), "rounds": b["stats"]["rounds"]}}
                         for b in old["benchmarks"]] + old["moeperf"]["non_time_benchmarks"]
    del old["moeperf"]["report_schema"], old["moeperf"]["non_time_benchmarks"]
    assert benchmark_metrics(old) == benchmark_metrics(doc)
    assert records_from_report(old)[1] == history
