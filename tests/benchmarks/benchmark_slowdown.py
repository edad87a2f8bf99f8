"""Test-only plugin (never part of the package): make pytest-benchmark benchmarks really slower.

Load it with ``PYTHONPATH=tests/benchmarks pytest -p benchmark_slowdown`` and set ``MOEPERF_SLOWDOWN="GLOB=N"``
(several separated by commas): in every test whose node id matches GLOB, the function handed to the ``benchmark``
fixture (``benchmark(f, ...)`` or ``benchmark.pedantic(f, ...)``) runs N times a call, so what pytest-benchmark times
— and so its own table, JSON and ``--benchmark-compare`` — and what pytest-moeperf adopts from it are N times the
work (plus one Python call of the wrapper). Unlike ``moeperf_inject``, which scales recorded samples, nothing here
touches a measurement: the code under test is slower. Used for docs/pytest-benchmark.md.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable
from typing import Any

import pytest


def _rules() -> list[tuple[str, int]]:
    rules = []
    for part in filter(None, (p.strip() for p in os.environ.get("MOEPERF_SLOWDOWN", "").split(","))):
        glob, _, times = part.rpartition("=")
        if not glob or not times.isdigit() or int(times) < 1:
            raise pytest.UsageError(f"MOEPERF_SLOWDOWN: expected GLOB=N (N a whole number >= 1), got {part!r}")
        rules.append((glob, int(times)))
    return rules


def _repeated(function: Callable[..., Any], times: int) -> Callable[..., Any]:
    def repeated(*args: Any, **kwargs: Any) -> Any:
        for _ in range(times - 1):
            function(*args, **kwargs)
        return function(*args, **kwargs)

    return repeated


def pytest_configure(config: pytest.Config) -> None:
    rules = _rules()
    if not rules:
        return
    from pytest_benchmark.fixture import BenchmarkFixture

    def times_for(fixture: Any) -> int:
        return next((n for glob, n in rules if fnmatch.fnmatchcase(fixture.fullname, glob)), 1)

    call, pedantic = BenchmarkFixture.__call__, BenchmarkFixture.pedantic

    def slower_call(self: Any, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        times = times_for(self)
        return call(self, function if times == 1 else _repeated(function, times), *args, **kwargs)

    def slower_pedantic(self: Any, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        times = times_for(self)
        return pedantic(self, target if times == 1 else _repeated(target, times), *args, **kwargs)

    BenchmarkFixture.__call__ = slower_call  # type: ignore[method-assign]
    BenchmarkFixture.pedantic = slower_pedantic  # type: ignore[method-assign]
