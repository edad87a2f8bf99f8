"""Shared helpers for the plugin's own tests."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

_ENTRY_POINT = any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(group="pytest11"))


@pytest.fixture
def run_moeperf(pytester: pytest.Pytester):  # type: ignore[no-untyped-def]
    """Run a real pytest session in the pytester directory with the plugin loaded (installed or not).

    The health gate is off unless a test turns it on (``--moeperf-health on`` after it): these sessions test
    verdicts, stores and reports, and a loaded box (CI beside other jobs, two busy loops) must not decide them; the
    gate's own tests run it on purpose. So is the canary (``--moeperf-canary on``): a second a reading, and its
    figures would join every baseline file and report these tests read."""

    def run(*args: str) -> pytest.RunResult:
        plugin = () if _ENTRY_POINT else ("-p", "pytest_moeperf.plugin")
        return pytester.runpytest(*plugin, "-p", "no:cacheprovider", "--moeperf-baselines",
                                  str(pytester.path / "baselines"), "--moeperf-health", "off", "--moeperf-canary",
                                  "off", *args)

    return run


@pytest.fixture
def spread_sittings() -> Callable[[Path, float], None]:
    """``spread(path, hours)``: move each update stored in baseline file ``path`` ``hours`` after the previous one
    (from 2026-12-01 17:00 UTC), as if recorded that far apart: updates a session makes seconds apart are one
    sitting (`store.entries.sittings`), two an hour or more apart are two."""

    def spread(path: Path, hours: float) -> None:
        stored = json.loads(path.read_text())
        start = dt.datetime(2026, 12, 1, 17, 0, tzinfo=dt.UTC)
        for entry in stored["metrics"].values():
            dates = sorted({run["date"] for run in entry["runs"]})
            for run in entry["runs"]:
                run["date"] = (start + dt.timedelta(hours=hours * dates.index(run["date"]))).isoformat()
        path.write_text(json.dumps(stored, indent=2, sort_keys=True) + "\n")

    return spread
