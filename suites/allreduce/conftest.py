"""Fixtures of the AllReduce suite."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def failed_backends() -> dict[str, str]:
    """Backend (or process-group backend, when its ranks could not start or hung) -> the case where it failed.

    Later cases of a failed backend fail at once instead of restarting ranks that hang or crash again: a hang
    costs the whole rank timeout, and GPU time is paid by the minute."""
    return {}
