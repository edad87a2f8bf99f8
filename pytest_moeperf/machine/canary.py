"""The canary: small fixed workloads that no change of ours or of the kernels under test touches, read beside each
test file's tests so that a move of the whole machine is measured instead of guessed.

A machine moves under its tests (a clean-clone CPU CI read every M=1 bf16 GEMM +12-19 % while the rest of the GEMM
family did not move; alone on the same clone one of them read +0.8 %), and the guest cannot see why. Trusted perf
CI measures the machine itself (MongoDB runs canary workloads in every task and rejects a result whose canary is an
outlier). Ours, each timed the way the suites time their kernels:

* ``cpu_compute``: a pure-Python integer loop (its code and data fit in L1), on the calling thread's CPU time;
* ``cpu_stream``: one read pass (``memchr``) over a buffer of twice the last-level cache (64 MiB to 1 GiB), on the
  calling thread's CPU time, as the CPU GEMMs read their rotated weights; allocated once a session (a VM's page
  faults made a fresh 960 MiB buffer cost 3 s a reading) and released at its end;
* ``gpu_gemm`` and ``gpu_copy`` (torch sees a GPU): a 4096³ bf16 matmul and a 256 MiB device copy, CUDA graph +
  events (`kernels.timing.time_cuda_graph`), as the GPU kernel suites.

Each CPU sample is the best of `BEST_OF` batches (other processes only ever add time); a reading is `SAMPLES`
samples of every workload, about a second on a 2-core VM. The readings become `Reading` records of the ledger; their
figures are stored in the baseline file of the test file they ran beside, under the key `key_of` names, and judged
by `judging.machine`.
"""

from __future__ import annotations

import math
import mmap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BEST_OF", "CANARY_TEST", "SAMPLES", "UNIT", "Canary", "Reading", "Workload", "cpu_workloads",
           "default_workloads", "gpu_workloads", "is_canary", "key_of", "stream_bytes"]

#: the test name canary figures are stored under in a baseline file: ``<test file>::moeperf_canary::<workload>``
CANARY_TEST = "moeperf_canary"
UNIT = "us"
SAMPLES = 3
BEST_OF = 3
COMPUTE_STEPS = 20_000
MIN_STREAM, MAX_STREAM = 64 << 20, 1 << 30
GPU_GEMM_N = 4096
GPU_COPY_BYTES = 256 << 20


def key_of(file: str, workload: str) -> str:
    """The metric key a workload's figures beside test file ``file`` are stored under."""
    return f"{file}::{CANARY_TEST}::{workload}"


def is_canary(key: str) -> bool:
    """Whether a metric key (or test id) is the canary's."""
    parts = key.split("::")
    return len(parts) >= 2 and parts[1] == CANARY_TEST


@dataclass(frozen=True)
class Reading:
    """One reading of one workload beside one test file: its samples (µs per call), when it was taken (``before``
    the file's first test, ``after`` its last, ``flagged``: beside a test that regressed) and the round (``call``;
    a child's round, `processes.rounds`)."""

    file: str
    workload: str
    samples: tuple[float, ...]
    when: str
    origin: str = "call"

    @property
    def key(self) -> str:
        return key_of(self.file, self.workload)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "workload": self.workload, "samples": list(self.samples), "when": self.when,
                "origin": self.origin}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Reading:
        samples = tuple(float(x) for x in data["samples"])
        if not samples or not all(math.isfinite(x) and x > 0 for x in samples):
            raise ValueError(f"canary reading {data.get('workload')!r}: samples must be finite and positive")
        return cls(str(data["file"]), str(data["workload"]), samples, str(data.get("when", "")),
                   str(data.get("origin", "call")))


@dataclass
class Workload:
    """A named fixed workload: ``measure`` returns its samples (µs per call); ``release`` frees what it holds."""

    name: str
    measure: Callable[[], Sequence[float]]
    release: Callable[[], None] = field(default=lambda: None)


def _best_of(raw: Sequence[float]) -> list[float]:
    return [min(raw[i:i + BEST_OF]) for i in range(0, len(raw), BEST_OF)]


def _compute() -> int:
    x = 0
    for _ in range(COMPUTE_STEPS):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return x


def stream_bytes(cache_bytes: int | None) -> int:
    """The stream's buffer: twice the last-level cache, at least 64 MiB, at most 1 GiB."""
    return min(MAX_STREAM, max(MIN_STREAM, 2 * (cache_bytes or 0)))


def cpu_workloads(cache_bytes: int | None, size: int | None = None) -> list[Workload]:
    """``cpu_compute`` and ``cpu_stream`` (over ``size`` bytes; default `stream_bytes`)."""
    from pytest_moeperf.kernels.timing import time_cpu

    clock = time.thread_time_ns
    held: list[mmap.mmap] = []

    def buffer() -> mmap.mmap:
        if not held:
            block = mmap.mmap(-1, size or stream_bytes(cache_bytes))
            block.write(bytes(len(block)))  # touch every page: untouched ones read as the shared zero page
            held.append(block)
        return held[0]

    def compute() -> list[float]:
        return _best_of(time_cpu(_compute, iters=SAMPLES * BEST_OF, warmup=1, min_time_s=0.01, clock=clock))

    def stream() -> list[float]:
        block = buffer()
        return _best_of(time_cpu(lambda: block.find(b"\x01", 0), iters=SAMPLES * BEST_OF, warmup=1, min_time_s=0.0,
                                 clock=clock))

    def release() -> None:
        while held:
            held.pop().close()

    return [Workload("cpu_compute", compute), Workload("cpu_stream", stream, release)]


def _on_gpu(build: Callable[[], Callable[[], object]]) -> list[float]:
    """Time what ``build`` makes (its tensors freed afterwards, the cache emptied) as the GPU kernel suites do."""
    import torch

    from pytest_moeperf.kernels.timing import time_cuda_graph

    try:
        return time_cuda_graph(build(), calls_per_graph=10, replays=SAMPLES * 4, warmup=3)
    finally:
        torch.cuda.empty_cache()


def _gemm() -> Callable[[], object]:
    import torch

    a, b = (torch.randn(GPU_GEMM_N, GPU_GEMM_N, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out = torch.empty_like(a)
    return lambda: torch.mm(a, b, out=out)


def _copy() -> Callable[[], object]:
    import torch

    src = torch.empty(GPU_COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def gpu_workloads() -> list[Workload]:
    """``gpu_gemm`` and ``gpu_copy`` on the current CUDA device (tensors made and freed by each reading)."""
    return [Workload("gpu_gemm", lambda: _on_gpu(_gemm)), Workload("gpu_copy", lambda: _on_gpu(_copy))]


def default_workloads(gpus: int, cache_bytes: int | None) -> list[Workload]:
    """The CPU workloads, and the GPU ones when this machine has GPUs and torch sees one."""
    workloads = cpu_workloads(cache_bytes)
    if gpus > 0:
        try:
            import torch

            cuda = bool(torch.cuda.is_available())
        except ImportError:
            cuda = False
        if cuda:
            workloads += gpu_workloads()
    return workloads


class Canary:
    """The canary of one process: its workloads (made by ``workloads()`` at the first reading), and the readings
    taken since they were last handed on."""

    def __init__(self, workloads: Callable[[], Sequence[Workload]], origin: str = "call") -> None:
        self.make = workloads
        self.workloads: list[Workload] | None = None
        self.origin = origin
        self.pending: list[Reading] = []
        self.problems: list[str] = []

    def read(self, file: str, when: str) -> list[Reading]:
        """One reading of every workload beside test file ``file``; a workload that fails is named once and
        dropped (the canary never fails a test)."""
        if self.workloads is None:
            self.workloads = list(self.make())
        taken = []
        for workload in list(self.workloads):
            try:
                samples = tuple(float(x) for x in workload.measure())
                if not samples or not all(math.isfinite(x) and x > 0 for x in samples):
                    raise ValueError(f"samples must be finite and positive, got {samples!r}")
            except Exception as exc:  # noqa: BLE001 - a broken canary must not fail the tests it runs beside
                self.problems.append(f"canary workload {workload.name} dropped: {type(exc).__name__}: {exc}")
                self.workloads.remove(workload)
                continue
            taken.append(Reading(file, workload.name, samples, when, self.origin))
        self.pending += taken
        return taken

    def drain(self) -> list[Reading]:
        """The readings taken since the last call (they travel in the next test report)."""
        taken, self.pending = self.pending, []
        return taken

    def close(self) -> None:
        for workload in self.workloads or ():
            workload.release()
