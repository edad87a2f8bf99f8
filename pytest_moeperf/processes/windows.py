"""``--moeperf-windows W``: W measurement windows of each test whose round is a server start, on that one start.

A start is the unit of a serving verdict (`starts`), but where the noise lives differs by profile: on the
full-depth Kimi-K2.5 rank on 1x H200 the server's TPOT moved 0.2 % over 8 starts, while a start costs 55-95 s; on the
tiny profiles two windows of one start differ as much as two starts. Windows are the level below the start: the test
is called W times on the same servers (fixtures kept), each call one round with its own health report, numbered
(`ledger.Round.window`) so that the store keeps a start's windows apart and the judge can learn each level's variance
(`judging.levels`): windows become the unit only where the stored starts show that a start adds nothing.

A window that ``--moeperf-deadline`` leaves no time for (less left than the last window took) is not begun, and the
session says so. Under ``--moeperf-update`` the windows are measured as well (a start's run keeps its windows).
"""

from __future__ import annotations

import time
from collections.abc import Generator

import pytest

from pytest_moeperf.runtime import confirming_key, perf_key, seconds_left


class Windows:
    """The session's adapter (registered beside it when W > 1): after the call of a test whose round is a start,
    W - 1 more calls on the same start, each another window."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.not_begun: list[str] = []  # tests whose windows the deadline cut, with how many were measured

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        started = time.monotonic()
        result = yield
        perf = pyfuncitem.stash.get(perf_key, None)
        if perf is None or not perf.records or not perf.repeats_on_start or pyfuncitem.stash.get(confirming_key, False):
            return result
        took = time.monotonic() - started
        if self.count > 1:
            perf.first_window()
        for window in range(2, self.count + 1):
            left = seconds_left(pyfuncitem.config)
            if left is not None and left < took:
                self.not_begun.append(f"{pyfuncitem.nodeid}: {window - 1} of {self.count} windows ({left:.0f} s of "
                                      f"--moeperf-deadline left, a window took {took:.0f} s)")
                break
            perf.new_window()
            pyfuncitem.stash[confirming_key] = True
            started = time.monotonic()
            try:
                pyfuncitem.ihook.pytest_pyfunc_call(pyfuncitem=pyfuncitem)
            finally:
                pyfuncitem.stash[confirming_key] = False
            took = time.monotonic() - started
        return result

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for text in self.not_begun:
            terminalreporter.write_line(f"moeperf: windows not begun (--moeperf-deadline): {text}", yellow=True)
