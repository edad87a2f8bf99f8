"""The history database: schema, migrations, and the only reader and writer of it.

One SQLite file by default (the stdlib's ``sqlite3``); PostgreSQL when the target is a ``postgresql://`` URL
(``psycopg`` 3, imported only then), so many runners can write one history. Both hold the same tables, prefixed
``moeperf_`` so a shared database can hold other things too; a session is one transaction.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote

from pytest_moeperf.history.records import MetricRecord, Point, SessionRecord, StoredSession

SCHEMA_VERSION = 3
OFF = ("off", "none", "no", "false", "0")


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


def is_postgresql(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def sqlite_path(target: str) -> Path:
    """A SQLite target is a path or a URL as SQLAlchemy spells it: ``sqlite:///relative`` or ``sqlite:////absolute``."""
    return Path(target.removeprefix("sqlite:///"))


def parse_target(text: str) -> str | None:
    """``--moeperf-history``: a PostgreSQL URL, a SQLite path (or ``sqlite:///path``), or ``off`` (None)."""
    value = text.strip()
    if value.lower() in OFF:
        return None
    if "://" in value and not (is_postgresql(value) or value.startswith("sqlite:///")):
        raise ValueError(f"expected a SQLite path, sqlite:///PATH, postgresql://… or off, got {text!r}")
    return value


_SECRET_PARAMETER = re.compile("pass|secret|token", re.IGNORECASE)  # password=, sslpassword=, passfile=, …


def _redact_parameter(parameter: str) -> str:
    key, equals, _ = parameter.partition("=")
    return f"{key}=***" if equals and _SECRET_PARAMETER.search(unquote(key)) else parameter


def redact(target: str) -> str:
    """The target with every password replaced, for messages: in the user information (``user:***@``) and in the
    query (``?password=***``, ``sslpassword=***``; a key libpq would decode from percent-encoding too)."""
    if not is_postgresql(target):
        return target
    scheme, _, rest = target.partition("://")
    userinfo = re.match(r"[^@/]*@", rest)  # libpq's reading: user information ends at the first '@' before any '/'
    if userinfo is not None:
        credentials = userinfo.group(0)[:-1]
        user = credentials.split(":", 1)[0]
        rest = f"{user}{':***' if ':' in credentials else ''}@{rest[userinfo.end():]}"
    location, question, query = rest.partition("?")
    if question:
        query = "&".join(_redact_parameter(p) for p in query.split("&"))
    return f"{scheme}://{location}{question}{query}"


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


class HistoryStore:
    """An open history database, its schema migrated to `SCHEMA_VERSION`. Use as a context manager."""

    def __init__(self, conn: Any, dialect: Dialect, target: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.target = target

    @classmethod
    def open(cls, target: str) -> HistoryStore:
        try:
            if is_postgresql(target):
                import psycopg

                store = cls(psycopg.connect(target, autocommit=True, connect_timeout=10), POSTGRESQL, target)
            else:
                path = sqlite_path(target)
                path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
                conn.execute("PRAGMA foreign_keys = ON")
                store = cls(conn, SQLITE, target)
        except ImportError as exc:
            raise HistoryError(f"a PostgreSQL history needs psycopg: pip install 'psycopg[binary]' ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - driver errors differ per database; all mean "cannot open"
            raise HistoryError(f"cannot open history {redact(target)}: {type(exc).__name__}: {exc}") from None
        try:
            store.migrate()
        except Exception:
            store.close()
            raise
        return store

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
            raise HistoryError(f"history {redact(self.target)}: {type(exc).__name__}: {exc}") from None

    @contextmanager
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
            raise HistoryError(f"cannot migrate history {redact(self.target)}: {type(exc).__name__}: {exc}") from None

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
            raise HistoryError(f"cannot write history {redact(self.target)}: {type(exc).__name__}: {exc}") from None
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
