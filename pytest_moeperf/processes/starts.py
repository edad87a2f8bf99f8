"""``--moeperf-starts S``: the start as the unit of the tests that measure one.

A serving window on a server the session launched is one observation of that server's start: two starts of one
profile on one 1x H200 differed by up to 14 % in the server's own TPOT, more than the windows of one start differ. So
such a test says what its round stands for (the ``pytest_moeperf_round_unit`` hook; the serving wing answers "server
start" for its tests on launched servers), and then it is never confirmed in-process (a re-run would measure the same
start again), its records carry ``round_unit``, and its verdicts count the starts judged and set aside.

With S > 1 (``auto``: `settings.GPU_STARTS` on a machine with GPUs, 1 without) a session runs its other tests
in-process as usual and those tests in S child sessions (`rounds.Children`), each starting its own servers, and no
more: a start costs a server's start and a batch is planned in starts, so a verdict that more starts could decide
says to raise ``--moeperf-starts`` instead of a confirmation start. Under ``--moeperf-deadline``, a start that the
previous one shows cannot end before the deadline is not begun (`rounds.Children.begins`): the starts done are kept.
Their records join the session's ledger, which ends the session as any other: one stored run per start under
``--moeperf-update`` (its windows kept apart, ``--moeperf-windows``).

**The plan** (``--moeperf-starts auto`` and ``--moeperf-windows auto``, the defaults): where this host's stored runs of
the tests keep their windows apart, the starts and the windows a start come from each level's variance and cost
(`judging.levels.plan`; the costs are what the stored windows and starts took, their ``window_s`` and ``start_s``),
within what is left of ``--moeperf-deadline``, and the session prints the plan before it runs it. Without such runs:
`settings.GPU_STARTS` starts on a machine with GPUs, 1 without, one window each.

A ``--moeperf-rounds`` parent does the same with its children (`rounds.run`); a child, an xdist worker (it measures
its share on one start) and a collect-only session run nothing in child sessions.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path

import pytest

from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.judging import stats
from pytest_moeperf.judging.levels import Plan, Planned, of_reference, plan
from pytest_moeperf.processes.rounds import Child, Children, deadline_at, judge_all, line, starts_ended
from pytest_moeperf.processes.windows import Windows
from pytest_moeperf.settings import Settings, starts_of
from pytest_moeperf.store.entries import BaselineError


def round_unit(config: pytest.Config, item: pytest.Item) -> str | None:
    """What one process's measurement of ``item`` stands for (None: an ordinary test)."""
    unit: str | None = config.hook.pytest_moeperf_round_unit(config=config, item=item)
    return unit


def applies(config: pytest.Config, settings: Settings, starts: int) -> bool:
    """Whether this session runs its per-start tests in child sessions."""
    return (starts > 1 and settings.round_of is None and not hasattr(config, "workerinput")
            and not config.option.collectonly)


def measured_on_starts(config: pytest.Config, items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """The ``items`` whose round is a start, in order."""
    return [item for item in items if round_unit(config, item) is not None]


def planned(state: Conclusion, tests: Sequence[str], budget_s: float | None) -> Plan | None:
    """Starts x windows for ``tests`` from this host's stored runs (None: none keeps its windows apart, or the
    stored runs do not say what a start and a window cost)."""
    store = state.judge.store
    metrics: list[Planned] = []
    start_s: list[float] = []
    window_s = 0.0
    for test in tests:
        try:
            entries = store.entries_of(test)
        except BaselineError:
            return None  # its tests fail naming the file
        costs: list[float] = []
        for entry in entries:
            ref = entry.reference(store.host)
            found = of_reference(ref)
            metrics.append(Planned(entry.key, found, ref.runs))
            for name, into in (("window_s", costs), ("start_s", start_s)):
                value = entry.context.get(name)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                    into.append(float(value))
        window_s += stats.median(costs) if costs else 0.0
    if not start_s or not window_s:
        return None
    return plan(metrics, max(start_s), window_s, budget_s)


def run(config: pytest.Config, state: Conclusion, nodeids: Sequence[str], starts: int, started: float,
        windows: int | None = None, reserve_s: float = 0.0) -> tuple[int | None, bool]:
    """S child sessions of the tests ``nodeids`` (test ids: each its own start) and their verdicts; ``started``
    is the session's start (``time.time()``), from which the deadline counts; ``reserve_s``: what the starts leave of
    the deadline (the confirmations that run after them). Returns an exit code when a child could not measure (then
    nothing may be written), and whether a test failed in a child or could not be judged (`rounds.judge_all`)."""
    line(f"moeperf: {len(nodeids)} test(s) measure a start: {starts} start(s) of them, each a child session that "
         "starts its own servers (--moeperf-starts)")
    deadline = deadline_at(state.settings, started)
    if deadline is not None and reserve_s > 0:
        line(f"moeperf: the starts leave {reserve_s:.0f} s of --moeperf-deadline to the confirmations that follow them")
        deadline -= reserve_s
    with tempfile.TemporaryDirectory(prefix="moeperf-starts-") as tmp:
        children = Children(config, state, deadline, Path(tmp), windows=windows)
        for j in range(1, starts + 1):
            child = Child(f"{j}/{starts} (start {j})", f"start {j}/{starts}", f"{j}/{starts}")
            if not children.begins(child, nodeids):
                break
            code = children.run(child, nodeids)
            if code is not None:
                return code, children.failed_tests
        tests = set(nodeids)
        broken = judge_all(state, [k for k, r in state.ledger.records.items() if r.metric.test_id in tests])
        starts_ended(state, tests, children.ran)
    return None, children.failed_tests or broken


class Starts:
    """The session's adapter (registered beside it): after the session's own tests have run, the tests that measure
    a start run in S child sessions, and their records join the session's ledger before its end."""

    def __init__(self, state: Conclusion, started: float, windows: Windows,
                 reserve: Callable[[], float] = lambda: 0.0) -> None:
        self.state = state
        self.started = started  # the session's ``time.monotonic()`` at its start: the deadline counts from it
        self.windows = windows  # the windows a start of this process (a planned count replaces the option's)
        self.reserve = reserve  # what the starts leave of the deadline (`processes.confirm_at`: confirmations)

    def plan(self, items: Sequence[pytest.Item], count: int) -> tuple[int, int | None]:
        """The starts and (when planned) the windows a start for ``items``; prints a plan it made."""
        settings = self.state.settings
        if settings.starts is not None or settings.windows is not None or not items:
            return count, None
        left = None if settings.deadline_s is None else settings.deadline_s - (time.monotonic() - self.started)
        found = planned(self.state, [self.state.ids.of_item(item) for item in items], left)
        if found is None:
            return count, None
        line(f"moeperf: plan from the stored runs' variance per level: {found.starts} start(s) x {found.windows} "
             f"window(s) a test, ~{found.seconds:.0f} s (--moeperf-starts/--moeperf-windows auto)")
        for text in found.lines:
            line(f"  {text}")
        self.windows.count = found.windows
        return found.starts, found.windows

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        state = self.state
        count = starts_of(state.settings, 0 if state.topology.simulated else state.topology.gpu_count)
        config = state.config
        planning = state.settings.round_of is None and not hasattr(config, "workerinput") and not \
            config.option.collectonly
        on_starts = measured_on_starts(config, session.items) if planning else []
        count, windows = self.plan(on_starts, count)
        delegated = on_starts if applies(state.config, state.settings, count) else []
        if not delegated:
            return (yield)
        away = {id(item) for item in delegated}
        session.items[:] = [item for item in session.items if id(item) not in away]
        result = yield
        reporter = state.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
        tests = [state.ids.of_item(item) for item in delegated]  # test ids, as the records and MOEPERF_ONLY name them
        code, failed = run(state.config, state, tests, count, time.time() - (time.monotonic() - self.started),
                           windows, self.reserve())
        session.testsfailed += int(failed)
        if code == pytest.ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
        if code is not None:
            session.shouldfail = f"moeperf: a start's child session ended with exit code {code}: nothing written"
            raise session.Failed(session.shouldfail)
        return result
