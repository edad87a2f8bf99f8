"""``moeperf ab`` run as a user runs it: real child pytest sessions of a synthetic suite on two sides.

The synthetic test's samples are scaled by ``MOEPERF_TEST_SCALE`` (the head side's environment sets it: a
deterministic slowdown) and moved by a bounded random jitter (±1 %, drawn anew in each process), so every verdict
below is certain, not likely: a ×1.10 head makes every pair's ratio at least 1.076, an A/A run keeps every ratio
within ±2 %. Each child session takes 1–3 s on a loaded 2-core box; the file runs about 60 of them (about 2 minutes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from pytest_moeperf.reports.document import metric_entries
from tests.ab.sessions import COMMAND, PYTEST, alive, commit, git, moeperf_ab

SUITE = """
import os, random

def test_latency(perf):
    scale = float(os.environ.get("MOEPERF_TEST_SCALE", "1.0"))
    jitter = random.uniform(0.99, 1.01)
    perf.record("latency", [v * scale * jitter for v in (10.0, 10.1, 9.9, 10.0)], unit="ms")

def test_bandwidth(perf):
    perf.record("gbps", [100.0, 101.0, 99.0], unit="GB/s", better="higher")
"""
LATENCY = "test_syn.py::test_latency::latency"
GBPS = "test_syn.py::test_bandwidth::gbps"


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_syn.py").write_text(SUITE)
    return tmp_path


def test_a_slower_head_is_regressed_after_extra_pairs_of_its_test_alone(suite: Path) -> None:
    # looks at 6 and 8 pairs, alpha 0.1 / 2 looks = 0.05 a look
    html = ("--html", "r.html") if importlib.util.find_spec("matplotlib") else ()  # the history extra draws it
    done = moeperf_ab("--head-env", "MOEPERF_TEST_SCALE=1.10", "--pairs", "6", "--max-pairs", "8", "--alpha", "0.1",
                      "--seed", "1", "-q", "--report", "r.json", "--markdown", "s.md", "--junitxml", "j.xml", *html,
                      "--", "test_syn.py", *PYTEST, cwd=suite)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # 6 pairs: p = 2/64 for latency, but the false-discovery control over 2 metrics doubles it (q = 0.0625)
    assert "moeperf ab: look 1 of at most 2, 6 pairs: 1 pass, 1 inconclusive (1 can be decided by more pairs)" in out
    assert "moeperf ab: block 4 (" in out and ", 1 test(s))" in out  # one more block, of test_latency only
    assert "moeperf ab: look 2 of at most 2, 8 pairs: 1 pass, 1 regressed" in out
    assert f"{LATENCY}" in out and "REGRESSED" in out

    doc = json.loads((suite / "r.json").read_text())
    ab = doc["moeperf"]["ab"]
    assert ab["sides"]["base"]["env"] == {} and ab["sides"]["head"]["env"] == {"MOEPERF_TEST_SCALE": "1.10"}
    assert ab["sides"]["base"]["python"] == ab["sides"]["head"]["python"]
    assert ab["sides"]["head"]["software"]["python"] and ab["sides"]["head"]["git"]
    assert ab["differences"] == ["env MOEPERF_TEST_SCALE: - -> 1.10"]
    assert ab["metrics"][LATENCY]["pairs"] == 8 and ab["metrics"][GBPS]["pairs"] == 6
    assert ab["metrics"][LATENCY]["p"] == pytest.approx(2 / 256)
    assert 0.07 < ab["metrics"][LATENCY]["estimate"] < 0.13
    assert [p["label"] for p in ab["processes"]].count("head 8") == 1 and len(ab["processes"]) == 16
    verdicts = {b["fullname"]: b["extra_info"]["verdict"] for b in metric_entries(doc)}
    assert verdicts == {LATENCY: "REGRESSED", GBPS: "PASS"}
    records = {r["metric"]["test_id"] + "::" + r["metric"]["name"]: r for r in doc["moeperf"]["records"]}
    origins = [r["origin"] for r in records[LATENCY]["rounds"]]
    assert sorted(origins) == sorted([f"base {k}" for k in range(1, 9)] + [f"head {k}" for k in range(1, 9)])

    summary = (suite / "s.md").read_text()
    assert "### Regressions" in summary and "### A/B sides" in summary and "MOEPERF_TEST_SCALE=1.10" in summary
    suite_xml = ElementTree.parse(suite / "j.xml").getroot().find("testsuite")
    assert suite_xml is not None and suite_xml.get("failures") == "1" and suite_xml.get("tests") == "2"
    if html:
        page = (suite / "r.html").read_text()
        assert "A/B sides" in page and "REGRESSED" in page


def test_a_a_calibration_finds_no_regression(suite: Path) -> None:
    done = moeperf_ab("--aa", "--pairs", "6", "--max-pairs", "6", "--seed", "2", "-q", "--report", "aa.json", "--",
                      "test_syn.py", *PYTEST, cwd=suite)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "moeperf ab: look 1 of at most 1, 6 pairs: 2 pass" in done.stdout, done.stdout
    assert "A/A calibration: 0 false alarm(s) in 2 metric(s) (0.0 %)" in done.stdout
    assert "0 metric(s) noisier than their minimum effect" in done.stdout
    calibration = json.loads((suite / "aa.json").read_text())["moeperf"]["ab"]["calibration"]
    assert calibration["false_alarm_rate"] == 0 and len(calibration["noise"]) == 2
    assert all(n["noise"] < 0.02 for n in calibration["noise"])


def test_pytest_arguments_that_select_no_test_are_bad_input(suite: Path) -> None:
    done = moeperf_ab("--head-env", "MOEPERF_TEST_SCALE=1.10", "--", "test_syn.py", "-k", "no_such_test", *PYTEST,
                      cwd=suite)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "select no test or are wrong: nothing written" in done.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------ git revisions
PROJECT_CONFTEST = """
import pytest
from speed import FACTOR

@pytest.fixture
def factor():
    return FACTOR
"""
PROJECT_TEST = """
import random

def test_step(perf, factor):
    perf.record("step", [factor * random.uniform(0.99, 1.01) for _ in range(3)], unit="s")
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A throwaway git project: the base commit, then a head commit that makes the step 1.25 times slower. Its
    conftest (beside the test, not at the top) imports ``speed`` from the top: a side's worktree is first on
    ``PYTHONPATH`` wherever in it the session starts."""
    repo = tmp_path / "project"
    commit(repo, {"pytest.ini": "[pytest]\n", "perf/conftest.py": PROJECT_CONFTEST, "speed.py": "FACTOR = 1.0\n",
                  "perf/test_step.py": PROJECT_TEST}, "base")
    commit(repo, {"speed.py": "FACTOR = 1.25\n"}, "head: slower")
    (tmp_path / "tmp").mkdir()
    return repo


def test_two_git_revisions_in_temporary_worktrees(project: Path) -> None:
    tmp = project.parent / "tmp"
    # started in a subdirectory: each side runs in the same subdirectory of its worktree
    done = moeperf_ab("--base-ref", "HEAD~1", "--head-ref", "HEAD", "--pairs", "6", "--max-pairs", "6", "--seed", "3",
                      "-q", "--report", "r.json", "--", ".", *PYTEST, cwd=project / "perf", tmp=tmp)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "moeperf ab: look 1 of at most 1, 6 pairs: 1 regressed" in done.stdout
    assert "perf/test_step.py::test_step::step" in done.stdout
    sides = json.loads((project / "perf" / "r.json").read_text())["moeperf"]["ab"]["sides"]
    assert sides["base"]["ref"] == "HEAD~1" and sides["base"]["commit"] == git(project, "rev-parse", "HEAD~1")
    assert sides["head"]["ref"] == "HEAD" and sides["head"]["commit"] == git(project, "rev-parse", "HEAD")
    assert sides["base"]["git"]["id"] == sides["base"]["commit"]  # the child ran in base's checkout
    assert sides["base"]["cwd"].endswith("/perf") and sides["base"]["cwd"] != sides["head"]["cwd"]
    assert Path(sides["head"]["pytest_moeperf"]).name == "pytest_moeperf"
    assert len(git(project, "worktree", "list").splitlines()) == 1, "the temporary worktrees are removed"
    assert not list(tmp.glob("moeperf-ab-*"))


def test_ctrl_c_writes_nothing_and_removes_the_worktrees(project: Path) -> None:
    tmp = project.parent / "tmp"
    proc = subprocess.Popen([sys.executable, "-m", "pytest_moeperf.cli", "ab", "--base-ref", "HEAD~1", "--head-ref",
                             "HEAD", "-q", "--report", "r.json", "--", "perf", *PYTEST], cwd=project,
                            env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(("  base 1 ", "  head 1 ")):  # the first process is done, the second is running
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "moeperf ab: interrupted before a pair was complete: nothing written" in err
    assert not (project / "r.json").exists()
    assert len(git(project, "worktree", "list").splitlines()) == 1
    assert not list(tmp.glob("moeperf-ab-*"))


def test_an_interrupted_run_judges_and_writes_its_complete_pairs(suite: Path) -> None:
    """A job's time limit (``timeout -s INT``) cut a 10-pair GEMM run on a lent H200 after 9 pairs, and nothing was
    written: the device time was lost. Now the complete pairs are judged and written, saying so."""
    proc = subprocess.Popen([sys.executable, "-m", "pytest_moeperf.cli", "ab", "--head-env", "MOEPERF_TEST_SCALE=1.10",
                             "--pairs", "20", "--max-pairs", "20", "--seed", "5", "--report", "r.json", "--",
                             "test_syn.py", *PYTEST], cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("  base 8 "):  # pairs 1-7 have both sides: exact two-sided p = 2/2^7
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    ab = json.loads((suite / "r.json").read_text())["moeperf"]["ab"]
    pairs = ab["pairs"]
    assert 7 <= pairs <= 8 and ab["interrupted"] is True
    assert f"interrupted after {pairs} complete pair(s) of at most 20" in out
    assert f"{LATENCY} " in out and "REGRESSED" in out


def test_a_side_server_that_cannot_start_names_its_side_and_leaves_nothing_running(suite: Path) -> None:
    done = moeperf_ab("--serve", "no-such-profile", "--head-env", "MOEPERF_TEST_SCALE=1.10", "--pairs", "6",
                      "--max-pairs", "6", "-q", "--report", "r.json", "--", "test_syn.py", cwd=suite)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "base's server (no-such-profile) exited with code 2 before it was healthy" in done.stderr
    assert "no-such-profile" in done.stderr and "nothing written" in done.stderr
    assert not (suite / "r.json").exists()
    leftover = subprocess.run(["pgrep", "-f", "pytest_moeperf.cli serve no-such-profile"], capture_output=True)
    assert leftover.returncode == 1, leftover.stdout  # no such process left


def test_both_sides_servers_start_together_only_where_two_fit() -> None:
    """Fresh starts a pair, both at once where two servers of the profile fit on the box (two CPU servers do), else a
    fresh server a process; a profile this checkout does not know is left to ``moeperf serve`` to refuse."""
    from pytest_moeperf.ab.servers import fit_twice

    repo = Path(__file__).parents[2]
    assert fit_twice("cpu-tiny-nospec", repo) is True
    assert fit_twice("gpu-tiny-tp1-nospec", repo) is False  # no GPU here: not even one
    assert fit_twice("no-such-profile", repo) is None and fit_twice("cpu-tiny-nospec", Path("/")) is None


# ------------------------------------------------------------------------------------------ SIGTERM and SIGKILL
HANGING = SUITE + """
import pathlib, time

def test_hangs_in_the_third_pair(perf):
    if os.environ["MOEPERF_ROUND"] in ("ab base 3", "ab head 3"):
        pathlib.Path(os.environ["PIDS"], str(os.getpid())).write_text("")
        time.sleep(600)
    perf.record("x", [1.0, 1.0, 1.0], unit="s")
"""


def _hanging_ab(suite: Path) -> tuple[subprocess.Popen[str], int, Path]:
    """``moeperf ab`` once the first process of the third pair hangs: the process, the hanging child, TMPDIR."""
    (suite / "test_syn.py").write_text(HANGING)
    tmp, pids = suite / "tmp", suite / "pids"
    tmp.mkdir()
    pids.mkdir()
    proc = subprocess.Popen([*COMMAND, "--head-env", "MOEPERF_TEST_SCALE=1.10", "--pairs", "6", "--max-pairs", "6",
                             "--seed", "4", "-q", "--report", "r.json", "--", "test_syn.py", *PYTEST], cwd=suite,
                            env={**os.environ, "TMPDIR": str(tmp), "PIDS": str(pids)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(pids.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None, "the third pair never started"
        time.sleep(0.1)
    return proc, int(next(pids.iterdir()).name), tmp


def test_sigterm_judges_the_complete_pairs_writes_and_leaves_nothing(suite: Path) -> None:
    """Issue 30 item 8: SIGTERM ended moeperf ab with 143 and no report while its child kept measuring under pid 1
    and /tmp/moeperf-ab-* stayed. Now it is an interruption: complete pairs judged and written, exit 143."""
    proc, child, tmp = _hanging_ab(suite)
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, out + err
        assert "terminated (SIGTERM) after 2 complete pair(s) of at most 6" in out
        ab = json.loads((suite / "r.json").read_text())["moeperf"]["ab"]
        assert ab["pairs"] == 2 and ab["interrupted"] is True
        assert not alive(child), "the measuring child is stopped"
        assert list(tmp.iterdir()) == [], "no temporary directory is left"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_of_a_killed_ab_stops(suite: Path) -> None:
    proc, child, _ = _hanging_ab(suite)
    try:
        proc.kill()
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 60
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child), "the parent-death signal interrupted the child"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
