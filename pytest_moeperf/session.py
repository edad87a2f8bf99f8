"""`MoePerfSession`: the per-run state and the hooks that judge, collect, store and report metrics.

Verdicts are computed where the test ran (a worker under xdist) and travel to the controller inside the test
report's ``user_properties``, so results from workers merge without loss.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf import report
from pytest_moeperf.baselines import BaselineEntry, BaselineError, BaselineStore, atomic_write
from pytest_moeperf.records import Measurement, Section
from pytest_moeperf.settings import Settings
from pytest_moeperf.stats import summarize
from pytest_moeperf.thresholds import Threshold, resolve_threshold
from pytest_moeperf.topology import Topology
from pytest_moeperf.verdict import Status, Verdict, judge

PROPERTY = "moeperf"
perf_key = pytest.StashKey["Any"]()  # the item's Perf object (typed loosely to avoid an import cycle)


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
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "project": root.name, "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None}


def software_changes(baseline: BaselineEntry | None, current: dict[str, str]) -> str:
    if baseline is None:
        return ""
    before = baseline.provenance.get("software", {})
    if not isinstance(before, dict):
        return ""
    changed = [f"{k} {before.get(k, '-')} -> {current.get(k, '-')}" for k in sorted(set(before) | set(current))
               if before.get(k) != current.get(k)]
    return ("software changed since the baseline: " + ", ".join(changed)) if changed else ""


class MoePerfSession:
    def __init__(self, config: pytest.Config, settings: Settings, topology: Topology) -> None:
        self.config = config
        self.settings = settings
        self.topology = topology
        self.fingerprint = topology.fingerprint
        self.store = BaselineStore(settings.baselines_dir, self.fingerprint.slug)
        self.measurements: list[Measurement] = []
        self.verdicts: list[Verdict] = []
        self.passed_keys: set[str] = set()
        self.written: list[Path] = []
        self.errors: list[str] = []
        self.sections: list[Section] = []
        self.update_failed = False

    # ------------------------------------------------------------------------------------------ judging
    def judge(self, item: pytest.Item, measurement: Measurement) -> tuple[Verdict, BaselineEntry | None]:
        baseline = self.store.lookup(measurement)
        threshold: Threshold = resolve_threshold(item, self.settings.tolerance, tolerance=measurement.tolerance,
                                                 abs_tolerance=measurement.abs_tolerance)
        verdict = self.config.hook.pytest_moeperf_verdict(config=self.config, measurement=measurement,
                                                          baseline=baseline, threshold=threshold)
        return verdict, baseline

    @pytest.hookimpl(trylast=True)
    def pytest_moeperf_verdict(self, measurement: Measurement, baseline: BaselineEntry | None,
                               threshold: Threshold) -> Verdict:
        return judge(measurement.key, measurement.name, measurement.unit, measurement.better,
                     summarize(measurement.samples), baseline.summary if baseline else None, threshold)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        rep = yield
        perf = item.stash.get(perf_key, None)
        if rep.when != "call" or perf is None or not perf.records:
            return rep
        payload: list[dict[str, Any]] = []
        regressed: list[str] = []
        broken: dict[str, None] = {}  # unusable baseline files, each named once
        lines: list[str] = []
        for measurement in perf.records:
            try:
                verdict, baseline = self.judge(item, measurement)
            except BaselineError as exc:
                broken[str(exc)] = None
                continue
            payload.append({"measurement": measurement.to_json(), "verdict": verdict.to_json(),
                            "passed": rep.passed})
            line = verdict.message()
            if verdict.status is Status.REGRESSED:
                changes = software_changes(baseline, self.topology.software)
                regressed.append(line + (f"\n  {changes}" if changes else ""))
            lines.append(line)
        rep.user_properties.append((PROPERTY, payload))
        if rep.passed and (broken or (regressed and not self.settings.update)):
            rep.outcome = "failed"
            head = (f"moeperf: {len(regressed)} metric(s) regressed against baselines/{self.fingerprint.slug}"
                    if regressed else "moeperf: baseline unusable")
            rep.longrepr = "\n".join([head] + ["  " + p for p in [*broken, *regressed]])
        elif lines:
            rep.sections.append(("moeperf metrics", "\n".join(lines)))
        return rep

    # ------------------------------------------------------------------------------------------ collecting
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, payload in report.user_properties:
            if name != PROPERTY:
                continue
            entries: list[dict[str, Any]] = payload  # type: ignore[assignment]
            for entry in entries:
                measurement = Measurement.from_json(entry["measurement"])
                self.measurements.append(measurement)
                self.verdicts.append(Verdict.from_json(entry["verdict"]))
                if entry["passed"]:  # the test itself passed (a regression alone does not stop an update)
                    self.passed_keys.add(measurement.key)

    # ------------------------------------------------------------------------------------------ finishing
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
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):
            return  # an xdist worker: the controller stores and reports
        try:
            results: list[list[Section]] = self.config.hook.pytest_moeperf_report_sections(
                config=self.config, measurements=list(self.measurements))
            for result in results:
                self.sections.extend(result)
        except Exception as exc:  # noqa: BLE001 - a broken extra table must not lose the run's results
            self.errors.append(f"report sections failed: {type(exc).__name__}: {exc}")
        if self.settings.update:
            self._update_baselines()
            if self.update_failed and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        header = self.header()
        if self.settings.report is not None:
            contexts = {m.key: dict(m.context) for m in self.measurements}
            samples = {m.key: list(m.samples) for m in self.measurements}
            doc = report.benchmark_json(self.verdicts, contexts, samples, self.machine_info(),
                                        git_commit_info(Path(self.config.rootpath)), self.sections)
            self._write(self.settings.report, json.dumps(doc, indent=2, sort_keys=True) + "\n")
        if self.settings.markdown is not None:
            self._write(self.settings.markdown, "\n".join(report.markdown_lines(self.verdicts, self.sections,
                                                                                header)) + "\n", append=True)

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
            self.errors.append(f"{skipped} metric(s) of failed tests were not written to the baselines")
        if not fresh:
            return
        fp = {"slug": self.fingerprint.slug, "hash": self.fingerprint.hash, "facts": self.fingerprint.facts}
        try:
            self.written += self.store.update(fresh, fp, self.provenance())
        except (BaselineError, OSError) as exc:
            self.errors.append(f"baselines not updated: {exc}")
            self.update_failed = True

    def header(self) -> str:
        src = f" [simulated from {self.topology.source}]" if self.topology.simulated else ""
        return (f"{self.fingerprint.slug} (hash {self.fingerprint.hash}){src}; "
                f"baselines: {self.store.directory}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.verdicts and not self.errors and not self.sections:
            return
        terminalreporter.write_sep("=", "moeperf")
        for line in report.terminal_lines(self.verdicts, self.sections, self.header()):
            terminalreporter.write_line(line)
        if self.settings.update:
            updated = {m.key for m in self.measurements} & self.passed_keys
            terminalreporter.write_line(f"baselines updated: {len(updated)} metric(s)")
        for path in self.written:
            terminalreporter.write_line(f"wrote {path}")
        for error in self.errors:
            terminalreporter.write_line(f"moeperf: {error}", red=True)
        improved = sum(1 for v in self.verdicts if v.status is Status.IMPROVED)
        if improved and not self.settings.update:
            terminalreporter.write_line(f"{improved} metric(s) improved: refresh with --moeperf-update")
