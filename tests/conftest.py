"""Shared helpers for the plugin's own tests."""

from __future__ import annotations

from importlib import metadata

import pytest

_ENTRY_POINT = any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(group="pytest11"))


@pytest.fixture
def run_moeperf(pytester: pytest.Pytester):  # type: ignore[no-untyped-def]
    """Run a real pytest session in the pytester directory with the plugin loaded (installed or not).

    The health gate is off unless a test turns it on (``--moeperf-health on`` after it): these sessions test
    verdicts, stores and reports, and a loaded box (CI beside other jobs, two busy loops) must not decide them; the
    gate's own tests run it on purpose."""

    def run(*args: str) -> pytest.RunResult:
        plugin = () if _ENTRY_POINT else ("-p", "pytest_moeperf.plugin")
        return pytester.runpytest(*plugin, "-p", "no:cacheprovider", "--moeperf-baselines",
                                  str(pytester.path / "baselines"), "--moeperf-health", "off", *args)

    return run
