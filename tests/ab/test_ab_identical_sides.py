"""Issue 37 item 8: ``moeperf ab`` with sides that do not differ compared the checkout with itself and reported PASS.

It is refused now (exit 2, before any side runs), pointing at ``--aa`` and the side options; sides that differ by
something real (an environment variable, an interpreter, a revision, uncommitted changes against ``--base-ref HEAD``)
run. Every case runs the real ``moeperf ab`` command in a real git project with pytest arguments that select no test
(``-k no_such_test``): a run that is not refused shows it by its first child session, which ends it (exit 2, saying
so), and one that is refused ends before any child.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ab.sessions import PYTEST, git, moeperf_ab, two_commits

TEST = """
def test_step(perf):
    perf.record("step", [1.0, 1.01, 0.99], unit="s")
"""
REFUSED = "moeperf ab: the two sides are the same"
SELECTS_NOTHING = "the pytest arguments after -- select no test or are wrong: nothing written"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A clean git project of two commits (the test file is the same in both); TMPDIR is ``tmp_path / "tmp"``."""
    return two_commits(tmp_path, TEST)


def ab(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``moeperf ab ARGS --pairs 1 -- test_p.py -k no_such_test`` in ``project``."""
    return moeperf_ab(*args, "--pairs", "1", "--", "test_p.py", "-k", "no_such_test", *PYTEST, cwd=project,
                      tmp=project.parent / "tmp")


@pytest.mark.parametrize("args", [
    pytest.param([], id="no side option"),
    pytest.param(["--base-env", "AB_X=1", "--head-env", "AB_X=1"], id="the same variable on both sides"),
    pytest.param(["--head-env", "AB_SET=yes"], id="a variable already set to that value"),
    pytest.param(["--base-python", sys.executable], id="this interpreter named"),
    pytest.param(["--base-ref", "HEAD"], id="HEAD of a clean checkout"),
    pytest.param(["--base-ref", "HEAD~1", "--head-ref", "main~1"], id="two names of one commit"),
])
def test_sides_that_do_not_differ_are_refused(project: Path, monkeypatch: pytest.MonkeyPatch,
                                              args: list[str]) -> None:
    monkeypatch.setenv("AB_SET", "yes")
    done = ab(project, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(REFUSED), line
    for hint in ("--aa", "--base-ref/--head-ref", "--base-python/--head-python", "--base-env/--head-env"):
        assert hint in line
    assert "block 1" not in done.stdout  # no side ran
    assert len(git(project, "worktree", "list").splitlines()) == 1
    assert not list((project.parent / "tmp").iterdir())


def test_the_refusal_names_what_the_sides_share(project: Path) -> None:
    line = ab(project, "--base-ref", "HEAD").stderr.strip().splitlines()[-1]
    commit = git(project, "rev-parse", "HEAD")
    assert f"--base-ref HEAD is commit {commit[:10]}, which this checkout is at with no uncommitted change" in line
    line = ab(project).stderr.strip().splitlines()[-1]
    assert f"both: this checkout as it is, {sys.executable}, no variable set" in line


@pytest.mark.parametrize("change", ["modified", "untracked"])
def test_head_of_a_checkout_with_changes_is_a_side_of_its_own(project: Path, change: str) -> None:
    """``--base-ref HEAD`` against a checkout with uncommitted changes compares those changes: it runs."""
    if change == "modified":
        (project / "notes.txt").write_text("changed, not committed\n")
    else:
        (project / "test_new.py").write_text(TEST)
    done = ab(project, "--base-ref", "HEAD")
    assert done.returncode == 2, done.stdout + done.stderr
    assert SELECTS_NOTHING in done.stderr.strip().splitlines()[-1], done.stderr


@pytest.mark.parametrize("args", [
    pytest.param(["--head-env", "AB_X=1"], id="a variable"),
    pytest.param(["--head-env", "AB_SET="], id="a variable set empty"),
    pytest.param(["--base-ref", "HEAD~1"], id="a revision"),
])
def test_sides_that_differ_run(project: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setenv("AB_SET", "yes")
    done = ab(project, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert SELECTS_NOTHING in done.stderr.strip().splitlines()[-1], done.stderr


def test_a_a_calibration_needs_no_side_option(project: Path) -> None:
    done = ab(project, "--aa")
    assert done.returncode == 2, done.stdout + done.stderr
    assert SELECTS_NOTHING in done.stderr.strip().splitlines()[-1], done.stderr
