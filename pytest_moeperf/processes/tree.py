"""A process's own tree: every process it started, wherever it went, and nothing else.

A batch step starts its command in a session of its own, and that command starts more: a vLLM server runs in a
session of *its* own, so a pytest killed at its time limit leaves the server running. To stop exactly what it
started, a process can mark itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``: an orphaned descendant is
re-parented to it instead of to init, so it stays in its tree), walk ``/proc`` for its descendants and signal their
process groups and pids. Nothing is ever found, or killed, by name: a vLLM server someone else started on the same
machine is not in this tree. ``moeperf batch`` sweeps its tree after every unit; a ``--moeperf-rounds`` parent stops
an interrupted child's tree (:mod:`pytest_moeperf.processes.termination`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Proc", "become_subreaper", "descendants", "stop_descendants"]

PR_SET_CHILD_SUBREAPER = 36
#: How long each of SIGTERM and SIGKILL is given before the next step.
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Proc:
    """One process as ``/proc`` shows it."""

    pid: int
    ppid: int
    pgid: int
    state: str
    command: str

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def become_subreaper() -> bool:
    """Ask Linux to re-parent this process's orphaned descendants to it (False where that is not available)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _read(entry: Path) -> Proc | None:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid pgrp session ...; comm may contain spaces and parentheses.
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 3:
        return None
    try:
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        command = " ".join(a.decode(errors="replace") for a in argv if a)
    except OSError:
        command = ""
    command = command or stat[stat.find("(") + 1: stat.rfind(")")]
    return Proc(int(entry.name), int(fields[1]), int(fields[2]), fields[0], command[:200])


def _table() -> dict[int, Proc]:
    table: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            proc = _read(entry)
            if proc is not None:
                table[proc.pid] = proc
    return table


def descendants(root: int | None = None) -> list[Proc]:
    """Every process below ``root`` (default: this process) in the parent tree, zombies included."""
    root = os.getpid() if root is None else root
    children: dict[int, list[Proc]] = {}
    for proc in _table().values():
        children.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def _signal(procs: Collection[Proc], sig: signal.Signals) -> None:
    me, my_group = os.getpid(), os.getpgrp()
    for pgid in {p.pgid for p in procs} - {my_group}:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        if proc.pid != me:
            try:
                os.kill(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _reap(managed: Collection[int]) -> None:
    """Collect the exit status of adopted orphans that died (not of children a ``Popen`` still waits for)."""
    me = os.getpid()
    for proc in descendants(me):
        if proc.ppid == me and not proc.alive and proc.pid not in managed:
            try:
                os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                pass


def stop_descendants(root: int | None = None, *, include_root: bool = False, managed: Collection[int] = (),
                     grace_s: float = STOP_GRACE_S) -> list[Proc]:
    """Stop every live descendant of ``root`` (default: this process; with ``include_root``, ``root`` too):
    SIGTERM to their process groups and pids, up to ``grace_s`` for them to end, then SIGKILL to what is left.
    Returns the processes that were alive when it began (empty: nothing was left). ``managed``: pids of direct
    children a ``subprocess.Popen`` reaps itself (the others this process adopted are reaped here)."""
    root = os.getpid() if root is None else root

    def live() -> list[Proc]:
        procs = descendants(root)
        if include_root:
            me = _read(Path(f"/proc/{root}"))
            procs += [me] if me is not None else []
        return [p for p in procs if p.alive]

    found = live()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not live():
            break
        _signal(live(), sig)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and live():
            _reap(managed)
            time.sleep(0.1)
    _reap(managed)
    return found
