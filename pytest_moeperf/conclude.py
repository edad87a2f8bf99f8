"""A session's state and its end: the ledger, the judge, the store; and the consumers that read the ledger once
every producer is done (MISSING metrics, fingerprint warnings, extra tables, the machine views: the canary's and the
machine shift, the baseline update, the reports and the history).

The session adapters (`session`) and the ``--moeperf-rounds`` parent (`processes.rounds`) both end here, so a
one-round session and a rounds session write the same reports from the same ledger.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from pytest_moeperf.history.noise import HistoryNoise
from pytest_moeperf.judging import shift
from pytest_moeperf.judging.judge import Judge
from pytest_moeperf.judging.levels import levels_section, of_reference
from pytest_moeperf.judging.machine_judge import MachineJudge
from pytest_moeperf.judging.thresholds import Reference, Threshold
from pytest_moeperf.judging.verdict import Status, Verdict, missing
from pytest_moeperf.ledger import STATE, Ledger, Measurement, suite_of
from pytest_moeperf.machine import probe
from pytest_moeperf.machine.canary import is_canary
from pytest_moeperf.machine.provenance import git_commit_info, pathspecs, perf_environment
from pytest_moeperf.machine.topology import Topology
from pytest_moeperf.reports import document, markdown, render
from pytest_moeperf.settings import Settings, configfile
from pytest_moeperf.store import files
from pytest_moeperf.store.baselines import BaselineStore
from pytest_moeperf.store.entries import BaselineError
from pytest_moeperf.store.keys import TestIds


def _progress(line: str) -> None:
    """A line while the session waits at its end (pytest's output capture is off there)."""
    print(f"moeperf: {line}", file=sys.stderr, flush=True)


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


class Conclusion:
    def __init__(self, config: Any, settings: Settings, topology: Topology) -> None:
        self.config = config  # for the plugin's hooks (verdict, report sections, machine info)
        self.settings = settings
        self.topology = topology
        self.fingerprint = topology.fingerprint
        self.host = settings.host_id or self.fingerprint.host or None
        self.commit = git_commit_info(root := configfile.rootpath(config),
                                      pathspecs(root, [settings.baselines_dir, *settings.code_exclude]))
        self.store = BaselineStore(settings.baselines_dir, self.fingerprint.slug, self.host)
        self.noise = HistoryNoise(settings.history, settings.baselines_dir, self.fingerprint.hash,
                                  settings.noise_runs, self.host, self.commit.get("branch"))
        # a --moeperf-rounds child leaves a changed unit or workload to its parent, which judges all rounds together
        # (and under --moeperf-update re-records them): failing it in the child lost every round of a re-record
        self.judge = Judge(self.store, self._decide, self.fingerprint.hash,
                           settings.update or settings.round_of is not None, settings.strict, self.noise)
        self.ledger = Ledger()
        self.written: list[Path] = []
        self.errors: list[str] = []
        self.lost: list[str] = []  # the requested reports and the history this session could not write
        self.update_failed = False
        self.updated = 0  # metrics written to the baselines
        self.started = _now()
        self.placement_note: str | None = None  # what the header says about xdist workers on shared cores
        moved = configfile.problem(config)  # pytest's rootdir or ini file is not the one the command line meant
        if moved is not None and moved[1]:
            self.ledger.warn(moved[0])
        elif moved is not None:
            self.ledger.notes.append(moved[0])
        self.machine = MachineJudge(self.store, self.ledger)  # the canary's judge

    @functools.cached_property
    def ids(self) -> TestIds:
        """Test ids of metric keys: relative to each test file's project root, not to pytest's rootdir."""
        return TestIds(Path(self.config.rootpath), Path(self.config.invocation_params.dir))

    def _decide(self, measurement: Measurement, rounds: tuple[tuple[float, ...], ...], reference: Reference | None,
                threshold: Threshold) -> Verdict:
        verdict: Verdict = self.config.hook.pytest_moeperf_verdict(
            config=self.config, measurement=measurement, rounds=rounds, reference=reference, threshold=threshold)
        return verdict

    # ------------------------------------------------------------------------------------------ the end
    def find_missing(self) -> None:
        """Baselined metrics of the tests that ran (or skipped, or failed) this session but were not measured."""
        measured = set(self.ledger.records)
        # a degenerate window records what it can: its test's other metrics say why the rest is not there
        windows = {r.metric.test_id: r.verdict.reason for r in self.ledger.records.values()
                   if r.verdict is not None and "window: " in r.verdict.reason}
        states: dict[str, set[Any]] = {}  # the exclusive states (`ledger.STATE`) each test measured this run
        for r in self.ledger.records.values():
            if r.metric.context.get(STATE) is not None:
                states.setdefault(r.metric.test_id, set()).add(r.metric.context[STATE])
        others: list[str] = []
        for nodeid, why in sorted(self.ledger.tests.items()):
            try:
                entries = self.store.entries_of(nodeid)
            except BaselineError:
                continue  # the tests that need it failed, naming the file
            for e in entries:
                if e.key in measured or e.key in self.ledger.missing:
                    continue
                stored = e.context.get(STATE)
                if stored is not None and states.get(nodeid) and stored not in states[nodeid]:
                    others.append(f"{e.key} ({stored})")  # another state's metric: this run measured its own
                    continue
                self.ledger.missing[e.key] = missing(e.key, e.name, e.unit, e.better, e.reference().value,
                                                     why or windows.get(nodeid, "not recorded this run"))
        if others:
            self.ledger.notes.append(f"{len(others)} baselined metric(s) of another state than this run measured "
                                     f"(context '{STATE}') are not expected, not MISSING: {', '.join(others[:4])}"
                                     f"{' …' if len(others) > 4 else ''}")

    def check_fingerprints(self) -> None:
        """Warn (strict: fail) when the baselines cannot be this machine's: another fingerprint hash in a suite's
        file, or no baselines for this fingerprint while the directory holds others (a changed slug: fewer CPUs
        through taskset, a GPU missing, a mistyped --moeperf-baselines)."""
        root = self.settings.baselines_dir
        suites = sorted({suite_of(nodeid) for nodeid in self.ledger.tests})
        for suite in suites:
            try:
                other = self.store.foreign_hash(suite, self.fingerprint.hash)
            except BaselineError:
                continue
            if other is not None:
                self.ledger.warn(f"fingerprint hash differs: {self.store.path(suite)} was recorded on a machine with "
                                 f"fingerprint hash {other}; this one ({self.fingerprint.slug}) is "
                                 f"{self.fingerprint.hash}")
        if not self.ledger.records or self.settings.update:
            return
        if not os.path.lexists(root):  # something else standing there failed the tests that need it, naming it
            self.ledger.warn(f"baselines directory {root} does not exist: every metric is NEW "
                             "(--moeperf-baselines names it; --moeperf-update records one)")
        elif root.is_dir() and not any(self.store.directory.glob("*.json")) and self.store.other_slugs():
            self.ledger.warn(f"no baselines for this machine's fingerprint {self.fingerprint.slug} in {root}, which "
                             f"holds {', '.join(self.store.other_slugs())}: every metric is NEW. A changed fingerprint "
                             "(fewer CPUs through taskset or affinity, a GPU missing or added, another GPU model) "
                             "or the wrong --moeperf-baselines hides the baselines")

    def check_keys(self) -> None:
        """Warn (strict: fail) when a baseline file of a test file that measured holds metrics, but all of other
        test paths: none of its metrics can match, every one is NEW (the test file moved, or its keys were formed
        against another root than the stored ones)."""
        if self.settings.update:
            return
        ran: dict[str, set[str]] = {}
        for record in self.ledger.records.values():
            ran.setdefault(record.metric.suite, set()).add(record.metric.test_id.split("::", 1)[0])
        for suite, paths in sorted(ran.items()):
            try:
                found = self.store.file(suite)
            except BaselineError:
                continue
            stored = sorted({key.split("::", 1)[0] for key in found.entries}) if found else []
            if stored and not paths & set(stored):
                self.ledger.warn(f"{self.store.path(suite)} holds {len(found.entries) if found else 0} metric(s) of "
                                 f"{', '.join(stored[:3])}{' …' if len(stored) > 3 else ''} and none of "
                                 f"{', '.join(sorted(paths))}, which this session measured: none matches, every "
                                 "metric is NEW (a moved test file, or keys formed against another root: see "
                                 "'Metric keys' in the README)")

    def _sections(self) -> None:
        measurements = [r.metric for r in self.ledger.records.values()]
        try:
            verdicts = {key: r.verdict for key, r in self.ledger.records.items() if r.verdict is not None}
            results = self.config.hook.pytest_moeperf_report_sections(config=self.config, measurements=measurements,
                                                                     verdicts=verdicts)
            self.ledger.sections += [section for result in results for section in result]
        except Exception as exc:  # noqa: BLE001 - a broken extra table must not lose the run's results
            self.errors.append(f"report sections failed: {type(exc).__name__}: {exc}")

    def _levels(self) -> None:
        """The report's table of each metric's variance per level (start > window), where stored runs teach it."""
        found = []
        for key in self.ledger.records:
            try:
                entry = self.store.entry(key)
            except BaselineError:
                continue
            ref = entry.reference(self.store.host) if entry is not None else None
            levels = of_reference(ref)
            if levels is not None:
                found.append((key, levels))
        section = levels_section(found)
        if section is not None:
            self.ledger.sections.append(section)

    def _shift(self) -> list[shift.Family]:
        """The machine-shift view (report-only tables); the verdicts inside moved families say so."""
        verdicts, subfamilies = self.ledger.verdicts, self.machine.subfamilies()
        stored = self.store.run_medians(v.key for v in verdicts)
        moved = {v.key: v for v in verdicts}
        views = shift.family_views(verdicts, stored, subfamilies)
        same = {k for k, v in moved.items() if v.status in (Status.IMPROVED, Status.REGRESSED) and self.of_this_code(k)}
        changed = shift.in_moved_families(moved, views, same, subfamilies)  # then the cases beside a common move:
        for key, verdict in {**changed, **shift.beside_common_moves(moved | changed, views, subfamilies)}.items():
            self.ledger.decide(key, verdict)
        shifts = shift.family_views(self.ledger.verdicts, stored, subfamilies)  # the verdicts as they read now
        self.ledger.sections += shift.shift_sections(shifts)
        self.ledger.notes += shift.shift_notes(shifts)
        return [f for f in shifts if f.moved]

    def of_this_code(self, key: str) -> bool:
        """Whether every stored run of ``key`` ran this run's code (`shift.same_code`): a family of such metrics that
        moved as a whole can only be the machine, so its REGRESSED waits for the session's end like another
        host's (`session`)."""
        try:
            entry = self.store.entry(key)
        except BaselineError:
            return False
        return entry is not None and shift.same_code(self._code_now, entry.provenance,
                                               [(r.git_commit, r.code) for r in entry.all_runs])

    @functools.cached_property
    def _code_now(self) -> dict[str, Any]:
        """This run's provenance, once a session (`same_code` reads its commit, software and environment)."""
        return self.provenance()

    def fails_its_test(self, key: str, verdict: Verdict, family_tests: int = 0) -> bool:
        """Whether a REGRESSED fails its test at once; one against other hosts' runs, against runs of this very
        code (a family that moved as a whole is then the machine, a gross change too: `_shift`), beside a canary
        that moved slower (`MachineJudge.slower`), or one its family's common move could explain in a family of
        ``family_tests`` >= `shift.MIN_CASES` tests (`shift.awaits_family`), waits for the session's end."""
        return (verdict.status is Status.REGRESSED and not verdict.provisional
                and not (family_tests >= shift.MIN_CASES and shift.awaits_family(verdict, self._common(key)))
                and not self.of_this_code(key) and not self.machine.slower(key))

    @functools.cache  # noqa: B019 - one session's store: the common mde of ``key``'s family (`shift.common_mde`)
    def _common(self, key: str) -> float:
        return shift.common_mde(runs := self.store.family_runs(key), runs)

    def failing_regressions(self) -> list[Verdict]:
        """The REGRESSED verdicts that fail the session: all of them (those against other hosts' baselines fail only
        here, their tests passed), except under --moeperf-update (reported, not failed) and in a --moeperf-rounds
        child (its parent judges)."""
        if self.settings.update or self.settings.round_of:
            return []
        return [v for v in self.ledger.verdicts if v.status is Status.REGRESSED]

    def finish(self, stopped: bool) -> bool:
        """Run the consumers; True when the session must fail for them (an update that failed or wrote nothing
        it measured; under --moeperf-strict, anything undecided or warned about)."""
        self.noise.close()
        if self.noise.problem:
            self.ledger.notes.append(self.noise.problem)
        self.find_missing()
        self.check_fingerprints()
        self.check_keys()
        self._sections()
        self._levels()
        self.machine.conclude()
        moved = self._shift()
        if self.settings.update:
            if stopped:
                self.errors.append("baselines not updated: the session was interrupted or stopped early "
                                   "(an update is one transaction of a whole session)")
                self.update_failed = bool(self.ledger.records)
            else:
                self._update(moved)
        self._write_reports()
        strict = self.settings.strict and bool(self.ledger.undecided() or self.ledger.warnings or self.lost)
        return self.update_failed or strict or bool(self.failing_regressions())

    def _update(self, moved: list[shift.Family]) -> None:
        from pytest_moeperf.store.update import plan_update

        plan = plan_update(self.ledger, moved, accept_shift=self.settings.accept_shift,
                           simulated=self.topology.simulated)
        self.errors += plan.problems
        if plan.measurements:
            try:
                self.written += self.store.update(plan.measurements, self.fingerprint_record(), self.provenance(),
                                                  self.settings.noise_runs, self.fingerprint.host_facts,
                                                  self.settings.lock_timeout_s, _progress)
                self.updated = len({m.key for m in plan.measurements if not is_canary(m.key)})
            except (BaselineError, OSError, files.FileFormatError) as exc:  # the last: a journal it cannot finish
                self.errors.append(f"baselines not updated: {exc}")
        self.update_failed = self.updated == 0 and bool(self.ledger.records)

    def fingerprint_record(self) -> dict[str, Any]:
        return {"slug": self.fingerprint.slug, "hash": self.fingerprint.hash, "facts": self.fingerprint.facts}

    def provenance(self) -> dict[str, Any]:
        return {"date": _now(), "git_commit": self.commit["id"], "git_dirty": self.commit["dirty"],
                "code": self.commit.get("code"), "software": dict(self.topology.software),
                "driver": self.topology.driver_version, "cuda": self.topology.cuda_version,
                "fingerprint_hash": self.fingerprint.hash, "host_id": self.host, "boot_id": probe.boot_id(),
                "env": perf_environment(os.environ)}

    def machine_info(self) -> dict[str, Any]:
        info = document.base_machine_info()
        info["moeperf"] = {"fingerprint": self.fingerprint.slug, "hash": self.fingerprint.hash, "host": self.host,
                           "host_facts": self.fingerprint.host_facts, "topology": self.topology.to_json()}
        info["cpu"] = {"brand_raw": self.topology.host.cpu_model, "count": self.topology.host.cores,
                       "arch": self.topology.host.arch}
        info["gpus"] = [g.name for g in self.topology.gpus]
        self.config.hook.pytest_moeperf_update_machine_info(config=self.config, machine_info=info)
        return info

    def report_document(self) -> dict[str, Any]:
        """This session's report (the one document the JSON report, the history and the HTML report are made of)."""
        return document.document(self.ledger, self.machine_info(), self.commit, {
            "fingerprint": self.fingerprint.slug, "hash": self.fingerprint.hash, "host": self.host,
            "started": self.started, "round_of": self.settings.round_of},
            extra=self.machine.report_entries())

    def _write_reports(self) -> None:
        from pytest_moeperf.history import plugin as history
        from pytest_moeperf.history.targets import redact

        settings = self.settings
        target = history.resolve_target(settings.history, settings.baselines_dir)
        if settings.report is not None or target is not None or settings.html is not None:
            doc = self.report_document()
            if settings.report is not None:
                self._write("JSON report", settings.report, json.dumps(doc, indent=2, sort_keys=True) + "\n")
            if (target is not None and self.ledger.records and not self.topology.simulated
                    and settings.round_of is None):  # a rounds child: the parent records the merged run
                if history.record_report(doc, target, started=self.started) is not None:
                    self.ledger.notes.append(f"history: this run appended to {redact(target)}")
                else:
                    self.lost.append(f"the history {redact(target)}")
            if settings.html is not None:
                if history.write_html(settings.html, doc, target):
                    self.written.append(settings.html)
                else:
                    self.lost.append(f"the HTML report {settings.html}")
        if settings.markdown is not None:
            lines = markdown.markdown_lines(self.ledger.verdicts, self.ledger.sections, self.header(),
                                          self.ledger.warnings)
            self._write("Markdown summary", settings.markdown, "\n".join(lines) + "\n", append=True)

    def _write(self, what: str, path: Path, text: str, append: bool = False) -> None:
        try:
            files.write_report(path, text, append)
            self.written.append(path)
        except OSError as exc:
            self.errors.append(f"could not write {path}: {exc}")
            self.lost.append(f"the {what} {path}")

    # ------------------------------------------------------------------------------------------ the summary
    def header(self) -> str:
        src = f" [simulated from {self.topology.source}]" if self.topology.simulated else ""
        return (f"{self.fingerprint.slug} (hash {self.fingerprint.hash}, host {self.host or 'unknown'}){src}; "
                f"baselines: {self.store.directory}")

    def summary_lines(self) -> list[tuple[str, bool]]:
        """The terminal summary as (line, red); empty when the session measured and said nothing."""
        ledger = self.ledger
        if not (ledger.verdicts or self.errors or ledger.sections or ledger.warnings or self.lost):
            return []
        verdicts = ledger.verdicts
        out = [(line, False) for line in render.terminal_lines(verdicts, ledger.sections, self.header())]
        out += [(f"moeperf: {line}", True) for line in ledger.warnings]
        if self.settings.update:
            out.append((f"baselines updated: {self.updated} metric(s)", False) if self.updated
                       else ("baselines not updated", True))
        out += [(f"wrote {path}", False) for path in self.written]
        out += [(line, False) for line in render.unit_lines(ledger.records.values())]
        out += [(note, False) for note in ledger.notes]
        out += [(f"moeperf: {error}", True) for error in self.errors]
        undecided_beyond = [v for v in verdicts if v.status is Status.INCONCLUSIVE and v.change is not None
                            and v.mde is not None and abs(v.change) > v.mde]
        if undecided_beyond:
            out.append((f"moeperf: {len(undecided_beyond)} metric(s) moved beyond their threshold but are not "
                        "decided (INCONCLUSIVE: see the reasons above; --moeperf-strict fails them)", True))
        beside = self.machine.beside(self.failing_regressions())
        if beside:
            out.append((f"moeperf: {len(beside)} metric(s) REGRESSED beyond the machine's move (the canary moved; see "
                        "'Machine' in the report): the session fails", True))
        out += [(line, True) for line in shift.awaited_lines(self.failing_regressions(), verdicts, self._common)]
        cross_host = [v for v in self.failing_regressions() if v.provisional]
        if cross_host:
            out.append((f"moeperf: {len(cross_host)} metric(s) REGRESSED against other hosts' baselines, beyond their "
                        "spread between hosts and not in a family that moved as a whole: the session fails", True))
            out += [(f"  {v.key.rsplit('::', 1)[0]}::{v.message()}", True) for v in cross_host]
        improved = [v for v in verdicts if v.status is Status.IMPROVED]
        confirmed = sum(v.reason_to_rerecord for v in improved)
        if confirmed and not self.settings.update:
            out.append((f"{confirmed} metric(s) improved: refresh with --moeperf-update", False))
        if len(improved) > confirmed and not self.settings.update:
            out.append((f"{len(improved) - confirmed} metric(s) IMPROVED but not confirmed (one round, or inside a "
                        "family that moved as a whole): not a reason to re-record yet", False))
        undecided = ledger.undecided()
        if self.settings.strict and (undecided or ledger.warnings):
            out.append((f"moeperf: --moeperf-strict: {len(undecided)} metric(s) INCONCLUSIVE or MISSING and "
                        f"{len(ledger.warnings)} warning(s): the session fails", True))
        if self.settings.strict and self.lost:
            out.append((f"moeperf: --moeperf-strict: not written: {', '.join(self.lost)}: the session fails", True))
        elif self.lost:
            out.append((f"moeperf: not written: {', '.join(self.lost)} (--moeperf-strict fails the session)", True))
        return out
