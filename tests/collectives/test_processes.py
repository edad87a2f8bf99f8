"""Process sessions (pytest_moeperf.processes.lifecycle) on real processes: a child's own children are ended with it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pytest_moeperf.processes.lifecycle import (
    describe_returncode,
    leftover_processes,
    log_tail,
    start_in_session,
    terminate_sessions,
)

# A parent that starts a grandchild ignoring SIGTERM, prints, then waits: SIGTERM alone would leave the grandchild.
GRANDCHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
SCRIPT = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}])
print("line 1"); print("line 2", flush=True)
time.sleep(60)
"""


def test_session_teardown_reaches_grandchildren(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    proc = start_in_session([sys.executable, "-c", SCRIPT], log=log)
    deadline = time.monotonic() + 120  # generous: two Python starts on a loaded box; ends as soon as both run
    while time.monotonic() < deadline:
        if "line 2" in log_tail(log) and len(leftover_processes([proc.pid])) >= 2:
            break
        time.sleep(0.05)
    assert len(leftover_processes([proc.pid])) >= 2, "the child and its grandchild should be running"
    terminate_sessions([proc], grace_s=1.0)
    assert leftover_processes([proc.pid]) == []
    assert proc.returncode is not None and describe_returncode(proc.returncode).startswith("killed by SIG")
    assert log_tail(log, 1) == "line 2"
