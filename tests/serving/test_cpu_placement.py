"""CPU placement: the automatic split (pure), and pinning real processes: a server's engine core and everything it
started on the engine's CPUs, the API server and its other processes on the API server's, every thread of each
(read back from ``/proc``); the load generator on the client's CPUs for a window only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf.serving.lifecycle.pinning import affinity, descendants, pin_server, pinned, title
from pytest_moeperf.serving.models.placement import (
    CpuSets,
    cpus_of_mask,
    format_cpu_list,
    parse_cpu_list,
    split_cpus,
)

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2


def test_cpu_lists_read_and_write_numactl_syntax() -> None:
    assert parse_cpu_list("0-3,8, 10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert cpus_of_mask("0xffff") == frozenset(range(16))
    assert cpus_of_mask("0xffff0000") == frozenset(range(16, 32))
    for bad in ("", "a", "3-1", "1-"):
        with pytest.raises(ValueError, match="CPU list"):
            parse_cpu_list(bad)


def test_the_automatic_split_gives_the_engine_half_apart_from_the_api_server_and_the_client() -> None:
    sets = split_cpus(range(16))
    assert sets is not None
    assert (format_cpu_list(sets.engine), format_cpu_list(sets.api), format_cpu_list(sets.client)) == (
        "0-7", "8-11", "12-15")
    # the GPU's own CPUs go to the engine first
    far = split_cpus(range(32), gpu_local=range(16, 32))
    assert far is not None and far.engine == frozenset(range(16, 32))
    # hyperthreads of one core stay in one role: CPUs n and n+8 share core n
    smt = split_cpus(range(16), siblings={c: c % 8 for c in range(16)})
    assert smt is not None and all((c in smt.engine) == (c + 8 in smt.engine) for c in range(8))
    assert not (smt.engine & smt.api or smt.api & smt.client or smt.engine & smt.client)


def test_no_automatic_split_on_the_two_core_box() -> None:
    assert split_cpus([0, 1]) is None
    assert split_cpus(range(3)) is None
    assert split_cpus(range(4)) == CpuSets(frozenset({0, 1}), frozenset({2}), frozenset({3}))


# A process tree shaped like a vLLM server's: the first process (the API server) starts a resource-tracker-like
# child and an engine core (titled as vLLM titles it, with a thread of its own and a worker child)
ENGINE = """
import subprocess, sys, threading, time, setproctitle
setproctitle.setproctitle("VLLM::EngineCore")
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(600)
"""
SERVER = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
subprocess.Popen([sys.executable, "-c", {ENGINE!r}])
time.sleep(600)
"""


def _cpus_allowed(pid: int) -> set[int]:
    """Every thread's ``Cpus_allowed_list`` of ``pid``, as the kernel reports it."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found |= set(parse_cpu_list(line.split(":", 1)[1].strip()))
    return found


@pytest.fixture
def server_tree() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER], start_new_session=True)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:  # the engine core, its thread and its worker are up
            engines = [p for p in descendants(proc.pid) if title(p).startswith("VLLM::EngineCore")]
            if engines and descendants(engines[0]) and len(os.listdir(f"/proc/{engines[0]}/task")) >= 2:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the synthetic server tree did not come up")
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.skipif(not TWO_CPUS, reason="needs two usable CPUs")
def test_pinning_puts_the_engine_tree_and_the_rest_apart(server_tree: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    sets = CpuSets(engine=frozenset({cpus[0]}), api=frozenset({cpus[1]}), client=frozenset({cpus[1]}))
    pinned_ = pin_server(server_tree, sets)
    engine = [p for p in descendants(server_tree) if title(p).startswith("VLLM::EngineCore")][0]
    assert set(pinned_.engine) == {engine, *descendants(engine)} and len(pinned_.engine) == 2
    assert server_tree in pinned_.api and len(pinned_.api) == 2
    for pid in pinned_.engine:
        assert _cpus_allowed(pid) == {cpus[0]}, f"engine process {pid} ({title(pid)})"
    for pid in pinned_.api:
        assert _cpus_allowed(pid) == {cpus[1]}, f"API server process {pid} ({title(pid)})"


@pytest.mark.skipif(not TWO_CPUS, reason="needs two usable CPUs")
def test_the_client_is_pinned_for_the_window_only() -> None:
    before = affinity(os.getpid())
    target = frozenset({sorted(before)[-1]})
    with pinned(target):
        assert _cpus_allowed(os.getpid()) == set(target)
    assert _cpus_allowed(os.getpid()) == set(before)
    with pinned(None):
        assert affinity(os.getpid()) == before
