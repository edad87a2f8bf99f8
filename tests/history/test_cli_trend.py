"""The issue's done-when, on SQLite and on PostgreSQL: three sessions are three runs in ``moeperf history``; a step
injected into 20 sessions is found by ``moeperf trend`` and named by its run, commit and version change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_moeperf.history.cli import main
from pytest_moeperf.history.records import records_from_report
from pytest_moeperf.history.store import HistoryStore
from pytest_moeperf.history.trend import find_steps
from tests.history.sessions import KEY, report_doc, stepped_series

STEP_AT = 12


def store_sessions(target: str, values: list[float], step_versions: bool = True) -> None:
    with HistoryStore.open(target) as store:
        for i, value in enumerate(values):
            versions = {"torch": "2.13.0", "vllm": "0.33.0" if step_versions and i >= STEP_AT else "0.32.0"}
            store.append(*records_from_report(report_doc(i, {KEY: value, "t.py::test_flat::tflops": 50.0 + i % 2},
                                                         versions=versions)))


def test_three_sessions_are_three_runs(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    store_sessions(target, [100.0, 101.0, 99.5])
    done = subprocess.run([sys.executable, "-m", "pytest_moeperf.history.cli", "history", "--db", target, "list"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("3 run(s) in ")
    runs = [line.split() for line in lines[3:]]
    assert [r[0] for r in runs] == ["#1", "#2", "#3"]
    assert [r[1] for r in runs] == ["2026-11-01T00:00:00+00:00", "2026-11-01T01:00:00+00:00",
                                    "2026-11-01T02:00:00+00:00"]
    assert all(r[3] == "cpu-2c-test" and r[-2:] == ["2", "0"] for r in runs), runs
    assert main(["history", "list", "--db", target, "--limit", "2", "--fingerprint", "cpu-2c-test"]) == 0
    assert main(["history", "--db", target, "--fingerprint", "another-box"]) == 0
    limited, other = capsys.readouterr().out.split("\n0 run(s)")
    assert limited.startswith("2 run(s)") and [line.split()[0] for line in limited.splitlines()[3:]] == ["#2", "#3"]


def test_trend_names_the_run_of_an_injected_step(target: str, capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    values = stepped_series(20, STEP_AT, step=0.10, noise=0.01)
    store_sessions(target, values)
    plot = tmp_path / "plots" / "latency.png"
    assert main(["trend", "test_step[bf16-tp8]::latency", "--db", target, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{KEY} on cpu-2c-test: 20 run(s), 1 change point(s)"
    step = out[1].split()
    assert step[:4] == ["step", "at", "run", f"#{STEP_AT + 1}"], out[1]
    assert f"commit {STEP_AT:04d}c0ffeec0" in out[1] and "worse)" in out[1]
    size = float(out[1].split("(")[-1].split(" %")[0])
    assert size == pytest.approx(10.0, abs=2.0), "the size is the step injected, within the noise"
    assert out[2] == "    versions: vllm 0.32.0 -> 0.33.0"
    assert out[-1] == f"wrote {plot}" and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_step_in_noise_and_plots_of_several_metrics(target: str, capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    store_sessions(target, stepped_series(20, STEP_AT, step=0.0, noise=0.01), step_versions=False)
    assert main(["trend", "--db", target, KEY, "t.py::test_flat::tflops", "--plot", str(tmp_path / "t.svg")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{KEY} on cpu-2c-test: 20 run(s), no change point(s)"
    assert out[1] == "t.py::test_flat::tflops on cpu-2c-test: 20 run(s), no change point(s)"
    svgs = sorted(tmp_path.glob("t-*.svg"))
    assert len(svgs) == 2 and all(b"<svg" in p.read_bytes()[:400] for p in svgs)


def test_show_and_errors(target: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store_sessions(target, [100.0, 120.0])
    assert main(["history", "--db", target, "show", "latency"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{KEY} on cpu-2c-test (ms, lower is better)"
    assert out[3].split()[0] == "#1" and out[4].split()[3] == "120" and "+20.0 %" in out[4]
    assert main(["history", "--db", target, "show", "nothing-like-this"]) == 2
    assert main(["trend", "--db", str(tmp_path / "absent.sqlite"), KEY]) == 2
    assert "no history at" in capsys.readouterr().err


def test_find_steps_on_series_alone() -> None:
    steps = find_steps(stepped_series(20, STEP_AT, step=-0.15, noise=0.02, seed=3))
    assert [s.index for s in steps] == [STEP_AT]
    assert steps[0].relative == pytest.approx(-0.15, abs=0.03) and steps[0].pvalue < 0.001
    assert find_steps([1.0, 2.0]) == [], "too short to split"


@pytest.mark.parametrize("action", [["list"], ["show", "latency"]])
def test_fingerprint_filters_before_and_after_the_action(target: str, capsys: pytest.CaptureFixture[str],
                                                         action: list[str]) -> None:
    """``--fingerprint`` works on either side of ``list`` and ``show`` (issue 37, item 9: before the action, a
    default one parser set on the action shared through ``parents=`` overwrote it, and every run was shown)."""
    other = {"fingerprint": "8x-h200-nvlink", "hash": "fedcba987654"}
    with HistoryStore.open(target) as store:
        store.append(*records_from_report(report_doc(0, {KEY: 100.0})))
        store.append(*records_from_report(report_doc(1, {KEY: 50.0}, fingerprint=other)))
    before = ["history", "--db", target, "--fingerprint", "8x-h200-nvlink", *action]
    after = ["history", "--db", target, *action, "--fingerprint", "fedcba987654"]
    for argv in (before, after, ["history", "--fingerprint", "8x-h200-nvlink", "--db", target]):
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert "8x-h200-nvlink" in out and "cpu-2c-test" not in out, (argv, out)
    assert main(["history", "--db", target, *action]) == 0
    out = capsys.readouterr().out
    assert "8x-h200-nvlink" in out and "cpu-2c-test" in out, "no filter: every fingerprint"
