"""``--moeperf-rounds N``: N independent rounds of the same session, each a separate pytest process.

Between-process variance dominates what a benchmark sees (as pyperf found), so N rounds in N processes are what a
noise model learns from. The parent (this module) runs the same command line N times — same arguments, working
directory, ini file and rootdir — with ``--moeperf-rounds 1``, a private ``--moeperf-report`` and the round in
``MOEPERF_ROUND`` (a child writes no baseline and no Markdown); then it judges every metric on all its rounds,
prints the combined table, writes the reports, and under ``--moeperf-update`` appends one run per round to the
baselines in one transaction (only when every round finished; a round whose window failed the health gate adds
no run, the metric's other rounds still do).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.baselines import BaselineError
from pytest_moeperf.records import Measurement
from pytest_moeperf.session import MetricChanged, MoePerfSession
from pytest_moeperf.settings import ROUND_ENV
from pytest_moeperf.thresholds import Threshold, ThresholdError
from pytest_moeperf.verdict import Status, Verdict, inconclusive


def is_parent(config: pytest.Config, rounds: int, round_of: str | None) -> bool:
    option = config.option
    return (rounds > 1 and round_of is None and not hasattr(config, "workerinput")
            and not any(getattr(option, name, False) for name in ("help", "version", "collectonly", "showfixtures",
                                                                    "markers")))


def child_command(config: pytest.Config, report: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", *config.invocation_params.args, "--moeperf-rounds", "1",
            "--moeperf-report", str(report)]


#: Child output lines worth showing while a round runs: pytest's per-file progress ("… [ 42%]") and the serving
#: windows' progress ("moeperf: [profile] 24/48 requests done …").
_PROGRESS = re.compile(r"\[\s*\d+%\]\s*$|moeperf: \[")


def _run_child(argv: list[str], config: pytest.Config, env: dict[str, str],
               echo: Callable[[str], None] | None) -> subprocess.CompletedProcess[str]:
    """Run one round; its progress lines are echoed (indented) as they come, all its output is kept."""
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(argv, cwd=config.invocation_params.dir, env=env, stdout=subprocess.PIPE, stderr=err,
                                text=True)
        out: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.append(line)
                if echo is not None and _PROGRESS.search(line):
                    echo("    " + line.strip())
            proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, "".join(out), err.read())


class _Writer:
    """Lines to stdout (this runs before pytest's terminal reporter exists)."""

    def line(self, text: str, red: bool = False) -> None:
        print(text, flush=True)

    def write(self, text: str) -> None:
        sys.stdout.write(text)

    def sep(self, char: str, title: str) -> None:
        side = max(3, (80 - len(title) - 2) // 2)
        self.line(f"{char * side} {title} {char * side}")


def run(config: pytest.Config, state: MoePerfSession) -> int:
    """Run the rounds, merge them into ``state`` and report; the exit code."""
    n = state.settings.rounds
    writer = _Writer()
    docs: list[dict[str, Any]] = []
    failed_tests = False
    with tempfile.TemporaryDirectory(prefix="moeperf-rounds-") as tmp:
        for i in range(1, n + 1):
            report = Path(tmp) / f"round-{i}.json"
            writer.line(f"moeperf: round {i}/{n} ...")
            started = time.monotonic()
            try:
                done = _run_child(child_command(config, report), config, env={**os.environ, ROUND_ENV: f"{i}/{n}"},
                                  echo=writer.line if config.get_verbosity() >= 0 else None)
            except KeyboardInterrupt:
                writer.line(f"moeperf: interrupted in round {i}/{n}: nothing written", red=True)
                return int(pytest.ExitCode.INTERRUPTED)
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            writer.line(f"moeperf: round {i}/{n} ({time.monotonic() - started:.0f} s): "
                        f"{lines[-1].strip('= ') if lines else '(no output)'}")
            for line in lines:
                if line.startswith(("FAILED ", "ERROR ")):
                    writer.line(f"  {line}")
            if done.returncode not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) or not report.exists():
                writer.write(done.stdout)
                writer.write(done.stderr)
                writer.line(f"moeperf: round {i}/{n} ended with exit code {done.returncode}: nothing written",
                            red=True)
                return done.returncode or int(pytest.ExitCode.INTERNAL_ERROR)
            failed_tests |= done.returncode == pytest.ExitCode.TESTS_FAILED
            docs.append(json.loads(report.read_text()))
    merge(state, docs)
    fails = state.finish(stopped=False)
    writer.sep("=", f"moeperf ({n} rounds)")
    for line, red in state.summary_lines():
        writer.line(line, red=red)
    regressed = any(v.status is Status.REGRESSED for v in state.verdicts)
    return int(pytest.ExitCode.TESTS_FAILED if (fails or regressed or failed_tests) else pytest.ExitCode.OK)


def merge(state: MoePerfSession, docs: list[dict[str, Any]]) -> None:
    """Judge each metric on its rounds from all children; keep their MISSING and fingerprint warnings."""
    per_key: dict[str, list[dict[str, Any]]] = {}
    missing: dict[str, dict[str, Any]] = {}
    for doc in docs:
        section = doc.get("moeperf", {})
        for entry in section.get("results", []):
            per_key.setdefault(Measurement.from_json(entry["measurement"]).key, []).append(entry)
        for verdict in section.get("missing", []):
            missing.setdefault(verdict["key"], verdict)
        state.foreign += [w for w in section.get("fingerprint_mismatch", []) if w not in state.foreign]
    for key, entries in per_key.items():
        healthy = [e for e in entries if not e.get("health") or e["health"]["ok"]]
        measurements = [Measurement.from_json(e["measurement"]) for e in healthy]
        threshold = Threshold(**entries[-1]["verdict"]["threshold"])
        if measurements:
            try:
                verdict, _ = state.judge(None, measurements, threshold=threshold)
            except (BaselineError, ThresholdError, MetricChanged) as exc:
                state.errors.append(f"{key}: {exc}")  # its test failed in every round, naming it
                continue
        else:
            reasons = sorted({r for e in entries for r in e["health"]["reasons"]})
            verdict = inconclusive(Verdict.from_json(entries[-1]["verdict"]),
                                   f"health: no healthy round ({'; '.join(reasons)})")
        passed = all(e["passed"] for e in entries)
        # an update writes the healthy rounds of a test that passed in every round: an unhealthy window drops that
        # round's run, not the other rounds' (a report from before "test_passed" existed counts health as failure)
        writable = bool(measurements) and all(e.get("test_passed", e["passed"]) for e in entries)
        state.verdicts.append(verdict)
        state.measurements += measurements or [Measurement.from_json(entries[-1]["measurement"])]
        state.results.append({"measurement": entries[-1]["measurement"], "verdict": verdict.to_json(),
                              "rounds": [r for e in entries for r in e["rounds"]], "passed": passed,
                              "health": [e.get("health") for e in entries]})
        if writable:
            state.passed_keys.add(key)
    state.verdicts += [Verdict.from_json(v) for k, v in sorted(missing.items()) if k not in per_key]
