"""What counts as a sitting, and the evidence an IMPROVED needs before it asks for a re-record (issue 30, item 15).

A same-box A/A after two update sittings 1.5 minutes apart flagged 2 of 19 GEMM cases IMPROVED on 1x H200 (router
M=1 -3.9 % against an mde of 3.6 %, gate_up bf16 M=1 -3.6 % against 2.0 %), and the summary advised
``--moeperf-update``: back-to-back updates counted as two sittings and unlocked the quiet floor.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from pathlib import Path

import pytest

from pytest_moeperf.judging.shift import family_views, in_moved_families
from pytest_moeperf.judging.stats import summarize
from pytest_moeperf.judging.thresholds import Threshold
from pytest_moeperf.judging.verdict import Status, judge
from pytest_moeperf.ledger import Measurement
from pytest_moeperf.store.entries import BaselineEntry, RunSummary, sittings

T0 = dt.datetime(2026, 12, 1, 17, 0, tzinfo=dt.UTC)


def _run(minutes: float, boot: str | None = "b-1", median: float = 100.0) -> RunSummary:
    return RunSummary(median, 20, 0.1, (T0 + dt.timedelta(minutes=minutes)).isoformat(), None, "h", boot)


def test_updates_minutes_apart_on_one_boot_are_one_sitting() -> None:
    assert sittings([_run(0), _run(0), _run(0), _run(1.5), _run(1.5), _run(1.5)]) == 1
    assert sittings([_run(0), _run(40), _run(80), _run(120)]) == 1, "back to back for hours: still one sitting"
    assert sittings([_run(0), _run(60), _run(180)]) == 3, "an hour or more between updates"
    assert sittings([_run(0, "b-1"), _run(1.5, "b-2")]) == 2, "a reboot between them"
    assert sittings([_run(0, None), _run(1.5, "b-2")]) == 1, "an unknown boot: the time decides"
    assert sittings([RunSummary(1.0, 1, 0.0), RunSummary(1.0, 1, 0.0, "not a date")]) == 1
    naive = RunSummary(1.0, 1, 0.0, "2026-12-01T19:00:00")  # merged trees and old files: no offset, read as UTC
    assert sittings([_run(0), naive]) == 2


def test_back_to_back_sittings_keep_the_default_minimum_effect() -> None:
    m = Measurement("t.py::test_router", "time", (96.0,) * 20, "us", "lower")
    back_to_back = BaselineEntry(m.key, m.test_id, m.name, "us", "lower", summarize(m.samples),
                                 runs=tuple(_run(minutes) for minutes in (0, 0, 0, 1.5, 1.5, 1.5)))
    reference = back_to_back.reference("h")
    assert reference.sittings == 1
    verdict = judge(m.key, m.name, "us", "lower", [m.samples] * 3, reference, Threshold(quiet_floor=0.02))
    assert verdict.status is Status.PASS and verdict.mde == 0.05, verdict.message()
    apart = dataclasses.replace(back_to_back, runs=tuple(_run(minutes) for minutes in (0, 0, 0, 90, 90, 90)))
    assert apart.reference("h").sittings == 2
    verdict = judge(m.key, m.name, "us", "lower", [m.samples] * 3, apart.reference("h"), Threshold(quiet_floor=0.02))
    assert verdict.status is Status.IMPROVED and verdict.mde == 0.02 and verdict.reason_to_rerecord


def test_an_improvement_in_one_round_is_confirmed_as_a_regression_is() -> None:
    m = Measurement("t.py::test_k", "time", (90.0,) * 20, "us", "lower")
    entry = BaselineEntry(m.key, m.test_id, m.name, "us", "lower", summarize(m.samples), runs=(_run(0),))
    family = dataclasses.replace(entry.reference("h"), family_spread=0.0, family_source="3 cases")
    one = judge(m.key, m.name, "us", "lower", [m.samples], family, Threshold())
    assert one.status is Status.IMPROVED and one.more_rounds_help and not one.reason_to_rerecord
    two = judge(m.key, m.name, "us", "lower", [m.samples] * 2, family, Threshold())
    assert two.status is Status.IMPROVED and not two.more_rounds_help and two.reason_to_rerecord
    # nine cases of its family moved with it: the machine, not the code (`shift.in_moved_families`)
    family_cases = {f"t.py::test_k[{i}]::time": dataclasses.replace(two, key=f"t.py::test_k[{i}]::time")
                    for i in range(9)}
    moved = in_moved_families(family_cases, family_views(list(family_cases.values())))
    assert len(moved) == 9 and not any(v.reason_to_rerecord for v in moved.values())


# ------------------------------------------------------------------------------------------ real sessions
CONSTANT = """
import os

def test_router(perf):
    perf.record("time", [100.0 * float(os.environ.get("SCALE", "1"))] * 20, unit="us")
"""


def test_three_updates_back_to_back_are_one_sitting_and_an_a_a_improvement_passes(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch, spread_sittings) -> None:
    pytester.makepyfile(test_syn=CONSTANT)
    for i in range(3):
        if i:
            time.sleep(1.1)  # three dates (stamped to the second), seconds apart
        assert run_moeperf("--moeperf-update").ret == pytest.ExitCode.OK
    monkeypatch.setenv("SCALE", "0.96")
    same_hour = run_moeperf("--moeperf-history", "off", "--moeperf-report", "same.json")
    assert same_hour.ret == pytest.ExitCode.OK
    same_hour.stdout.fnmatch_lines(["test_syn.py::test_router::time *-4.0 %  5.0 % *1 *PASS"])
    assert _spread(pytester.path / "same.json") == "spread 0.0 % from 3 runs in 1 sitting"
    assert "refresh with --moeperf-update" not in same_hour.stdout.str()

    spread_sittings(next((pytester.path / "baselines").glob("*/test_syn.json")), 2)
    apart = run_moeperf("--moeperf-history", "off", "--moeperf-report", "apart.json")
    apart.stdout.fnmatch_lines(["test_syn.py::test_router::time *-4.0 %  3.0 % *4 *IMPROVED",
                                "1 metric(s) improved: refresh with --moeperf-update"])
    assert _spread(pytester.path / "apart.json") == "spread 0.0 % from 3 runs in 3 sittings; quiet: floor 3 %"


def _spread(report: Path) -> str:
    (bench,) = json.loads(report.read_text())["benchmarks"]
    return str(bench["extra_info"]["spread"])


FAMILY = """
import os
import pytest

@pytest.mark.parametrize("case", ["a", "b", "c", "new"])
def test_k(perf, case):
    if case == "new" and not os.environ.get("WITH_NEW"):
        pytest.skip("added later")
    scale = float(os.environ.get("SCALE", "1")) if case == "new" else 1.0
    perf.record("time", [100.0 * scale] * 20, unit="us")
"""


def test_an_improvement_seen_in_one_round_is_confirmed_before_a_re_record_is_advised(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case with one stored run is judged on its family's spread (the quartile rule), which decides in one
    round: a REGRESSED got a confirmation round, an IMPROVED did not, and the summary advised a re-record."""
    pytester.makepyfile(test_fam=FAMILY)
    for _ in range(3):
        assert run_moeperf("--moeperf-update", "--moeperf-history", "off").ret == pytest.ExitCode.OK
    monkeypatch.setenv("WITH_NEW", "1")
    assert run_moeperf("--moeperf-update", "--moeperf-history", "off", "-k", "new").ret == pytest.ExitCode.OK
    monkeypatch.setenv("SCALE", "0.90")
    confirmed = run_moeperf("--moeperf-history", "off", "-k", "new")
    confirmed.stdout.fnmatch_lines(["test_fam.py::test_k?new?::time *-10.0 %  5.0 % (family) *2 *IMPROVED",
                                    "1 metric(s) improved: refresh with --moeperf-update"])
    once = run_moeperf("--moeperf-history", "off", "-k", "new", "--moeperf-confirm", "0")
    once.stdout.fnmatch_lines(["test_fam.py::test_k?new?::time *-10.0 %  5.0 % (family) *1 *IMPROVED",
                               "1 metric(s) IMPROVED but not confirmed (one round, or inside a family that moved as a "
                               "whole): not a reason to re-record yet"])
    assert "refresh with --moeperf-update" not in once.stdout.str()
