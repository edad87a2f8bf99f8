"""pytest-benchmark adopted (``--moeperf-benchmark``, on by default): the ``benchmark`` fixture's result of each test
becomes the test's metric ``time`` on its `Perf` when the call ends, so everything downstream is the ``perf.record``
path — the health gate's window around the call, the verdict at the call report (a regression fails that test),
confirmation re-runs, xdist transport, ``--moeperf-rounds`` children, the update and every report.

What it reads of pytest-benchmark: the test's ``benchmark`` funcarg, its public attributes (``stats``: the result's
``Metadata``, whose ``as_dict`` is the entry of pytest-benchmark's JSON; ``disabled``; ``has_error``) and its session
plugin's ``benchmarks`` list (``config.pluginmanager.get_plugin("pytest-benchmark")``). One private attribute: the
fixture refuses a second use in a test (``_mode``), so a confirmation re-run sets it back; pytest-benchmark's own
results keep the test's first call (a re-run's result is taken off its list). Calibration, timer, rounds and warm-up
stay pytest-benchmark's.

A test whose fixture measured nothing (``--benchmark-disable``; xdist, under which pytest-benchmark disables itself)
says so: the reason travels in its call report, names it where its baselined metrics are MISSING, and one line a
reason ends the session (a warning for xdist, counted and failed by ``--moeperf-strict``; a note for
``--benchmark-disable``, which the user asked for)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Generator, Iterable
from typing import Any

import pytest

from pytest_moeperf.adoption.results import METRIC, OFF, adopt
from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.perf import Perf
from pytest_moeperf.runtime import confirming_key, new_perf, perf_key, reported_test_id, settings_key

FIXTURE = "benchmark"
#: the call report's property that says why a benchmark test measured nothing to adopt
NOT_MEASURED = "moeperf-benchmark-unmeasured"
XDIST = "pytest-benchmark disables itself under xdist: run the benchmarks without -n"
DISABLED = "its fixture is disabled: --benchmark-disable runs each benchmarked function once, untimed"
OTHERWISE = "pytest-benchmark disabled its fixture"
#: the reasons that are warnings (the user did not ask for them); the others are notes
WARNED = (XDIST, OTHERWISE)
#: why a test was not measured, kept on its item until its call report
_reason_key = pytest.StashKey[str]()


def adopts(config: pytest.Config, fixturenames: Iterable[str]) -> bool:
    """Whether a test with these fixtures is measured by this session (an adopted benchmark)."""
    return config.stash[settings_key].benchmark_unit != OFF and FIXTURE in fixturenames


def install(config: pytest.Config, state: Conclusion, unit: str) -> None:
    """Register the adoption when it is on (``unit`` is not ``off``) and pytest-benchmark is installed."""
    if unit != OFF and importlib.util.find_spec("pytest_benchmark") is not None:
        config.pluginmanager.register(Adoption(config, state, unit), "moeperf-benchmark")


def benchmark_fixture(item: pytest.Item) -> Any:
    """The item's pytest-benchmark fixture, or None (no such funcarg, or another plugin's ``benchmark``)."""
    found = getattr(item, "funcargs", {}).get(FIXTURE)
    return found if any(c.__module__.startswith("pytest_benchmark") for c in type(found).__mro__) else None


def why_unmeasured(config: pytest.Config) -> str:
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return XDIST
    return DISABLED if config.getoption("benchmark_disable", False) else OTHERWISE


class Adoption:
    def __init__(self, config: pytest.Config, state: Conclusion, unit: str) -> None:
        self.config = config
        self.state = state
        self.unit = unit
        self.unmeasured: dict[str, list[str]] = {}  # reason -> test ids

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """After the fixtures: a benchmark test gets a `Perf` (the one of its ``perf`` fixture, when it has one)."""
        names = getattr(item, "fixturenames", ())
        if FIXTURE in names and "perf" not in names and benchmark_fixture(item) is not None:
            new_perf(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        fixture = benchmark_fixture(pyfuncitem)
        perf = pyfuncitem.stash.get(perf_key, None)
        if fixture is None or perf is None:
            return (yield)
        again = pyfuncitem.stash.get(confirming_key, False)
        if again:  # a confirmation re-run: the fixture may be used once more
            fixture._mode = None
            fixture.stats = None
        try:
            return (yield)
        finally:
            self._record(pyfuncitem, fixture, perf, again)

    def _record(self, item: pytest.Function, fixture: Any, perf: Perf, again: bool) -> None:
        if fixture.disabled:
            item.stash[_reason_key] = why_unmeasured(self.config)
            return
        result = fixture.stats
        if result is None or not result or fixture.has_error:
            return  # not called, or the benchmarked function raised: the test's own outcome says so
        if not hasattr(fixture, "_mode"):
            perf.measured_once("this pytest-benchmark cannot be used twice in a test")
        adopted = adopt(result.as_dict(include_data=True), self.unit)
        perf.record(METRIC, adopted.samples, unit=adopted.unit, better="lower", context=adopted.context)
        if again:  # pytest-benchmark's own results keep the test's first call
            session = self.config.pluginmanager.get_plugin("pytest-benchmark")
            listed = getattr(session, "benchmarks", None)
            if isinstance(listed, list):
                listed[:] = [b for b in listed if b is not result]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        rep = yield
        reason = item.stash.get(_reason_key, None)
        if rep.when == "call" and reason is not None:
            rep.user_properties.append((NOT_MEASURED, reason))  # to the controller (xdist)
        return rep

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, reason in report.user_properties:
            if name == NOT_MEASURED:
                test = reported_test_id(report, self.state.ids)
                self.unmeasured.setdefault(str(reason), []).append(test)
                self.state.ledger.note_test(test, f"pytest-benchmark measured nothing: {reason}")

    def pytest_sessionfinish(self) -> None:
        """Before the session's end (`conclude`): one line a reason."""
        if hasattr(self.config, "workerinput"):
            return
        for reason, tests in self.unmeasured.items():
            line = (f"pytest-benchmark measured nothing in {len(tests)} test(s) ({reason}): nothing of theirs is "
                    "judged or stored")
            if reason in WARNED:
                self.state.ledger.warn(line)
            elif line not in self.state.ledger.notes:
                self.state.ledger.notes.append(line)
