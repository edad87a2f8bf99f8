"""A ``moeperf ab`` run's temporary folder, which records its owner; the folders of runs that died are removed.

Everything a run makes on disk lies in one folder, ``$TMPDIR/moeperf-ab-*``: the sides' git worktrees
(``worktrees/``), the empty baselines directory, the children's reports, the servers' logs. The run removes it on
leaving, also on Ctrl-C and SIGTERM; a run killed with SIGKILL cannot. So the folder holds ``owner.json``, the pid of
the run, the start time of that process (Linux: ``/proc/PID/stat``, so that a reused pid does not read as the owner)
and the host; every run begins by removing the folders of owners that are gone (`sweep`), each worktree in them
unregistered from its repository first (``git worktree remove``, then ``git worktree prune``). A folder of a live
run, of another host (a shared TMPDIR), of another user or without a readable owner record is never removed; the
last is named, once it is a minute old (a younger one may be a run's that is still writing its record).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PREFIX = "moeperf-ab-"
OWNER = "owner.json"
WORKTREES = "worktrees"  # the sides' git worktrees (`sides.Checkouts`)
#: how old a folder without an owner record must be to be named (younger: a run may be writing its record)
UNOWNED_AFTER_S = 60.0
_GITDIR = re.compile(r"gitdir: (.+)")


@dataclass(frozen=True)
class Owner:
    """The run a folder belongs to."""

    pid: int
    host: str
    started: int | None  # the process's start time (clock ticks after boot, Linux), None where unknown
    since: str  # when the folder was made (UTC)
    command: str

    @classmethod
    def this_process(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, socket.gethostname(), _started(pid), dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
                   " ".join(sys.argv)[:400])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Owner:
        """An owner record (`ValueError` for one that is not)."""
        try:
            started = data["started"]
            owner = cls(int(data["pid"]), str(data["host"]), None if started is None else int(started),
                        str(data.get("since", "")), str(data.get("command", "")))
        except (TypeError, KeyError, ValueError) as exc:
            raise ValueError(f"not an owner record: {exc}") from exc
        if owner.pid <= 0:
            raise ValueError(f"not an owner record: pid {owner.pid}")
        return owner

    def gone(self) -> bool:
        """Whether the owner has ended, for certain: a process of this host that no longer runs (a zombie has ended;
        a pid that now belongs to a process started at another time is another process)."""
        if self.host != socket.gethostname():
            return False
        stat = _stat(self.pid)
        if stat is not None:
            state, started = stat
            return state in ("Z", "X") or (self.started is not None and started != self.started)
        if Path("/proc/self/stat").exists():
            return True  # Linux, and no such process
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state and start time (``/proc/PID/stat`` fields 3 and 22); None where there is none to read."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rfind(")") + 2:].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _started(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[1]


@contextlib.contextmanager
def made() -> Iterator[Path]:
    """A new run folder in the temporary directory, its owner recorded; removed on leaving."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        (path / OWNER).write_text(json.dumps(Owner.this_process().to_json()) + "\n")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], capture_output=True, text=True, timeout=120)


def _unregister(worktrees: Path) -> list[Path]:
    """Unregister every git worktree under ``worktrees`` from its repository (``git worktree remove --force
    --force``: a worktree whose ``git worktree add`` was cut is locked); the repositories' git directories."""
    commons: list[Path] = []
    for tree in sorted(worktrees.iterdir()) if worktrees.is_dir() else []:
        try:
            found = _GITDIR.match((tree / ".git").read_text().strip())
        except OSError:
            continue
        if found is None:
            continue
        common = Path(found.group(1)).parent.parent  # <git dir>/worktrees/<name>
        if common.is_dir():
            _git(f"--git-dir={common}", "worktree", "remove", "--force", "--force", str(tree))
            commons.append(common)
    return commons


def _checkout(common: Path) -> str:
    """The checkout a git directory belongs to, as a user names it (``/repo`` for ``/repo/.git``)."""
    return str(common.parent) if common.name == ".git" else str(common)


def _leftover(path: Path, now: float) -> str | None:
    """Remove ``path`` when its owner is gone; what was done, or what the user must know (None: nothing)."""
    try:
        owner = Owner.from_json(json.loads((path / OWNER).read_text()))
    except (OSError, ValueError) as exc:
        if now - path.stat().st_mtime < UNOWNED_AFTER_S:
            return None
        why = "no owner record" if isinstance(exc, FileNotFoundError) else f"no owner record it can read ({exc})"
        return (f"moeperf ab: {path} has {why}: not removed (left by an older moeperf ab?); once no moeperf ab runs, "
                "remove it, then run `git worktree prune` in the checkout it compared")
    if not owner.gone():
        return None
    commons = _unregister(path / WORKTREES)
    shutil.rmtree(path, ignore_errors=True)
    for common in commons:
        _git(f"--git-dir={common}", "worktree", "prune")
    trees = "".join(f", and its git worktree of {_checkout(c)}" for c in dict.fromkeys(commons))
    what = f"{path}, left by moeperf ab pid {owner.pid} (since {owner.since}), which ended without removing it{trees}"
    if path.exists():
        return f"moeperf ab: could not remove {what}: remove it by hand"
    return f"moeperf ab: removed {what}"


def sweep(parent: Path | None = None) -> list[str]:
    """Remove the run folders in ``parent`` (default: the temporary directory) whose owner is gone; a line for each
    folder removed and for each one left that the user should know about."""
    parent = Path(tempfile.gettempdir()) if parent is None else parent
    lines = []
    now = time.time()
    uid = os.getuid() if hasattr(os, "getuid") else None
    for path in sorted(parent.glob(f"{PREFIX}*")):
        try:
            if path.is_symlink() or not path.is_dir() or (uid is not None and path.stat().st_uid != uid):
                continue
            line = _leftover(path, now)
        except OSError:
            continue  # gone meanwhile (another run swept it), or not ours to read
        if line is not None:
            lines.append(line)
    return lines
