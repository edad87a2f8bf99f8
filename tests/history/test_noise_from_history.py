"""The noise model reads the perf history: with more accepted sessions of a metric in the history than runs in its
baseline, the between-run spread comes from those sessions, and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.judging.thresholds import Reference, Threshold

SESSION = """
import os

def test_latency(perf):
    v = float(os.environ["MOEPERF_TEST_VALUE"])
    perf.record("latency", [v, v * 1.001, v * 0.999], unit="ms")
"""


def test_history_medians_replace_the_baselines_runs_only_when_there_are_more() -> None:
    three = Reference((100.0, 100.5, 99.5))
    assert three.noise_source == "baseline"
    assert Reference((100.0, 100.5, 99.5), history_medians=(100.0, 104.0, 96.0)).noise_source == "baseline"
    noisy = Reference((100.0, 100.5, 99.5), history_medians=(100.0, 104.0, 96.0, 103.0))
    assert noisy.noise_source == "history" and noisy.value == 100.0  # the reference value stays the baseline's
    allowed, note = Threshold(tolerance=0.05, noise_k=3.0).allowed(noisy)
    assert note.endswith("from 4 history sessions")
    assert allowed > 0.05 and allowed == pytest.approx(3 * noisy.between_run_spread)  # type: ignore[operator]


def _run(pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch, value: float,  # type: ignore[no-untyped-def]
         *args: str) -> dict[str, object]:
    monkeypatch.setenv("MOEPERF_TEST_VALUE", str(value))
    report = pytester.path / "report.json"
    # a minimum effect named as a policy (5 %): no quiet floor, so sessions within 5 % are accepted
    result = run_moeperf("--moeperf-report", str(report), "--moeperf-confirm", "0", "--moeperf-tolerance", "0.05",
                         "--moeperf-health", "off", "--moeperf-canary", "off",  # the noise model is the subject
                         *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    (bench,) = json.loads(report.read_text())["benchmarks"]
    return bench["extra_info"]["moeperf"] if "moeperf" in bench["extra_info"] else bench["extra_info"]


def test_a_session_learns_its_spread_from_the_accepted_sessions_in_history(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_lat=SESSION)
    for value in (10.0, 10.05, 9.95):  # a quiet baseline: three runs within 0.5 %
        _run(pytester, run_moeperf, monkeypatch, value, "--moeperf-update")
    first = _run(pytester, run_moeperf, monkeypatch, 10.0)
    assert "from 3 runs" in str(first["spread"])
    # four accepted sessions that moved more than the baseline's runs did (each within the 5 % minimum effect)
    for value in (10.4, 9.6, 10.3, 9.7):
        _run(pytester, run_moeperf, monkeypatch, value)
    learned = _run(pytester, run_moeperf, monkeypatch, 10.0)
    assert "history sessions" in str(learned["spread"]), learned
    assert float(learned["mde"]) > 0.05  # type: ignore[arg-type]
    assert Path(pytester.path / ".moeperf" / "history.sqlite").is_file()
    # the history off: the baseline's own noise again
    off = _run(pytester, run_moeperf, monkeypatch, 10.0, "--moeperf-history", "off")
    assert "from 3 runs" in str(off["spread"])
