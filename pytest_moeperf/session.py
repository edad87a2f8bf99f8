"""`MoePerfSession`: pytest's events adapted to the ledger (its end is `conclude`'s). A test's rounds (its call, then
confirmation processes: `processes.confirm`, at the session's end by default: `processes.confirm_at`) become records at
its call report, are judged there (a regression fails *that* test) and travel to the controller in the report's
``user_properties`` (xdist), where the ledger takes them."""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

import pytest

from pytest_moeperf.conclude import Conclusion
from pytest_moeperf.judging.judge import MetricChanged, budget_ended, settled
from pytest_moeperf.judging.thresholds import Threshold, ThresholdError, resolve_threshold
from pytest_moeperf.judging.verdict import Verdict
from pytest_moeperf.ledger import Measurement, Record, records_of
from pytest_moeperf.machine.markers import threshold_marker
from pytest_moeperf.perf import Perf
from pytest_moeperf.processes.confirm import Confirmed
from pytest_moeperf.processes.confirm_at import ConfirmAt
from pytest_moeperf.reports import junit
from pytest_moeperf.runtime import (
    carry_test_id,
    confirmed_key,
    deferred_key,
    function_cases,
    health_key,
    perf_key,
    reported_test_id,
    skip_reason,
)
from pytest_moeperf.settings import quiet_floor_of
from pytest_moeperf.store.entries import BaselineError, software_changes

PROPERTY = "moeperf"
JUDGING_ERRORS = (BaselineError, ThresholdError, MetricChanged)


class MoePerfSession(Conclusion):
    confirm_at: ConfirmAt | None = None  # when its tests are confirmed (`processes.confirm_at`)

    def _threshold(self, item: pytest.Item, metric: Measurement) -> Threshold:
        s = self.settings
        return resolve_threshold(threshold_marker(item), s.tolerance, tolerance=metric.tolerance,
                                 abs_tolerance=metric.abs_tolerance, default_noise_k=s.noise_k,
                                 quiet_floor=quiet_floor_of(s))

    def wants_confirmation(self, item: pytest.Item) -> bool:
        """Whether another round can settle a metric of this test (a bad baseline or argument cannot be)."""
        perf = item.stash.get(perf_key, None)
        try:
            return perf is not None and any(not settled(self.judge.judge(r)) for r in self.records(item, perf, True))
        except JUDGING_ERRORS:
            return False

    def records(self, item: pytest.Item, perf: Perf, test_passed: bool) -> list[Record]:
        """The test's records: the rounds of its call in this process, then those of its confirmation processes."""
        health, extra = item.stash.get(health_key, {}), item.stash.get(confirmed_key, Confirmed()).rounds
        return [Record(measured[-1][1], tuple(perf.round_of(i, name, m.samples, test_passed, health.get(i))
                                              for i, m in measured) + tuple(extra.get(name, ())),
                       self._threshold(item, measured[-1][1])) for name, measured in perf.by_metric().items()]

    def _verdict(self, item: pytest.Item, record: Record, perf: Perf) -> Verdict:
        verdict = self.judge.judge(record)
        if perf.single_round is not None:
            why = perf.single_round if perf.round_unit else f"the test is measured once a session: {perf.single_round}"
            return budget_ended(verdict, 0, f"{perf.more_rounds} ({why})")
        return verdict if self.settings.update else item.stash.get(confirmed_key, Confirmed()).ended(
            verdict, self.settings.confirm)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        rep = yield
        carry_test_id(rep, self.ids.of_item(item))
        if rep.when == "call" and not item.stash.get(deferred_key, False):
            self.judge_report(item, rep)
        return rep

    def judge_report(self, item: pytest.Item, rep: pytest.TestReport) -> list[tuple[str, str]]:
        """Judge the test's metrics on all its rounds into its call report (a regression fails it); the JUnit
        properties it added to the item (its teardown report carries them to the XML)."""
        perf = item.stash.get(perf_key, None)
        if perf is None or not any(perf.rounds):
            return []
        records: list[Record] = []
        broken: dict[str, None] = {}  # bad baseline files and arguments, each named once
        regressed, lines = list[str](), list[str]()  # failing messages; every verdict's line
        try:
            built = self.records(item, perf, rep.passed)
        except ThresholdError as exc:
            built, broken[str(exc)] = [], None
        for record in built:
            try:
                verdict = self._verdict(item, record, perf)
            except JUDGING_ERRORS as exc:
                broken[str(exc)] = None
                continue
            records.append(Record(record.metric, record.rounds, record.threshold, verdict))
            lines.append(verdict.message())
            if self.fails_its_test(record.key, verdict, function_cases(item)):
                changes = software_changes(self.judge.store.entry(record.key), self.topology.software)
                regressed.append(verdict.message() + (f"\n  {changes}" if changes else ""))
        payload = json.dumps([r.to_json() for r in records], separators=(",", ":"), sort_keys=True)
        rep.user_properties.append((PROPERTY, payload))  # to the controller (xdist) and to this session's ledger
        properties = junit.properties([r.verdict for r in records if r.verdict is not None])
        item.user_properties.extend(properties)
        # under --moeperf-update a regression is reported, not failed; a --moeperf-rounds child leaves the
        # verdict to its parent, which judges all rounds together
        judged_here = not (self.settings.update or self.settings.round_of)
        if rep.passed and (broken or (regressed and judged_here)):
            rep.outcome = "failed"
            head = (f"moeperf: {len(regressed)} metric(s) regressed against baselines/{self.fingerprint.slug}"
                    if regressed else "moeperf: baseline unusable or metric misused")
            rep.longrepr = "\n".join([head] + ["  " + p for p in [*broken, *regressed]])
        elif lines:
            rep.sections.append(("moeperf metrics", "\n".join(lines)))
        return properties

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.ledger.note_test(reported_test_id(report, self.ids), skip_reason(report))
        if report.when != "call":
            return
        for name, payload in report.user_properties:
            if name == PROPERTY:
                for record in records_of(json.loads(payload) if isinstance(payload, str) else payload):  # type: ignore[arg-type]
                    self.ledger.add(record)
                    if record.verdict is not None:
                        self.ledger.decide(record.key, record.verdict)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        if hasattr(self.config, "workerinput"):
            return  # an xdist worker: the controller stores and reports
        # the hook's exitstatus, not session.exitstatus: a collection-only session (pytester.getitem) has none
        stopped = (exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
                   or bool(session.shouldstop) or bool(session.shouldfail))
        if self.finish(stopped=stopped) and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        lines = self.summary_lines()
        if not lines:
            return
        terminalreporter.write_sep("=", "moeperf")
        for line, red in lines:
            terminalreporter.write_line(line, red=red)
