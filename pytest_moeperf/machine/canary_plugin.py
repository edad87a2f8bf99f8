"""The canary's pytest surface (registered beside the session while ``--moeperf-canary`` is on): a reading before
the first perf test (``perf``, or an adopted pytest-benchmark test) of each test file, before its fixtures start
anything, and after its last, after they are torn down, and one beside a test that regressed
(`judging.machine_judge.MachineJudge.slower` asks for it). In an xdist worker the readings travel to the controller
in the next test report; otherwise they join the ledger at once."""

from __future__ import annotations

import json
from collections.abc import Generator

import pytest

from pytest_moeperf.adoption.plugin import adopts
from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.machine.canary import Canary, Reading

PROPERTY = "moeperf-canary"


class CanaryPlugin:
    def __init__(self, state: Conclusion, canary: Canary) -> None:
        self.state = state
        self.canary = canary
        self.file: str | None = None  # the test file whose tests are running (read before them)
        self.worker = hasattr(state.config, "workerinput")
        state.machine.canary = canary

    def _file(self, item: pytest.Item) -> str:
        return self.state.ids.of_item(item).split("::", 1)[0]

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        names = getattr(item, "fixturenames", ())
        if ("perf" in names or adopts(item.config, names)) and self._file(item) != self.file:
            self.file = self._file(item)
            self.canary.read(self.file, "before")
        return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
        result = yield
        if self.file is not None and self._file(item) == self.file and (
                nextitem is None or self._file(nextitem) != self.file):
            self.canary.read(self.file, "after")
            self.file = None
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        rep = yield
        taken = self.canary.drain()
        self.state.ledger.canary += taken
        if taken and self.worker:  # a copy: the item's own list is shared by its three reports
            rep.user_properties = [*rep.user_properties, (PROPERTY, json.dumps([r.to_json() for r in taken]))]
        return rep

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.worker:
            return  # its readings are in its ledger already, and in the report for the controller
        for name, payload in report.user_properties:
            if name == PROPERTY and isinstance(payload, str):
                self.state.ledger.canary += [Reading.from_json(r) for r in json.loads(payload)]

    def pytest_sessionfinish(self) -> None:  # before the session's own end (trylast): it judges the readings
        self.state.ledger.canary += self.canary.drain()
        self.state.ledger.notes += [p for p in self.canary.problems if p not in self.state.ledger.notes]
        self.canary.close()
