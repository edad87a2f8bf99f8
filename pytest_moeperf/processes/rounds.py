"""``--moeperf-rounds N``: N independent rounds of the same session, each a separate pytest process.

Between-process variance dominates what a benchmark sees (as pyperf found), so N rounds in N processes are what a
noise model learns from. The parent (this module) runs the same command line N times — same arguments, working
directory, ini file and rootdir — with ``--moeperf-rounds 1``, a private ``--moeperf-report`` and the round in
``MOEPERF_ROUND`` (a child confirms nothing, writes no baseline and no Markdown), and appends each child's ledger
to its own: every metric gets one round per child. Tests whose round is a start (`starts`: a serving window on a
server the child launched) get ``max(N, S)`` rounds under ``--moeperf-starts S``: after the N rounds, rounds of only
those tests, and no more. Then it judges every metric on all its rounds; a metric of another test that more rounds
can still decide gets them — further children that run only the tests of such metrics, up to ``--moeperf-confirm``
of them — and the session ends as any other (`conclude`): reports, and under ``--moeperf-update`` one run per
storable round, in one transaction, only when every round finished. Under ``--moeperf-deadline`` the deadline counts
from the parent's start across its children (``MOEPERF_DEADLINE_AT``), as the session it is, and a child that a
child of the same tests shows cannot end before it is not begun: the session ends with the rounds it has (a batch's
interrupt at the deadline would have cut that child, and with it every round: nothing written). Ctrl-C or SIGTERM
interrupts the running child (which tears its fixtures down), removes the temporary directories and ends the session
with nothing written: exit 2 (interrupted) or 143 (terminated); a child whose parent was killed is interrupted by the
parent-death signal (`termination`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.judging.judge import MetricChanged, budget_ended
from pytest_moeperf.judging.thresholds import ThresholdError
from pytest_moeperf.ledger import DEADLINE_SKIP, ROUND_UNIT, SKIPPED, Ledger
from pytest_moeperf.processes.children import CACHE_ENV, ONLY_ENV, ChildResult, only_file, run_child
from pytest_moeperf.processes.termination import EXIT_TERMINATED, Terminated, sigterm_interrupts
from pytest_moeperf.settings import DEADLINE_ENV, ROUND_ENV, WINDOWS_ENV, Settings, starts_of
from pytest_moeperf.store.entries import BaselineError


def is_parent(config: pytest.Config, rounds: int, round_of: str | None) -> bool:
    option = config.option
    return (rounds > 1 and round_of is None and not hasattr(config, "workerinput")
            and not any(getattr(option, name, False) for name in ("help", "version", "collectonly", "showfixtures",
                                                                    "markers")))


def line(text: str, red: bool = False) -> None:
    """A line to stdout (this runs before pytest's terminal reporter exists, or between its lines)."""
    print(text, flush=True)


def _relabel(ledger: Ledger, origin: str) -> Ledger:
    """The child's rounds, named for the parent's round (a child runs one round of each test)."""
    for key, record in list(ledger.records.items()):
        rounds = tuple(dataclasses.replace(r, origin=origin) for r in record.rounds)
        ledger.records[key] = dataclasses.replace(record, rounds=rounds)
    ledger.canary = [dataclasses.replace(r, origin=origin) for r in ledger.canary]
    return ledger


def deadline_at(settings: Settings, started: float) -> float | None:
    """The session's ``--moeperf-deadline`` as a Unix time, given the session's start (``time.time()``); a child's
    children keep the one they were given."""
    if settings.deadline_at is not None:
        return settings.deadline_at
    return None if settings.deadline_s is None else started + settings.deadline_s


@dataclass(frozen=True)
class Child:
    """One child round: how the progress lines name it, the origin its rounds get, its ``MOEPERF_ROUND``."""

    label: str
    origin: str
    round_of: str


@dataclass
class Children:
    """The parent's side of its child rounds: the command line, the deadline, a scratch folder; what they did."""

    config: pytest.Config
    state: Conclusion
    deadline: float | None
    scratch: Path
    failed_tests: bool = False
    ran: int = 0  # child rounds run so far
    took: dict[tuple[str, ...], list[float]] = dataclasses.field(default_factory=dict)  # seconds, by ``only``
    windows: int | None = None  # the windows a start a parent planned (``--moeperf-windows auto``)
    extra_args: tuple[str, ...] = ()  # appended to the session's command line in each child

    def begins(self, child: Child, only: Sequence[str] = ()) -> bool:
        """Whether ``child`` can begin: under a deadline, not when a child of the same tests took longer than what
        is left of it (or nothing is left). A child cut by the batch's interrupt loses what every child measured
        (nothing written); one not begun loses only itself. A child not begun says so (a warning: the verdicts
        rest on fewer rounds); its tests that no earlier round measured count as skipped by the deadline (a batch
        reads the step as cut)."""
        if self.deadline is None:
            return True
        left = self.deadline - time.time()
        earlier = self.took.get(tuple(only)) or [t for ts in self.took.values() for t in ts]
        need = max(earlier, default=0.0)
        if left > need:  # need >= 0: nothing left begins nothing
            return True
        why = (f"not begun: {left:.0f} s of --moeperf-deadline left, and a round of "
               f"{'these tests' if only else 'the session'} took {need:.0f} s" if left > 0 else
               "not begun: --moeperf-deadline has passed")
        line(f"moeperf: round {child.label} {why}", red=True)
        ledger = self.state.ledger
        for test in only or list(ledger.tests):
            if not ledger.ran_before(test):
                ledger.note_test(test, f"{SKIPPED}{DEADLINE_SKIP}(round {child.label} {why})")
        ledger.warn(f"round {child.label} {why}: its verdicts rest on {self.ran} round(s)")
        return False

    def env(self, child: Child, only: Sequence[str]) -> dict[str, str]:
        env = {**os.environ, ROUND_ENV: child.round_of}
        if getattr(self.config, "cache", None) is None:  # no pytest cache: the children share one for their servers
            env.setdefault(CACHE_ENV, str(self.scratch / "serve-cache"))
        if only:
            env[ONLY_ENV] = str(only_file(self.scratch, only))
        if self.deadline is not None:
            env[DEADLINE_ENV] = f"{self.deadline:.3f}"
        if self.windows is not None:
            env[WINDOWS_ENV] = str(self.windows)
        return env

    def run(self, child: Child, only: Sequence[str] = ()) -> int | None:
        """One child round of ``only`` (empty: every test), merged into the ledger; an exit code to end with when
        the child could not measure (crashed, interrupted), else None."""
        done = self.measure(child, only)
        if isinstance(done, int):
            return done
        # a test's records join the records of its earlier rounds (a confirmation round brings only its tests)
        self.state.ledger.merge(done if not only else Ledger(records=done.records, tests=done.tests,
                                                              warnings=done.warnings, canary=done.canary),
                                rounds=True)
        return None

    def measure(self, child: Child, only: Sequence[str] = (), quiet: bool = False) -> Ledger | int:
        """One child round of ``only`` (empty: every test): its ledger, every round named for ``child``; or an exit
        code to end with when the child could not measure (crashed, interrupted). ``quiet``: no progress lines
        (a confirmation of one test says what it found itself)."""
        if not quiet:
            line(f"moeperf: round {child.label} ...")
        started = time.monotonic()
        config = self.config
        try:
            done = run_child([*config.invocation_params.args, *self.extra_args], config.invocation_params.dir,
                             self.env(child, only),
                             sys.executable, echo=line if config.get_verbosity() >= 0 and not quiet else None)
        except Terminated:
            line(f"moeperf: terminated (SIGTERM) in round {child.label}: nothing written", red=True)
            return EXIT_TERMINATED
        except KeyboardInterrupt:
            line(f"moeperf: interrupted in round {child.label}: nothing written", red=True)
            return int(pytest.ExitCode.INTERRUPTED)
        self.took.setdefault(tuple(only), []).append(time.monotonic() - started)
        if not quiet:
            line(f"moeperf: round {child.label} ({time.monotonic() - started:.0f} s): {done.last_line}")
        for failure in done.failures:
            line(f"  {failure}")
        if not _measured(done):
            sys.stdout.write(done.stdout + done.stderr)
            line(f"moeperf: round {child.label} ended with exit code {done.returncode}"
                 f"{f' and {done.problem}' if done.problem else ''}"
                 f"{': its rounds are not counted' if quiet else ': nothing written'}", red=True)
            return done.returncode or int(pytest.ExitCode.INTERNAL_ERROR)
        assert done.ledger is not None
        self.ran += 1
        self.failed_tests |= done.returncode == pytest.ExitCode.TESTS_FAILED
        return _relabel(done.ledger, child.origin)

    def confirm(self, skip: Collection[str] = ()) -> int | None:
        """Extra rounds of the tests (but those in ``skip``) that more rounds can still decide, up to
        ``--moeperf-confirm``; then the verdicts that the budget ended say so."""
        budget, done = self.state.settings.confirm, self.ran
        for j in range(1, budget + 1):
            tests = [] if self.state.settings.update else [
                t for t in unsettled_tests(self.state.ledger) if t not in skip]
            if not tests:
                break
            line(f"moeperf: {len(tests)} test(s) not settled after {done + j - 1} rounds: one more round of them")
            child = Child(f"{done + j} (confirmation {j} of at most {budget})", f"round {done + j} (confirmation {j})",
                          f"{done + j}/{done + budget}")
            if not self.begins(child, tests):
                break
            before = set(self.state.ledger.records)
            code = self.run(child, tests)
            if code is not None:
                return code
            judge_all(self.state, [k for k, r in self.state.ledger.records.items()
                                   if r.metric.test_id in tests or k not in before])
        if not self.state.settings.update:
            for key, record in self.state.ledger.records.items():
                if record.verdict is not None and record.metric.test_id not in skip:
                    self.state.ledger.decide(key, budget_ended(record.verdict, budget, "--moeperf-confirm"))
        return None


def _measured(done: ChildResult) -> bool:
    return done.returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and done.ledger is not None


def judge_all(state: Conclusion, keys: list[str] | None = None) -> bool:
    """Judge the records of ``keys`` (None: all); whether one could not be judged (a bad baseline or argument, or a
    changed unit or workload: named in the errors, and the session fails)."""
    broken = False
    for key in keys if keys is not None else list(state.ledger.records):
        record = state.ledger.records[key]
        try:
            state.ledger.decide(key, state.judge.judge(record))
        except (BaselineError, ThresholdError, MetricChanged) as exc:
            state.errors.append(f"{key}: {exc}")
            broken = True
    return broken


def unsettled_tests(ledger: Ledger) -> list[str]:
    """Tests with a metric that another round can still decide."""
    return sorted({r.metric.test_id for r in ledger.records.values()
                   if r.verdict is not None and r.verdict.more_rounds_help})


def starts_ended(state: Conclusion, tests: Collection[str], starts: int) -> None:
    """The verdicts of the tests that measure a start, once their starts are done: no confirmation start follows
    (a start costs a server's start, and a batch's time is planned in starts), so one that more starts could decide
    says to raise ``--moeperf-starts``."""
    if state.settings.update:
        return
    for key, record in state.ledger.records.items():
        if record.verdict is not None and record.metric.test_id in tests:
            state.ledger.decide(key, budget_ended(record.verdict, 0, "--moeperf-starts",
                                                  f"its {starts} start(s) (--moeperf-starts)"))


def unit_tests(ledger: Ledger) -> list[str]:
    """Tests whose rounds are starts (their records name a round unit): those ``--moeperf-starts`` measures."""
    return sorted({r.metric.test_id for r in ledger.records.values() if r.metric.context.get(ROUND_UNIT)})


def run(config: pytest.Config, state: Conclusion) -> int:
    """Run the rounds, the extra starts and the extra rounds of unsettled tests, judge, end the session; the exit
    code. SIGTERM interrupts it as Ctrl-C does (the child is interrupted and stopped, nothing written), exit 143."""
    with sigterm_interrupts():
        try:
            return _run(config, state)
        except Terminated:  # between the rounds (a round's own says which round)
            line("moeperf: terminated (SIGTERM) between the rounds", red=True)
            return EXIT_TERMINATED


def _run(config: pytest.Config, state: Conclusion) -> int:
    n = state.settings.rounds
    starts = starts_of(state.settings, 0 if state.topology.simulated else state.topology.gpu_count)
    with tempfile.TemporaryDirectory(prefix="moeperf-rounds-") as tmp:
        children = Children(config, state, deadline_at(state.settings, time.time()), Path(tmp))
        for i in range(1, n + 1):
            child = Child(f"{i}/{n}", f"round {i}/{n}", f"{i}/{n}")
            if not children.begins(child):
                break
            code = children.run(child)
            if code is not None:
                return code
        measured = unit_tests(state.ledger)
        if starts > n and measured and children.ran == n:
            line(f"moeperf: {len(measured)} test(s) measure a start (--moeperf-starts {starts}): "
                 f"{starts - n} more round(s) of them")
            for j in range(n + 1, starts + 1):
                child = Child(f"{j}/{starts} (start {j} of the tests that measure one)", f"start {j}/{starts}",
                              f"{j}/{starts}")
                if not children.begins(child, measured):
                    break
                code = children.run(child, measured)
                if code is not None:
                    return code
        broken = judge_all(state)
        starts_ended(state, measured, children.ran)  # every round run measured them: the starts they had
        code = children.confirm(skip=measured)
        if code is not None:
            return code
    fails = state.finish(stopped=False)
    line(f" moeperf ({n} rounds) ".center(80, "="))
    for text, red in state.summary_lines():
        line(text, red=red)
    regressed = any(v.status.value == "REGRESSED" for v in state.ledger.verdicts)
    return int(pytest.ExitCode.TESTS_FAILED if (fails or regressed or broken or children.failed_tests)
               else pytest.ExitCode.OK)
