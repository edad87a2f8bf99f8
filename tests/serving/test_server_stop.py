"""`LaunchedServer.stop` ends when its process group has nothing alive in it, zombies aside.

Where nothing reaps an orphaned zombie (a container whose init does not), ``killpg(pgid, 0)`` finds the group for
ever, and every stop of a server waited its whole grace (SIGTERM's and then SIGKILL's): 30 s a start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pytest_moeperf.processes.lifecycle import leftover_processes


def test_a_group_whose_only_process_is_a_zombie_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    deadline = time.monotonic() + 30
    while not Path(f"/proc/{proc.pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, 0)  # the group is still there for the kernel: a zombie leads it
    assert not leftover_processes([proc.pid])
    proc.wait()


STOP = """
import json, os, sys, time
from pathlib import Path
from pytest_moeperf.processes.lifecycle import leftover_processes
from pytest_moeperf.processes.tree import become_subreaper
from pytest_moeperf.serving.lifecycle.server import LaunchedServer
assert become_subreaper()  # orphans come here and are never reaped: as under an init that does not reap them
child = (
    "import os, signal, time\\n"
    "if os.fork() == 0:\\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "    time.sleep(120)\\n"
    "time.sleep(120)\\n"
)
server = LaunchedServer("zombie", [sys.executable, "-c", child], port=1, log_path=Path(sys.argv[1]))
server.start()
time.sleep(1.0)
began = time.monotonic()
server.stop(grace_s=1.0)
took = time.monotonic() - began
zombies = [p for p in Path("/proc").iterdir() if p.name.isdigit() and (p / "stat").exists()
           and (p / "stat").read_text().rsplit(")", 1)[1].split()[:3] == ["Z", str(os.getpid()), str(server.pid)]]
print(json.dumps({"took": took, "alive": bool(leftover_processes([server.pid])), "zombies": len(zombies)}))
"""


def test_stop_returns_once_only_a_zombie_is_left_of_the_group(tmp_path: Path) -> None:
    """The server forks a child that ignores SIGTERM; SIGKILL ends it, and it stays a zombie of a subreaper that never
    reaps it. The stop ends then, not after SIGKILL's whole 10 s."""
    done = subprocess.run([sys.executable, "-c", STOP, str(tmp_path / "log")], capture_output=True, text=True,
                          timeout=120, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["zombies"] == 1 and not seen["alive"]
    assert seen["took"] < 1.0 + 5.0, seen  # SIGTERM's 1 s grace, then SIGKILL: its 10 s wait is not spent
