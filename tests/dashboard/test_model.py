"""The dashboard's pure parts: the window and its lanes, suites and families, the family level, safe inline JSON."""

from __future__ import annotations

import json

import pytest

from pytest_moeperf.dashboard import changes, model, render
from pytest_moeperf.dashboard.window import Lane, select
from pytest_moeperf.history.records import MetricRecord, SessionRecord, StoredSession


def stored(sid: int, host: str | None, finished: str, fingerprint: str = "cpu") -> StoredSession:
    return StoredSession(id=sid, run=SessionRecord(finished=finished, fingerprint=fingerprint, fingerprint_hash="h",
                                                   host="node", host_id=host))


def metric(value: float, status: str = "PASS") -> MetricRecord:
    return MetricRecord(test_id="suites/gemm/test_gemm.py::test_gemm[a]", name="time", unit="us", better="lower",
                        median=value, n=3, iqr=0.0, status=status)


def test_the_window_keeps_each_lanes_last_sessions_in_time_order() -> None:
    sessions = [stored(i, "a" if i % 2 else "b", f"2026-01-01T00:{i:02d}:00") for i in range(10)]
    sessions.append(stored(10, None, "2026-01-01T00:30:00", fingerprint="gpu"))  # no host id: the node names it
    window = select(list(reversed(sessions)), last=2)
    assert window.ids == [6, 7, 8, 9, 10] and window.total == 11
    assert window.lanes == (Lane("cpu", "a"), Lane("cpu", "b"), Lane("gpu", "node"))
    assert [window.lane[i] for i in window.ids] == [1, 0, 1, 0, 2]
    assert window.latest == "2026-01-01T00:30:00"
    with pytest.raises(ValueError, match="at least 1"):
        select(sessions, last=0)


@pytest.mark.parametrize(("test_id", "suite"), [("suites/gemm/test_gemm.py::t[x]", "gemm"),
                                                 ("suites/serving/sub/test_s.py::t", "serving"),
                                                 ("perf/test_a.py::t", "perf"), ("test_b.py::t", "test_b.py")])
def test_suite_of_a_test(test_id: str, suite: str) -> None:
    assert model.suite_of(test_id) == suite


def test_pages_are_unique_and_safe_names() -> None:
    a, b = "suites/g/test_g.py::t[a/b]::time", "suites/g/test_g.py::t[a_b]::time"
    assert model.page_of(a) != model.page_of(b)
    assert all(c.isalnum() or c in "._-/" for c in model.page_of(a)) and model.page_of(a).startswith("m/")
    assert model.family_of(a) == ("suites/g/test_g.py", "time") and model.case_of(a) == "t[a/b]"


def test_a_family_level_is_the_median_case_over_its_own_median() -> None:
    fast = [(1, metric(10.0)), (2, metric(10.0)), (3, metric(11.0))]
    slow = [(1, metric(100.0)), (2, metric(100.0)), (3, metric(110.0))]
    level = model.family_level([fast, slow])
    assert level == [(1, 1.0), (2, 1.0), (3, pytest.approx(1.1))]


def test_a_case_whose_usual_value_is_zero_counts_one_where_it_is_zero() -> None:
    failed = [(1, metric(0.0)), (2, metric(0.0)), (3, metric(0.25, "REGRESSED"))]  # median 0: no ratio to it
    assert model.family_level([failed]) == [(1, 1.0), (2, 1.0), (3, None)]  # session 3: no level, a gap
    fast = [(1, metric(10.0)), (2, metric(10.0)), (3, metric(11.0))]
    assert model.family_level([failed, fast]) == [(1, 1.0), (2, 1.0), (3, pytest.approx(1.1))]
    window = select([stored(i, "a", f"2026-01-01T00:0{i}:00") for i in (1, 2, 3)], last=10)
    [row] = model.index_rows(window, {"suites/serving/test_s.py::t::failed_rate": {0: failed}}, {})
    [lane] = row["lanes"]
    assert (lane["s"], lane["y"]) == ([1, 2, 3], [1.0, 1.0, None])
    assert lane["k"] == [[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 1], [1, 0, 0, 0, 0, 0]]  # every session's verdicts


def test_index_groups_the_cases_change_points_by_session() -> None:
    sessions = [stored(i, "a", f"2026-01-01T00:{i:02d}:00") for i in range(6)]
    window = select(sessions, last=10)
    series: model.Series = {}
    for case in ("a", "b", "c"):
        key = f"suites/gemm/test_gemm.py::test_gemm[{case}]::time"
        series[key] = {0: [(i, metric(100.0 * (1.1 if i >= 3 else 1.0))) for i in range(6)]}
    step = changes.Step(index=3, before=100.0, after=110.0, pvalue=1e-4)
    steps = {(k, 0): [step] for k in list(series)[:2]}
    [row] = model.index_rows(window, series, steps)
    [lane] = row["lanes"]
    assert (row["suite"], row["metric"], lane["of"]) == ("gemm", "time", 3)
    assert lane["steps"] == [{"s": 3, "n": 2, "rel": 0.1, "pages": sorted(model.page_of(k) for k in list(series)[:2])}]
    assert lane["k"][0] == [0, 0, 0, 0, 0, 3]  # three PASS verdicts in the first session


def test_inline_json_cannot_close_its_script_element() -> None:
    text = render.script_json({"reason": "</script><script>alert(1)</script> & <!--"})
    assert "</" not in text and "<!--" not in text
    assert json.loads(text) == {"reason": "</script><script>alert(1)</script> & <!--"}


def test_change_points_in_parallel_are_the_serial_ones() -> None:
    series = {i: [100.0] * 10 + [110.0 + (i % 3)] * 10 for i in range(changes.SERIAL_BELOW + 1)}
    assert changes.all_steps(series, jobs=2) == changes.all_steps(series, jobs=1)
    assert all(len(steps) == 1 and steps[0].index == 10 for steps in changes.all_steps(series, jobs=2).values())


def test_the_canary_is_the_machine_suite_first_in_the_index_one_family_per_workload() -> None:
    window = select([stored(i, "a", f"2026-01-01T00:{i:02d}:00") for i in range(3)], last=10)
    series: model.Series = {}
    for file, scale in (("suites/gemm/test_gemm.py", 1.0), ("suites/allreduce/test_allreduce.py", 3.0)):
        key = f"{file}::moeperf_canary::cpu_stream"
        series[key] = {0: [(i, metric(1000.0 * scale * (1.2 if i == 2 else 1.0))) for i in range(3)]}
    series["suites/gemm/test_gemm.py::test_gemm[a]::time"] = {0: [(i, metric(10.0)) for i in range(3)]}
    machine, gemm = model.index_rows(window, series, {})
    assert (machine["suite"], machine["file"], machine["metric"]) == ("machine", "machine", "cpu_stream")
    assert [c["case"] for c in machine["cases"]] == ["suites/allreduce/test_allreduce.py", "suites/gemm/test_gemm.py"]
    assert machine["lanes"][0]["y"] == [1.0, 1.0, 1.2]  # the machine's level: both files' canary moved +20 %
    assert gemm["suite"] == "gemm"
    assert model.metric_payload("suites/gemm/test_gemm.py::moeperf_canary::cpu_stream",
                                series["suites/gemm/test_gemm.py::moeperf_canary::cpu_stream"], {}, window)[
        "suite"] == "machine"
