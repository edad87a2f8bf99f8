"""Running the real ``moeperf ab`` command from the A/B tests: its pytest arguments, the command, git, processes."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

INSTALLED = any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(group="pytest11"))
#: the pytest arguments of both sides: the plugin (when it is not installed), no cache files in the project, and the
#: health gate off (as in `run_moeperf`: a loaded box must not decide these verdicts by dropping pairs)
PYTEST = (*(() if INSTALLED else ("-p", "pytest_moeperf.plugin")), "-p", "no:cacheprovider", "--moeperf-health", "off")
#: ``moeperf ab`` as a command line, its arguments to follow
COMMAND = (sys.executable, "-m", "pytest_moeperf.cli", "ab")


def moeperf_ab(*args: str, cwd: Path, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``moeperf ab ARGS`` run to its end in ``cwd`` (``tmp``: its TMPDIR)."""
    env = {**os.environ, **({"TMPDIR": str(tmp)} if tmp else {})}
    return subprocess.run([*COMMAND, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def commit(repo: Path, files: dict[str, str], message: str) -> None:
    """Write ``files`` (paths relative to ``repo``) and commit everything, making ``repo`` a git repository (branch
    ``main``) first when it is none."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    if not (repo / ".git").exists():
        git(repo, "init", "-q", "-b", "main")
        for key, value in (("user.email", "ab@example.invalid"), ("user.name", "ab test")):
            git(repo, "config", key, value)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)


def two_commits(tmp_path: Path, test: str) -> Path:
    """``tmp_path/project``: a git project whose ``test_p.py`` is ``test`` in both of its two commits (the second
    adds a note); ``tmp_path/tmp`` made for a TMPDIR."""
    repo = tmp_path / "project"
    commit(repo, {"pytest.ini": "[pytest]\n", "test_p.py": test}, "first")
    commit(repo, {"notes.txt": "a second commit\n"}, "second")
    (tmp_path / "tmp").mkdir()
    return repo
