"""The suites' own settings: the serving and spec-decode suites run the serve profiles of this repository."""

from __future__ import annotations

from pathlib import Path

import pytest

PROFILES = Path(__file__).parent / "serving" / "profiles"


def pytest_moeperf_profile_dirs(config: pytest.Config) -> list[Path]:
    return [PROFILES]
