"""The history backends of `tests/history/conftest.py` (SQLite and a real PostgreSQL), for the dashboard's tests, and
a history of the real suites (`real_history`), made once for the build and the browser tests."""

from pathlib import Path

import pytest

from tests.dashboard import real_history
from tests.history.conftest import pg_target, target  # noqa: F401 - fixtures


@pytest.fixture(scope="session")
def real_suites(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A SQLite history of the four real suites (`real_history.fill`) and its session count."""
    work = tmp_path_factory.mktemp("real-suites")
    history = work / "history.sqlite"
    return history, real_history.fill(history, work)
