"""Issue 37 item 15: a ``moeperf ab --base-ref`` killed with SIGKILL left a registered git worktree and its temporary
folders, and no later run removed them.

Each run now keeps everything it makes under one temporary folder that records its owner (pid, its start time, the
host); the next run removes the folders of owners that are gone, unregistering their worktrees, and leaves those of a
live run alone. The first test kills a real ``moeperf ab`` in a real git project, keeps a second one running beside
it, and runs a third; the others check the owner rules on folders made by hand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pytest_moeperf.ab import workdir
from tests.ab.sessions import COMMAND, PYTEST, alive, git, moeperf_ab, two_commits

HANGS = """
import os, pathlib, time

def test_step(perf):
    if os.environ.get("HANG") and os.environ["MOEPERF_ROUND"] in ("ab base 1", "ab head 1"):
        pathlib.Path(os.environ["HANG"], str(os.getpid())).write_text("")
        time.sleep(600)
    perf.record("step", [1.0, 1.01, 0.99], unit="s")
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A git project of two commits whose test hangs in the run's first process when ``HANG`` names a folder."""
    return two_commits(tmp_path, HANGS)


def hanging(project: Path, name: str) -> tuple[subprocess.Popen[str], int]:
    """``moeperf ab --base-ref HEAD~1`` in ``project`` once its first child hangs: the process and the child's pid."""
    pids = project.parent / name
    pids.mkdir()
    proc = subprocess.Popen([*COMMAND, "--base-ref", "HEAD~1", "--pairs", "6", "--", "test_p.py", *PYTEST],
                            cwd=project, env={**os.environ, "TMPDIR": str(project.parent / "tmp"), "HANG": str(pids)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(pids.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None, "the first child never started"
        time.sleep(0.1)
    return proc, int(next(pids.iterdir()).name)


def worktrees(project: Path) -> list[str]:
    return [line.split()[0] for line in git(project, "worktree", "list").splitlines()[1:]]


def test_the_next_run_removes_what_a_killed_run_left_and_keeps_a_live_runs(project: Path) -> None:
    tmp = project.parent / "tmp"
    live, live_child = hanging(project, "live")
    live_dirs, live_trees = set(tmp.iterdir()), worktrees(project)
    killed, killed_child = hanging(project, "killed")
    try:
        killed.kill()
        killed.communicate(timeout=30)
        deadline = time.monotonic() + 60
        while alive(killed_child) and time.monotonic() < deadline:  # the parent-death signal interrupts it
            time.sleep(0.1)
        assert not alive(killed_child)
        left, killed_trees = set(tmp.iterdir()) - live_dirs, set(worktrees(project)) - set(live_trees)
        assert left and len(killed_trees) == 1, "the killed run left its folders and its registered worktree"

        done = moeperf_ab("--head-env", "AB_X=1", "--", "test_p.py", "-k", "no_such_test", *PYTEST, cwd=project,
                          tmp=tmp)
        assert done.returncode == 2, done.stdout + done.stderr
        assert [path for path in left if path.exists()] == [], done.stdout + done.stderr
        [gone] = left
        assert f"moeperf ab: removed {gone}, left by moeperf ab pid {killed.pid}" in done.stdout
        assert f"its git worktree of {project}" in done.stdout
        assert worktrees(project) == live_trees and Path(live_trees[0], "test_p.py").is_file()
        assert live_dirs and all(path.exists() for path in live_dirs)
        assert alive(live_child) and live.poll() is None

        live.send_signal(signal.SIGTERM)
        _, err = live.communicate(timeout=120)
        assert live.returncode == 143, err
        assert worktrees(project) == [] and list(tmp.iterdir()) == [], "the live run removed its own"
    finally:
        for pid in {killed.pid, killed_child, live.pid, live_child}:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _folder(parent: Path, owner: dict[str, object] | str | None, age_s: float = 3600) -> Path:
    """A run folder made ``age_s`` ago with this owner record (a text: written as it is)."""
    path = parent / f"{workdir.PREFIX}{len(list(parent.iterdir()))}"
    path.mkdir()
    (path / "file").write_text("x")
    if owner is not None:
        (path / workdir.OWNER).write_text(owner if isinstance(owner, str) else json.dumps(owner))
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_only_folders_whose_owner_is_gone_are_removed(tmp_path: Path) -> None:
    me = workdir.Owner.this_process()
    finished = subprocess.Popen(["true"])
    finished.wait()
    live = _folder(tmp_path, me.to_json())
    dead = _folder(tmp_path, {**me.to_json(), "pid": finished.pid})
    reused = _folder(tmp_path, {**me.to_json(), "started": (me.started or 0) + 1})  # this pid, another process
    elsewhere = _folder(tmp_path, {**me.to_json(), "pid": finished.pid, "host": "another-host"})
    lines = workdir.sweep(tmp_path)
    assert live.exists() and elsewhere.exists()
    assert not dead.exists() and not reused.exists()
    assert [line.split(",")[0] for line in lines] == [f"moeperf ab: removed {dead}", f"moeperf ab: removed {reused}"]


def test_a_folder_without_an_owner_record_is_named_not_removed(tmp_path: Path) -> None:
    old = _folder(tmp_path, None)
    unreadable = _folder(tmp_path, "{not json")
    being_made = _folder(tmp_path, None, age_s=0)
    not_ours = tmp_path / "moeperf-child-1"
    not_ours.mkdir()
    lines = workdir.sweep(tmp_path)
    assert old.exists() and unreadable.exists() and being_made.exists() and not_ours.exists()
    assert len(lines) == 2 and all("not removed" in line for line in lines)
    assert lines[0].startswith(f"moeperf ab: {old} has no owner record")
    assert lines[1].startswith(f"moeperf ab: {unreadable} has no owner record")


def test_a_run_keeps_its_folder_and_removes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with workdir.made() as path:
        assert path.parent == tmp_path and path.name.startswith(workdir.PREFIX)
        owner = json.loads((path / workdir.OWNER).read_text())
        assert owner["pid"] == os.getpid() and owner["started"] == workdir.Owner.this_process().started
        assert workdir.sweep(tmp_path) == [] and path.exists()
    assert list(tmp_path.iterdir()) == []
