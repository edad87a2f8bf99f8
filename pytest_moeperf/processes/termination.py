"""SIGTERM as an interruption, and child processes that end with their parent.

A ``--moeperf-rounds`` parent and ``moeperf ab`` measure in child pytest sessions, whose fixtures start processes
of their own (vLLM servers, rank groups), each in a session of its own. Python's default SIGTERM ends a process on
the spot: the parent exited 143 while its child kept measuring under pid 1, the temporary directories stayed, and
on a GPU box the orphan skewed the next session. Here:

- `sigterm_interrupts`: while entered, SIGTERM raises `Terminated`, a `KeyboardInterrupt`, so every Ctrl-C path
  runs for it too (stop the child, judge what is complete, write, remove the temporary directories); the command
  then exits `EXIT_TERMINATED`, 143 (128 + SIGTERM, what a shell reports for a process SIGTERM ended), not 130.
- `start_child`: a child in a session of its own (a terminal's Ctrl-C reaches only the parent, which hands it on
  once: a second SIGINT would cut the child's teardown short), with SIGINT at its default and the Linux
  parent-death signal (``prctl(PR_SET_PDEATHSIG)``) set to SIGINT before it executes. A child whose parent was
  killed (SIGKILL: nothing of the parent runs) is interrupted as by Ctrl-C, tears its fixtures down and ends. SIGINT,
  not SIGTERM, because every pytest handles it, also an ``ab`` side at an older revision of this plugin.
- `stop_child`: SIGINT to the child's session, `CHILD_GRACE_S` for its teardown (its output drained meanwhile),
  then SIGTERM and SIGKILL to its whole tree (:mod:`pytest_moeperf.processes.tree`).
- `after_interrupted_session`: in the child, a session that was interrupted stops what of it still runs (a process
  a fixture did not stop), by its tree, never by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from pytest_moeperf.processes import tree
from pytest_moeperf.processes.lifecycle import signal_session

__all__ = ["CHILD_GRACE_S", "EXIT_TERMINATED", "INTERRUPTS", "Terminated", "after_interrupted_session",
           "die_with_parent", "held_interrupts", "sigterm_interrupts", "start_child", "stop_child"]

#: the exit status of a command SIGTERM ended (after it stopped its children and wrote what it could)
EXIT_TERMINATED = 128 + signal.SIGTERM
#: how long an interrupted child is given to tear its fixtures down (a server's stop takes up to 6 s, a rank
#: group's as long) before SIGTERM and SIGKILL reach its whole tree
CHILD_GRACE_S = 30.0
PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (inside `sigterm_interrupts`): handled as an interruption, reported as a termination."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"terminated ({signal.Signals(signum).name})")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While entered (in the main thread), SIGTERM raises `Terminated`; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def die_with_parent(sig: signal.Signals = signal.SIGINT) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when the thread that starts it ends (Linux; elsewhere nothing), with
    SIGINT at its default (an ignored SIGINT is inherited across exec). A parent already gone ends it at once."""
    parent = os.getpid()
    try:
        prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)  # blocked while the parent forked (`held_interrupts`)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was set
            os._exit(EXIT_TERMINATED)

    return preexec


#: the signals that interrupt a parent (Ctrl-C, and SIGTERM inside `sigterm_interrupts`)
INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def held_interrupts() -> Iterator[Callable[[], None]]:
    """While entered, SIGINT and SIGTERM wait (blocked); the ``release`` it yields lets a waiting one in, as
    KeyboardInterrupt (or `Terminated`) where ``release`` is called; leaving releases too. A signal that arrives
    while a child is forked would otherwise be raised inside logging's at-fork hook, where Python prints it as
    "Exception ignored" and drops it: ``moeperf ab`` then ran on after a Ctrl-C and exited 1, not 130."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    try:
        yield release
    finally:
        release()


def start_child(argv: Sequence[str], *, cwd: str | Path | None, env: Mapping[str, str], stdout: int | IO[Any],
                stderr: int | IO[Any]) -> subprocess.Popen[str]:
    """Start a child session (text output) that is interrupted when this process dies; see the module."""
    return subprocess.Popen(list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=stderr, text=True, start_new_session=True, preexec_fn=die_with_parent())


def stop_child(proc: subprocess.Popen[str], grace_s: float = CHILD_GRACE_S) -> None:
    """Interrupt ``proc`` (SIGINT to its session), give it ``grace_s`` to tear down, then stop its whole tree."""
    if proc.poll() is None:
        signal_session(proc.pid, signal.SIGINT)
        _drain(proc, time.monotonic() + grace_s)
    tree.stop_descendants(proc.pid, include_root=proc.poll() is None, managed=(proc.pid,))
    proc.wait()


def _drain(proc: subprocess.Popen[str], until: float) -> None:
    """Wait until ``proc`` ends or ``until`` (``time.monotonic()``), reading and dropping its output meanwhile: a
    child blocked on a full pipe would never end."""
    fd = proc.stdout.fileno() if proc.stdout is not None and not proc.stdout.closed else None
    while proc.poll() is None and time.monotonic() < until:
        if fd is None:
            time.sleep(0.05)
            continue
        try:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready and not os.read(fd, 1 << 16):
                fd = None  # end of its output: now only its exit
        except OSError:
            fd = None


def after_interrupted_session() -> list[tree.Proc]:
    """In a child session that was interrupted: stop what it still runs below it; what was running."""
    return tree.stop_descendants()
