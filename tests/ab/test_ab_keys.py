"""``moeperf ab`` in a project without a pytest configuration file (issue 30, item 1): the base side runs in a
temporary worktree elsewhere and both sides get the baselines directory on their command line, yet both sides key
the metrics alike, so they pair."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SYN = """
import os, random

def test_a(perf):
    perf.record("time", [100.0 * float(os.environ.get("MULT", "1")) * random.uniform(0.99, 1.01)] * 5, unit="us")
"""


def test_both_sides_of_a_project_without_configuration_pair_their_metrics(tmp_path: Path) -> None:
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "test_ab.py").write_text(SYN)
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.email=ab@example.invalid", "-c", "user.name=ab", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", "ab", "--base-ref", "HEAD", "--head-env",
                           "MULT=10", "--pairs", "6", "--max-pairs", "6", "--seed", "1", "-q", "--", "test_ab.py",
                           "-p", "no:cacheprovider", "--moeperf-health", "off"],
                          cwd=repo, env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "6 pairs: 1 regressed" in done.stdout, done.stdout
    assert "test_ab.py::test_a::time" in done.stdout and "MISSING" not in done.stdout
