"""``--moeperf-rounds N``: N independent rounds of the same session, each a separate pytest process.

Between-process variance dominates what a benchmark sees (as pyperf found), so N rounds in N processes are what a
noise model learns from. The parent (this module) runs the same command line N times — same arguments, working
directory, ini file and rootdir — with ``--moeperf-rounds 1``, a private ``--moeperf-report`` and the round in
``MOEPERF_ROUND`` (a child confirms nothing, writes no baseline and no Markdown), and appends each child's ledger
to its own: every metric gets one round per child. Then it judges every metric on all its rounds; a metric that
more rounds can still decide gets them — further children that run only the tests of such metrics, up to
``--moeperf-confirm`` of them — and the session ends as any other (`conclude`): reports, and under
``--moeperf-update`` one run per storable round, in one transaction, only when every round finished. Ctrl-C or
SIGTERM interrupts the running child (which tears its fixtures down), removes the temporary directories and ends
the session with nothing written: exit 2 (interrupted) or 143 (terminated); a child whose parent was killed is
interrupted by the parent-death signal (`termination`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.judging.judge import MetricChanged, budget_ended
from pytest_moeperf.judging.thresholds import ThresholdError
from pytest_moeperf.ledger import Ledger
from pytest_moeperf.processes.children import ONLY_ENV, ChildResult, only_file, run_child
from pytest_moeperf.processes.termination import EXIT_TERMINATED, Terminated, sigterm_interrupts
from pytest_moeperf.settings import ROUND_ENV
from pytest_moeperf.store.entries import BaselineError


def is_parent(config: pytest.Config, rounds: int, round_of: str | None) -> bool:
    option = config.option
    return (rounds > 1 and round_of is None and not hasattr(config, "workerinput")
            and not any(getattr(option, name, False) for name in ("help", "version", "collectonly", "showfixtures",
                                                                    "markers")))


def line(text: str, red: bool = False) -> None:
    """A line to stdout (this runs before pytest's terminal reporter exists)."""
    print(text, flush=True)


def _relabel(ledger: Ledger, origin: str) -> Ledger:
    """The child's rounds, named for the parent's round (a child runs one round of each test)."""
    for key, record in list(ledger.records.items()):
        rounds = tuple(dataclasses.replace(r, origin=origin) for r in record.rounds)
        ledger.records[key] = dataclasses.replace(record, rounds=rounds)
    return ledger


def _round(config: pytest.Config, label: str, env: dict[str, str]) -> ChildResult | int:
    """One child round; its result, or the exit code to end the session with."""
    line(f"moeperf: round {label} ...")
    started = time.monotonic()
    try:
        done = run_child(config.invocation_params.args, config.invocation_params.dir, env, sys.executable,
                         echo=line if config.get_verbosity() >= 0 else None)
    except Terminated:
        line(f"moeperf: terminated (SIGTERM) in round {label}: nothing written", red=True)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        line(f"moeperf: interrupted in round {label}: nothing written", red=True)
        return int(pytest.ExitCode.INTERRUPTED)
    line(f"moeperf: round {label} ({time.monotonic() - started:.0f} s): {done.last_line}")
    for failure in done.failures:
        line(f"  {failure}")
    if done.returncode not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or done.ledger is None:
        sys.stdout.write(done.stdout + done.stderr)
        line(f"moeperf: round {label} ended with exit code {done.returncode}"
             f"{f' and {done.problem}' if done.problem else ''}: nothing written", red=True)
        return done.returncode or int(pytest.ExitCode.INTERNAL_ERROR)
    return done


def _judge_all(state: Conclusion, keys: list[str] | None = None) -> None:
    for key in keys if keys is not None else list(state.ledger.records):
        record = state.ledger.records[key]
        try:
            state.ledger.decide(key, state.judge.judge(record))
        except (BaselineError, ThresholdError, MetricChanged) as exc:
            state.errors.append(f"{key}: {exc}")  # its test failed in every round, naming it


def unsettled_tests(ledger: Ledger) -> list[str]:
    """Tests with a metric that another round can still decide."""
    return sorted({r.metric.test_id for r in ledger.records.values()
                   if r.verdict is not None and r.verdict.more_rounds_help})


def run(config: pytest.Config, state: Conclusion) -> int:
    """Run the rounds (and the extra rounds of unsettled tests), judge, end the session; the exit code. SIGTERM
    interrupts it as Ctrl-C does (the child is interrupted and stopped, nothing written), exit 143."""
    with sigterm_interrupts():
        try:
            return _run(config, state)
        except Terminated:  # between the rounds (a round's own says which round)
            line("moeperf: terminated (SIGTERM) between the rounds", red=True)
            return EXIT_TERMINATED


def _run(config: pytest.Config, state: Conclusion) -> int:
    n, budget = state.settings.rounds, state.settings.confirm
    failed_tests = False
    for i in range(1, n + 1):
        done = _round(config, f"{i}/{n}", {**os.environ, ROUND_ENV: f"{i}/{n}"})
        if isinstance(done, int):
            return done
        failed_tests |= done.returncode == pytest.ExitCode.TESTS_FAILED
        assert done.ledger is not None
        state.ledger.merge(_relabel(done.ledger, f"round {i}/{n}"))
    _judge_all(state)
    with tempfile.TemporaryDirectory(prefix="moeperf-confirm-") as tmp:
        for j in range(1, budget + 1):
            tests = [] if state.settings.update else unsettled_tests(state.ledger)
            if not tests:
                break
            line(f"moeperf: {len(tests)} test(s) not settled after {n + j - 1} rounds: one more round of them")
            env = {**os.environ, ROUND_ENV: f"{n + j}/{n + budget}", ONLY_ENV: str(only_file(Path(tmp), tests))}
            done = _round(config, f"{n + j} (confirmation {j} of at most {budget})", env)
            if isinstance(done, int):
                return done
            assert done.ledger is not None
            extra = _relabel(done.ledger, f"round {n + j} (confirmation {j})")
            state.ledger.merge(Ledger(records=extra.records))
            _judge_all(state, [k for k in extra.records if k in state.ledger.records])
    if not state.settings.update:
        for key, record in state.ledger.records.items():
            if record.verdict is not None:
                state.ledger.decide(key, budget_ended(record.verdict, budget, "--moeperf-confirm"))
    fails = state.finish(stopped=False)
    title = f" moeperf ({n} rounds) "
    line(title.center(80, "="))
    for text, red in state.summary_lines():
        line(text, red=red)
    regressed = any(v.status.value == "REGRESSED" for v in state.ledger.verdicts)
    return int(pytest.ExitCode.TESTS_FAILED if (fails or regressed or failed_tests) else pytest.ExitCode.OK)
