"""Confirmation in fresh processes: a test whose metric another round can still decide is measured again in child
sessions of that test alone, up to ``--moeperf-confirm`` of them, before its report.

Why not call it again in the same process: the process is a level that varies, and re-runs inside one process are
copies of that process's state, not independent rounds. Measured on the 2-core CPU box (canary_check runs 1-4 of
16cb975, 2026-12-06): inside one suites session the four rounds of ``q_b_proj`` M=1 bf16 read 551-572 µs (within 4 %)
while four fresh sessions read it 487, 508, 523-548 and 551-572 µs (16 % apart); ``kv_b_proj`` M=1: 357-368 µs in one
session, 312 and 322 µs in two others. Four in-process rounds, each beyond the threshold, against stored runs that
each came from their own process passed the rank test on one process's luck: 15 false REGRESSED in one clean-clone
run, 10 in another. A confirmation in a child session is a new process (new memory, new threads, its own canary
readings): its rounds are units of the same level as the stored runs.

Each child runs the session's command line with only this test (`children.ONLY_ENV`) and ``MOEPERF_ROUND`` set, so
it judges and writes nothing; its rounds join the test's own (origin ``confirm k``), and the test is judged on all
of them at its report, where a confirmed regression fails it as before. Under ``--moeperf-deadline`` a child that the
previous one shows cannot end in time is not begun. An xdist worker starts no children (its verdict says to use
``--moeperf-rounds``); a ``--moeperf-rounds`` parent confirms in its own children (`rounds.Children.confirm`).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.judging.judge import budget_ended
from pytest_moeperf.judging.verdict import Verdict
from pytest_moeperf.ledger import Round
from pytest_moeperf.processes.rounds import Child, Children, deadline_at
from pytest_moeperf.processes.termination import EXIT_TERMINATED, Terminated

__all__ = ["Confirmation", "Confirmed"]

#: why an xdist worker's verdicts end without confirmation
XDIST = "pytest-xdist (a worker starts no confirmation processes; --moeperf-rounds N measures N processes)"


@dataclass
class Confirmed:
    """What confirming one test found: each metric's rounds from fresh processes, and why it ended early."""

    rounds: dict[str, list[Round]] = field(default_factory=dict)
    processes: int = 0
    stopped: str = ""  # what ended the confirmation before the evidence or the budget did ("" if nothing)

    def add(self, found: dict[str, list[Round]]) -> None:
        for name, rounds in found.items():
            self.rounds.setdefault(name, []).extend(rounds)
        self.processes += 1

    def ended(self, verdict: Verdict, budget: int) -> Verdict:
        """``verdict``, saying what ended its confirmation where more rounds could still have decided it."""
        if self.stopped:
            how = ("--moeperf-rounds" if self.stopped == XDIST else "--moeperf-deadline"
                   if self.stopped.startswith("--moeperf-deadline") else "--moeperf-confirm")
            return budget_ended(verdict, budget, how, self.stopped)
        return budget_ended(verdict, budget, "--moeperf-confirm") if self.processes >= budget else verdict


class Confirmation:
    """The session's confirmation processes: one scratch folder, the deadline, how long each child took."""

    def __init__(self, state: Conclusion, started: float) -> None:
        self.state = state
        self.started = started  # the session's ``time.monotonic()`` at its start: the deadline counts from it
        self._scratch: tempfile.TemporaryDirectory[str] | None = None  # removed when the session's process ends
        self._children: Children | None = None

    def _of_session(self) -> Children:
        if self._children is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="moeperf-confirm-")
            wall_start = time.time() - (time.monotonic() - self.started)
            scratch = Path(self._scratch.name)
            config = self.state.config
            # pytest-benchmark in a child would save its runs beside the session's own (--benchmark-autosave)
            extra = ((f"--benchmark-storage=file://{scratch / 'benchmarks'}",)
                     if getattr(config.option, "benchmark_storage", None) is not None else ())
            self._children = Children(config, self.state, deadline_at(self.state.settings, wall_start), scratch,
                                      extra_args=extra)
        return self._children

    def unavailable(self, config: pytest.Config) -> str:
        """Why this process cannot confirm in child sessions ("" when it can)."""
        return XDIST if hasattr(config, "workerinput") else ""

    def run(self, confirmed: Confirmed, test: str, budget: int, wants_round: Callable[[], bool]) -> None:
        """Confirmations of ``test`` (its test id) into ``confirmed`` while ``wants_round()`` says another round can
        settle a metric, up to ``budget`` processes, or until one cannot be run."""
        for k in range(1, budget + 1):
            if not wants_round():
                break
            found = self.unavailable(self.state.config) or self.measure([test], k, budget)
            if isinstance(found, str):
                confirmed.stopped = found
                break
            confirmed.add(found[test])

    def measure(self, tests: Sequence[str], k: int, budget: int, need_s: float = 0.0
                ) -> dict[str, dict[str, list[Round]]] | str:
        """Confirmation ``k`` of ``budget`` of ``tests`` (test ids): those tests alone in one fresh child session;
        each test's rounds by metric name, or why there are none. ``need_s``: what the child is expected to take
        when no confirmation process has run yet (the deadline's check). Ctrl-C or SIGTERM during it propagates."""
        children = self._of_session()
        what = tests[0] if len(tests) == 1 else f"{len(tests)} tests"
        child = Child(f"confirmation {k}/{budget} of {what}", f"confirm {k}", f"{k + 1}/{budget + 1}")
        if children.deadline is not None:
            left = children.deadline - time.time()
            need = max((t for took in children.took.values() for t in took), default=need_s)
            if left <= need:
                return f"--moeperf-deadline ({left:.0f} s left, a confirmation process takes {need:.0f} s)"
        started = time.monotonic()
        done = children.measure(child, list(tests), quiet=True)
        if done == EXIT_TERMINATED:
            raise Terminated("terminated (SIGTERM) in a confirmation process")
        if done == int(pytest.ExitCode.INTERRUPTED):
            raise KeyboardInterrupt
        if isinstance(done, int):
            return f"confirmation process {k} ended with exit code {done}"
        found: dict[str, dict[str, list[Round]]] = {test: {} for test in tests}
        for record in done.records.values():
            if record.metric.test_id in found:
                found[record.metric.test_id].setdefault(record.metric.name, []).extend(record.rounds)
        if not any(found.values()):
            return f"confirmation process {k} measured nothing of {'this test' if len(tests) == 1 else 'them'}"
        _progress(self.state.config, f"moeperf: {what}: confirmation {k}/{budget} in a fresh process "
                                     f"({time.monotonic() - started:.0f} s)")
        return found


def _progress(config: pytest.Config, text: str) -> None:
    """A line on the terminal now, while the test's call still runs (its output capture suspended meanwhile)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        if reporter is None:
            print(text, flush=True)
            return
        reporter.ensure_newline()
        if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):  # -q: a line of progress dots
            reporter.write("\n")
        reporter.write_line(text)
