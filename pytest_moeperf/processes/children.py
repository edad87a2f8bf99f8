"""Child pytest sessions: the same command line run again in a fresh process, its progress echoed, its ledger read
back. ``--moeperf-rounds`` runs its rounds this way, and ``moeperf ab`` its sides."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.ledger import Ledger
from pytest_moeperf.processes.termination import held_interrupts, start_child, stop_child
from pytest_moeperf.reports.document import ledger_of

#: the environment variable naming a file of node ids: a child session runs only those tests (the others are
#: deselected), e.g. the extra rounds of the tests whose metrics are still unsettled
ONLY_ENV = "MOEPERF_ONLY"

#: the environment variable naming a directory a parent's children keep their servers' caches in when they have no
#: pytest cache (``-p no:cacheprovider``, as ``moeperf batch`` runs them): the generated models and vLLM's compile
#: caches, so that a session's later starts (``--moeperf-starts``, ``--moeperf-rounds``) reuse what its first made
CACHE_ENV = "MOEPERF_SERVE_CACHE"

#: Child output lines worth showing while it runs: pytest's per-file progress ("… [ 42%]") and the serving
#: windows' progress ("moeperf: [profile] 24/48 requests done …").
_PROGRESS = re.compile(r"\[\s*\d+%\]\s*$|moeperf: \[")


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    stdout: str
    stderr: str
    ledger: Ledger | None  # None: the child wrote no readable report
    problem: str = ""  # why there is no ledger
    document: Mapping[str, Any] | None = None  # the child's whole report (provenance: versions, git commit)

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        return lines[-1].strip("= ") if lines else "(no output)"

    @property
    def failures(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def pytest_command(python: str, args: Sequence[str], report: Path) -> list[str]:
    # option values joined with '=': a separate existing path would count towards pytest's rootdir
    return [python, "-m", "pytest", *args, "--moeperf-rounds=1", f"--moeperf-report={report}"]


def run_child(args: Sequence[str], cwd: Path, env: Mapping[str, str], python: str = sys.executable,
              echo: Callable[[str], None] | None = None, scratch: Path | None = None) -> ChildResult:
    """Run ``python -m pytest ARGS`` with a private JSON report (in a folder of its own in ``scratch``, default the
    temporary directory); progress lines are echoed (indented) as they come, all output is kept; the child's ledger
    is read from its report. The child ends with this process (`termination.start_child`); a KeyboardInterrupt
    (Ctrl-C, or SIGTERM as `termination.Terminated`) interrupts it, waits for its teardown and stops what is left of
    it, then propagates."""
    with (tempfile.TemporaryDirectory(prefix="moeperf-child-", dir=scratch) as tmp,
          tempfile.TemporaryFile(mode="w+", dir=scratch) as err):
        report = Path(tmp) / "report.json"
        argv = pytest_command(python, args, report)
        with held_interrupts() as release:  # a Ctrl-C during the fork is raised below, with the child known
            proc = start_child(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err)
            out: list[str] = []
            try:
                release()
                assert proc.stdout is not None
                for line in proc.stdout:
                    out.append(line)
                    if echo is not None and _PROGRESS.search(line):
                        echo("    " + line.strip())
                proc.wait()
            except BaseException:
                stop_child(proc)
                raise
        err.seek(0)
        stderr = err.read()
        document: Mapping[str, Any] | None = None
        try:
            loaded = json.loads(report.read_text())
            ledger: Ledger | None = ledger_of(loaded)
            document, problem = loaded, ""
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            ledger, problem = None, f"no readable report ({type(exc).__name__}: {exc})"
        return ChildResult(proc.returncode, "".join(out), stderr, ledger, problem, document)


def only_file(directory: Path, nodeids: Sequence[str]) -> Path:
    """A file of node ids for `ONLY_ENV`."""
    path = directory / "only.txt"
    path.write_text("\n".join(nodeids) + "\n")
    return path


def read_only(path: str) -> set[str]:
    return {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
