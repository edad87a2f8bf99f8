"""The history backends of `tests/history/conftest.py` (SQLite and a real PostgreSQL), for the dashboard's tests."""

from tests.history.conftest import pg_target, target  # noqa: F401 - fixtures
