"""Test-only plugin (never part of the package): inject a regression into real measurements.

Load it with ``PYTHONPATH=tests/benchmarks pytest -p moeperf_inject`` and set ``MOEPERF_INJECT="GLOB=FACTOR"``
(several separated by commas): every metric whose ``<nodeid>::<name>`` key matches GLOB gets its recorded samples
made worse by FACTOR — multiplied when lower is better, divided when higher is better. Used by
``tests/benchmarks/power.sh`` to measure how often the verdicts catch a regression of a known size (power) and how
often they flag one that is not there (factor 1.00: false alarms), on real noise.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from typing import Any

import pytest

from pytest_moeperf.perf import Perf


def _rules() -> list[tuple[str, float]]:
    rules = []
    for part in filter(None, (p.strip() for p in os.environ.get("MOEPERF_INJECT", "").split(","))):
        glob, _, factor = part.rpartition("=")
        if not glob or float(factor) <= 0:
            raise pytest.UsageError(f"MOEPERF_INJECT: expected GLOB=FACTOR, got {part!r}")
        rules.append((glob, float(factor)))
    return rules


def pytest_configure(config: pytest.Config) -> None:
    rules = _rules()
    if not rules:
        return
    original = Perf.record

    def record(self: Perf, name: str, samples: float | int | Sequence[float | int], **kwargs: Any) -> Any:
        key = f"{self.test_id}::{name}"
        factor = next((f for glob, f in rules if fnmatch.fnmatchcase(key, glob)), 1.0)
        if factor != 1.0:
            values = [float(samples)] if isinstance(samples, (int, float)) else [float(s) for s in samples]
            worse = (lambda v: v * factor) if kwargs.get("better", "lower") == "lower" else (lambda v: v / factor)
            samples = [worse(v) for v in values]
            kwargs.setdefault("context", {})
            kwargs["context"] = {**kwargs["context"], "injected_factor": factor}
        return original(self, name, samples, **kwargs)

    Perf.record = record  # type: ignore[method-assign]
