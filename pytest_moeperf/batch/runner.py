"""Running a batch's commands: each in a session of its own with its output in a log, within a time limit, and
after each unit a sweep of the batch's own process tree (:mod:`pytest_moeperf.processes.tree`).

A command past its limit gets SIGINT (pytest tears its fixtures down: servers stop, the session ends), then
``grace`` seconds, then SIGTERM and SIGKILL to whatever the batch started. Ctrl-C (or SIGTERM) on the batch does
the same to the running command and skips the units left. The summary (``summary.txt``) is written as it goes."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from pytest_moeperf.processes import tree
from pytest_moeperf.processes.lifecycle import describe_returncode, signal_session, start_in_session

__all__ = ["Batch", "Outcome", "StepResult"]

POLL_S = 0.5


@dataclass
class Outcome:
    """How one command ended: its return code (None: still running) and why it was cut short, if it was."""

    rc: int | None
    cut: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.cut

    @property
    def status(self) -> str:
        return "cut" if self.cut else "ok" if self.rc == 0 else "failed"

    def describe(self) -> str:
        return self.cut or ("ok" if self.rc == 0 else describe_returncode(self.rc or 0))


@dataclass
class StepResult:
    """One unit of the batch as the summary and ``batch.json`` show it."""

    name: str
    status: str  # ok, failed, skipped, cut
    detail: str = ""
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "seconds": round(self.seconds, 1),
                "outputs": self.outputs, "stopped": self.stopped}


class Batch:
    """The clock, the summary, the running command and the results of one batch."""

    def __init__(self, out: Path, *, root: Path, env: Mapping[str, str], deadline_s: float | None,
                 echo: Callable[[str], object] = print) -> None:
        self.out, self.root, self.env = out, root, dict(env)
        self.deadline_s = deadline_s
        self.started = time.monotonic()
        self.started_utc = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.echo = echo
        self.results: list[StepResult] = []
        self.interrupted = False
        self._running: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ clock and summary
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float | None:
        """Seconds to the batch's deadline (None: no deadline)."""
        return None if self.deadline_s is None else self.deadline_s - self.elapsed()

    def note(self, text: str) -> None:
        line = f"[{self.elapsed():5.0f}s] {text}"
        with (self.out / "summary.txt").open("a") as handle:
            handle.write(line + "\n")
        self.echo(line)

    def output(self, path: Path) -> str:
        """``path`` as the summary names it: relative to the output folder."""
        return str(path.relative_to(self.out)) if path.is_relative_to(self.out) else str(path)

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.interrupted = True
        if self._running is not None:
            signal_session(self._running.pid, signal.SIGINT)

    def install_signal_handlers(self) -> dict[signal.Signals, Any]:
        """Ctrl-C and SIGTERM interrupt the running command and skip the units left; returns the old handlers.
        Call it before starting commands: a caught signal is reset to its default in a child, an ignored one
        (a batch started as a script's background job) would stay ignored, and pytest would not hear SIGINT."""
        return {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    # ------------------------------------------------------------------ commands
    def start(self, argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(argv)}\n")
        return start_in_session(argv, log=log, env=self.env, cwd=self.root)

    def wait(self, proc: subprocess.Popen[bytes], *, until: float | None, grace_s: float,
             done: Callable[[], bool] | None = None) -> Outcome:
        """Wait for ``proc`` to end, or for ``done()`` to turn true (then it keeps running: the Outcome's rc is
        None, ``cut`` empty). ``until`` is a ``time.monotonic()`` limit: past it (or on an interrupt) the command
        gets SIGINT, ``grace_s`` seconds, then SIGTERM/SIGKILL for everything the batch started."""
        self._running = proc
        try:
            while True:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    return Outcome(rc, "interrupted" if self.interrupted else "")
                except subprocess.TimeoutExpired:
                    pass
                if done is not None and done():
                    return Outcome(None)
                over = until is not None and time.monotonic() >= until
                if over or self.interrupted:
                    return self.interrupt(proc, grace_s, "interrupted" if self.interrupted else "cut at its "
                                          "time limit")
        finally:
            self._running = None

    def interrupt(self, proc: subprocess.Popen[bytes], grace_s: float, why: str) -> Outcome:
        """SIGINT to ``proc``'s session, up to ``grace_s`` for it to end, then SIGTERM/SIGKILL to it and its
        descendants. What it left running after it ended is for :meth:`sweep`."""
        signal_session(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            tree.stop_descendants(proc.pid, include_root=True, managed=(proc.pid,))
            proc.wait()
        return Outcome(proc.returncode, why)

    def run(self, argv: Sequence[str], log: Path, *, until: float | None, grace_s: float) -> Outcome:
        return self.wait(self.start(argv, log), until=until, grace_s=grace_s)

    def sweep(self, result: StepResult) -> None:
        """Stop whatever the unit left running (a server a killed pytest left behind): the descendants of this
        process, which is the batch's own (``moeperf batch`` runs as a process of its own)."""
        for proc in tree.stop_descendants():
            result.stopped.append(f"{proc.pid} {proc.command}")
        if result.stopped:
            self.note(f"{result.name}: stopped {len(result.stopped)} process(es) it left running: "
                      + "; ".join(result.stopped[:5]))

    # ------------------------------------------------------------------ results
    def record(self, result: StepResult) -> None:
        self.results.append(result)
        line = f"{result.name}: {result.status}" + (f" ({result.detail})" if result.detail else "")
        self.note(f"{line} in {result.seconds:.0f} s" if result.status != "skipped" else line)

    def exit_code(self) -> int:
        """130 when interrupted, 1 when a unit failed or was cut, else 0."""
        if self.interrupted:
            return 130
        return 1 if any(r.status in ("failed", "cut") for r in self.results) else 0
