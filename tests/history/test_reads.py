"""Reads never write (issue 37, items 5 and 6): ``moeperf history list|show``, ``moeperf trend`` and ``moeperf
dashboard`` open the history read-only and never migrate it, so a foreign database is refused untouched, an older
schema is refused with what upgrades it, a history on read-only media reads, and a read goes on while another
process holds a write transaction. Real SQLite files, real processes, a real PostgreSQL."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf import cli
from pytest_moeperf.history.records import records_from_report
from pytest_moeperf.history.store import SCHEMA_VERSION, HistoryError, HistoryStore
from tests.history.sessions import KEY, report_doc

READS = {"list": ["history", "list"], "show": ["history", "show", "latency"], "trend": ["trend", "latency"]}


def moeperf(target: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``moeperf ARGV --db TARGET`` as a process of its own."""
    return subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", *argv, "--db", target], capture_output=True,
                          text=True, timeout=timeout)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def store_sessions(target: str, count: int = 3) -> None:
    with HistoryStore.open(target) as store:
        for i in range(count):
            store.append(*records_from_report(report_doc(i, {KEY: 100.0 + i})))


def every_read(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[int, str]]:
    """Exit status and stderr of each reading command on ``target``, run in this process."""
    found = []
    for argv in [*READS.values(), ["dashboard", "--out", str(tmp_path / "site")]]:
        status = cli.main([*argv, "--db", target])
        found.append((status, capsys.readouterr().err))
    return found


@pytest.mark.parametrize("content", ["foreign", "empty"])
def test_a_foreign_or_empty_sqlite_file_is_refused_and_left_as_it_was(tmp_path: Path, content: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / f"{content}.sqlite"
    path.touch()
    if content == "foreign":
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("CREATE TABLE mine (a TEXT)")
            conn.execute("INSERT INTO mine VALUES ('kept')")
    before = digest(path)
    for status, err in every_read(str(path), tmp_path, capsys):
        assert status == 2 and "holds no moeperf history (no moeperf_schema table), and a read adds none" in err, err
    assert digest(path) == before and sorted(os.listdir(tmp_path)) == [path.name], "not a byte, not a file more"


def test_a_postgresql_database_without_a_history_is_refused_and_left_as_it_was(
        pg_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for status, err in every_read(pg_target, tmp_path, capsys):
        assert status == 2 and "holds no moeperf history" in err, err
    with HistoryStore._connect(pg_target, read_only=True) as store:
        assert store.schema() is None, "no moeperf table was made by a read"


def test_a_postgresql_read_is_a_read_only_transaction(pg_target: str) -> None:
    store_sessions(pg_target, 1)
    with HistoryStore.read(pg_target) as store, pytest.raises(Exception, match="read-only transaction"):
        store.conn.execute("DELETE FROM moeperf_runs")
    with HistoryStore.read(pg_target) as store:
        assert len(store.runs()) == 1


def _downgrade(target: str) -> None:
    """Make ``target`` a history of schema 2, as a version before the reasons column wrote it."""
    with HistoryStore.open(target) as store:
        store.conn.execute("ALTER TABLE moeperf_metrics DROP COLUMN reason")
        store.conn.execute("DELETE FROM moeperf_schema WHERE version = 3")


def test_an_older_schema_is_refused_by_reads_and_upgraded_on_request(target: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    store_sessions(target)
    _downgrade(target)
    for status, err in every_read(target, tmp_path, capsys):
        assert status == 2, err
        assert "has schema 2, older than this moeperf's 3, and a read does not upgrade it: `moeperf history --db " \
               in err and " upgrade` does, as does the next pytest session that records to it" in err, err
    with HistoryStore.read(target, current=False) as store:
        assert store.version() == 2, "no read migrated it"
    assert cli.main(["history", "--db", target, "upgrade"]) == 0
    assert capsys.readouterr().out.endswith(f": schema 2 upgraded to {SCHEMA_VERSION}\n")
    assert cli.main(["history", "--db", target, "list"]) == 0
    assert capsys.readouterr().out.startswith("3 run(s) in ")
    assert cli.main(["history", "--db", target, "upgrade"]) == 0
    assert capsys.readouterr().out.endswith(f": schema {SCHEMA_VERSION}, current (this moeperf's is 3)\n")


def test_upgrade_refuses_what_is_not_a_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "foreign.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE mine (a TEXT)")
    before = digest(path)
    assert cli.main(["history", "--db", str(path), "upgrade"]) == 2
    assert "holds no moeperf history" in capsys.readouterr().err and digest(path) == before
    assert cli.main(["history", "--db", str(tmp_path / "absent.sqlite"), "upgrade"]) == 2
    assert "no history at" in capsys.readouterr().err and not (tmp_path / "absent.sqlite").exists()


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` on read-only media: a read-only bind mount of itself (as root, whom permissions do not stop),
    else its write permission taken away."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"root without the right to mount, so no read-only media here: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        assert not os.access(folder, os.W_OK)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True, capture_output=True)


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_a_history_on_read_only_media_reads(tmp_path: Path, journal: str) -> None:
    """A history read from a folder nothing can write to: a WAL database (as sessions write it now) needs a
    shared-memory file SQLite cannot make there, so the read falls back to an immutable open; one in rollback
    journal mode (as older versions wrote it) reads as it is."""
    media = tmp_path / "media"
    media.mkdir()
    target = str(media / "history.sqlite")
    store_sessions(target)
    with contextlib.closing(sqlite3.connect(target)) as conn:
        assert conn.execute(f"PRAGMA journal_mode = {journal}").fetchone() == (journal,)
    with read_only(media):
        for name, argv in READS.items():
            done = moeperf(target, *argv)
            assert done.returncode == 0, (name, done.stderr)
        assert moeperf(target, "history", "list").stdout.startswith("3 run(s) in ")
        done = moeperf(target, "dashboard", "--out", str(tmp_path / "site"))
        assert done.returncode == 0, done.stderr


HOLD = """
import sys
from pytest_moeperf.history.records import records_from_report
from pytest_moeperf.history.store import HistoryStore
from tests.history.sessions import KEY, report_doc

store = HistoryStore.open(sys.argv[1])  # the writer's open, as a session's end
store.conn.execute("BEGIN IMMEDIATE")  # a session's write transaction, held open
store.conn.execute("INSERT INTO moeperf_runs (finished, git_dirty, host, fingerprint, fingerprint_hash, versions) "
                   "VALUES ('2026-12-31T00:00:00+00:00', 0, 'h', 'uncommitted', 'u', '{}')")
print("holding", flush=True)
sys.stdin.read()
store.conn.execute("ROLLBACK")
"""


def test_reads_go_on_while_another_process_holds_a_write_transaction(tmp_path: Path) -> None:
    target = str(tmp_path / "history.sqlite")
    store_sessions(target)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parents[2])
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        for argv in [*READS.values(), ["dashboard", "--out", str(tmp_path / "site")]]:
            start = time.monotonic()
            try:
                done = moeperf(target, *argv, timeout=20)  # a read that waits for the writer waited 30 s
            except subprocess.TimeoutExpired:
                pytest.fail(f"moeperf {' '.join(argv)} waited for the writer (20 s and more)")
            assert done.returncode == 0, (argv, done.stderr)
            assert time.monotonic() - start < 15, argv
            if argv[:2] == ["history", "list"]:
                assert done.stdout.startswith("3 run(s) in ") and "uncommitted" not in done.stdout
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=30)
    assert holder.returncode == 0


def test_a_missing_history_is_not_created_by_a_read(tmp_path: Path) -> None:
    for opening in (HistoryStore.read, HistoryStore.upgrade):
        with pytest.raises(HistoryError, match="no history at"):
            opening(str(tmp_path / "deep" / "absent.sqlite"))
    assert list(tmp_path.iterdir()) == []
