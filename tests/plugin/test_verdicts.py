"""The verdict rules through real pytest sessions: masking, confirmation, MISSING, strict, unit changes, bad
markers, interrupted updates, the health gate's record, fingerprint mismatches and ``--moeperf-rounds``."""

from __future__ import annotations

import importlib.util
import json
from importlib import metadata
from pathlib import Path

import pytest

# A synthetic test: its samples are scaled by MOEPERF_TEST_SCALE (or, for round k of the test in this session,
# by the k-th value of MOEPERF_TEST_SCALES); every call is counted in calls.txt.
SYNTHETIC = """
import os, pytest
from pathlib import Path

def scale():
    calls = Path("calls.txt")
    n = len(calls.read_text().splitlines()) if calls.exists() else 0
    with calls.open("a") as handle:
        handle.write("call\\n")
    per_round = os.environ.get("MOEPERF_TEST_SCALES")
    if per_round:
        values = [float(x) for x in per_round.split(",")]
        return values[min(n, len(values) - 1)]
    return float(os.environ.get("MOEPERF_TEST_SCALE", "1.0"))

def test_latency(perf):
    s = scale()
    perf.record("latency", [10.0 * s, 10.1 * s, 9.9 * s, 10.0 * s, 10.05 * s], unit="ms")

def test_maybe_skipped(perf):
    if os.environ.get("MOEPERF_TEST_SKIP"):
        pytest.skip("backend raises on this box")
    perf.record("gbps", [100.0], unit="GB/s", better="higher")
"""


def calls(pytester: pytest.Pytester) -> int:
    path = pytester.path / "calls.txt"
    count = len(path.read_text().splitlines()) if path.exists() else 0
    path.unlink(missing_ok=True)
    return count


def stored(pytester: pytest.Pytester) -> dict:  # type: ignore[type-arg]
    files = list((pytester.path / "baselines").glob("*/test_syn.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())["metrics"]  # type: ignore[no-any-return]


def record_runs(run_moeperf, pytester: pytest.Pytester, n: int = 3, *args: str) -> None:  # type: ignore[no-untyped-def]
    """``n`` stored runs: one ``--moeperf-update`` session each (a baseline needs 3 before it can decide)."""
    for _ in range(n):
        assert run_moeperf("--moeperf-update", *args).ret == pytest.ExitCode.OK
    calls(pytester)


def test_confirmation_reruns_and_a_persistent_regression_still_fails(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                                     run_moeperf, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_syn=SYNTHETIC)
    pytester.makeini("[pytest]\nmoeperf_history = off\n")  # the baseline's runs alone set the noise here
    run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    assert calls(pytester) == 1  # one call under --moeperf-update (no confirmation)
    record_runs(run_moeperf, pytester, 2)

    monkeypatch.setenv("MOEPERF_TEST_SCALES", "1.5,1.0,1.0")  # one slow round, then normal again
    flaky = run_moeperf("-k", "test_latency")
    flaky.assert_outcomes(passed=1)
    assert calls(pytester) == 3, "the crossing round was re-measured until the verdict settled"
    flaky.stdout.fnmatch_lines(["*test_syn.py::test_latency::latency*PASS"])

    monkeypatch.setenv("MOEPERF_TEST_SCALES", "1.5")
    slow = run_moeperf("-k", "test_latency")
    slow.assert_outcomes(failed=1)
    assert calls(pytester) == 4, "against 3 stored runs the rank test needs 4 rounds: 1 + 3 confirmations"
    slow.stdout.fnmatch_lines(["*latency: baseline 10 ms (3 runs) -> current 15 ms (n=20, 4 rounds)*REGRESSED: "
                               "rank test p = 0.029*"])

    # without the rounds it needs, the change is named and counted, and --moeperf-strict fails it
    budget = run_moeperf("-k", "test_latency", "--moeperf-confirm", "0")
    assert budget.ret == pytest.ExitCode.OK and calls(pytester) == 1
    budget.stdout.fnmatch_lines(["INCONCLUSIVE test_syn.py::test_latency::latency: every round is worse than the "
                                 "threshold, but 1 round(s) against 3 stored runs cannot reach p < 0.05: 4 rounds can "
                                 "— the confirmation budget (0 more round(s)) ended it, not the evidence*",
                                 "*1 metric(s) moved beyond their threshold but are not decided*"])
    assert run_moeperf("-k", "test_latency", "--moeperf-confirm", "0", "--moeperf-strict").ret == \
        pytest.ExitCode.TESTS_FAILED


# A test whose slowness belongs to the process it runs in (set at import, as an allocation's placement or a thread
# pool's state is): the session's own process reads x MOEPERF_TEST_PROCESS_SCALE, a confirmation process (a child
# session: MOEPERF_ROUND set) reads x1.
PER_PROCESS = """
import os
from pathlib import Path

SCALE = 1.0 if os.environ.get("MOEPERF_ROUND") else float(os.environ.get("MOEPERF_TEST_PROCESS_SCALE", "1.0"))

def test_latency(perf):
    with Path("calls.txt").open("a") as handle:
        handle.write(f"{os.getpid()}\\n")
    perf.record("latency", [10.0 * SCALE, 10.1 * SCALE, 9.9 * SCALE, 10.0 * SCALE, 10.05 * SCALE], unit="ms")
"""


def test_confirmation_is_a_fresh_process_so_one_process_s_slowness_is_not_confirmed_by_copies_of_it(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch):
    """Re-runs in the slow process would read x1.5 four times and pass the rank test (the CPU GEMMs' false
    REGRESSED, docs/confirmation.md); fresh processes read x1, and the median of the three rounds passes."""
    pytester.makepyfile(test_syn=PER_PROCESS)
    pytester.makeini("[pytest]\nmoeperf_history = off\n")
    record_runs(run_moeperf, pytester, 3)

    monkeypatch.setenv("MOEPERF_TEST_PROCESS_SCALE", "1.5")
    result = run_moeperf()
    assert result.ret == pytest.ExitCode.OK, "one process's slowness is not a regression"
    pids = (pytester.path / "calls.txt").read_text().split()
    assert len(pids) == 3 and len(set(pids)) == 3, "the call, then two confirmations, each in a process of its own"
    # 1 of 2 round medians beyond (rounds disagree: more can decide), then the median of 3 rounds is within the mde
    result.stdout.fnmatch_lines(["*test_syn.py::test_latency: confirmation 1/3 in a fresh process*",
                                 "*test_syn.py::test_latency: confirmation 2/3 in a fresh process*",
                                 "test_syn.py::test_latency::latency *ms *10 *10 *+0.0 % *3 *PASS"])


def test_an_xdist_worker_starts_no_confirmation_process_and_its_verdict_says_so(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_syn=SYNTHETIC)
    pytester.makeini("[pytest]\nmoeperf_history = off\n")
    record_runs(run_moeperf, pytester, 3)

    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.5")
    result = run_moeperf("-k", "test_latency", "-n", "1")
    assert result.ret == pytest.ExitCode.OK and calls(pytester) == 1
    result.stdout.fnmatch_lines(["INCONCLUSIVE test_syn.py::test_latency::latency: every round is worse than the "
                                 "threshold*— pytest-xdist (a worker starts no confirmation processes; "
                                 "--moeperf-rounds N measures N processes) ended it, not the evidence: raise "
                                 "--moeperf-rounds*"])


def test_a_value_measured_once_is_not_confirmed_by_copies_of_itself(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                                    run_moeperf, monkeypatch: pytest.MonkeyPatch):
    # a server's start-up time comes from a fixture: calling the test again records the same number, and three
    # copies of one value would pass for three rounds (a rank test of 3 against 5 stored runs rejects at p = 0.018)
    pytester.makepyfile(test_once="""
        import os
        def test_startup(perf):
            perf.measured_once("measured when the fixture started")
            with open("calls.txt", "a") as handle:
                handle.write("call\\n")
            perf.record("startup_s", 60.0 * float(os.environ.get("SCALE", "1")), unit="s")
    """)
    record_runs(run_moeperf, pytester, 3)
    monkeypatch.setenv("SCALE", "1.5")
    result = run_moeperf()
    assert calls(pytester) == 1, "no confirmation rounds"
    result.stdout.fnmatch_lines(["*test_once.py::test_startup::startup_s*60*90*+50.0 %*INCONCLUSIVE",
                                 "INCONCLUSIVE *startup_s: every round is worse than the threshold, but 1 round(s) "
                                 "against 3 stored runs cannot reach p < 0.05: 4 rounds can — the confirmation budget "
                                 "(0 more round(s)) ended it, not the evidence: raise --moeperf-rounds (the test is "
                                 "measured once a session: measured when the fixture started)"])


def test_one_lucky_sample_does_not_mask_a_regression(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_mask="""
        import os
        def test_t(perf):
            bad = os.environ.get("BAD")
            perf.record("t", [100, 190, 190, 190, 190] if bad else [100] * 5, unit="ms")
            perf.record("speedup", [1.2, 1.2, 1.2, 1.9] if bad else [1.82] * 4, unit="x", better="higher")
    """)
    record_runs(run_moeperf, pytester, 3)
    monkeypatch.setenv("BAD", "1")
    result = run_moeperf()
    out = result.stdout.str()
    assert "test_mask.py::test_t::t" in out and " PASS" not in out, out
    result.assert_outcomes(failed=1)


def test_missing_metrics_and_strict_mode(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_syn=SYNTHETIC)
    run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    monkeypatch.setenv("MOEPERF_TEST_SKIP", "1")
    result = run_moeperf("--moeperf-report", "r.json", "--moeperf-markdown", "s.md")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK, "MISSING does not fail by default"
    result.stdout.fnmatch_lines(["*1 pass, 1 missing*",
                                 "MISSING test_syn.py::test_maybe_skipped::gbps: test skipped: backend raises*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert [v["key"] for v in doc["moeperf"]["missing"]] == ["test_syn.py::test_maybe_skipped::gbps"]
    assert "MISSING `test_syn.py::test_maybe_skipped::gbps`: test skipped" in (pytester.path / "s.md").read_text()

    strict = run_moeperf("--moeperf-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(["*--moeperf-strict: 1 metric(s) INCONCLUSIVE or MISSING and 0 warning(s): the "
                                 "session fails*"])
    deselected = run_moeperf("--moeperf-strict", "-k", "test_latency")
    assert deselected.ret == pytest.ExitCode.OK and "MISSING" not in deselected.stdout.str()
    if importlib.util.find_spec("xdist") is not None:  # workers' reports reach the controller, which decides
        workers = run_moeperf("-n", "2", "--moeperf-strict")
        assert workers.ret == pytest.ExitCode.TESTS_FAILED
        workers.stdout.fnmatch_lines(["MISSING test_syn.py::test_maybe_skipped::gbps: test skipped: backend raises*"])


def test_a_degenerate_window_names_why_its_other_metrics_are_missing(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    # a coalesced serving window records TTFT but no client TPOT: MISSING says why, not "not recorded this run"
    pytester.makepyfile(test_win="""
        import os
        def test_window(perf):
            perf.record("ttft_ms", [20.0, 21.0, 19.5], unit="ms")
            if os.environ.get("LUMPED"):
                perf.inconclusive("40 of 48 answers arrived in <= 2 SSE chunks (the stream coalesced)")
            else:
                perf.record("tpot_ms", [3.0, 3.1, 2.9], unit="ms")
    """)
    run_moeperf("--moeperf-update", "--moeperf-health", "off").assert_outcomes(passed=1)
    monkeypatch.setenv("LUMPED", "1")
    result = run_moeperf("--moeperf-health", "off", "--moeperf-confirm", "0")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 inconclusive, 1 missing*",
                                 "MISSING test_win.py::test_window::tpot_ms: window: 40 of 48 answers arrived in "
                                 "<= 2 SSE chunks (the stream coalesced)"])


def test_a_degenerate_window_can_spare_the_metrics_it_did_not_disturb(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    # a coalesced stream spoils the client's clock, not the server's counters: acceptance keeps its verdict
    pytester.makepyfile(test_scope="""
        import os
        def test_window(perf):
            slow = float(os.environ.get("SLOW", "1"))
            perf.record("ttft_ms", [20.0 * slow, 21.0 * slow, 19.5 * slow], unit="ms")
            perf.record("acceptance_rate", [0.9], unit="ratio", better="higher")
            if os.environ.get("LUMPED"):
                perf.inconclusive("answers arrived in bursts", only=["ttft_ms"])
    """)
    run_moeperf("--moeperf-update", "--moeperf-health", "off").assert_outcomes(passed=1)
    monkeypatch.setenv("LUMPED", "1")
    monkeypatch.setenv("SLOW", "10")
    result = run_moeperf("--moeperf-health", "off", "--moeperf-confirm", "0")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*1 pass, 1 inconclusive*",
                                 "*test_scope.py::test_window::acceptance_rate*PASS",
                                 "INCONCLUSIVE test_scope.py::test_window::ttft_ms: window: answers arrived in bursts"])


def test_unit_change_fails_the_test_naming_both(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_unit="""
        import os
        def test_t(perf):
            perf.record("t", [10.0], unit=os.environ.get("UNIT", "us"))
    """)
    run_moeperf("--moeperf-update").assert_outcomes(passed=1)
    monkeypatch.setenv("UNIT", "ms")
    result = run_moeperf()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*t: unit or direction changed: baseline 'us' (lower is better), now 'ms'*"])
    run_moeperf("--moeperf-update").assert_outcomes(passed=1)  # an intended change is re-recorded
    run_moeperf().assert_outcomes(passed=1)


#: a test whose workload (context) and value come from the environment
WORKLOAD_TEST = """
    import os
    def test_t(perf):
        perf.context(workload=os.environ.get("WORKLOAD") or None)
        perf.record("t", [float(os.environ.get("T", "10"))], unit="us")
"""


def test_a_changed_workload_is_not_compared_and_its_re_record_starts_afresh(
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_workload=WORKLOAD_TEST)
    for _ in range(3):
        run_moeperf("--moeperf-update").assert_outcomes(passed=1)
    monkeypatch.setenv("WORKLOAD", "outputs spread")
    monkeypatch.setenv("T", "30")  # three times slower, but another workload: no verdict either way
    result = run_moeperf()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*t: workload changed: baseline None, now 'outputs spread'; the numbers cannot be "
                                 "compared: re-record with --moeperf-update*"])
    run_moeperf("--moeperf-update").assert_outcomes(passed=1)  # the re-record keeps none of the old runs
    stored = json.loads(next(pytester.path.glob("baselines/*/test_workload.json")).read_text())
    entry = stored["metrics"]["test_workload.py::test_t::t"]
    assert [r["median"] for r in entry["runs"]] == [30.0] and entry["since"]
    assert entry["context"]["workload"] == "outputs spread"
    run_moeperf().assert_outcomes(passed=1)


def test_a_changed_workload_is_re_recorded_in_rounds_and_named_by_the_parent_when_judged(
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # Seen re-recording the CPU GEMMs timed a new way: each --moeperf-rounds child judged without --moeperf-update
    # (the parent writes), failed every test on the changed workload, and the update wrote nothing.
    pytester.makepyfile(test_workload=WORKLOAD_TEST)
    run_moeperf("--moeperf-update").assert_outcomes(passed=1)
    monkeypatch.setenv("WORKLOAD", "spread")
    result = run_moeperf("--moeperf-rounds", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*t: workload changed: baseline None, now 'spread'*re-record with --moeperf-update*"])
    result = run_moeperf("--moeperf-update", "--moeperf-rounds", "2")
    assert result.ret == 0, result.stdout.str()
    stored = json.loads(next(pytester.path.glob("baselines/*/test_workload.json")).read_text())
    entry = stored["metrics"]["test_workload.py::test_t::t"]
    assert [r["median"] for r in entry["runs"]] == [10.0, 10.0] and entry["context"]["workload"] == "spread"


def test_bad_marker_arguments_error_that_test_only(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.gpus("two")
        def test_gpus():
            pass

        @pytest.mark.moeperf_threshold(tolerance="lots")
        def test_threshold(perf):
            perf.record("t", 1.0, unit="us")

        def test_fine():
            pass
    """)
    result = run_moeperf()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, errors=2)
    assert "INTERNALERROR" not in result.stdout.str()
    result.stdout.fnmatch_lines_random([
        "*test_bad.py::test_gpus: bad marker: gpus: n (the number of GPUs) must be an integer, got 'two'*",
        "*test_bad.py::test_threshold: bad marker: moeperf_threshold: tolerance must be a number, got 'lots'*",
    ])


def test_interrupted_update_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_int="""
        def test_a(perf):
            perf.record("t", 1.0, unit="us")

        def test_b(perf):
            raise KeyboardInterrupt
    """)
    installed = any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(group="pytest11"))
    plugin = () if installed else ("-p", "pytest_moeperf.plugin")
    result = pytester.runpytest(*plugin, "-p", "no:cacheprovider", "--moeperf-baselines",
                                str(pytester.path / "baselines"), "--moeperf-update", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*baselines not updated: the session was interrupted or stopped early*"])
    assert not list(pytester.path.glob("baselines/*/*.json"))


def test_unhealthy_window_is_inconclusive_with_its_reasons(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_syn=SYNTHETIC)
    run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    pytester.makeconftest("""
        import pytest
        from pytest_moeperf.ledger import HealthReport
        from pytest_moeperf.runtime import health_key

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(item, call):
            if call.when == "call":
                item.stash[health_key] = {0: HealthReport(False, ("host: 1.8 foreign cores busy",), {"load": 3.5})}
            return (yield)
    """)
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "2.0")  # x3 would be a gross change, decided by a healthy round
    result = run_moeperf("--moeperf-report", "r.json", "-k", "test_latency")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["INCONCLUSIVE test_syn.py::test_latency::latency: health: host: 1.8 foreign cores*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    (record,) = doc["moeperf"]["records"]
    assert [r["health"]["facts"] for r in record["rounds"]] == [{"load": 3.5}]
    update = run_moeperf("--moeperf-update", "-k", "test_latency")
    update.stdout.fnmatch_lines(["*1 metric(s) not written to the baselines (health: host: 1.8 foreign cores busy): "
                                 "test_syn.py::test_latency::latency*"])
    assert update.ret == pytest.ExitCode.TESTS_FAILED, "an update that wrote nothing it measured fails"
    assert stored(pytester)["test_syn.py::test_latency::latency"]["summary"]["median"] == pytest.approx(10.0)


def test_an_unhealthy_round_drops_its_own_run_from_an_update_not_the_others(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf) -> None:
    # Seen recording the CPU baselines: one round of five had a busy window, and all five runs of that test's
    # metrics were dropped (46 metrics kept their old runs only), so their spread never saw the second sitting.
    pytester.makepyfile(test_syn=SYNTHETIC)
    pytester.makeconftest("""
        import os, pytest
        from pytest_moeperf.ledger import HealthReport
        from pytest_moeperf.runtime import health_key

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(item, call):
            if call.when == "call" and os.environ.get("MOEPERF_ROUND", "").startswith("2/"):
                item.stash[health_key] = {0: HealthReport(False, ("host: 1.8 foreign cores busy",), {})}
            return (yield)
    """)
    update = run_moeperf("--moeperf-update", "--moeperf-rounds", "3", "-k", "test_latency")
    assert update.ret == pytest.ExitCode.OK, update.stdout.str()
    update.stdout.fnmatch_lines(["baselines updated: 1 metric(s)"])
    runs = stored(pytester)["test_syn.py::test_latency::latency"]["runs"]
    assert len(runs) == 2, "rounds 1 and 3; round 2's window failed the gate"


def test_fingerprint_hash_mismatch_is_reported_once(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_syn=SYNTHETIC)
    run_moeperf("--moeperf-update").assert_outcomes(passed=2)
    path = next((pytester.path / "baselines").glob("*/test_syn.json"))
    doc = json.loads(path.read_text())
    doc["fingerprint"]["hash"] = "0000000000"
    path.write_text(json.dumps(doc))
    result = run_moeperf()
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count("fingerprint hash differs") == 1
    strict = run_moeperf("--moeperf-strict")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    strict.stdout.fnmatch_lines(["*INCONCLUSIVE*recorded on a machine with fingerprint hash 0000000000*"])


def test_rounds_run_in_separate_processes_and_update_once(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_syn=SYNTHETIC)
    update = run_moeperf("--moeperf-update", "--moeperf-rounds", "3", "--moeperf-markdown", "s.md")
    assert update.ret == pytest.ExitCode.OK, update.stdout.str()
    update.stdout.fnmatch_lines(["moeperf: round 1/3 ...", "    test_syn.py .. *100%]",  # the child's progress, live
                                 "moeperf: round 1/3 (* s): *2 passed*", "moeperf: round 3/3*",
                                 "*moeperf (3 rounds)*", "baselines updated: 2 metric(s)"])
    assert calls(pytester) == 3
    runs = stored(pytester)["test_syn.py::test_latency::latency"]["runs"]
    assert len(runs) == 3, "one run summary per round, written once"
    assert Path(pytester.path / "s.md").read_text().count("## moeperf") == 1

    monkeypatch.setenv("MOEPERF_TEST_SCALES", "1.5,1.0,1.0")  # one slow process out of three: the parent decides
    one_slow = run_moeperf("--moeperf-rounds", "3", "-k", "test_latency")
    assert one_slow.ret == pytest.ExitCode.OK, one_slow.stdout.str()
    one_slow.stdout.fnmatch_lines(["*test_syn.py::test_latency::latency * 3 * PASS"])
    calls(pytester)
    monkeypatch.delenv("MOEPERF_TEST_SCALES")

    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.5")
    # 3 rounds against 3 stored runs cannot get the rank test below 5 % (its smallest p is 1/C(6,3) = 0.05); 4 can
    slow = run_moeperf("--moeperf-rounds", "4")
    assert slow.ret == pytest.ExitCode.TESTS_FAILED
    slow.stdout.fnmatch_lines(["*test_syn.py::test_latency::latency * 4 * REGRESSED"])
    assert len(stored(pytester)["test_syn.py::test_latency::latency"]["runs"]) == 3, "a plain run writes nothing"
    quiet = run_moeperf("--moeperf-rounds", "2", "-q", "-k", "test_maybe_skipped")
    assert "    test_syn.py" not in quiet.stdout.str(), "-q shows no per-round progress"
