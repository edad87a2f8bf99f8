"""Attach mode's processes: a server's pids found from its listening port, adopted by the health gate as ours (a real
listening process outside this pytest's process tree, not a stand-in), and ``--moeperf-server-pid``'s checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("psutil")

from pytest_moeperf.health.gate import HealthGate, HealthLimits, foreign_cpu  # noqa: E402
from pytest_moeperf.health.probes import GpuSample, sample_host  # noqa: E402
from pytest_moeperf.serving.lifecycle.attach import listening_pids  # noqa: E402

# the grandchild: listens on a free port, writes "pid port", then keeps one core busy until told to stop
LISTENER = """
import os, socket, sys, time
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
out = sys.argv[1]
with open(out + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {sock.getsockname()[1]}")
os.replace(out + ".tmp", out)
end = time.monotonic() + 120
while time.monotonic() < end and not os.path.exists(out + ".stop"):
    sum(range(10000))
"""
# the child starts the grandchild in a session of its own and exits: the grandchild leaves this pytest's tree
SPAWN = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""


@pytest.fixture
def foreign_listener(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(pid, port) of a busy listening process that is not a descendant of this pytest process."""
    out = tmp_path / "listener"
    subprocess.run([sys.executable, "-c", SPAWN, LISTENER, str(out)], check=True, timeout=30)
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid, port = (int(x) for x in out.read_text().split())
    try:
        yield pid, port
    finally:
        (tmp_path / "listener.stop").touch()
        time.sleep(0.2)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_servers_processes_are_found_from_its_port(foreign_listener: tuple[int, int]) -> None:
    pid, port = foreign_listener
    found, note = listening_pids(f"http://127.0.0.1:{port}/")
    assert found == (pid,) and note == f"listening on port {port}"
    assert listening_pids(f"http://localhost:{port}")[0] == (pid,)
    nobody, why = listening_pids("http://127.0.0.1:9")  # port 9 (discard): nothing listens
    assert nobody == () and "--moeperf-server-pid" in why
    remote, why = listening_pids("http://192.0.2.1:8000")  # TEST-NET-1: never this host
    assert remote == () and "is not this host" in why


def test_an_adopted_process_is_ours_for_the_health_gate(foreign_listener: tuple[int, int]) -> None:
    """Membership, not magnitude: the busy process is in the foreign tally until adopted, then out of it."""
    pid, _ = foreign_listener
    gate = HealthGate(HealthLimits(), roots=(os.getpid(),), gpu_indices=lambda item: ())

    def foreign_pids() -> set[int]:
        start = sample_host(gate.roots)
        time.sleep(0.3)
        return {ident[0] for ident in foreign_cpu(start, sample_host(gate.roots))}

    def gpu_reasons() -> list[str]:
        """The gate's GPU verdict on samples where the process holds a compute context on GPU 0 (NVML's figures,
        as a sample records them; there is no GPU here)."""
        held = [GpuSample(index=0, monotonic=0.0, compute_pids=(pid,))]
        report = gate.judge(sample_host(gate.roots), sample_host(gate.roots), held, held)
        return [r for r in report.reasons if r.startswith("gpu0")]

    assert pid in foreign_pids()
    assert gpu_reasons() == [f"gpu0: other compute process(es) on the GPU: pid {pid}"]
    gate.adopt([pid])
    gate.adopt([pid])  # adopting twice keeps one root
    assert gate.roots == (os.getpid(), pid)
    assert pid not in foreign_pids()
    assert any(ident[0] == pid for ident in sample_host(gate.roots).ours)
    assert gpu_reasons() == []  # its GPU work is ours too


def test_server_pid_option_is_checked(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    alone = run_moeperf("--moeperf-server-pid", str(os.getpid()))
    assert alone.ret == pytest.ExitCode.USAGE_ERROR
    alone.stderr.fnmatch_lines(["*--moeperf-server-pid names an attached server's processes: it needs "
                                "--moeperf-server-url*"])
    bad = run_moeperf("--moeperf-server-pid", "abc")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--moeperf-server-pid: expected an integer, got 'abc'*"])
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = run_moeperf("--moeperf-server-url", "http://127.0.0.1:9", "--moeperf-server-pid", done.stdout.strip())
    assert gone.ret == pytest.ExitCode.USAGE_ERROR
    gone.stderr.fnmatch_lines([f"*--moeperf-server-pid {done.stdout.strip()}: no such process on this host*"])
    pytester.makeini("[pytest]\nmoeperf_server_pid = 0\n")
    ini = run_moeperf()
    assert ini.ret == pytest.ExitCode.USAGE_ERROR
    ini.stderr.fnmatch_lines(["*ini option moeperf_server_pid: must be at least 1, got 0*"])
