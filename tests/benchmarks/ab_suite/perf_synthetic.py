"""A synthetic CPU suite for measuring ``moeperf ab`` itself (not collected by the plugin's tests: run it by path).

Ten small pure-Python workloads, each timed 15 times after 3 warm-up calls in CPU time of the thread (as the CPU GEMM
suite times: time the process was preempted by other jobs on a shared box is not counted; caches, memory bandwidth
and clocks shared with them are), so their noise is the real noise of a process on this box:
``moeperf ab --aa -- tests/benchmarks/ab_suite/perf_synthetic.py`` measures the false-alarm rate; with
``-p moeperf_inject`` and ``--head-env MOEPERF_INJECT='*::time=1.05'`` (``PYTHONPATH`` naming ``tests/benchmarks``)
the head side is 5 % slower, and the run measures detection. See docs/measurements/ab.md.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable

import pytest

DATA = list(range(20_000, 0, -1))
TEXT = " ".join(f"word{i}" for i in range(5_000))

CASES: dict[str, Callable[[], object]] = {
    "sum": lambda: sum(range(200_000)),
    "sort": lambda: sorted(DATA),
    "join": lambda: ",".join(str(i) for i in range(20_000)),
    "dict": lambda: {i: i * i for i in range(20_000)},
    "sha256": lambda: hashlib.sha256(b"x" * 2_000_000).hexdigest(),
    "json": lambda: json.dumps({str(i): [i, i * 0.5, "v"] for i in range(3_000)}),
    "listcomp": lambda: [i * 3 for i in range(100_000) if i % 7],
    "floats": lambda: sum(i * 0.5 / (i + 1) for i in range(50_000)),
    "regex": lambda: re.findall(r"word(\d+)", TEXT),
    "bytes": lambda: bytes(bytearray(4_000_000)),
}


@pytest.mark.parametrize("name", CASES)
def test_workload(perf, name: str) -> None:  # type: ignore[no-untyped-def]
    work = CASES[name]
    for _ in range(3):
        work()
    samples = []
    for _ in range(15):
        started = time.thread_time()
        work()
        samples.append((time.thread_time() - started) * 1e3)
    perf.record("time", samples, unit="ms")
