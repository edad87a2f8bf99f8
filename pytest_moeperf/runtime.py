"""The pytest runtime of the plugin: every stash key in one place, and what the hooks read off pytest's objects.

Nothing below the session adapters imports this module: the ledger, the judge, the store and the reports take
plain values.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest

from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.ledger import DEADLINE_SKIP, SKIPPED, HealthReport
from pytest_moeperf.machine.markers import MarkerError, family_keys
from pytest_moeperf.perf import Perf
from pytest_moeperf.processes.confirm import Confirmed
from pytest_moeperf.settings import Settings
from pytest_moeperf.store.keys import REPORT_ATTRIBUTE, TestIds

#: the resolved options of this session
settings_key = pytest.StashKey[Settings]()
#: the session state: ledger, judge, store (a `session.MoePerfSession`)
session_key = pytest.StashKey[Conclusion]()
#: a test item's `Perf` (set by the ``perf`` fixture)
perf_key = pytest.StashKey[Perf]()
#: the health gate's report of each round's window of a test item (round index -> report)
health_key = pytest.StashKey[dict[int, HealthReport]]()
#: set on an item while another window of it runs (``--moeperf-windows``)
confirming_key = pytest.StashKey[bool]()
#: what an item's confirmation processes measured (`processes.confirm`)
confirmed_key = pytest.StashKey[Confirmed]()
#: set on an item whose confirmation waits for the session's end, its reports held (`processes.deferred`)
deferred_key = pytest.StashKey[bool]()
#: `time.monotonic()` when the session was configured (``--moeperf-deadline`` counts from it)
started_key = pytest.StashKey[float]()
#: undoes the environment an interconnect emulation set
restore_env_key = pytest.StashKey[Callable[[], None]]()
#: in a child session (a --moeperf-rounds round, a moeperf ab side): its SIGTERM handler, closed at unconfigure
child_key = pytest.StashKey[contextlib.ExitStack]()


def new_perf(item: pytest.Item) -> Perf:
    """A fresh `Perf` for a test item, kept in its stash: the ``perf`` fixture's, or an adopted pytest-benchmark
    test's (`adoption`). Its metrics are keyed by the test's id relative to its project root (`store.keys`)."""
    config = item.config
    state = config.stash[session_key]
    topo = state.topology
    unit = config.hook.pytest_moeperf_round_unit(config=config, item=item)
    try:
        family = family_keys(item)
    except MarkerError:
        family = ()  # its test errored at setup, naming the marker
    recorder = Perf(state.ids.of_item(item), simulated_from=topo.source if topo.simulated else None, round_unit=unit,
                    family=family)
    item.stash[perf_key] = recorder
    return recorder


def skip_reason(report: pytest.TestReport) -> str:
    """Why a test did not measure: its skip reason, or that it failed or errored ("" when it passed)."""
    if report.passed:
        return ""
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        return f"{SKIPPED}{reason.removeprefix('Skipped: ')}"
    return "test failed" if report.when == "call" else f"test errored in {report.when}"


def carry_test_id(report: pytest.TestReport, test_id: str) -> None:
    """Attach a test's id in metric keys (`store.keys`) to its report: it travels with the report from an xdist
    worker, which has the item, to the controller, which has only the node id."""
    setattr(report, REPORT_ATTRIBUTE, test_id)


def reported_test_id(report: pytest.TestReport, ids: TestIds) -> str:
    """The test id a report carries, else its node id's."""
    carried = getattr(report, REPORT_ATTRIBUTE, None)
    return carried if isinstance(carried, str) else ids.of_nodeid(report.nodeid)


def seconds_left(config: pytest.Config) -> float | None:
    """What is left of ``--moeperf-deadline`` (None: no deadline)."""
    settings = config.stash[settings_key]
    if settings.deadline_s is None:
        return None
    if settings.deadline_at is not None:
        return settings.deadline_at - time.time()
    return settings.deadline_s - (time.monotonic() - config.stash[started_key])


def skip_past_deadline(config: pytest.Config) -> None:
    """Skip the running test when ``--moeperf-deadline`` has passed. Called before every test that records
    metrics, or, for a test marked ``moeperf_deadline_inside``, by the test itself before it starts new work."""
    settings = config.stash[settings_key]
    deadline = settings.deadline_s
    if deadline is None:
        return
    if settings.deadline_at is not None:  # a child of a parent: the session's deadline, counted from its start
        past = time.time() - settings.deadline_at
        if past > 0:
            pytest.skip(f"--moeperf-deadline {deadline:g} s passed ({past:.0f} s ago, counted from the start of the "
                        "session whose round this is): the batch's time slot is used up")
        return
    elapsed = time.monotonic() - config.stash[started_key]
    if elapsed > deadline:
        pytest.skip(f"{DEADLINE_SKIP}{deadline:g} s passed ({elapsed:.0f} s into the session): "
                    "the batch's time slot is used up")


def function_cases(item: pytest.Item) -> int:
    """How many of the session's tests are ``item``'s test function's cases: the most cases a family (one test file,
    one metric name) of its metrics can judge, as far as its call knows (a family spread over several functions
    counts as smaller, so its REGRESSED fails its test at once, as before: `Conclusion.fails_its_test`)."""
    name = getattr(item, "originalname", item.name)
    return sum(i.path == item.path and getattr(i, "originalname", i.name) == name for i in item.session.items)
