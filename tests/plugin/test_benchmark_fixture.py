"""pytest-benchmark's ``benchmark`` fixture adopted into the ledger, through real pytest sessions: its results are
metrics (unit, group, params and extra_info mapped), judged, confirmed and stored like ``perf.record`` ones; the
switch; ``--benchmark-disable`` and xdist say that they measured nothing; ``--moeperf-rounds`` repeats them; and
pytest-benchmark's own options keep working beside it.

The benchmarks time a clock of their own (pytest-benchmark's ``timer`` marker option): every reading is 2 ms (times
``MOEPERF_TEST_SCALE``) after the last, so each round of pedantic mode takes exactly that, whatever the box does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_moeperf.judging import stats

pytest.importorskip("pytest_benchmark")

BENCH = """
import itertools
import os

import pytest

SCALE = float(os.environ.get("MOEPERF_TEST_SCALE", "1"))


class Clock:
    def __init__(self):
        self.ticks = itertools.count()

    def __call__(self):
        return next(self.ticks) * 0.002 * SCALE


def work(n):
    return sum(range(n))


@pytest.mark.benchmark(timer=Clock(), group="sums")
@pytest.mark.parametrize("n", [10, 1000])
def test_sum(benchmark, n):
    benchmark.extra_info.update(items=n, shape=[n, 1], note="plain")
    assert benchmark.pedantic(work, args=(n,), rounds=7, iterations=1) == sum(range(n))


@pytest.mark.benchmark(timer=Clock())
def test_halved(benchmark):
    benchmark.pedantic(work, args=(5,), rounds=4, iterations=2)


def test_plain():
    assert work(3) == 3
"""

KEYS = ["test_bench.py::test_halved::time", "test_bench.py::test_sum[1000]::time", "test_bench.py::test_sum[10]::time"]


def stored(pytester: pytest.Pytester) -> dict[str, Any]:
    files = list((pytester.path / "baselines").glob("*/test_bench.json"))
    assert len(files) == 1, files
    metrics: dict[str, Any] = json.loads(files[0].read_text())["metrics"]
    return metrics


def no_baselines(pytester: pytest.Pytester) -> bool:
    return not list((pytester.path / "baselines").glob("*/*.json"))


def test_every_benchmark_is_a_metric_in_the_unit_asked_for(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    """Before: pytest-benchmark's results never reached the ledger, and an update stored nothing."""
    pytester.makepyfile(test_bench=BENCH)
    update = run_moeperf("--moeperf-update", "--moeperf-benchmark", "ms", "--moeperf-report", "r.json",
                         "--moeperf-health", "on")
    update.assert_outcomes(passed=4)
    update.stdout.fnmatch_lines(["baselines updated: 3 metric(s)"])
    metrics = stored(pytester)
    assert sorted(metrics) == KEYS
    summed = metrics["test_bench.py::test_sum[10]::time"]
    assert summed["unit"] == "ms" and summed["better"] == "lower"
    assert summed["summary"]["median"] == pytest.approx(2.0) and summed["summary"]["n"] == 7
    # the group and the params beside the key's node id, extra_info as given (a list as its JSON text)
    assert summed["context"] == {"group": "sums", "n": 10, "items": 10, "shape": "[10, 1]", "note": "plain",
                                 "benchmark_rounds": 7, "benchmark_iterations": 1}
    halved = metrics["test_bench.py::test_halved::time"]  # 2 iterations a round: pytest-benchmark's time per call
    assert halved["summary"]["median"] == pytest.approx(1.0) and halved["context"]["benchmark_iterations"] == 2
    assert "group" not in halved["context"]
    doc = json.loads((pytester.path / "r.json").read_text())
    (record,) = [r for r in doc["moeperf"]["records"] if r["metric"]["name"] == "time"
                 and r["metric"]["test_id"].endswith("test_sum[1000]")]
    assert record["rounds"][0]["samples"] == [pytest.approx(2.0)] * 7
    assert "health_window_s" in record["rounds"][0]["health"]["facts"], "the health gate watches the call"

    default = run_moeperf()  # unset: seconds; a changed unit fails its test, naming both
    default.assert_outcomes(passed=1, failed=3)
    default.stdout.fnmatch_lines(["*unit or direction changed: baseline 'ms'*now 's'*"])


def test_a_slower_benchmark_is_confirmed_regressed_and_fails_its_test(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      spread_sittings) -> None:
    """The verdict needs 3 rounds against the 4 sessions of the history (3 updates and a judged run): the test is
    re-run in the process (pytest-benchmark's fixture used again: without setting it back the re-run raises
    FixtureAlreadyUsed), and pytest-benchmark's own results keep one entry per test. Threshold markers apply."""
    pytester.makepyfile(test_bench=BENCH)
    for _ in range(3):
        run_moeperf("--moeperf-update").assert_outcomes(passed=4)
    spread_sittings(next((pytester.path / "baselines").glob("*/test_bench.json")), 2.0)
    run_moeperf().stdout.fnmatch_lines(["*3 pass*"])

    monkeypatch.setenv("MOEPERF_TEST_SCALE", "2")
    slower = run_moeperf("--benchmark-json", "bench.json")
    slower.assert_outcomes(passed=1, failed=3)
    assert slower.ret == pytest.ExitCode.TESTS_FAILED
    slower.stdout.fnmatch_lines(["*moeperf: 1 metric(s) regressed against baselines/*",
                                 "*time: baseline 0.002 s (3 runs) -> current 0.004 s (n=21, 3 rounds), change "
                                 "+100.0 %*REGRESSED: rank test p = 0.029*"])
    assert "FixtureAlreadyUsed" not in slower.stdout.str()
    own = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
    assert sorted(b["fullname"] for b in own) == ["test_bench.py::test_halved", "test_bench.py::test_sum[1000]",
                                                  "test_bench.py::test_sum[10]"]
    assert all(b["stats"]["median"] == pytest.approx(0.004 if "sum" in b["name"] else 0.002) for b in own)

    pytester.makeconftest("import pytest\n\ndef pytest_collection_modifyitems(items):\n    for item in items:\n"
                          "        item.add_marker(pytest.mark.moeperf_threshold(abs_tolerance=0.01))\n")
    run_moeperf().assert_outcomes(passed=4)  # the marker's absolute tolerance: +2 ms is within 10 ms


def test_the_switch_and_its_ini_twin(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_bench=BENCH)
    off = run_moeperf("--moeperf-update", "--moeperf-benchmark", "off")
    off.assert_outcomes(passed=4)
    assert no_baselines(pytester) and "::time" not in off.stdout.str()
    pytester.makeini("[pytest]\nmoeperf_benchmark = off\n")
    run_moeperf("--moeperf-update").assert_outcomes(passed=4)
    assert no_baselines(pytester)
    run_moeperf("--moeperf-update", "--moeperf-benchmark", "us").assert_outcomes(passed=4)  # the option beats the ini
    assert stored(pytester)["test_bench.py::test_sum[10]::time"]["summary"]["median"] == pytest.approx(2000.0)
    pytester.makeini("[pytest]\nmoeperf_benchmark = minutes\n")
    bad = run_moeperf()
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*ini option moeperf_benchmark: expected a time unit (s, ms, us, ns), on or off, "
                              "got 'minutes'*"])


def test_benchmark_disable_stores_nothing_and_says_so(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_bench=BENCH)
    run_moeperf("--moeperf-update").assert_outcomes(passed=4)
    disabled = run_moeperf("--benchmark-disable", "--moeperf-update")
    disabled.assert_outcomes(passed=4)
    disabled.stdout.fnmatch_lines(["*pytest-benchmark measured nothing in 3 test(s) (its fixture is disabled: "
                                   "--benchmark-disable runs each benchmarked function once, untimed): nothing of "
                                   "theirs is judged or stored*"])
    assert all(len(m["runs"]) == 1 for m in stored(pytester).values()), "the disabled run stored a run"
    judged = run_moeperf("--benchmark-disable")
    judged.assert_outcomes(passed=4)
    judged.stdout.fnmatch_lines(["MISSING test_bench.py::test_sum?10?::time: pytest-benchmark measured nothing: "
                                 "its fixture is disabled*"])


def test_under_xdist_it_says_pytest_benchmark_measured_nothing(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("xdist")
    pytester.makepyfile(test_bench=BENCH)
    result = run_moeperf("-n", "2", "--moeperf-update")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*moeperf: pytest-benchmark measured nothing in 3 test(s) (pytest-benchmark "
                                 "disables itself under xdist: run the benchmarks without -n): nothing of theirs is "
                                 "judged or stored*"])
    assert no_baselines(pytester)
    strict = run_moeperf("-n", "2", "--moeperf-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED, "a warning fails a strict session"


def test_rounds_repeat_benchmarks_in_fresh_processes(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_bench=BENCH)
    result = run_moeperf("--moeperf-update", "--moeperf-rounds", "2", "-k", "test_sum")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    metrics = stored(pytester)
    assert sorted(metrics) == KEYS[1:]
    assert all(len(m["runs"]) == 2 for m in metrics.values())


def test_pytest_benchmarks_own_options_keep_working(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_bench=BENCH)
    saved = run_moeperf("--benchmark-autosave", "--benchmark-storage", "store")
    saved.assert_outcomes(passed=4)
    assert len(list((pytester.path / "store").rglob("*.json"))) == 1
    compared = run_moeperf("--benchmark-compare", "--benchmark-storage", "store", "--benchmark-compare-fail",
                           "median:5%")
    compared.assert_outcomes(passed=4)
    compared.stdout.fnmatch_lines(["*test_sum?10? (0001_*", "*test_sum?10? (NOW)*"])
    skipped = run_moeperf("--benchmark-skip")
    skipped.assert_outcomes(passed=1, skipped=3)
    only = run_moeperf("--benchmark-only")
    only.assert_outcomes(passed=3, skipped=1)


def test_results_map_units_and_context() -> None:
    from pytest_moeperf.adoption import results

    entry = {"group": None, "params": {"impl": type, "m": 8}, "extra_info": {"round_unit": "x", "flops": 2.5e9},
             "stats": {"data": [0.001, 0.003, 0.002], "rounds": 3, "iterations": 10}}
    adopted = results.adopt(entry, "us")
    assert adopted.samples == pytest.approx((1000.0, 3000.0, 2000.0)) and adopted.unit == "us"
    assert adopted.context == {"impl": "<class 'type'>", "m": 8, "flops": 2.5e9, "benchmark_rounds": 3,
                               "benchmark_iterations": 10}
    with pytest.raises(ValueError, match="pytest-benchmark result of test_x: no rounds"):
        results.adopt({**entry, "fullname": "test_x", "stats": {"data": [], "rounds": 0, "iterations": 1}}, "s")


def test_many_rounds_keep_their_median_quartiles_and_range() -> None:
    """pytest-benchmark runs up to hundreds of thousands of rounds; the metric keeps 1001 quantiles of them."""
    from pytest_moeperf.adoption import results

    data = [((i * 7919) % 100003) * 1e-9 + 1e-6 for i in range(100003)]
    entry = {"group": "g", "params": None, "extra_info": {}, "stats": {"data": data, "rounds": len(data),
                                                                       "iterations": 1}}
    samples = results.adopt(entry, "s").samples
    assert len(samples) == results.MAX_SAMPLES
    for q in (0.0, 0.25, 0.5, 0.75, 1.0):
        assert stats.quantile(samples, q) == stats.quantile(data, q)
    assert stats.quantile_points([3.0, 1.0, 2.0], 5) == [1.0, 1.5, 2.0, 2.5, 3.0]

