"""Process sessions: start a child in its own session, signal the whole session, tear it down
(SIGTERM, then SIGKILL), check ``/proc`` that nothing of it is left, and read the tail of its log.

One home for child-process lifecycle: the rank runner (:mod:`pytest_moeperf.kernels.rank_controller`) uses it,
and a server launcher can. Core module: no torch, no pytest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "KILL_GRACE_S",
    "describe_returncode",
    "leftover_processes",
    "log_tail",
    "signal_session",
    "start_in_session",
    "terminate_sessions",
    "wait_all",
]

#: How long each of SIGTERM and SIGKILL is given to end a session before the next step.
KILL_GRACE_S = 3.0
LOG_TAIL_LINES = 25


def start_in_session(argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
                     pass_fds: Sequence[int] = (), cwd: str | Path | None = None,
                     preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session (so the whole tree can be signalled), stdin closed,
    stdout and stderr appended to ``log``; ``preexec_fn`` e.g. `termination.die_with_parent()`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=None if env is None else dict(env), pass_fds=tuple(pass_fds), start_new_session=True,
            close_fds=True, cwd=cwd, preexec_fn=preexec_fn,
        )


def signal_session(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to every process of the session (process group) led by ``pid``; gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _live_session_members(sids: set[int]) -> list[tuple[int, str]]:
    """(pid, command) of every non-zombie process whose session is one of ``sids``."""
    found: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) < 4 or fields[0] == "Z":
            continue
        if int(fields[3]) in sids:
            found.append((int(entry.name), stat[stat.find("(") + 1: stat.rfind(")")]))
    return found


def leftover_processes(pids: Sequence[int]) -> list[tuple[int, str]]:
    """Processes still alive (not zombies) in the sessions led by ``pids``: what a teardown left behind."""
    return _live_session_members(set(pids))


def terminate_sessions(procs: Sequence[subprocess.Popen[bytes]], *, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM to each session, wait up to ``grace_s``; then SIGKILL to what is left, wait again. Returns as soon
    as no process of these sessions is alive (reaping the leaders)."""
    pids = [p.pid for p in procs]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            signal_session(pid, sig)
        deadline = time.monotonic() + grace_s
        wait_all(procs, grace_s)
        # the leaders are reaped; a grandchild killed with them can still be exiting (seen on a loaded 2-core box:
        # one left just after the SIGKILL round): poll the sessions, not only the leaders
        while leftover_processes(pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not leftover_processes(pids):
            return


def wait_all(procs: Sequence[subprocess.Popen[bytes]], seconds: float) -> None:
    """Wait for each of ``procs`` to exit, ``seconds`` in all (those still running are left running)."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def describe_returncode(returncode: int) -> str:
    """``"killed by SIGKILL"`` / ``"exited with code 3"``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"
