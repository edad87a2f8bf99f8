"""When a test is confirmed (``--moeperf-confirm-at``). At the session's end (``end``, the default): a test whose
metric another round can still decide is not confirmed at once; its reports are held, and after the session's other
tests (and its server starts) its confirmations run, each one fresh child session of every held test still
undecided; then each held test is judged on all its rounds and reported, passing or failing as at its call.

Why: the process is not the only level that varies on a shared box; the machine's minute does too. Measured on the
2-core CPU box (clean-clone CI of 7eef6f4, 2026-12-06): ``shared_gate_up`` M=1/8/32 and ``shared_down`` M=1, four
consecutive cases, read +37 to +86 % in the call and again in a fresh process started right after it, and 2 such
rounds against 5 stored runs reached p = 0.048: 15 false REGRESSED. A confirmation taken minutes later, after the
other tests, no longer shares the call's minute; one child for all held tests costs one start-up, not one a test.
``--moeperf-confirm-at call`` confirms each test right after its call (its verdict at once; `-x` stops on it).
Neither applies where this process confirms nothing: under ``--moeperf-update``, in a child session, and for a test
measured once a session or re-run on one start (``--moeperf-windows``).

The held reports are logged in the order the tests ran, after the confirmations; an interrupted session (Ctrl-C,
SIGTERM, a child that could not measure) logs them at once, judged on the rounds they have, saying what ended
their confirmation. Under ``--moeperf-deadline`` the server starts leave the confirmations their expected time
(`reserve_s`), and a confirmation that cannot end in time is not begun.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import pytest
from _pytest.runner import runtestprotocol

from pytest_moeperf.processes.confirm import Confirmation, Confirmed
from pytest_moeperf.runtime import confirmed_key, confirming_key, deferred_key, perf_key, started_key

if TYPE_CHECKING:
    from pytest_moeperf.session import MoePerfSession

__all__ = ["CHILD_START_S", "ConfirmAt"]

#: what a child session takes before its first test on the 2-core CPU box (a confirmation of one GEMM case: 12 s)
CHILD_START_S = 15.0


class ConfirmAt:
    """Confirms a test after its call (``at_end`` False), or holds its reports to confirm, judge and log it at the
    session's end."""

    def __init__(self, state: MoePerfSession, at_end: bool) -> None:
        self.state = state
        self.at_end = at_end
        self.confirmation = Confirmation(state, state.config.stash[started_key])
        self.held: list[tuple[pytest.Item, list[pytest.TestReport]]] = []

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        result = yield
        perf, state = pyfuncitem.stash.get(perf_key, None), self.state
        if (perf is None or not perf.records or state.settings.update or perf.single_round is not None
                or pyfuncitem.stash.get(confirming_key, False)):
            return result
        if self.at_end:  # its reports held until the session's end (`pytest_runtest_protocol`)
            pyfuncitem.stash[deferred_key] = state.wants_confirmation(pyfuncitem)
            return result
        confirmed = pyfuncitem.stash[confirmed_key] = Confirmed()  # `records` reads its rounds from here
        self.confirmation.run(confirmed, state.ids.of_item(pyfuncitem), state.settings.confirm,
                              lambda: state.wants_confirmation(pyfuncitem))
        return result

    def reserve_s(self) -> float:
        """What the confirmations of the tests held so far are expected to take (the server starts leave it)."""
        if not self.held:
            return 0.0
        calls = sum(r.duration for _, reports in self.held for r in reports if r.when == "call")
        return self.state.settings.confirm * (CHILD_START_S + calls)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if not self.at_end:
            return None  # pytest's own
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = runtestprotocol(item, log=False, nextitem=nextitem)
        if item.stash.get(deferred_key, False):
            self.held.append((item, reports))
            return True
        _log(item, reports)
        return True

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside the server starts' wrapper: after the starts
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        if not self.at_end:
            return (yield)
        try:
            result = yield
        except BaseException:
            self._release("the session was interrupted")
            raise
        try:
            self.confirm()
        except BaseException:
            self._release("the session was interrupted during the confirmations")
            raise
        self._release("")
        return result

    def confirm(self) -> None:
        """Up to ``--moeperf-confirm`` child sessions, each of every held test that more rounds can still decide."""
        budget, undecided = self.state.settings.confirm, self._undecided()
        if undecided:
            _line(self.state.config, f"moeperf: {len(undecided)} test(s) crossed a threshold: confirming them now, "
                                     f"apart from their calls, in up to {budget} fresh process(es)")
        for item, _ in self.held:
            item.stash[confirmed_key] = Confirmed()
        for k in range(1, budget + 1):
            tests = {self.state.ids.of_item(item): item for item in self._undecided()}  # each judged once a round
            if not tests:
                return
            found = self.confirmation.measure(list(tests), k, budget, need_s=self.reserve_s() / max(budget, 1))
            for test, item in tests.items():
                confirmed = item.stash[confirmed_key]
                if isinstance(found, str):
                    confirmed.stopped = found
                elif found.get(test):
                    confirmed.add(found[test])
                else:
                    confirmed.stopped = f"confirmation process {k} measured nothing of this test"
            if isinstance(found, str):
                return

    def _undecided(self) -> list[pytest.Item]:
        return [item for item, _ in self.held
                if not item.stash.get(confirmed_key, Confirmed()).stopped and self.state.wants_confirmation(item)]

    def _release(self, stopped: str) -> None:
        """Judge each held test's call report on the rounds it has, then log its reports."""
        held, self.held = self.held, []
        for item, reports in held:
            confirmed = item.stash.setdefault(confirmed_key, Confirmed())
            if stopped and not confirmed.stopped:
                confirmed.stopped = stopped
            item.stash[deferred_key] = False
            properties = [p for rep in reports if rep.when == "call" for p in self.state.judge_report(item, rep)]
            for rep in reports:  # the JUnit XML takes a test's properties from its teardown report
                if rep.when == "teardown":
                    rep.user_properties.extend(properties)
            ihook = item.ihook
            ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
            _log(item, reports)


def _log(item: pytest.Item, reports: list[pytest.TestReport]) -> None:
    for rep in reports:
        item.ihook.pytest_runtest_logreport(report=rep)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _line(config: pytest.Config, text: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        print(text, flush=True)
        return
    reporter.ensure_newline()
    reporter.write_line(text)
