"""``moeperf dashboard`` over a history of the four real suites (`real_history`: GEMM and all-reduce run here, serving
and spec decode from the committed 1x H200 reports): every suite on the index, the machine's (the canary's) first,
every session of a family with its verdict counts, and the metrics whose value is 0 (``failed_rate``, 0 s start-up
phases) drawn as 0. A history of two of the README's own suite runs, serving included, once crashed the build
(``KeyError`` in `model.index_rows`)."""

from __future__ import annotations

from pathlib import Path

from pytest_moeperf.dashboard.build import Options, guarded
from pytest_moeperf.dashboard.model import STATUSES
from tests.dashboard.test_build import payload


def test_a_history_of_the_real_suites_builds_with_its_zeros(real_suites: tuple[Path, int], tmp_path: Path) -> None:
    history, sessions = real_suites
    out = tmp_path / "site"
    built = guarded(Options(target=str(history), out=out, jobs=1), lambda _: None)
    assert built.shown == built.total == sessions
    rows = payload(out / "index.html")["rows"]
    assert {r["suite"] for r in rows} == {"machine", "gemm", "allreduce", "serving", "specdecode"}
    machine = [r for r in rows if r["suite"] == "machine"]  # the canary beside the CPU sessions' test files, first
    assert rows[:len(machine)] == machine and {r["metric"] for r in machine} == {"cpu_compute", "cpu_stream"}
    assert all(len(r["cases"]) == 2 for r in machine)  # read beside test_gemm.py and test_allreduce.py
    assert built.families == len(rows) and built.metrics == sum(len(r["cases"]) for r in rows)
    for row in rows:
        for lane in row["lanes"]:  # every session of the lane, with its verdict counts; a level or a gap (None)
            assert len(lane["s"]) == len(lane["y"]) == len(lane["k"]) and lane["s"], row
            assert all(len(k) == len(STATUSES) and 1 <= sum(k) <= lane["of"] for k in lane["k"]), row
            assert any(y is not None for y in lane["y"]), row
    failed = [r for r in rows if r["metric"] == "failed_rate"]
    assert failed and all(y == 1.0 for r in failed for lane in r["lanes"] for y in lane["y"])  # 0, as usual
    zeros = 0
    for row in failed:
        for case in row["cases"]:
            points = [p for lane in payload(out / case["page"])["lanes"] for p in lane["p"]]
            assert points and all(p[1] == 0.0 for p in points), case
            zeros += len(points)
    assert zeros >= 20
