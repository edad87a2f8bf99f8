"""How a GEMM case is measured: enough weight copies to read cold weights, a correctness check, then timing
(CUDA graphs of back-to-back calls on a GPU, thread CPU time on one intra-op thread on a CPU)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from pytest_moeperf.kernels.gemm import Problem, build, check

__all__ = ["CPU_BEST_OF", "CPU_CLOCK", "CPU_CLOCK_NAME", "CPU_SPAN_S", "CPU_THREADS", "CPU_TIMING", "Timed", "measure"]


@dataclass(frozen=True)
class Timed:
    """A checked and timed case: per-call µs samples, copies rotated through, relative error of copy 0."""

    samples: list[float]
    copies: int
    rel_err: float
    threads: int | None  # CPU: torch intra-op threads used; None on GPU


#: GPU: target duration of one captured graph and of all timed replays of a case.
GPU_GRAPH_US = 2000.0
GPU_TOTAL_US = 100_000.0
#: GPU: untimed graph replays before the timed ones, at least this many and at least ``warmup_us`` of them.
GPU_WARMUP_REPLAYS = 3
#: CPU: one intra-op thread. On a small shared machine, OpenMP threads that spin waiting for a core another
#: process holds turn a 1 ms GEMM into 10 ms; one thread is slower but far steadier.
CPU_THREADS = 1
#: CPU: each sample is the best of at least this many timed batches of >= 10 ms; other processes only ever add time.
CPU_BEST_OF = 3
#: CPU: a sample's batches are spread across this many seconds of wall time
#: (:func:`~pytest_moeperf.kernels.timing.time_cpu_spread`): on the shared 2-core VM, memory-bound GEMMs ran +50 %
#: slower for bursts of 1-3 s several times a minute, and a case timed in 0.3 s read them as a +30-60 % regression
#: (docs/measurements/cpu-gemm-bursts.md).
CPU_SPAN_S = 3.0
#: CPU: the metrics' ``workload`` context: part of their identity, so baselines timed another way are re-recorded
#: (`ledger.Identity`), never compared with these
CPU_TIMING = f"best of batches spread over {CPU_SPAN_S:g} s"
#: CPU clock: the calling thread's CPU time. With one intra-op thread the GEMM runs on the calling thread, so
#: time other processes hold the cores is not counted (wall time moved by up to 3x between runs on a shared
#: 2-core box). Cache and memory-bandwidth contention still count.
CPU_CLOCK = time.thread_time_ns
CPU_CLOCK_NAME = "thread_time"


def measure(impl: str, problem: Problem, *, device: str, cache_bytes: int, quick: bool = False,
            max_total_bytes: int | None = None, warmup_us: float = 0.0, span_s: float = CPU_SPAN_S) -> Timed:
    """Build ``impl`` for ``problem`` with enough weight copies to exceed ``2 × cache_bytes``, check it
    (:func:`check` raises above the tolerance: a wrong kernel is never timed), then time it: on CUDA a graph
    of back-to-back calls cycling through the copies (:func:`~pytest_moeperf.kernels.timing.time_cuda_graph`, sized
    from an eager estimate to ~2 ms per graph and ~100 ms in all), on CPU
    :func:`~pytest_moeperf.kernels.timing.time_cpu_spread` with :data:`CPU_THREADS` intra-op threads on the
    :data:`CPU_CLOCK` (thread CPU time), each sample the best of :data:`CPU_BEST_OF` or more batches of calls lasting
    >= 10 ms, spread across ``span_s`` seconds (default :data:`CPU_SPAN_S`). On CUDA the
    untimed replays before the timed ones last at least ``warmup_us`` (at least :data:`GPU_WARMUP_REPLAYS`)."""
    import torch

    from pytest_moeperf.kernels import timing

    cap = max_total_bytes if max_total_bytes is not None else ((16 << 30) if device == "cuda" else (1 << 30))
    copies = timing.rotation_copies(problem.weight_bytes(impl), cache_bytes, factor=2.0, max_total_bytes=cap)
    if device == "cpu":
        previous = torch.get_num_threads()
        torch.set_num_threads(CPU_THREADS)
        try:
            built = build(impl, problem, device=device, copies=copies)
            err = check(built)
            fn = timing.cycle(built.calls)
            n = 5 if quick else 7
            samples = timing.time_cpu_spread(fn, samples=n, best_of=CPU_BEST_OF, span_s=span_s, warmup=copies,
                                             min_time_s=0.01, clock=CPU_CLOCK)
        finally:
            torch.set_num_threads(previous)
        return Timed(samples, copies, err, CPU_THREADS)
    built = build(impl, problem, device=device, copies=copies)
    err = check(built)
    fn = timing.cycle(built.calls)
    estimate = sorted(timing.time_eager_cuda(fn, iters=max(3, copies), warmup=copies))[max(3, copies) // 2]
    calls = max(copies, min(500, math.ceil(GPU_GRAPH_US / max(estimate, 1e-3))))
    calls = math.ceil(calls / copies) * copies  # every copy equally often
    total = GPU_TOTAL_US / (3 if quick else 1)
    replays = max(10, min(60, math.ceil(total / (estimate * calls))))
    warmup = max(GPU_WARMUP_REPLAYS, math.ceil(warmup_us / (estimate * calls)))
    samples = timing.time_cuda_graph(fn, calls_per_graph=calls, replays=replays, warmup=warmup)
    del built, fn
    torch.cuda.empty_cache()
    return Timed(samples, copies, err, None)
