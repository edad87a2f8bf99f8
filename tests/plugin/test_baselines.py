"""The newcomer's workflow end to end, through real pytest sessions: NEW, update, PASS, REGRESSED, IMPROVED."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.reports.document import metric_entries

SYNTHETIC = """
import os

def test_decode_step(perf):
    scale = float(os.environ.get("MOEPERF_TEST_SCALE", "1.0"))
    base = [10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98]
    perf.context(model="tiny", batch=1)
    perf.record("latency", [x * scale for x in base], unit="ms", better="lower")
    perf.record("throughput", [100.0 / scale], unit="tok/s", better="higher")

def test_other(perf):
    perf.record("gemm_time", [5.0, 5.1, 4.9], unit="us")
"""


def baseline_file(pytester: pytest.Pytester) -> Path:
    files = list((pytester.path / "baselines").glob("*/test_synthetic.json"))
    assert len(files) == 1, files
    return files[0]


def test_new_update_pass_regress_improve(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_synthetic=SYNTHETIC)

    first = run_moeperf()
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["*3 new*", "*test_synthetic.py::test_decode_step::latency*ms*NEW*"])
    assert not (pytester.path / "baselines").exists(), "a plain run must not write baselines"

    update = run_moeperf("--moeperf-update")
    update.assert_outcomes(passed=2)
    update.stdout.fnmatch_lines(["baselines updated: 3 metric(s)", "wrote *test_synthetic.json"])
    stored = json.loads(baseline_file(pytester).read_text())
    assert stored["schema"] == 2
    latency = stored["metrics"]["test_synthetic.py::test_decode_step::latency"]
    assert latency["summary"]["median"] == pytest.approx(10.0)
    assert latency["summary"]["n"] == 7
    assert [run["median"] for run in latency["runs"]] == [pytest.approx(10.0)]
    assert latency["context"] == {"model": "tiny", "batch": 1}
    assert {"date", "git_commit", "software", "fingerprint_hash"} <= set(latency["provenance"])
    assert list(stored["metrics"]) == sorted(stored["metrics"]), "keys are sorted for diff-friendly files"

    same = run_moeperf()
    same.assert_outcomes(passed=2)
    same.stdout.fnmatch_lines(["*3 pass*"])

    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.2")
    slower = run_moeperf()
    slower.assert_outcomes(passed=1, failed=1)
    slower.stdout.fnmatch_lines([
        "*_ test_decode_step _*",
        "moeperf: 2 metric(s) regressed against baselines/*",
        # the history holds 3 accepted sessions of these metrics on this host by now (more than the baseline's 1
        # run): the spread is learned from them; they agree, so the quiet floor (3 %) is the mde; against 3 sessions
        # the rank test needs 4 rounds
        "*latency: baseline 10 ms (1 run) -> current 12 ms (n=28, 4 rounds), change +20.0 % ?lower is better; "
        "mde 3.0 %; spread 0.0 % from 3 history sessions; quiet: floor 3 %? -> REGRESSED: rank test p = 0.029",
        "*throughput: baseline 100 tok/s (1 run) -> current 83.33 tok/s (n=4, 4 rounds), change -16.7 %*higher is "
        "better*REGRESSED*",
    ])
    assert "FAILED test_synthetic.py::test_other" not in slower.stdout.str()

    monkeypatch.setenv("MOEPERF_TEST_SCALE", "0.8")
    faster = run_moeperf()
    faster.assert_outcomes(passed=2)
    faster.stdout.fnmatch_lines(["*2 improved*", "*refresh with --moeperf-update*"])


def test_update_touches_only_what_ran_and_only_this_fingerprint(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                                 run_moeperf,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_synthetic=SYNTHETIC)
    run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    path = baseline_file(pytester)
    other_fp = pytester.path / "baselines" / "2x-h200-nvlink" / "test_synthetic.json"
    other_fp.parent.mkdir()
    other_fp.write_text(path.read_text())
    other_before = other_fp.read_bytes()
    before = json.loads(path.read_text())["metrics"]

    monkeypatch.setenv("MOEPERF_TEST_SCALE", "2.0")
    run_moeperf("--moeperf-update", "-k", "test_decode_step").assert_outcomes(passed=1)
    after = json.loads(path.read_text())["metrics"]
    assert after["test_synthetic.py::test_other::gemm_time"] == before["test_synthetic.py::test_other::gemm_time"]
    assert after["test_synthetic.py::test_decode_step::latency"]["summary"]["median"] == pytest.approx(20.0)
    assert other_fp.read_bytes() == other_before
    assert not list(path.parent.glob(".*.tmp")), "no temporary file left behind"


def test_failed_test_metrics_are_not_written(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile("def test_t(perf):\n    perf.record('x', 1.0, unit='us')\n    assert False, 'broken'\n")
    result = run_moeperf("--moeperf-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["baselines not updated",
                                 "moeperf: 1 metric(s) not written to the baselines (test failed): *::test_t::x"])
    assert not list((pytester.path / "baselines").glob("*/*.json"))


@pytest.mark.parametrize(
    ("content", "message"),
    [("{ not json", "is not valid JSON"), ('{"schema": 99, "metrics": {}}', "has schema 99"),
     ('{"schema": 1, "metrics": {"k": {"summary": {}}}}', "is malformed")],
)
def test_corrupt_baseline_fails_the_test_naming_the_file_and_is_untouched(
        pytester: pytest.Pytester, run_moeperf, content: str, message: str) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_synthetic=SYNTHETIC)
    run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    path = baseline_file(pytester)
    path.write_text(content)

    result = run_moeperf()
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "moeperf: baseline unusable" in out and str(path) in out and message in out, out

    update = run_moeperf("--moeperf-update")
    assert update.ret != 0
    assert "baseline unusable" in update.stdout.str() and str(path) in update.stdout.str()
    assert path.read_text() == content


def test_threshold_precedence_marker_cli_ini(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_thr="""
        import os, pytest
        S = float(os.environ.get("MOEPERF_TEST_SCALE", "1.0"))

        def test_default(perf):
            perf.record("t", [10 * S] * 5, unit="us")

        @pytest.mark.moeperf_threshold(tolerance=0.5)
        def test_marker(perf):
            perf.record("t", [10 * S] * 5, unit="us")

        def test_record_arg(perf):
            perf.record("t", [10 * S] * 5, unit="us", tolerance=0.5)
    """)
    for _ in range(3):  # three stored runs: a baseline decides nothing before it knows its noise
        run_moeperf("--moeperf-update").assert_outcomes(passed=3)
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.3")
    run_moeperf().assert_outcomes(passed=2, failed=1)
    run_moeperf("--moeperf-tolerance", "0.4").assert_outcomes(passed=3)
    pytester.makeini("[pytest]\nmoeperf_tolerance = 0.4\n")
    run_moeperf().assert_outcomes(passed=3)
    pytester.makeini("[pytest]\nmoeperf_tolerance = lots\n")
    bad = run_moeperf()
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*ini option moeperf_tolerance: expected a number, got 'lots'*"])
    assert run_moeperf("--moeperf-tolerance", "-1").ret == pytest.ExitCode.USAGE_ERROR


def test_reports_json_in_benchmark_schema_and_markdown(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_synthetic=SYNTHETIC)
    run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    result = run_moeperf("--moeperf-report", "out/report.json", "--moeperf-markdown", "out/summary.md")
    result.assert_outcomes(passed=2)
    doc = json.loads((pytester.path / "out" / "report.json").read_text())
    assert {"machine_info", "commit_info", "benchmarks", "datetime", "version"} <= set(doc)
    assert doc["machine_info"]["moeperf"]["fingerprint"].startswith("cpu-")
    by_name = {b["fullname"]: b for b in doc["benchmarks"]}
    lat = by_name["test_synthetic.py::test_decode_step::latency"]
    # a time: stats in seconds, as pytest-benchmark reads them; the metric's own unit and numbers in extra_info
    assert lat["stats"]["median"] == pytest.approx(0.010) and lat["stats"]["rounds"] == 7
    assert {"min", "max", "mean", "stddev", "iqr", "q1", "q3", "ops", "data"} <= set(lat["stats"])
    assert lat["extra_info"]["verdict"] == "PASS" and lat["extra_info"]["unit"] == "ms"
    assert lat["extra_info"]["metric_stats"]["median"] == pytest.approx(10.0)
    # not a time: kept out of pytest-benchmark's list, in its own unit
    assert "test_synthetic.py::test_decode_step::throughput" not in by_name
    (throughput,) = doc["moeperf"]["non_time_benchmarks"]
    assert throughput["stats"]["median"] == pytest.approx(100.0) and throughput["extra_info"]["unit"] == "tok/s"
    assert lat["params"] == {"model": "tiny", "batch": 1}
    md = (pytester.path / "out" / "summary.md").read_text()
    assert md.startswith("## moeperf: cpu-")
    row = "| `test_synthetic.py::test_decode_step::latency` | ms | 10 | 10 | +0.0 % | 5.0 % (no spread) | 1 | ✅ PASS |"
    assert row in md


def test_results_from_xdist_workers_are_merged(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("xdist")
    pytester.makepyfile(test_synthetic=SYNTHETIC)
    result = run_moeperf("-n", "2", "--moeperf-update", "--moeperf-report", "r.json")
    result.assert_outcomes(passed=2)
    doc = json.loads((pytester.path / "r.json").read_text())
    assert len(metric_entries(doc)) == 3
    assert len(json.loads(baseline_file(pytester).read_text())["metrics"]) == 3


def test_regression_message_names_the_software_that_changed(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_synthetic=SYNTHETIC)
    for _ in range(3):
        run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    path = baseline_file(pytester)
    doc = json.loads(path.read_text())
    for metric in doc["metrics"].values():
        metric["provenance"]["software"]["nccl"] = "2.21.5"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.5")
    result = run_moeperf()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*software changed since the baseline: nccl 2.21.5 -> -*"])


HUGE = """
def test_huge(perf):
    perf.record("big", [1e308, 1e308, 1.5e308], unit="us")  # the sum overflows; the mean and the spread do not
    perf.record("ok", [1.0, 1.1, 0.9], unit="us")

def test_unusable(perf):
    perf.record("wild", [-1.7e308, 1.7e308], unit="us")  # its standard deviation is beyond the largest float
    perf.record("kept", [3.0, 3.1, 2.9], unit="us")

def test_other(perf):
    perf.record("fine", [2.0, 2.1, 1.9], unit="us")
"""


def test_huge_samples_never_block_the_update_of_other_metrics(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    """``[1e308, 1e308]`` overflowed the mean, the baseline writer refused the non-finite summary and no metric of the
    session was written (issue 22, item 9). A summary of finite samples is finite; a metric whose spread really is
    beyond floating point is refused alone, INCONCLUSIVE with a reason that names it."""
    pytester.makepyfile(test_huge=HUGE)
    result = run_moeperf("--moeperf-update", "-rs")
    result.assert_outcomes(passed=3)
    assert "baselines not updated" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*INCONCLUSIVE*test_unusable::wild: *'wild'*stddev*beyond the largest float*"])
    stored = json.loads(next((pytester.path / "baselines").glob("*/test_huge.json")).read_text())["metrics"]
    assert sorted(stored) == ["test_huge.py::test_huge::big", "test_huge.py::test_huge::ok",
                              "test_huge.py::test_other::fine", "test_huge.py::test_unusable::kept"]
    big = stored["test_huge.py::test_huge::big"]["summary"]
    assert big["median"] == 1e308 and big["mean"] == pytest.approx(1.1666666e308, rel=1e-5) and big["stddev"] > 0
