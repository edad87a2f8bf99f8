"""The machine measure: a canary read beside every test file, stored with the baselines and the history, and verdicts
that know the machine. Real pytest sessions whose canary (a test-only ``pytest_moeperf_canary`` in their conftest)
and family are slowed by a known factor, deterministically; then the pure rule's units; then the real workloads."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from pathlib import Path

import pytest

from pytest_moeperf.judging import machine
from pytest_moeperf.judging.machine import CanaryMove, canary_moves, machine_verdicts, moved_slower
from pytest_moeperf.judging.stats import summarize
from pytest_moeperf.judging.verdict import Cause, Status, Verdict
from pytest_moeperf.machine.canary import Canary, Reading, Workload, cpu_workloads, is_canary, key_of

# ------------------------------------------------------------------------------------------ real sessions
#: a canary whose figures are 100 and 1000 µs times CANARY (each sample a little apart; JITTER moves a whole run)
CONFTEST = """
import os

from pytest_moeperf.machine.canary import Workload


def _samples(base):
    scale = float(os.environ.get("CANARY", "1")) * (1 + float(os.environ.get("JITTER", "0")))
    return [base * scale * (1 + d) for d in (0.0, 0.001, -0.001)]


def pytest_moeperf_canary(config):
    return [Workload("cpu_compute", lambda: _samples(100.0)), Workload("cpu_stream", lambda: _samples(1000.0))]
"""

#: a family of 8 cases (FAMILY scales all, SLOW_<case> one more); no sub-families
FAMILY = """
import os
import pytest


@pytest.mark.parametrize("case", [f"c{i}" for i in range(8)])
def test_op(perf, case):
    scale = float(os.environ.get("FAMILY", "1")) * float(os.environ.get(f"SLOW_{case}", "1"))
    scale *= 1 + float(os.environ.get("JITTER", "0"))
    base = 100.0 + 10 * int(case[1:])
    perf.record("time", [base * scale * (1 + d) for d in (0.0, 0.002, -0.002, 0.001, -0.001)], unit="us")
"""

#: 6 bf16 cases (FAMILY scales them) beside 6 int4 ones that do not move; MARK names the sub-family or nothing
SUBFAMILIES = """
import os
import pytest

CASES = [(dtype, i) for dtype in ("bf16", "int4") for i in range(6)]


{mark}
@pytest.mark.parametrize(("dtype", "i"), CASES, ids=[f"{{d}}-{{i}}" for d, i in CASES])
def test_gemm(perf, dtype, i):
    scale = float(os.environ.get("FAMILY", "1")) if dtype == "bf16" else 1.0
    scale *= 1 + float(os.environ.get("JITTER", "0"))
    perf.context(dtype=dtype)
    perf.record("time", [(50.0 + 5 * i) * scale * (1 + d) for d in (0.0, 0.002, -0.002)], unit="us")
"""


def _record(run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Three updates (three stored runs of every metric and of the canary), a little apart."""
    for jitter in ("0", "0.002", "-0.002"):
        monkeypatch.setenv("JITTER", jitter)
        assert run_moeperf("--moeperf-canary", "on", "--moeperf-update", "--moeperf-history", "off").ret == 0
    monkeypatch.setenv("JITTER", "0")


def _verdicts(report: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    """Each metric's (and canary workload's) report entry, with its verdict's cause from the ledger."""
    doc = json.loads(report.read_text())
    causes = {r["verdict"]["key"]: r["verdict"]["cause"] for r in doc["moeperf"]["records"]}
    return {b["fullname"]: {**b["extra_info"], "cause": causes.get(b["fullname"])} for b in doc["benchmarks"]}


def _judge(run_moeperf, **env: str) -> pytest.RunResult:  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        return run_moeperf("--moeperf-canary", "on", "--moeperf-history", "off", "--moeperf-report", "r.json")


@pytest.fixture
def family(pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fam=FAMILY)
    _record(run_moeperf, monkeypatch)
    return run_moeperf


def test_the_canary_is_stored_with_every_baseline_run(pytester: pytest.Pytester, family) -> None:  # type: ignore[no-untyped-def]
    stored = json.loads((next((pytester.path / "baselines").glob("*/test_fam.json"))).read_text())["metrics"]
    canary = stored["test_fam.py::moeperf_canary::cpu_stream"]
    # one run per update, each the median of the update's readings (before the file's tests and after them)
    assert [run["median"] for run in canary["runs"]] == [1000.0, 1002.0, 998.0]
    assert canary["unit"] == "us" and canary["better"] == "lower"
    assert len(stored["test_fam.py::test_op[c0]::time"]["runs"]) == 3


def test_a_family_that_moves_with_the_canary_is_inconclusive_cause_machine(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                                            family) -> None:
    result = _judge(family, CANARY="1.15", FAMILY="1.15")
    assert result.ret == pytest.ExitCode.OK  # each test passed: the canary moved slower, so its end decides
    result.assert_outcomes(passed=8)
    verdicts = _verdicts(pytester.path / "r.json")
    cases = {k: v for k, v in verdicts.items() if not is_canary(k)}
    assert {v["verdict"] for v in cases.values()} == {"INCONCLUSIVE"}
    assert {v["cause"] for v in cases.values()} == {Cause.MACHINE}
    reason = cases["test_fam.py::test_op[c3]::time"]["reason"]
    assert "+15.0 %" in reason and "against 100 us over 3 stored runs" in reason and "8 of 8 cases" in reason
    canary = verdicts["test_fam.py::moeperf_canary::cpu_compute"]
    assert canary["verdict"] == "INCONCLUSIVE" and canary["change"] == pytest.approx(0.15)
    result.stdout.fnmatch_lines(["*Machine: the canary beside each test file*",
                                 "test_fam.py*cpu_compute*115*100*3*+15.0 %*moved*8 INCONCLUSIVE, 0 decided*",
                                 "moeperf: machine: the canary moved beyond its stored spread*8 verdict(s)*"])


def test_a_family_that_moves_alone_is_regressed(pytester: pytest.Pytester, family) -> None:  # type: ignore[no-untyped-def]
    result = _judge(family, FAMILY="1.15")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=8)  # each test fails at once: the canary beside it did not move
    verdicts = _verdicts(pytester.path / "r.json")
    assert {v["verdict"] for k, v in verdicts.items() if not is_canary(k)} == {"REGRESSED"}
    assert {v["verdict"] for k, v in verdicts.items() if is_canary(k)} == {"PASS"}


def test_one_case_beyond_the_machines_move_stays_regressed(pytester: pytest.Pytester, family) -> None:  # type: ignore[no-untyped-def]
    result = _judge(family, CANARY="1.10", FAMILY="1.10", SLOW_c5="1.15")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # its test passed (the canary moved); the session fails
    result.assert_outcomes(passed=8)
    verdicts = _verdicts(pytester.path / "r.json")
    slow = verdicts["test_fam.py::test_op[c5]::time"]
    assert slow["verdict"] == "REGRESSED" and "moved +15.0 % beyond that move: decided" in slow["reason"]
    assert {v["verdict"] for k, v in verdicts.items() if "c5" not in k and not is_canary(k)} == {"INCONCLUSIVE"}
    result.stdout.fnmatch_lines(["moeperf: 1 metric(s) REGRESSED beyond the machine's move*the session fails"])


def test_a_canary_move_the_family_does_not_share_leaves_it_decided(pytester: pytest.Pytester, family) -> None:  # type: ignore[no-untyped-def]
    result = _judge(family, CANARY="1.40", FAMILY="1.15")  # the family moved less than half the canary's move
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    verdicts = _verdicts(pytester.path / "r.json")
    case = verdicts["test_fam.py::test_op[c0]::time"]
    assert case["verdict"] == "REGRESSED" and "did not move with it" in case["reason"]


def test_an_update_stores_the_machines_other_state_with_its_canary(pytester: pytest.Pytester, family) -> None:  # type: ignore[no-untyped-def]
    # another sitting: the machine and the family 4 % slower (no machine shift: below 5 %); an update is meant to
    # store that state, and the canary's figure beside it widens the spread its later moves are judged against
    path = next((pytester.path / "baselines").glob("*/test_fam.json"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CANARY", "1.04")
        mp.setenv("FAMILY", "1.04")
        assert family("--moeperf-canary", "on", "--moeperf-update", "--moeperf-history", "off").ret == 0
    stored = json.loads(path.read_text())["metrics"]
    assert len(stored["test_fam.py::test_op[c0]::time"]["runs"]) == 4
    assert [r["median"] for r in stored["test_fam.py::moeperf_canary::cpu_stream"]["runs"]] == [1000.0, 1002.0,
                                                                                                998.0, 1040.0]


def test_a_sub_family_moves_with_the_canary_where_its_whole_family_does_not(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sub=SUBFAMILIES.format(mark='@pytest.mark.moeperf_family("dtype")'))
    _record(run_moeperf, monkeypatch)
    assert _judge(run_moeperf, CANARY="1.15", FAMILY="1.15").ret == pytest.ExitCode.OK
    verdicts = _verdicts(pytester.path / "r.json")
    bf16 = {v["verdict"] for k, v in verdicts.items() if "bf16" in k}
    assert bf16 == {"INCONCLUSIVE"}
    assert "test_sub.py time [dtype=bf16] moved +15.0 %" in verdicts["test_sub.py::test_gemm[bf16-0]::time"]["reason"]
    assert {v["verdict"] for k, v in verdicts.items() if "int4" in k} == {"PASS"}
    # the same cases without the marker: half a family moved, which is not the canary's move for its other half
    pytester.makepyfile(test_sub=SUBFAMILIES.format(mark=""))
    assert _judge(run_moeperf, CANARY="1.15", FAMILY="1.15").ret == pytest.ExitCode.TESTS_FAILED
    verdicts = _verdicts(pytester.path / "r.json")
    assert {v["verdict"] for k, v in verdicts.items() if "bf16" in k} == {"REGRESSED"}


def test_the_canary_has_a_series_in_the_history(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fam=FAMILY)
    for canary in ("1", "1.2"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CANARY", canary)
            assert run_moeperf("--moeperf-canary", "on", "--moeperf-history", "h.sqlite").ret == 0
    with sqlite3.connect(pytester.path / "h.sqlite") as db:
        rows = db.execute("SELECT m.median, m.status FROM moeperf_metrics m WHERE m.test_id = ? AND m.name = ? "
                          "ORDER BY m.run_id", ("test_fam.py::moeperf_canary", "cpu_stream")).fetchall()
    assert rows == [(1000.0, "NEW"), (1200.0, "NEW")]


def test_readings_of_rounds_and_xdist_workers_reach_the_store(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fam=FAMILY)
    assert run_moeperf("--moeperf-canary", "on", "--moeperf-update", "--moeperf-rounds", "2").ret == 0
    path = next((pytester.path / "baselines").glob("*/test_fam.json"))
    runs = json.loads(path.read_text())["metrics"]["test_fam.py::moeperf_canary::cpu_compute"]["runs"]
    assert len(runs) == 2  # one per round, as every metric's
    assert run_moeperf("--moeperf-canary", "on", "--moeperf-update", "-n", "2").ret == 0
    runs = json.loads(path.read_text())["metrics"]["test_fam.py::moeperf_canary::cpu_compute"]["runs"]
    assert len(runs) == 3 and runs[-1]["n"] >= 6  # the workers' readings (before and after their share), pooled


def test_the_canary_is_off_on_request(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_fam=FAMILY)
    assert run_moeperf("--moeperf-update").ret == 0  # run_moeperf: --moeperf-canary off
    stored = json.loads(next((pytester.path / "baselines").glob("*/test_fam.json")).read_text())["metrics"]
    assert not any(is_canary(k) for k in stored)


# ------------------------------------------------------------------------------------------ the pure rule
def _canary(change: float, stored: tuple[float, ...] = (100.0, 101.0, 99.0), file: str = "t.py") -> CanaryMove:
    current = 100.0 * (1 + change)
    return CanaryMove(file, "cpu_stream", current, (current,), (current,), stored)


def _case(i: int, change: float, status: Status = Status.PASS, *, better: str = "lower", mde: float = 0.05,
          cause: str = "") -> Verdict:
    value = 1.0 + change
    return Verdict(f"t.py::test_k[c{i}]::time", "time", "us", better, status, summarize([value]), (value,),
                   reference=1.0, runs=3, change=change, mde=mde, cause=cause)


def _family(changes: list[float], flagged: dict[int, Status]) -> dict[str, Verdict]:
    return {v.key: v for v in (_case(i, c, flagged.get(i, Status.PASS)) for i, c in enumerate(changes))}


def test_the_canary_moved_beyond_its_spread_and_every_stored_figure() -> None:
    assert _canary(0.10).moved and _canary(-0.10).moved
    assert not _canary(0.025).moved  # within the 3 % floor however tight its stored figures
    wide = (100.0, 110.0, 90.0, 105.0, 95.0)  # spread 7.4 %: 3 spreads are 22 %
    assert not _canary(0.15, wide).moved and _canary(0.25, wide).moved
    assert not _canary(0.05, (100.0, 100.0, 106.0)).moved  # beyond 3 % but not beyond every stored figure
    learning = _canary(0.5, (100.0, 100.0))
    assert not learning.moved and learning.state == "learning (2 of 3 runs)" and learning.reference is None


def test_a_figure_is_the_median_of_its_rounds() -> None:
    readings = [Reading("t.py", "w", (1.0, 2.0, 3.0), "before", "round 1/2"),
                Reading("t.py", "w", (3.0, 5.0), "after", "round 1/2"),
                Reading("t.py", "w", (10.0,), "before", "round 2/2")]
    (move,) = canary_moves(readings, {key_of("t.py", "w"): (1.0, 2.0, 3.0)})
    assert move.rounds == (3.0, 10.0) and move.current == 6.5 and move.reference == 2.0


def test_a_family_matches_in_direction_and_comparable_size_only() -> None:
    flagged = {0: Status.REGRESSED}
    moved = _family([0.12] * 6, flagged)
    for canary, explained in ((0.10, True), (0.065, True), (0.05, False), (0.30, False), (-0.10, False)):
        changed, _ = machine_verdicts(moved, {}, [_canary(canary)])
        verdict = changed["t.py::test_k[c0]::time"]
        assert (verdict.cause == Cause.MACHINE) is explained, canary
        assert verdict.status is (Status.INCONCLUSIVE if explained else Status.REGRESSED)


def test_five_cases_pass_the_sign_test_and_a_smaller_family_must_be_unanimous() -> None:
    flagged, key = {0: Status.REGRESSED}, "t.py::test_k[c0]::time"
    five, (match,) = machine_verdicts(_family([0.10] * 5, flagged), {}, [_canary(0.10)])
    assert five[key].cause == Cause.MACHINE and match.tested and "sign test p = 0.031" in five[key].reason
    # four cases cannot pass a sign test at 0.05 (1/16): all four the canary's way, of its size, are its move
    four, (match,) = machine_verdicts(_family([0.10] * 4, flagged), {}, [_canary(0.10)])
    assert four[key].cause == Cause.MACHINE and not match.tested
    assert "all 4 of its case(s), too few for a sign test at 0.05" in four[key].reason
    # the spec-decode engine_step_ms of a clean-clone CI run: +43.2 % (REGRESSED, mde 21.4 %) beside +13.5, +37.6
    # and +19.2 %, while the compute canary beside the file read +53.7 %
    seen = _family([0.432, 0.135, 0.376, 0.192], flagged)
    seen[key] = dataclasses.replace(seen[key], mde=0.214)
    changed, _ = machine_verdicts(seen, {}, [_canary(0.537)])
    assert changed[key].status is Status.INCONCLUSIVE and changed[key].cause == Cause.MACHINE
    # one case of four against the canary's way: no agreement, decided; so is one case of a different size
    split, _ = machine_verdicts(_family([0.10] * 3 + [-0.02], flagged), {}, [_canary(0.10)])
    assert split[key].status is Status.REGRESSED and "did not move with it" in split[key].reason
    alone, _ = machine_verdicts(_family([0.10], flagged), {}, [_canary(0.30)])
    assert alone[key].status is Status.REGRESSED
    alone, _ = machine_verdicts(_family([0.10], flagged), {}, [_canary(0.12)])
    assert alone[key].cause == Cause.MACHINE
    # four of six the canary's way, two the other way: one-sided p = 22/64, not an agreement
    mixed, _ = machine_verdicts(_family([0.10] * 4 + [-0.10] * 2, flagged), {}, [_canary(0.10)])
    assert mixed[key].status is Status.REGRESSED


def test_a_case_beyond_its_familys_move_and_a_gross_change_stay_decided() -> None:
    family = _family([0.10] * 7 + [0.10 * 1.15 + 0.15], {7: Status.REGRESSED})  # x1.15 on one case of +10 %
    changed, (match,) = machine_verdicts(family, {}, [_canary(0.10)])
    assert changed["t.py::test_k[c7]::time"].status is Status.REGRESSED
    assert (match.explained, match.stands, match.cases, match.with_canary) == (0, 1, 8, 8)
    assert math.expm1(match.move) == pytest.approx(0.10)
    big = _case(9, 2.5, Status.REGRESSED, cause=Cause.GROSS)
    gross = {**_family([0.10] * 7, {}), big.key: big}
    changed, _ = machine_verdicts(gross, {}, [_canary(0.10)])
    assert changed["t.py::test_k[c9]::time"].status is Status.REGRESSED
    assert "a gross change" in changed["t.py::test_k[c9]::time"].reason


def test_a_faster_machine_explains_improvements_and_a_case_smaller_than_the_move() -> None:
    family = {v.key: v for v in [_case(i, -0.10, Status.IMPROVED if i < 2 else Status.PASS) for i in range(6)]}
    family["t.py::test_k[c6]::time"] = _case(6, -0.06, Status.IMPROVED)  # less than the family's move: explained
    family["t.py::test_k[c7]::time"] = _case(7, 0.08, Status.REGRESSED)  # against the machine: decided
    changed, _ = machine_verdicts(family, {}, [_canary(-0.10)])
    assert {k for k, v in changed.items() if v.cause == Cause.MACHINE} == {
        "t.py::test_k[c0]::time", "t.py::test_k[c1]::time", "t.py::test_k[c6]::time"}
    assert changed["t.py::test_k[c7]::time"].status is Status.REGRESSED
    higher = {k: _case(i, -0.10, Status.REGRESSED if i == 0 else Status.PASS, better="higher") for i, k in
              enumerate(f"t.py::test_k[c{i}]::time" for i in range(6))}  # a throughput fell: slower
    changed, _ = machine_verdicts(higher, {}, [_canary(0.11)])
    assert changed["t.py::test_k[c0]::time"].cause == Cause.MACHINE


def test_a_sub_family_is_judged_when_it_has_five_cases_else_its_whole_family() -> None:
    cases = _family([0.10] * 5 + [0.0] * 5, {0: Status.REGRESSED})
    subfamilies = {k: ("dtype=bf16" if i < 5 else "dtype=int4") for i, k in enumerate(cases)}
    changed, (match,) = machine_verdicts(cases, subfamilies, [_canary(0.10)])
    assert changed["t.py::test_k[c0]::time"].cause == Cause.MACHINE and match.subfamily == "dtype=bf16"
    small = {k: s for i, (k, s) in enumerate(subfamilies.items()) if i < 4 or i >= 5}
    changed, _ = machine_verdicts({k: cases[k] for k in small}, small, [_canary(0.10)])
    assert changed["t.py::test_k[c0]::time"].status is Status.REGRESSED  # 4 bf16 cases: the whole family decides


def test_a_regression_waits_for_the_sessions_end_only_beside_a_slower_canary() -> None:
    assert moved_slower([_canary(0.10)], "t.py") is not None
    assert moved_slower([_canary(-0.10), _canary(0.01)], "t.py") is None
    assert moved_slower([_canary(0.10, file="u.py")], "t.py") is None
    assert machine.machine_section([], []) == [] and machine.machine_notes([_canary(0.0)], []) == []


# ------------------------------------------------------------------------------------------ the workloads
def test_the_real_cpu_workloads_read_and_release() -> None:
    workloads = cpu_workloads(None, size=8 << 20)
    canary = Canary(lambda: workloads)
    readings = canary.read("t.py", "before")
    assert [(r.workload, len(r.samples)) for r in readings] == [("cpu_compute", 3), ("cpu_stream", 3)]
    assert all(x > 0 for r in readings for x in r.samples)
    assert canary.drain() == readings and canary.pending == []
    canary.close()


def test_a_broken_workload_is_dropped_and_named_never_failing_a_test() -> None:
    def broken() -> list[float]:
        raise RuntimeError("no GPU after all")

    canary = Canary(lambda: [Workload("gpu_gemm", broken), Workload("fixed", lambda: [5.0])])
    assert [r.workload for r in canary.read("t.py", "before")] == ["fixed"]
    assert canary.problems == ["canary workload gpu_gemm dropped: RuntimeError: no GPU after all"]
    assert [r.workload for r in canary.read("t.py", "after")] == ["fixed"]
    assert len(canary.problems) == 1


def test_a_fresh_host_reads_its_canary_against_the_hosts_that_recorded(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI machine that recorded nothing: its metrics are judged against the hosts that recorded them, and so is its
    canary (this host has no figures of its own), so a sub-family slower in step with the canary is the machine (it
    read REGRESSED: the canary stayed learning), and the same sub-family slower alone is still REGRESSED."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sub=SUBFAMILIES.format(mark='@pytest.mark.moeperf_family("dtype")'))
    for host, jitter in (("rec-a", "0"), ("rec-b", "0.002"), ("rec-c", "-0.002")):
        monkeypatch.setenv("JITTER", jitter)
        assert run_moeperf("--moeperf-canary", "on", "--moeperf-update", "--moeperf-history", "off",
                           "--moeperf-host-id", host).ret == 0
    monkeypatch.setenv("JITTER", "0")
    moved = _judge(run_moeperf, CANARY="1.15", FAMILY="1.15", PYTEST_ADDOPTS="--moeperf-host-id ci")
    assert moved.ret == pytest.ExitCode.OK, moved.stdout.str()
    verdicts = _verdicts(pytester.path / "r.json")
    assert {v["cause"] for k, v in verdicts.items() if "bf16" in k} == {Cause.MACHINE}
    assert "over 3 stored runs of other hosts" in verdicts["test_sub.py::test_gemm[bf16-0]::time"]["reason"]
    alone = _judge(run_moeperf, FAMILY="1.15", PYTEST_ADDOPTS="--moeperf-host-id ci")
    assert alone.ret == pytest.ExitCode.TESTS_FAILED
    assert {v["verdict"] for k, v in _verdicts(pytester.path / "r.json").items() if "bf16" in k} == {"REGRESSED"}
