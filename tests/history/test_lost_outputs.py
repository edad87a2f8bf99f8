"""A requested report or history that could not be written is not lost silently (issue 37, item 7): under
``--moeperf-strict`` the session fails, naming what was lost; without, it warns as before. Either way no empty or
partial file is left: a history that is not SQLite or is corrupt stays as it was, and on a full disk (a real
``ulimit -f`` on a real pytest process) no history, report or summary is left half written."""

from __future__ import annotations

import hashlib
import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _ENTRY_POINT
from tests.history.conftest import listing

TEST = "def test_p(perf):\n    perf.record('t', [1.0, 1.01, 0.99, 1.0, 1.02], unit='ms')\n"
SUMMARY_LIMIT_KB = 4  # ulimit -f: the JSON report (~6 KB), the HTML report and a history's first pages are larger


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(pytester: pytest.Pytester, run_moeperf) -> pytest.Pytester:  # type: ignore[no-untyped-def]
    """A project whose one metric has a baseline, so a judged session is clean (PASS, no warning) but for what the
    test does to its outputs."""
    pytester.makepyfile(test_p=TEST)
    run_moeperf("--moeperf-update", "--moeperf-history", "off").assert_outcomes(passed=1)
    return pytester


def _corrupt(path: Path) -> None:
    """A real history whose pages after the first are overwritten: SQLite opens it, then reads garbage."""
    from pytest_moeperf.history.plugin import record_session
    from pytest_moeperf.history.records import records_from_report
    from tests.history.sessions import KEY, report_doc

    assert record_session(*records_from_report(report_doc(0, {KEY: 1.0})), str(path)) == 1
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xa5" * (len(data) - 4096)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind", ["not-sqlite", "corrupt"])
def test_a_history_that_cannot_be_written_fails_a_strict_session(project: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                 kind: str) -> None:
    history = project.path / f"{kind}.sqlite"
    if kind == "not-sqlite":
        history.write_text("not a database\n")
    else:
        _corrupt(history)
    before = digest(history)
    strict = run_moeperf(f"--moeperf-history={history}", "--moeperf-strict", "-W", "always")
    strict.assert_outcomes(passed=1)
    assert strict.ret == pytest.ExitCode.TESTS_FAILED, strict.stdout.str()
    strict.stdout.fnmatch_lines([f"moeperf: --moeperf-strict: not written: the history {history}: the session fails"])
    lenient = run_moeperf(f"--moeperf-history={history}", "-W", "always")
    assert lenient.ret == pytest.ExitCode.OK, lenient.stdout.str()
    lenient.stdout.fnmatch_lines(["*HistoryWarning: moeperf history not written: *",
                                  f"moeperf: not written: the history {history} (--moeperf-strict fails the session)"])
    assert digest(history) == before, "the history was left as it was"
    assert sorted(p.name for p in project.path.iterdir() if p.name.startswith(f".{kind}")) == [], "no file beside it"


def _session(project: pytest.Pytester, limit_kb: int | None, *args: str) -> subprocess.CompletedProcess[str]:
    """A real pytest process in ``project`` under ``ulimit -f LIMIT_KB`` (a full disk, for every file it writes)."""
    plugin = [] if _ENTRY_POINT else ["-p", "pytest_moeperf.plugin"]
    argv = [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "--moeperf-baselines",
            str(project.path / "baselines"), "--moeperf-health", "off", "-W", "always", *args]
    command = " ".join(shlex.quote(a) for a in argv)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(["bash", "-c", f"ulimit -f {limit_kb}; exec {command}" if limit_kb else f"exec {command}"],
                          cwd=project.path, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("strict", [True, False])
def test_a_full_disk_leaves_no_empty_or_partial_file(project: pytest.Pytester, strict: bool) -> None:
    out = project.path / "out"
    summary = project.path / "summary.md"
    summary.write_text("# earlier sessions\n" + "x" * (SUMMARY_LIMIT_KB * 1024 - 200) + "\n")  # an append crosses
    before = digest(summary)
    done = _session(project, SUMMARY_LIMIT_KB, "--moeperf-history", str(out / "history.sqlite"),
                    "--moeperf-report", str(out / "report.json"), "--moeperf-html", str(out / "report.html"),
                    "--moeperf-markdown", str(summary), *(["--moeperf-strict"] if strict else []))
    output = done.stdout + done.stderr
    assert not out.exists() or sorted(os.listdir(out)) == [], f"left behind: {sorted(os.listdir(out))}"
    assert digest(summary) == before, "the summary is as it was, without part of this session's text"
    lost = (f"not written: the JSON report {out / 'report.json'}, the history {out / 'history.sqlite'}, "
            f"the HTML report {out / 'report.html'}, the Markdown summary {summary}")
    if strict:
        assert done.returncode == 1, output
        assert f"moeperf: --moeperf-strict: {lost}: the session fails" in output, output
    else:
        assert done.returncode == 0, output
        assert f"moeperf: {lost} (--moeperf-strict fails the session)" in output, output
    assert "HistoryWarning: moeperf history not written: " in output and "File too large" in output, output


def test_the_same_session_writes_everything_with_room(project: pytest.Pytester) -> None:
    """The control: the same command without the limit writes each output whole, and exits 0 under strict."""
    out = project.path / "out"
    done = _session(project, None, "--moeperf-history", str(out / "history.sqlite"), "--moeperf-report",
                    str(out / "report.json"), "--moeperf-html", str(out / "report.html"), "--moeperf-strict")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(os.listdir(out)) == ["history.sqlite", "report.html", "report.json"]
    with sqlite3.connect(out / "history.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM moeperf_runs").fetchone() == (1,)


def test_a_summary_append_that_fails_is_taken_back(project: pytest.Pytester) -> None:
    """``--moeperf-markdown`` appends (``$GITHUB_STEP_SUMMARY`` collects sessions): an append cut short by a full disk
    is taken back, so the file ends with the earlier sessions' text, not with part of this one's."""
    summary = project.path / "summary.md"
    summary.write_text("# earlier sessions\n" + "x" * (SUMMARY_LIMIT_KB * 1024 - 200) + "\n")
    before = digest(summary)
    done = _session(project, SUMMARY_LIMIT_KB, "--moeperf-history", "off", "--moeperf-markdown", str(summary))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"could not write {summary}: [Errno 27] File too large" in done.stdout, done.stdout
    assert digest(summary) == before and summary.stat().st_size < SUMMARY_LIMIT_KB * 1024


def test_sessions_creating_one_new_history_at_once_each_land_in_it(tmp_path: Path) -> None:
    """A new SQLite history is written beside its path and linked into place whole; a session that finds another's
    already there appends to it instead: four at once, four runs, no file beside it."""
    from concurrent.futures import ThreadPoolExecutor

    from pytest_moeperf.history.plugin import record_session
    from pytest_moeperf.history.records import records_from_report
    from pytest_moeperf.history.store import HistoryStore
    from tests.history.sessions import KEY, report_doc

    target = str(tmp_path / "new" / "history.sqlite")
    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda i: record_session(*records_from_report(report_doc(i, {KEY: 1.0 + i})), target),
                            range(4)))
    assert None not in ids
    with HistoryStore.read(target) as store:
        assert sorted(p.metric.median for p in store.series(KEY)) == [1.0, 2.0, 3.0, 4.0]
    assert listing(tmp_path / "new") == ["history.sqlite"]
