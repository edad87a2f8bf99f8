"""History backends for the tests: a SQLite file, and a real PostgreSQL server (``scripts/ci-postgres.sh``, started
by ``.ci/run``) in a schema of its own per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import matplotlib.figure  # noqa: F401 - the history extra is required here (no silent skip); imported before any
import otava.analysis  # noqa: F401 - pytester test snapshots sys.modules, which would otherwise reload numpy per test
import pytest

PG_ENV = "MOEPERF_TEST_PG_URL"


def listing(folder: Path) -> list[str]:
    """The names in ``folder``, sorted, less SQLite's own ``-wal`` and ``-shm`` files beside a WAL database: a
    read-only read in a writable folder may leave them (the database unchanged), and the next write removes them."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(("-wal", "-shm")))


def pg_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f"{PG_ENV} is unset: start a server with `eval \"$(scripts/ci-postgres.sh start)\"` "
                    "(.ci/run does) to run the PostgreSQL tests")
    return url


@pytest.fixture
def pg_target() -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a fresh schema, dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    url = pg_url()
    schema = f"moeperf_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    yield f"{url}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each history test runs on both backends."""
    if request.param == "sqlite":
        return str(tmp_path / "history.sqlite")
    return str(request.getfixturevalue("pg_target"))
