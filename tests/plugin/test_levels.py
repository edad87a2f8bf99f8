"""Where the noise lives: variance components of nested data (start > window), the unit a verdict takes, the plan of
starts x windows, and real pytest sessions that store a start's windows apart and decide on windows only where the
stored starts show a start adds nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_moeperf.judging.levels import (
    START,
    WINDOW,
    Components,
    Planned,
    components,
    judged_units,
    plan,
    starts_of,
    windows_per_start,
)
from pytest_moeperf.judging.thresholds import Reference
from pytest_moeperf.ledger import Round


def test_components_of_a_balanced_data_set_match_kalibera_and_jones() -> None:
    # 3 starts x 2 windows: start means 11, 15, 19; S_w^2 = 2, S_s^2 = 16, T_s^2 = S_s^2 - S_w^2 / r = 15
    found = components([[10, 12], [14, 16], [18, 20]])
    assert found is not None
    assert (found.starts, found.windows, found.mean) == (3, 6, 15.0)
    assert found.window_var == pytest.approx(2.0)
    assert found.start_var == pytest.approx(15.0)
    assert found.unit == START
    assert found.rcv(START) == pytest.approx(math.sqrt(15) / 15)


def test_a_start_that_adds_nothing_makes_windows_the_unit() -> None:
    found = components([[10, 14], [11, 13], [12, 12]], sittings=2)  # every start's mean is 12: the window's spread
    assert found is not None and found.start_var < 0 and found.start_adds_nothing
    assert found.unit == WINDOW
    assert found.rcv(START) == 0.0
    assert "3 stored starts in 2 sittings, 6 windows: start's own rCV <= 0" in found.describe()


def test_starts_of_one_sitting_never_make_windows_the_unit() -> None:
    # they share that hour's machine: what a later sitting adds is a level they never sampled
    found = components([[10, 14], [11, 13], [12, 12]])
    assert found is not None and found.start_adds_nothing and found.sittings == 1
    assert found.unit == START


def test_two_starts_never_make_windows_the_unit() -> None:
    found = components([[10, 14], [12, 12]], sittings=2)
    assert found is not None and found.start_adds_nothing and found.unit == START


def test_unbalanced_starts_use_the_general_moment_estimator() -> None:
    groups = [[1.0, 2.0, 3.0], [4.0, 6.0], [5.0]]
    found = components(groups)
    assert found is not None
    values = [y for g in groups for y in g]
    total, n = len(values), len(groups)
    grand = sum(values) / total
    within = sum((y - sum(g) / len(g)) ** 2 for g in groups for y in g) / (total - n)
    between = sum(len(g) * (sum(g) / len(g) - grand) ** 2 for g in groups) / (n - 1)
    r0 = (total - sum(len(g) ** 2 for g in groups) / total) / (n - 1)
    assert found.window_var == pytest.approx(within)
    assert found.start_var == pytest.approx((between - within) / r0)


def test_too_little_nesting_teaches_nothing() -> None:
    assert components([[1.0, 2.0]]) is None
    assert components([[1.0], [2.0], [3.0]]) is None  # no start of two windows


def test_windows_per_start_follow_the_cost_ratio() -> None:
    found = Components(3, 9, 10.0, window_var=4.0, start_var=1.0)
    # r = ceil(sqrt((c_start / c_window) * T_w^2 / T_s^2)) = ceil(sqrt(100 / 25 * 4)) = 4
    assert windows_per_start(found, 100.0, 25.0) == 4
    assert windows_per_start(Components(3, 9, 10.0, 4.0, -1.0), 100.0, 25.0) is None


def test_the_plan_takes_one_start_where_windows_are_the_unit() -> None:
    window_unit = Components(3, 9, 7.0, window_var=0.01, start_var=-0.001, sittings=2)
    start_unit = Components(3, 9, 7.0, window_var=0.01, start_var=0.04)
    one = plan([Planned("tpot_ms", window_unit, 3)], start_s=60.0, window_s=30.0)
    assert one is not None and (one.starts, one.windows) == (1, 2)  # 2 windows against 9 stored: p = 1/55
    assert one.seconds == pytest.approx(60 + 2 * 30)
    both = plan([Planned("tpot_ms", window_unit, 3), Planned("output_throughput", start_unit, 3)], 60.0, 30.0)
    assert both is not None and both.starts == 4  # against 3 stored starts the rank test needs 4
    assert any("starts are the unit of 1 metric(s): output_throughput" in line for line in both.lines)
    ttft = Components(3, 9, 100.0, window_var=1.0, start_var=50.0)  # first-token latency is not planned for
    only = plan([Planned("tpot_ms", window_unit, 3), Planned("ttft_ms", ttft, 3)], 60.0, 30.0)
    assert only is not None and only.starts == 1
    assert any("not planned for" in line for line in only.lines)
    assert plan([Planned("tpot_ms", None, 3)], 60.0, 30.0) is None


def test_the_plan_never_passes_the_budget() -> None:
    start_unit = Components(3, 9, 7.0, window_var=0.04, start_var=0.0004)
    wanted = plan([Planned("tpot_ms", start_unit, 3)], start_s=90.0, window_s=10.0)
    assert wanted is not None and wanted.starts == 4 and wanted.windows > 1
    cut = plan([Planned("tpot_ms", start_unit, 3)], start_s=90.0, window_s=10.0, budget_s=250.0)
    assert cut is not None and cut.seconds <= 250.0
    assert any("cut to the time budget (250 s)" in line for line in cut.lines)


def window(origin: str, k: int, *values: float) -> Round:
    return Round(tuple(values), origin, window=k)


def test_windows_are_judged_alone_only_where_the_stored_starts_show_nothing_between_them() -> None:
    rounds = [window("start 1/1", 1, 2.2, 2.21), window("start 1/1", 2, 2.19, 2.2)]
    flat = Reference((2.0, 2.0, 2.0), windows=((1.98, 2.0, 2.02), (1.99, 2.0, 2.01), (2.02, 2.0, 1.98)),
                     window_sittings=2)
    units = judged_units(rounds, flat)
    assert units.rounds == ((2.2, 2.21), (2.19, 2.2))
    assert units.reference is not None and units.reference.runs == 9
    assert "windows are the unit" in units.note
    varying = Reference((1.8, 2.0, 2.2), windows=((1.79, 1.81), (1.99, 2.01), (2.19, 2.21)))
    units = judged_units(rounds, varying)
    assert units.rounds == ((2.2, 2.21, 2.19, 2.2),) and units.reference == varying
    assert "starts are the unit" in units.note
    other_host = Reference((2.0,) * 3, windows=flat.windows, other_hosts="3 other hosts")
    assert "starts are the unit" in judged_units(rounds, other_host).note
    one_sitting = Reference((2.0,) * 3, windows=flat.windows)
    assert "starts are the unit: 3 stored starts in 1 sitting" in judged_units(rounds, one_sitting).note
    plain = [Round((1.0,), "call"), Round((1.1,), "confirm 1")]
    assert judged_units(plain, flat).rounds == ((1.0,), (1.1,)) and judged_units(plain, flat).note == ""


def test_starts_of_groups_windows_by_origin() -> None:
    rounds = [window("start 1/2", 1, 1.0), window("start 1/2", 2, 1.1), window("start 2/2", 1, 1.2),
              Round((1.3,), "call"), Round((1.4,), "confirm 1")]
    assert [len(g) for g in starts_of(rounds)] == [2, 1, 1, 1]


# A test whose round is a start (as the serving wing says for its tests on launched servers): its windows read
# 2 ms x MOEPERF_TEST_SCALE x the start's factor (MOEPERF_TEST_START) x 0.99 / 1.00 / 1.01 in turn, and it says
# what a window and a start cost, as the serving suites do
CONFTEST = """
def pytest_moeperf_round_unit(config, item):
    return "server start"
"""
TESTS = """
import os, time
from pathlib import Path

def test_window(perf):
    time.sleep(float(os.environ.get("MOEPERF_TEST_SLEEP", "0")))
    counter = Path("windows.txt")
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    value = (2.0 * float(os.environ.get("MOEPERF_TEST_SCALE", "1")) * float(os.environ.get("MOEPERF_TEST_START", "1"))
             * (0.99, 1.0, 1.01)[n % 3])
    perf.context(window_s=1.0, start_s=4.0)
    perf.record("tpot_ms", [value * 0.999, value, value * 1.001], unit="ms")
"""


@pytest.fixture
def nested(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_nested=TESTS)
    return pytester


def stored_runs(pytester: pytest.Pytester) -> list[dict[str, object]]:
    (path,) = (pytester.path / "baselines").glob("*/test_nested.json")
    runs: list[dict[str, object]] = json.loads(path.read_text())["metrics"]["test_nested.py::test_window::tpot_ms"][
        "runs"]
    return runs


def record_starts(run_moeperf, monkeypatch: pytest.MonkeyPatch, factors: tuple[float, ...]) -> None:  # type: ignore[no-untyped-def]
    for factor in factors:
        monkeypatch.setenv("MOEPERF_TEST_START", str(factor))
        result = run_moeperf("--moeperf-update", "--moeperf-starts", "1", "--moeperf-windows", "3")
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    monkeypatch.delenv("MOEPERF_TEST_START")


def test_an_update_stores_one_run_per_start_with_its_windows_apart(nested: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    record_starts(run_moeperf, monkeypatch, (1.0,))
    (run,) = stored_runs(nested)
    assert run["windows"] == [1.98, 2.0, 2.02] and run["n"] == 9 and run["median"] == 2.0


def test_one_start_of_windows_decides_where_starts_add_nothing(nested: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    record_starts(run_moeperf, monkeypatch, (1.0, 1.0, 1.0))
    assert len(stored_runs(nested)) == 3
    one_sitting = run_moeperf()  # seconds apart: one sitting, which cannot show what a start adds
    one_sitting.stdout.fnmatch_lines(["*plan from the stored runs' variance per level: * start(s) x * window(s)*",
                                      "  starts are the unit of 1 metric(s): test_nested.py::test_window::tpot_ms"])
    (path,) = (nested.path / "baselines").glob("*/test_nested.json")
    stored = json.loads(path.read_text())
    for k, run in enumerate(stored["metrics"]["test_nested.py::test_window::tpot_ms"]["runs"]):
        run["date"] = f"2026-12-01T{17 + 2 * k}:00:00+00:00"  # as if recorded 2 hours apart: 3 sittings
    path.write_text(json.dumps(stored))
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.1")
    result = run_moeperf("-rA")  # starts and windows auto: planned from the stored runs
    result.stdout.fnmatch_lines([
        "moeperf: plan from the stored runs' variance per level: 1 start(s) x 2 window(s) a test, ~6 s*",
        "  windows are the unit of 1 metric(s): test_nested.py::test_window::tpot_ms",
        "*tpot_ms*+1?.? %*windows are the unit: 3 stored starts in 3 sittings, 9 windows: start's own rCV <= 0*"
        "REGRESSED*",
    ])
    result.stdout.fnmatch_lines(["moeperf: 2 windows on up to 1 server start a test; 0 set aside*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.0")
    aa = run_moeperf()
    assert aa.ret == pytest.ExitCode.OK, aa.stdout.str()
    assert "REGRESSED" not in aa.stdout.str() and "IMPROVED" not in aa.stdout.str()


def test_windows_of_one_start_do_not_decide_where_starts_vary(nested: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    record_starts(run_moeperf, monkeypatch, (0.97, 1.0, 1.03))
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.15")
    result = run_moeperf("--moeperf-starts", "1", "--moeperf-windows", "3", "-rA")
    result.stdout.fnmatch_lines([
        "*tpot_ms*starts are the unit: 3 stored starts in 1 sitting, 9 windows*INCONCLUSIVE*",
        "*1 round(s) against 3 stored runs cannot reach p < 0.05*",
    ])
    assert result.ret == pytest.ExitCode.OK


def test_the_deadline_leaves_windows_unbegun(nested: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPERF_TEST_SLEEP", "1.5")
    result = run_moeperf("--moeperf-starts", "1", "--moeperf-windows", "3", "--moeperf-deadline", "2.5",
                         "--moeperf-update")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["moeperf: windows not begun (--moeperf-deadline): *test_window: 1 of 3 windows*"])
    assert [run["windows"] for run in stored_runs(nested)] == [[1.98]]


def test_a_baseline_with_malformed_windows_is_refused(nested: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    record_starts(run_moeperf, monkeypatch, (1.0,))
    (path,) = (nested.path / "baselines").glob("*/test_nested.json")
    stored = json.loads(path.read_text())
    stored["metrics"]["test_nested.py::test_window::tpot_ms"]["runs"][0]["windows"] = ["2.0"]
    Path(path).write_text(json.dumps(stored))
    result = run_moeperf("--moeperf-starts", "1")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*runs[[]0[]].windows[[]0[]] must be a finite number*"])


def test_the_report_shows_each_levels_variance(nested: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    record_starts(run_moeperf, monkeypatch, (0.97, 1.0, 1.03))
    result = run_moeperf("--moeperf-starts", "1", "--moeperf-windows", "2")
    result.stdout.fnmatch_lines([
        "*Noise by level (server start > window)*",
        "*test_nested.py::test_window::tpot_ms*3*9*2.94 %*1.00 %*start",
    ])
