"""Session state shared by the spec-decode tests: each (profile, concurrency) window is measured once."""

from __future__ import annotations

import pytest

from pytest_moeperf.serving.served import SpecWindow


@pytest.fixture(scope="session")
def spec_windows() -> dict[tuple[str, int], SpecWindow]:
    return {}
