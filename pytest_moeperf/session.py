"""`MoePerfSession`: the per-run state and the hooks that judge, confirm, collect, store and report metrics.

Verdicts are computed where the test ran (a worker under xdist) and travel to the controller inside the test
report's ``user_properties``, so results from workers merge without loss. A metric that crosses its threshold is
re-measured (the test function is called again, its fixtures kept: a launched server or a rank pool stays up and
only the measurement repeats, and no setup/teardown state of pytest is rewound) up to ``--moeperf-confirm`` times
and judged on all its rounds. MISSING (baselined, not measured) and the baseline update are decided at the
session's end, by the controller; an interrupted or crashed session writes no baseline.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf import report
from pytest_moeperf.baselines import BaselineEntry, BaselineError, BaselineStore, atomic_write, software_changes
from pytest_moeperf.health_record import HealthReport, health_key
from pytest_moeperf.history.noise import HistoryNoise
from pytest_moeperf.records import Measurement, Section, suite_of
from pytest_moeperf.settings import Settings
from pytest_moeperf.shift import family_views, shift_notes, shift_sections
from pytest_moeperf.thresholds import Reference, Threshold, ThresholdError, resolve_threshold
from pytest_moeperf.topology import Topology
from pytest_moeperf.verdict import Status, Verdict, inconclusive, missing

PROPERTY = "moeperf"
perf_key = pytest.StashKey["Any"]()  # the item's Perf object (typed loosely to avoid an import cycle)
confirming_key = pytest.StashKey[bool]()
UNSETTLED = (Status.REGRESSED, Status.INCONCLUSIVE)


class MetricChanged(Exception):
    """A metric's unit or direction differs from its stored entry: the numbers cannot be compared."""


def git_commit_info(root: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    sha = git("rev-parse", "HEAD")
    return {"id": sha or None, "time": git("log", "-1", "--format=%cI") or None,
            "author_time": git("log", "-1", "--format=%aI") or None,
            # without a commit, whether the tree is dirty is unknown too (None), not "clean"
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if sha else None,
            "project": root.name, "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None}


def skip_reason(report: pytest.TestReport) -> str:
    """Why a test did not measure: its skip reason, or that it failed or errored."""
    if report.skipped:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        return f"test skipped: {reason.removeprefix('Skipped: ')}"
    return "test failed" if report.when == "call" else f"test errored in {report.when}"


class MoePerfSession:
    def __init__(self, config: pytest.Config, settings: Settings, topology: Topology) -> None:
        self.config = config
        self.settings = settings
        self.topology = topology
        self.fingerprint = topology.fingerprint
        self.store = BaselineStore(settings.baselines_dir, self.fingerprint.slug)
        self.measurements: list[Measurement] = []  # one per round that may be written to the baselines
        self.verdicts: list[Verdict] = []
        self.results: list[dict[str, Any]] = []  # per metric: verdict, rounds, health (the JSON report's)
        self.passed_keys: set[str] = set()
        self.ran: dict[str, str] = {}  # nodeid → why it did not measure ("" when it ran through)
        self.foreign: list[str] = []  # baseline files recorded on a machine of another fingerprint hash
        self.written: list[Path] = []
        self.errors: list[str] = []
        self.sections: list[Section] = []
        self.update_failed = False
        self.notes: list[str] = []
        self._noise = HistoryNoise(settings.history, settings.baselines_dir, self.fingerprint.hash,
                                   settings.noise_runs)
        self.started = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()

    def judge(self, item: pytest.Item | None, rounds: list[Measurement], threshold: Threshold | None = None,
              check_hash: bool = True) -> tuple[Verdict, BaselineEntry | None]:
        """Judge one metric from its rounds (oldest first); the threshold is resolved for ``item`` unless given.
        Raises `BaselineError`, `ThresholdError`, `MetricChanged`."""
        last = rounds[-1]
        baseline = self.store.lookup(last)
        if baseline is not None and (baseline.unit, baseline.better) != (last.unit, last.better):
            change = (f"{last.name}: unit or direction changed: baseline {baseline.unit!r} ({baseline.better} is "
                      f"better), now {last.unit!r} ({last.better} is better)")
            if not self.settings.update:
                raise MetricChanged(change + "; the numbers cannot be compared: re-record with --moeperf-update")
            baseline = None  # the update starts this metric's runs afresh
        if threshold is None:
            threshold = resolve_threshold(item, self.settings.tolerance, tolerance=last.tolerance,
                                          abs_tolerance=last.abs_tolerance, default_noise_k=self.settings.noise_k)
        verdict: Verdict = self.config.hook.pytest_moeperf_verdict(
            config=self.config, measurement=last, rounds=tuple(m.samples for m in rounds),
            reference=self._with_history(baseline.reference(), last) if baseline else None, threshold=threshold)
        if baseline is not None and self.settings.strict and check_hash:
            other = self.store.foreign_hash(last.suite, self.fingerprint.hash)
            if other is not None:
                verdict = inconclusive(verdict, f"--moeperf-strict: baseline recorded on a machine with fingerprint "
                                                f"hash {other}, this one is {self.fingerprint.hash}")
        return verdict, baseline

    def _with_history(self, reference: Reference, last: Measurement) -> Reference:
        """``reference`` with the medians of this metric's last accepted sessions in the perf history."""
        medians = self._noise.medians(f"{last.test_id}::{last.name}")
        return dataclasses.replace(reference, history_medians=medians) if medians else reference

    def _unsettled(self, item: pytest.Item, perf: Any) -> bool:
        """Whether a metric of the rounds so far is REGRESSED or INCONCLUSIVE on its values (so another round may
        settle it; not for what measuring again cannot change: a zero baseline, another machine's baseline)."""
        for rounds in _by_name(perf.rounds).values():
            try:
                verdict, _ = self.judge(item, rounds, check_hash=False)
            except (BaselineError, ThresholdError, MetricChanged):
                return False  # the test fails for that; measuring again does not help
            if verdict.status in UNSETTLED and verdict.change is not None:
                return True
        return False

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        result = yield
        perf = pyfuncitem.stash.get(perf_key, None)
        if (perf is None or not perf.records or self.settings.update or self.settings.confirm == 0
                or perf.single_round is not None or pyfuncitem.stash.get(confirming_key, False)):
            return result
        for _ in range(self.settings.confirm):
            if not self._unsettled(pyfuncitem, perf):
                break
            perf.new_round()
            pyfuncitem.stash[confirming_key] = True
            try:
                pyfuncitem.ihook.pytest_pyfunc_call(pyfuncitem=pyfuncitem)
            finally:
                pyfuncitem.stash[confirming_key] = False
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        rep = yield
        perf = item.stash.get(perf_key, None)
        if rep.when != "call" or perf is None or not any(perf.rounds):
            return rep
        health: HealthReport | None = item.stash.get(health_key, None)
        sick = [f"health: {'; '.join(health.reasons)}"] if health is not None and not health.ok else []
        payload: list[dict[str, Any]] = []
        regressed: list[str] = []
        broken: dict[str, None] = {}  # unusable baseline files and bad arguments, each named once
        lines: list[str] = []
        for rounds in _by_name(perf.rounds).values():
            try:
                verdict, baseline = self.judge(item, rounds)
            except (BaselineError, ThresholdError, MetricChanged) as exc:
                broken[str(exc)] = None
                continue
            why_not = sick + [f"window: {reason}" for reason in perf.unusable_for(rounds[-1].name)]
            if why_not:
                verdict = inconclusive(verdict, "; ".join(why_not))
            payload.append({"measurement": rounds[-1].to_json(), "rounds": [list(m.samples) for m in rounds],
                            "verdict": verdict.to_json(), "passed": rep.passed and not why_not,
                            "test_passed": rep.passed,
                            "health": None if health is None else {"ok": health.ok, "reasons": list(health.reasons),
                                                                   "facts": dict(health.facts)}})
            line = verdict.message()
            if verdict.status is Status.REGRESSED:
                changes = software_changes(baseline, self.topology.software)
                regressed.append(line + (f"\n  {changes}" if changes else ""))
            lines.append(line)
        # the results travel to the controller (xdist) in the call report; --junitxml writes the item's properties
        # (with the teardown report): one readable property per metric there
        rep.user_properties.append((PROPERTY, json.dumps(payload, separators=(",", ":"), sort_keys=True)))
        item.user_properties.extend(report.junit_properties(entry["verdict"] for entry in payload))
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
        return rep

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        why = "" if report.passed else skip_reason(report)
        if not self.ran.get(report.nodeid):
            self.ran[report.nodeid] = why
        if report.when != "call":
            return
        for name, payload in report.user_properties:
            if name != PROPERTY:
                continue
            entries: list[dict[str, Any]] = json.loads(payload) if isinstance(payload, str) else payload  # type: ignore[assignment]
            for entry in entries:
                self.add_result(entry)

    def add_result(self, entry: dict[str, Any]) -> None:
        """Take one metric's result (from this process, a worker or a round's report)."""
        measurement = Measurement.from_json(entry["measurement"])
        self.measurements.append(measurement)
        self.verdicts.append(Verdict.from_json(entry["verdict"]))
        self.results.append(entry)
        if entry["passed"]:  # the test itself passed (a regression alone does not stop an update)
            self.passed_keys.add(measurement.key)

    def find_missing(self) -> list[Verdict]:
        """Baselined metrics of the tests that ran (or skipped, or failed) this session but were not measured."""
        measured = {v.key for v in self.verdicts}
        # a degenerate window records what it can: its test's other metrics say why the rest is not there
        windows = {v.key.rsplit("::", 1)[0]: v.reason for v in self.verdicts if "window: " in v.reason}
        found: list[Verdict] = []
        for nodeid, why in sorted(self.ran.items()):
            try:
                entries = self.store.entries_of(nodeid)
            except BaselineError:
                continue  # the tests that need it failed, naming the file
            for e in entries:
                if e.key not in measured:
                    found.append(missing(e.key, e.name, e.unit, e.better, e.reference().value,
                                         why or windows.get(nodeid, "not recorded this run")))
        return found

    def check_fingerprints(self) -> None:
        for suite in sorted({suite_of(nodeid) for nodeid in self.ran}):
            try:
                other = self.store.foreign_hash(suite, self.fingerprint.hash)
            except BaselineError:
                continue
            if other is not None:
                self.foreign.append(f"{self.store.path(suite)} was recorded on a machine with fingerprint hash "
                                    f"{other}; this one ({self.fingerprint.slug}) is {self.fingerprint.hash}")

    def provenance(self) -> dict[str, Any]:
        commit = git_commit_info(Path(self.config.rootpath))
        return {"date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
                "git_commit": commit["id"], "git_dirty": commit["dirty"], "software": dict(self.topology.software),
                "driver": self.topology.driver_version, "cuda": self.topology.cuda_version,
                "fingerprint_hash": self.fingerprint.hash}

    def machine_info(self) -> dict[str, Any]:
        info = report.base_machine_info()
        info["moeperf"] = {"fingerprint": self.fingerprint.slug, "hash": self.fingerprint.hash,
                           "topology": self.topology.to_json()}
        info["cpu"] = {"brand_raw": self.topology.host.cpu_model, "count": self.topology.host.cores,
                       "arch": self.topology.host.arch}
        info["gpus"] = [g.name for g in self.topology.gpus]
        self.config.hook.pytest_moeperf_update_machine_info(config=self.config, machine_info=info)
        return info

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        if hasattr(self.config, "workerinput"):
            return  # an xdist worker: the controller stores and reports
        # the hook's exitstatus, not session.exitstatus: a collection-only session (pytester.getitem) has none
        stopped = (exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
                   or bool(session.shouldstop) or bool(session.shouldfail))
        if self.finish(stopped=stopped) and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def finish(self, stopped: bool) -> bool:
        """MISSING, fingerprint check, extra tables, the baseline update (only for a session that ran to its
        end) and the reports. True when the session must fail for it (update failed; strict and undecided)."""
        self._noise.close()  # the noise model's reader; the history write below opens its own connection
        self.notes += [self._noise.problem] if self._noise.problem else []
        self.verdicts += self.find_missing()
        self.check_fingerprints()
        try:
            results: list[list[Section]] = self.config.hook.pytest_moeperf_report_sections(
                config=self.config, measurements=list(self.measurements))
            self.sections += [section for result in results for section in result]
        except Exception as exc:  # noqa: BLE001 - a broken extra table must not lose the run's results
            self.errors.append(f"report sections failed: {type(exc).__name__}: {exc}")
        shifts = family_views(self.verdicts, self.store.run_medians(v.key for v in self.verdicts))  # report-only
        self.sections += shift_sections(shifts)
        self.notes += shift_notes(shifts)
        if self.settings.update:
            if stopped:
                self.errors.append("baselines not updated: the session was interrupted or stopped early "
                                   "(an update is one transaction of a whole session)")
            else:
                self._update_baselines()
        header = self.header()
        from pytest_moeperf.history import plugin as history
        from pytest_moeperf.history.store import redact

        history_target = history.resolve_target(self.settings.history, self.settings.baselines_dir)
        if self.settings.report is not None or history_target is not None or self.settings.html is not None:
            doc = self.report_document()
            if self.settings.report is not None:
                self._write(self.settings.report, json.dumps(doc, indent=2, sort_keys=True) + "\n")
            if (history_target is not None and self.measurements and not self.topology.simulated
                    and self.settings.round_of is None):  # a rounds child: the parent records the merged run
                if history.record_report(doc, history_target, started=self.started) is not None:
                    self.notes.append(f"history: this run appended to {redact(history_target)}")
            if self.settings.html is not None:
                history.write_html(self.settings.html, doc, history_target)
                self.written.append(self.settings.html)
        if self.settings.markdown is not None:
            self._write(self.settings.markdown, "\n".join(report.markdown_lines(self.verdicts, self.sections, header,
                                                                                self.foreign)) + "\n", append=True)
        return self.update_failed or bool(self.settings.strict and self.undecided())

    def report_document(self) -> dict[str, Any]:
        """This session's report in the pytest-benchmark schema (the one document the JSON report, the history
        and the HTML report are made from)."""
        contexts = {m.key: dict(m.context) for m in self.measurements}
        samples = {m.key: list(m.samples) for m in self.measurements}
        doc = report.benchmark_json(self.verdicts, contexts, samples, self.machine_info(),
                                    git_commit_info(Path(self.config.rootpath)), self.sections)
        doc["moeperf"].update(results=self.results, fingerprint_mismatch=self.foreign,
                              missing=[v.to_json() for v in self.verdicts if v.status is Status.MISSING])
        return doc

    def undecided(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in (Status.INCONCLUSIVE, Status.MISSING)]

    def _write(self, path: Path, text: str, append: bool = False) -> None:
        try:
            if append and path.exists():
                with path.open("a") as handle:
                    handle.write(text)
            else:
                atomic_write(path, text)
            self.written.append(path)
        except OSError as exc:
            self.errors.append(f"could not write {path}: {exc}")

    def _update_baselines(self) -> None:
        if self.topology.simulated:
            self.errors.append("baselines not updated: the topology is simulated")
            return
        fresh = [m for m in self.measurements if m.key in self.passed_keys]
        skipped = len(self.measurements) - len(fresh)
        if skipped:
            self.errors.append(f"{skipped} metric(s) of failed tests (or unhealthy windows) were not written to "
                               "the baselines")
        if not fresh:
            return
        fp = {"slug": self.fingerprint.slug, "hash": self.fingerprint.hash, "facts": self.fingerprint.facts}
        try:
            self.written += self.store.update(fresh, fp, self.provenance(), keep_runs=self.settings.noise_runs)
        except (BaselineError, OSError) as exc:
            self.errors.append(f"baselines not updated: {exc}")
            self.update_failed = True

    def header(self) -> str:
        src = f" [simulated from {self.topology.source}]" if self.topology.simulated else ""
        return (f"{self.fingerprint.slug} (hash {self.fingerprint.hash}){src}; "
                f"baselines: {self.store.directory}")

    def summary_lines(self) -> list[tuple[str, bool]]:
        """The terminal summary: (line, red)."""
        out = [(line, False) for line in report.terminal_lines(self.verdicts, self.sections, self.header())]
        out += [(f"moeperf: fingerprint hash differs: {line}", True) for line in self.foreign]
        if self.settings.update:
            updated = {m.key for m in self.measurements} & self.passed_keys
            out.append((f"baselines updated: {len(updated)} metric(s)" if self.written or not self.errors
                        else "baselines not updated", False))
        out += [(f"wrote {path}", False) for path in self.written]
        out += [(note, False) for note in self.notes]
        out += [(f"moeperf: {error}", True) for error in self.errors]
        improved = sum(1 for v in self.verdicts if v.status is Status.IMPROVED)
        if improved and not self.settings.update:
            out.append((f"{improved} metric(s) improved: refresh with --moeperf-update", False))
        undecided = self.undecided()
        if undecided and self.settings.strict:
            out.append((f"moeperf: --moeperf-strict: {len(undecided)} metric(s) INCONCLUSIVE or MISSING: "
                        "the session fails", True))
        return out

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.verdicts and not self.errors and not self.sections and not self.foreign:
            return
        terminalreporter.write_sep("=", "moeperf")
        for line, red in self.summary_lines():
            terminalreporter.write_line(line, red=red)


def _by_name(rounds: tuple[tuple[Measurement, ...], ...]) -> dict[str, list[Measurement]]:
    """Each metric's measurements across the rounds of a test, in recording order."""
    grouped: dict[str, list[Measurement]] = {}
    for m in (m for records in rounds for m in records):
        grouped.setdefault(m.name, []).append(m)
    return grouped
