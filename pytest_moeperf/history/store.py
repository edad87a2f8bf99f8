"""The history database: schema, migrations, and the only reader and writer of it.

One SQLite file by default (the stdlib's ``sqlite3``); PostgreSQL when the target is a ``postgresql://`` URL
(``psycopg`` 3, imported only then), so many runners can write one history. Both hold the same tables, prefixed
``moeperf_`` so a shared database can hold other things too; a session is one transaction.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from pytest_moeperf.history.records import MetricRecord, Point, SessionRecord, StoredSession
from pytest_moeperf.history.targets import is_postgresql, redact, scrub, sqlite_path

SCHEMA_VERSION = 3


class HistoryError(RuntimeError):
    """The history database cannot be opened, migrated, read or written."""


@dataclass(frozen=True)
class Dialect:
    name: str
    param: str
    id_column: str
    real: str
    boolean: str


SQLITE = Dialect("sqlite", "?", "INTEGER PRIMARY KEY AUTOINCREMENT", "REAL", "INTEGER")
POSTGRESQL = Dialect("postgresql", "%s", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "DOUBLE PRECISION",
                     "BOOLEAN")

# Each entry moves the schema from version i to i + 1; never edit a released entry, append a new one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE moeperf_runs (
            id {id}, started TEXT, finished TEXT NOT NULL, git_commit TEXT, git_dirty {bool} NOT NULL,
            host TEXT NOT NULL, fingerprint TEXT NOT NULL, fingerprint_hash TEXT NOT NULL, versions TEXT NOT NULL)""",
        """CREATE TABLE moeperf_metrics (
            run_id BIGINT NOT NULL REFERENCES moeperf_runs (id) ON DELETE CASCADE,
            test_id TEXT NOT NULL, name TEXT NOT NULL, unit TEXT NOT NULL, better TEXT NOT NULL,
            median {real} NOT NULL, n INTEGER NOT NULL, iqr {real} NOT NULL, status TEXT NOT NULL,
            change {real}, allowed {real}, baseline {real}, PRIMARY KEY (run_id, test_id, name))""",
        "CREATE INDEX moeperf_metrics_key ON moeperf_metrics (test_id, name)",
        "CREATE INDEX moeperf_runs_fingerprint ON moeperf_runs (fingerprint_hash, finished)",
    ),
    (  # which machine (host id) and which branch a session ran on: noise is learned per host and branch
        "ALTER TABLE moeperf_runs ADD COLUMN host_id TEXT",
        "ALTER TABLE moeperf_runs ADD COLUMN branch TEXT",
    ),
    (  # why each verdict is what it is: the dashboard shows it beside REGRESSED, IMPROVED and INCONCLUSIVE
        "ALTER TABLE moeperf_metrics ADD COLUMN reason TEXT",
    ),
)


_RUN_COLUMNS = "r.id, r.started, r.finished, r.git_commit, r.git_dirty, r.host, r.fingerprint, r.fingerprint_hash, " \
               "r.host_id, r.branch, " \
               "r.versions"
_METRIC_COLUMNS = "m.test_id, m.name, m.unit, m.better, m.median, m.n, m.iqr, m.status, m.change, m.allowed, " \
                  "m.baseline, m.reason"


def _run(row: Sequence[Any], metrics: int = 0, regressed: int = 0) -> StoredSession:
    return StoredSession(id=int(row[0]), metrics=int(metrics or 0), regressed=int(regressed or 0), run=SessionRecord(
        started=row[1], finished=row[2], git_commit=row[3], git_dirty=bool(row[4]), host=row[5], fingerprint=row[6],
        fingerprint_hash=row[7], host_id=row[8], branch=row[9], versions=json.loads(row[10])))


def _metric(row: Sequence[Any]) -> MetricRecord:
    return MetricRecord(test_id=row[0], name=row[1], unit=row[2], better=row[3], median=float(row[4]), n=int(row[5]),
                        iqr=float(row[6]), status=row[7], change=row[8], allowed=row[9], baseline=row[10],
                        reason=row[11])


def match_keys(known: Iterable[str], patterns: Sequence[str]) -> list[str]:
    """Keys named by ``patterns``, in the patterns' order: an exact key, else a glob, else a substring (test ids hold
    ``[`` and ``]``, which a glob reads as a character class, hence exact first)."""
    keys = sorted(set(known))
    chosen: list[str] = []
    for pattern in patterns:
        found = [pattern] if pattern in keys else [k for k in keys if fnmatch.fnmatchcase(k, pattern)]
        found = found or [k for k in keys if pattern in k]
        chosen += [k for k in found if k not in chosen]
    return chosen


def driver_error(what: str, target: str, exc: BaseException) -> HistoryError:
    """A driver's error as a `HistoryError`: ``what``, the target (redacted), then the driver's text, scrubbed of
    every password and fragment of one (`targets.scrub`: a driver quotes what it failed to parse)."""
    return HistoryError(f"{what} {redact(target)}: {type(exc).__name__}: {scrub(str(exc), target)}")


def _sqlite_read_only(path: Path, immutable: bool) -> sqlite3.Connection:
    """``path`` opened read-only (SQLite's ``mode=ro``); ``immutable``: also without the shared-memory file a WAL
    database needs beside it, which a read-only folder cannot hold (and where nothing can change the file)."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro{'&immutable=1' if immutable else ''}"
    return sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)


class HistoryStore:
    """An open history database; use as a context manager. `open` is the writer's: it creates the database or
    migrates its schema to `SCHEMA_VERSION`. `read` is every reader's: read-only, never creating nor migrating."""

    def __init__(self, conn: Any, dialect: Dialect, target: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.target = target

    @classmethod
    def _connect(cls, target: str, read_only: bool, at: Path | None = None) -> HistoryStore:
        try:
            if is_postgresql(target):
                import psycopg

                conn = psycopg.connect(target, autocommit=True, connect_timeout=10)
                if read_only:  # every statement is then a read-only transaction: the server refuses any write
                    conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
                return cls(conn, POSTGRESQL, target)
            path = at or sqlite_path(target)
            if read_only:
                return cls(_sqlite_read_only(path, immutable=False), SQLITE, target)
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA foreign_keys = ON")
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                with contextlib.suppress(sqlite3.OperationalError):  # a long read under way: write as before, now
                    conn.execute("PRAGMA journal_mode = WAL")  # kept by the file: readers go on while one writes
            return cls(conn, SQLITE, target)
        except ImportError as exc:
            raise HistoryError(f"a PostgreSQL history needs psycopg: pip install 'psycopg[binary]' ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - driver errors differ per database; all mean "cannot open"
            raise driver_error("cannot open history", target, exc) from None

    @classmethod
    def open(cls, target: str, at: Path | None = None) -> HistoryStore:
        """The history to write to: created when missing, its schema migrated; a SQLite file in WAL journal mode.
        ``at``: the SQLite file to write instead of the target's (a new history's, before it is moved into place);
        messages still name the target."""
        store = cls._connect(target, read_only=False, at=at)
        try:
            store.migrate()
        except Exception:
            store.close()
            raise
        return store

    @classmethod
    def read(cls, target: str, *, current: bool = True) -> HistoryStore:
        """An existing history to read: opened read-only (SQLite ``mode=ro``; PostgreSQL, read-only transactions),
        never created nor migrated, so it reads while a session writes, and from read-only media. A missing file,
        a database without moeperf's tables, a newer schema and (``current``) an older one are refused."""
        if not is_postgresql(target):
            path = sqlite_path(target)
            if not path.exists():
                raise HistoryError(f"no history at {target} (run pytest with --moeperf-history, or pass --db "
                                   "URL|PATH)")
            if path.is_dir():
                raise HistoryError(f"{target} is a directory, not a history database file")
        store = cls._connect(target, read_only=True)
        try:
            try:
                found = store.schema()
            except HistoryError:
                if store.dialect is POSTGRESQL or os.access(sqlite_path(target).absolute().parent, os.W_OK):
                    raise
                store.close()  # a WAL file in a folder no one here can write to: read it as immutable
                store = cls(_sqlite_read_only(sqlite_path(target), immutable=True), SQLITE, target)
                found = store.schema()
            store._check(found, current)
        except Exception:
            store.close()
            raise
        return store

    @classmethod
    def upgrade(cls, target: str) -> tuple[int, int]:
        """Migrate an existing history to `SCHEMA_VERSION` (``moeperf history upgrade``); its schema version before
        and after. A database without moeperf's tables is refused, not given them."""
        with cls.read(target, current=False) as store:
            before = store.version()
        with cls.open(target) as store:
            return before, store.version()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ plumbing
    def _sql(self, text: str) -> str:
        return text.replace("?", self.dialect.param)

    def _rows(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self.conn.execute(self._sql(text), tuple(params)).fetchall())
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error or psycopg.Error
            raise driver_error("cannot read history", self.target, exc) from None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction; SQLite takes the write lock at once so concurrent sessions queue instead of failing."""
        if self.dialect is POSTGRESQL:
            with self.conn.transaction():
                yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ------------------------------------------------------------------------------------------ schema
    def version(self) -> int:
        rows = self._rows("SELECT MAX(version) FROM moeperf_schema")
        return int(rows[0][0] or 0)

    def schema(self) -> int | None:
        """The schema version; None when the database holds no moeperf history (no ``moeperf_schema`` table)."""
        found = self._rows("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'moeperf_schema'"
                           if self.dialect is SQLITE else "SELECT to_regclass('moeperf_schema') IS NOT NULL")
        return self.version() if found[0][0] else None

    def _check(self, version: int | None, current: bool) -> None:
        shown = redact(self.target)
        if version is None:
            raise HistoryError(f"{shown} holds no moeperf history (no moeperf_schema table), and a read adds none: "
                               "name the database your sessions record to (--moeperf-history)")
        if version > SCHEMA_VERSION:
            raise HistoryError(f"history {shown} has schema {version}; this moeperf reads up to {SCHEMA_VERSION}: "
                               "upgrade pytest-moeperf")
        if current and version < SCHEMA_VERSION:
            raise HistoryError(f"history {shown} has schema {version}, older than this moeperf's {SCHEMA_VERSION}, "
                               f"and a read does not upgrade it: `moeperf history --db {shown} upgrade` does, as "
                               "does the next pytest session that records to it (after that, older versions of "
                               "pytest-moeperf cannot read it)")

    def migrate(self) -> None:
        """Create the tables or bring them up to `SCHEMA_VERSION`, once, even with several writers at a time."""
        try:
            with self._transaction():
                if self.dialect is POSTGRESQL:
                    self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('moeperf_history_schema'))")
                self.conn.execute("CREATE TABLE IF NOT EXISTS moeperf_schema (version INTEGER NOT NULL)")
                current = self.version()
                if current > SCHEMA_VERSION:
                    raise HistoryError(f"history {redact(self.target)} has schema {current}; this moeperf reads "
                                       f"up to {SCHEMA_VERSION}: upgrade pytest-moeperf")
                for version in range(current, SCHEMA_VERSION):
                    for statement in MIGRATIONS[version]:
                        self.conn.execute(statement.format(id=self.dialect.id_column, real=self.dialect.real,
                                                           bool=self.dialect.boolean))
                    self.conn.execute(self._sql("INSERT INTO moeperf_schema (version) VALUES (?)"), (version + 1,))
        except HistoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error or psycopg.Error
            raise driver_error("cannot migrate history", self.target, exc) from None

    # ------------------------------------------------------------------------------------------ writing
    def append(self, run: SessionRecord, metrics: Sequence[MetricRecord]) -> int:
        """Store one session in one transaction; returns the run's id. Nothing is stored when anything fails."""
        try:
            with self._transaction():
                row = self.conn.execute(self._sql(
                    "INSERT INTO moeperf_runs (started, finished, git_commit, git_dirty, host, fingerprint, "
                    "fingerprint_hash, host_id, branch, versions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id"),
                    (run.started, run.finished, run.git_commit, run.git_dirty, run.host, run.fingerprint,
                     run.fingerprint_hash, run.host_id, run.branch,
                     json.dumps(dict(run.versions), sort_keys=True))).fetchone()
                run_id = int(row[0])
                cursor = self.conn.cursor()
                cursor.executemany(self._sql(
                    "INSERT INTO moeperf_metrics (run_id, test_id, name, unit, better, median, n, iqr, status, change, "
                    "allowed, baseline, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                    [(run_id, m.test_id, m.name, m.unit, m.better, m.median, m.n, m.iqr, m.status, m.change,
                      m.allowed, m.baseline, m.reason) for m in metrics])
                cursor.close()
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error or psycopg.Error, rolled back
            raise driver_error("cannot write history", self.target, exc) from None
        return run_id

    # ------------------------------------------------------------------------------------------ reading
    def runs(self, fingerprint: str | None = None, limit: int | None = None) -> list[StoredSession]:
        """Runs oldest first (the last ``limit`` of them), with their metric and regression counts."""
        where, params = ("WHERE r.fingerprint = ? OR r.fingerprint_hash = ?", [fingerprint, fingerprint]) \
            if fingerprint else ("", [])
        rows = self._rows(
            f"SELECT {_RUN_COLUMNS}, COUNT(m.name), SUM(CASE WHEN m.status = 'REGRESSED' THEN 1 ELSE 0 END) "
            f"FROM moeperf_runs r LEFT JOIN moeperf_metrics m ON m.run_id = r.id {where} "
            f"GROUP BY {_RUN_COLUMNS} ORDER BY r.finished DESC, r.id DESC"
            + (f" LIMIT {int(limit)}" if limit else ""), params)
        return [_run(row[:11], row[11], row[12]) for row in reversed(rows)]

    def sessions(self) -> list[StoredSession]:
        """Every run, oldest first, without the metric counts `runs` joins in (one row a run: cheap on a history of
        millions of metric rows)."""
        rows = self._rows(f"SELECT {_RUN_COLUMNS} FROM moeperf_runs r ORDER BY r.finished, r.id")
        return [_run(row) for row in rows]

    def metrics_of(self, run_ids: Sequence[int], chunk: int = 500) -> Iterator[tuple[int, MetricRecord]]:
        """``(run id, metric)`` of every metric of the named runs, a chunk of runs per query (SQLite caps the
        parameters of one statement)."""
        ids = sorted(set(run_ids))
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            marks = ", ".join("?" for _ in part)
            for row in self._rows(f"SELECT m.run_id, {_METRIC_COLUMNS} FROM moeperf_metrics m "
                                  f"WHERE m.run_id IN ({marks})", part):
                yield int(row[0]), _metric(row[1:])

    def keys(self) -> list[str]:
        return sorted(f"{t}::{n}" for t, n in self._rows("SELECT DISTINCT test_id, name FROM moeperf_metrics"))

    def series(self, key: str, fingerprint: str | None = None) -> list[Point]:
        """Every stored value of metric ``key`` (``test_id::name``), oldest first, all fingerprints unless one is
        named (slug or hash)."""
        test_id, _, name = key.rpartition("::")
        where, params = "m.test_id = ? AND m.name = ?", [test_id, name]
        if fingerprint:
            where += " AND (r.fingerprint = ? OR r.fingerprint_hash = ?)"
            params += [fingerprint, fingerprint]
        rows = self._rows(f"SELECT {_RUN_COLUMNS}, {_METRIC_COLUMNS} FROM moeperf_metrics m JOIN moeperf_runs r "
                          f"ON r.id = m.run_id WHERE {where} ORDER BY r.finished, r.id", params)
        return [Point(run=_run(row[:11]), metric=_metric(row[11:])) for row in rows]

    def recent(self, key: str, fingerprint_hash: str, limit: int, *, unit: str | None = None,
               better: str | None = None, since: str | None = None, host_id: str | None = None,
               branch: str | None = None, statuses: Sequence[str] = ("PASS", "IMPROVED", "NEW")) -> list[MetricRecord]:
        """The last ``limit`` records of ``key`` on this fingerprint whose verdict is one of ``statuses``, newest
        first: what a noise model learns a metric's run-to-run spread from. Each given filter narrows them to the
        same measurement: ``unit`` and ``better``, sessions finished at or after ``since`` (the re-record that
        reset the baseline's runs), the same ``host_id`` and ``branch``."""
        test_id, _, name = key.rpartition("::")
        marks = ", ".join("?" for _ in statuses)
        where = ["m.test_id = ?", "m.name = ?", "r.fingerprint_hash = ?", f"m.status IN ({marks})"]
        params: list[Any] = [test_id, name, fingerprint_hash, *statuses]
        for column, value in (("m.unit = ?", unit), ("m.better = ?", better), ("r.finished >= ?", since),
                              ("r.host_id = ?", host_id), ("r.branch = ?", branch)):
            if value is not None:
                where.append(column)
                params.append(value)
        rows = self._rows(f"SELECT {_METRIC_COLUMNS} FROM moeperf_metrics m JOIN moeperf_runs r ON r.id = m.run_id "
                          f"WHERE {' AND '.join(where)} ORDER BY r.finished DESC, r.id DESC LIMIT {int(limit)}",
                          params)
        return [_metric(row) for row in rows]
