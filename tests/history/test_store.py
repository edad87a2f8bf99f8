"""The history store on SQLite and on a real PostgreSQL server: round trip, one transaction per session,
migrations, and the queries the CLI and a noise model use."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pytest_moeperf.history.records import MetricRecord, SessionRecord, records_from_report
from pytest_moeperf.history.store import SCHEMA_VERSION, HistoryError, HistoryStore, match_keys
from pytest_moeperf.history.targets import parse_target, redact, sqlite_path
from tests.history.sessions import KEY, report_doc


def test_a_session_reads_back_as_written(target: str) -> None:
    run, metrics = records_from_report(report_doc(0, {KEY: 104.0, "t.py::test_x::tflops": 55.5}), "2026-11-01T00:00Z")
    with HistoryStore.open(target) as store:
        run_id = store.append(run, metrics)
        [stored] = store.runs()
        assert stored.id == run_id and stored.run == run and (stored.metrics, stored.regressed) == (2, 0)
        assert store.keys() == sorted([KEY, "t.py::test_x::tflops"])
        [point] = store.series(KEY)
        assert point.metric == metrics[0] and point.run.run == run
        assert point.metric.change == pytest.approx(0.04) and point.metric.baseline == 100.0


def test_a_failed_session_write_stores_nothing(target: str) -> None:
    run, metrics = records_from_report(report_doc(0, {KEY: 100.0}))
    with HistoryStore.open(target) as store:
        store.append(run, metrics)
        with pytest.raises(HistoryError, match="cannot write history"):
            store.append(run, metrics + metrics)  # the same metric twice: the primary key refuses the second row
        assert [r.metrics for r in store.runs()] == [1], "the run row of the failed session was rolled back"


def test_schema_is_created_once_and_a_newer_one_is_refused(target: str) -> None:
    with HistoryStore.open(target) as store:
        assert store.version() == SCHEMA_VERSION
    with HistoryStore.open(target) as store:  # reopening migrates nothing twice
        assert store.version() == SCHEMA_VERSION
        store.conn.execute(store._sql("INSERT INTO moeperf_schema (version) VALUES (?)"), (SCHEMA_VERSION + 1,))
    with pytest.raises(HistoryError, match="upgrade pytest-moeperf"):
        HistoryStore.open(target)


def test_runs_filter_and_limit_and_recent_accepted_values(target: str) -> None:
    other = {"fingerprint": "8x-h200-nvlink", "hash": "fedcba987654"}
    with HistoryStore.open(target) as store:
        for i, (value, status) in enumerate([(100.0, "PASS"), (130.0, "REGRESSED"), (101.0, "PASS"),
                                             (99.0, "IMPROVED")]):
            store.append(*records_from_report(report_doc(i, {KEY: value}, status=status)))
        store.append(*records_from_report(report_doc(9, {KEY: 50.0}, fingerprint=other)))
        assert [r.regressed for r in store.runs()] == [0, 1, 0, 0, 0]
        assert [r.run.fingerprint for r in store.runs(limit=2)] == ["cpu-2c-test", "8x-h200-nvlink"]
        assert len(store.runs("8x-h200-nvlink")) == len(store.runs("fedcba987654")) == 1
        recent = store.recent(KEY, "0123456789ab", limit=2)
        assert [m.median for m in recent] == [99.0, 101.0], "newest first, regressions and other machines left out"
        assert [p.metric.median for p in store.series(KEY, "8x-h200-nvlink")] == [50.0]


def test_a_sqlite_history_is_a_plain_file_other_tools_read(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "h.sqlite"
    with HistoryStore.open(f"sqlite:///{path}") as store:
        store.append(SessionRecord(finished="2026-11-01T00:00:00+00:00", fingerprint="f", fingerprint_hash="h"),
                     [MetricRecord("a.py::t", "m", "s", "lower", 1.0, 1, 0.0, "NEW")])
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT test_id, name, status FROM moeperf_metrics").fetchall() == [("a.py::t", "m", "NEW")]


def test_an_unreachable_postgresql_is_a_history_error(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(HistoryError, match="cannot open history postgresql://moeperf:\\*\\*\\*@"):
        HistoryStore.open(f"postgresql://moeperf:secret@/db?host={tmp_path}&port=1&connect_timeout=2")


def test_targets_and_keys() -> None:
    assert parse_target("off") is None and parse_target(" OFF ") is None
    assert parse_target("history.sqlite") == "history.sqlite"
    assert parse_target("postgresql://u@h/db") == "postgresql://u@h/db"
    with pytest.raises(ValueError, match="postgresql://"):
        parse_target("mysql://u@h/db")
    assert sqlite_path("sqlite:////abs/h.sqlite") == Path("/abs/h.sqlite")
    assert redact("postgresql://u:pw@h:5432/db") == "postgresql://u:***@h:5432/db"


@pytest.mark.parametrize(("target", "shown"), [
    ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
    ("postgresql://u@h/db?password=pw&sslmode=require", "postgresql://u@h/db?password=***&sslmode=require"),
    ("postgres://h/db?user=u&sslpassword=pw", "postgres://h/db?user=u&sslpassword=***"),
    ("postgresql:///db?host=/run/pg&PASSWORD=pw", "postgresql:///db?host=/run/pg&PASSWORD=***"),
    ("postgresql://h/db?pass%77ord=pw", "postgresql://h/db?pass%77ord=***"),  # libpq decodes the key too
    ("postgresql://u:p%40w@h/db?password=p:w@x", "postgresql://u:***@h/db?password=***"),
    ("postgresql://h/db?application_name=a@b", "postgresql://h/db?application_name=a@b"),
    ("history.sqlite", "history.sqlite"),
])
def test_a_password_is_never_shown(target: str, shown: str) -> None:
    """In the user information and in the query (``?password=``, ``sslpassword=``): issue 22, item 9."""
    assert redact(target) == shown


def test_a_session_never_prints_the_password_of_its_history(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                            tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    pytester.makepyfile("def test_t(perf):\n    perf.record('t', [1.0, 1.1, 0.9], unit='us')\n")
    url = f"postgresql://moeperf@/db?host={tmp_path}&port=1&connect_timeout=2&password=hunter2&sslpassword=hunter3"
    result = run_moeperf("--moeperf-history", url, "-W", "always")
    result.assert_outcomes(passed=1)
    output = result.stdout.str() + result.stderr.str()
    assert "moeperf history not written: cannot open history postgresql://moeperf@/db?" in output, output
    assert "password=***" in output and "sslpassword=***" in output
    assert "hunter" not in output, output
    keys = ["a.py::t[bf16-4096]::tflops", "a.py::t[fp8-4096]::tflops", "b.py::u::latency"]
    assert match_keys(keys, ["a.py::t[bf16-4096]::tflops"]) == [keys[0]], "brackets are no character class"
    assert match_keys(keys, ["*::tflops", "latency"]) == [keys[0], keys[1], keys[2]]
    assert match_keys(keys, ["nothing"]) == []


def test_concurrent_sessions_each_write_whole(target: str) -> None:
    """Four writers open a new history at once (each migrates) and append five sessions each: nothing is lost or
    interleaved, as on runners sharing one PostgreSQL or jobs sharing one SQLite file."""
    from concurrent.futures import ThreadPoolExecutor

    def writer(number: int) -> list[int]:
        with HistoryStore.open(target) as store:
            return [store.append(*records_from_report(report_doc(number * 10 + i, {KEY: 100.0 + number,
                                                                                    f"t.py::w{number}::m": 1.0})))
                    for i in range(5)]

    with ThreadPoolExecutor(4) as pool:
        ids = [run_id for batch in pool.map(writer, range(4)) for run_id in batch]
    assert len(set(ids)) == 20
    with HistoryStore.open(target) as store:
        assert store.version() == SCHEMA_VERSION
        assert [r.metrics for r in store.runs()] == [2] * 20
        assert sorted(p.metric.median for p in store.series(KEY)) == sorted([100.0 + n for n in range(4)] * 5)


def test_plugin_side_targets(tmp_path: Path) -> None:
    from pytest_moeperf.history.plugin import default_target, parse_history_option, resolve_target

    baselines = tmp_path / "repo" / "baselines"
    assert resolve_target(None, baselines) == default_target(baselines) == str(
        tmp_path / "repo" / ".moeperf" / "history.sqlite")
    assert resolve_target(parse_history_option("Off"), baselines) is None
    assert resolve_target(parse_history_option("postgresql://ci@db/perf"), baselines) == "postgresql://ci@db/perf"
    assert parse_history_option("sqlite:///h.sqlite") == parse_history_option("h.sqlite") == Path("h.sqlite")
    assert resolve_target(tmp_path / "h.sqlite", baselines) == str(tmp_path / "h.sqlite")
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="sqlite:///PATH"):
        parse_history_option("http://example.invalid/history")
