"""A real ``moeperf ab --report`` beside a real session's history: the dashboard shows the paired result next to the
session of the A/B's head commit. The suite is `tests/ab/test_ab_sessions.py`'s (a head ×1.10 slower makes every
pair's ratio at least 1.076); about 13 child sessions, a minute and a half on a loaded 2-core box."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_moeperf.dashboard.build import Options, guarded
from pytest_moeperf.dashboard.model import page_of
from tests.ab.sessions import PYTEST, moeperf_ab
from tests.ab.test_ab_sessions import LATENCY, SUITE
from tests.dashboard.test_build import payload


def test_a_real_ab_report_is_shown_beside_its_head_commits_session(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_syn.py").write_text(SUITE)
    for command in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit",
                                                    "-qm", "suite"]):
        subprocess.run(["git", *command], cwd=project, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, check=True, capture_output=True,
                            text=True).stdout.strip()
    history = tmp_path / "history.sqlite"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    session = subprocess.run([sys.executable, "-m", "pytest", *PYTEST, "-q", "--moeperf-history", str(history)],
                             cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert session.returncode == 0, session.stdout + session.stderr
    done = moeperf_ab("--head-env", "MOEPERF_TEST_SCALE=1.10", "--pairs", "6", "--max-pairs", "6", "--seed", "1",
                      "-q", "--report", str(tmp_path / "ab.json"), "--", ".", *PYTEST, cwd=project)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: REGRESSED
    report = json.loads((tmp_path / "ab.json").read_text())
    assert report["commit_info"]["id"] == commit
    [verdict] = [b["extra_info"]["verdict"] for b in report["benchmarks"] if b["fullname"] == LATENCY]
    guarded(Options(target=str(history), out=tmp_path / "site", jobs=1, ab=(tmp_path / "ab.json",)),
            lambda _: None)
    [row] = payload(tmp_path / "site" / page_of(LATENCY))["ab"]
    assert (row["s"], row["report"], row["status"], row["pairs"]) == (1, "ab.json", verdict, 6)
    assert row["change"] > 0.07 and row["low"] > 0.07 and 0 < row["p"] < 0.05, row
    assert row["base"].startswith(commit[:10])
