"""Timing primitives: CUDA graph + event timing, eager CUDA timing, CPU timing, weight rotation.

Every function returns *per-call* times in microseconds, one float per sample, so callers can hand the list
straight to ``perf.record(name, samples, unit="us")``.

GPU method (the one that matters: on two H200s an eager, host-timed loop of a 14 KB all-reduce came out ~3x the
CUDA-graph-replay figure; nccl-tests agree with the graph figure within 2.3 %): capture ``calls_per_graph`` back-to-
back calls of ``fn`` into one CUDA graph on a side stream, replay it ``replays`` times with a pair of events around
each replay, and synchronise once at the end. Host launch overhead and Python are out of the figure; what is left is
what the device spends per call when calls follow each other, as in a captured decode step. To measure cold weights
(decode reads every weight once per step), make ``fn`` rotate through enough copies of its operands that the working
set exceeds the last-level cache: :func:`rotation_copies` says how many, :func:`cycle` turns the per-copy callables
into one ``fn``.

torch is imported lazily so that importing this module never needs a GPU or a particular torch build.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "EAGER_WARMUP_BEFORE_CAPTURE",
    "cycle",
    "rotation_copies",
    "time_cpu",
    "time_cpu_spread",
    "time_cuda_graph",
    "time_eager_cuda",
]

#: Eager calls of ``fn`` made on the capture stream before a graph is captured (cuBLAS/NCCL lazily allocate
#: workspaces and pick algorithms on the first calls; none of that may happen during capture).
EAGER_WARMUP_BEFORE_CAPTURE = 3


def _check_counts(**counts: int) -> None:
    for name, value in counts.items():
        if name == "warmup":
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        elif value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def time_cuda_graph(
    fn: Callable[[], object],
    *,
    calls_per_graph: int,
    replays: int,
    warmup: int,
    stream: torch.cuda.Stream | None = None,
    after_capture: Callable[[], object] | None = None,
) -> list[float]:
    """Per-call device time in microseconds, one sample per graph replay.

    ``fn`` is called :data:`EAGER_WARMUP_BEFORE_CAPTURE` times eagerly on the capture stream, then
    ``calls_per_graph`` times under capture into one ``torch.cuda.CUDAGraph`` (never on the default stream: a
    fresh side stream is used unless ``stream`` is given). The graph is replayed ``warmup`` times untimed, then
    ``replays`` times with a CUDA event recorded before and after each replay on the capture stream; there is a
    single host synchronisation, after the last replay. Sample *i* is
    ``elapsed_ms(start_i, end_i) * 1000 / calls_per_graph``.

    ``fn`` must be capturable (no host syncs, no allocations that depend on data). Whatever tensors it touches
    at capture time are the ones every replay touches, so operand rotation must be built into ``fn``
    (see :func:`cycle`). ``after_capture`` runs once between capture and the first replay (e.g. vLLM's custom
    all-reduce IPC-registers the buffers its captured kernels point at: ``register_graph_buffers``).
    """
    import torch

    _check_counts(calls_per_graph=calls_per_graph, replays=replays, warmup=warmup)
    capture_stream = stream if stream is not None else torch.cuda.Stream()  # type: ignore[no-untyped-call, unused-ignore]
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        for _ in range(EAGER_WARMUP_BEFORE_CAPTURE):
            fn()
    capture_stream.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream):
        for _ in range(calls_per_graph):
            fn()
    if after_capture is not None:
        after_capture()

    starts = [_event() for _ in range(replays)]
    ends = [_event() for _ in range(replays)]
    with torch.cuda.stream(capture_stream):
        for _ in range(warmup):
            graph.replay()
        for start, end in zip(starts, ends, strict=True):
            start.record(capture_stream)
            graph.replay()
            end.record(capture_stream)
    capture_stream.synchronize()
    samples = [start.elapsed_time(end) * 1000.0 / calls_per_graph for start, end in zip(starts, ends, strict=True)]
    del graph
    return samples


def _event() -> torch.cuda.Event:
    import torch

    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call, unused-ignore]


def time_eager_cuda(fn: Callable[[], object], *, iters: int, warmup: int) -> list[float]:
    """Per-call time in microseconds of ``fn`` launched eagerly on the current stream.

    Events are recorded around every call, one synchronisation at the end. Unlike :func:`time_cuda_graph` this
    includes launch gaps when the host cannot keep ahead of the device; use it for what cannot be captured, and
    say so where the number is reported.
    """
    import torch

    _check_counts(iters=iters, warmup=warmup)
    current = torch.cuda.current_stream()
    for _ in range(warmup):
        fn()
    starts = [_event() for _ in range(iters)]
    ends = [_event() for _ in range(iters)]
    for start, end in zip(starts, ends, strict=True):
        start.record(current)
        fn()
        end.record(current)
    current.synchronize()
    return [start.elapsed_time(end) * 1000.0 for start, end in zip(starts, ends, strict=True)]


def time_cpu(
    fn: Callable[[], object],
    *,
    iters: int,
    warmup: int,
    min_time_s: float = 1e-3,
    max_loops: int = 1 << 20,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> list[float]:
    """Per-call time in microseconds of ``fn`` on the host, ``iters`` samples.

    ``clock`` is a nanosecond clock: wall time (``time.perf_counter_ns``, the default), or the calling thread's
    CPU time (``time.thread_time_ns``) when ``fn`` runs entirely on the calling thread (e.g. torch with one
    intra-op thread): other processes competing for the cores then do not inflate the figure.

    After ``warmup`` untimed calls, the number of calls per sample (``loops``) is calibrated by doubling until one
    sample lasts at least ``min_time_s`` (capped at ``max_loops``), so that fast functions are not dominated by
    clock resolution. Each sample is then ``elapsed / loops``. ``min_time_s=0`` gives one call per sample.
    """
    _check_counts(iters=iters, warmup=warmup, max_loops=max_loops)
    loops, first = _calibrate(fn, warmup, min_time_s, max_loops, clock)
    samples = [first]  # the last calibration run is a real sample
    for _ in range(iters - 1):
        samples.append(_run_loops(fn, loops, clock) / loops / 1000.0)
    return samples


def time_cpu_spread(
    fn: Callable[[], object],
    *,
    samples: int,
    best_of: int,
    span_s: float,
    warmup: int,
    min_time_s: float = 1e-3,
    max_loops: int = 1 << 20,
    clock: Callable[[], int] = time.perf_counter_ns,
    wall: Callable[[], float] = time.monotonic,
) -> list[float]:
    """Per-call time in microseconds of ``fn`` on the host: ``samples`` samples, each the fastest of at least
    ``best_of`` batches **spread across** ``span_s`` seconds of wall time.

    Batches (``loops`` calls each, calibrated as in :func:`time_cpu`) run back to back until ``span_s`` has passed
    and at least ``samples × best_of`` have run; sample *j* is the fastest of batches *j*, *j + samples*,
    *j + 2·samples*, … so its batches lie across the whole span, not side by side. Why: on a shared VM, memory-bound
    GEMMs run +50 % slower for bursts of 1–3 s several times a minute (a neighbour's load, invisible to the guest;
    docs/measurements/cpu-gemm-bursts.md). The fastest of three adjacent 10 ms batches sits inside one burst; the
    fastest of batches spread over 3 s does not. A change to ``fn`` itself slows every batch, so it still shows.
    """
    _check_counts(samples=samples, best_of=best_of, warmup=warmup, max_loops=max_loops)
    if span_s < 0 or not math.isfinite(span_s):
        raise ValueError(f"span_s must be a finite number >= 0, got {span_s}")
    start = wall()
    loops, first = _calibrate(fn, warmup, min_time_s, max_loops, clock)
    batches = [first]
    while len(batches) < samples * best_of or wall() - start < span_s:
        batches.append(_run_loops(fn, loops, clock) / loops / 1000.0)
    return [min(batches[j::samples]) for j in range(samples)]


def _calibrate(fn: Callable[[], object], warmup: int, min_time_s: float, max_loops: int,
               clock: Callable[[], int]) -> tuple[int, float]:
    """Run ``warmup`` untimed calls, then double ``loops`` until one batch lasts ``min_time_s``: the loops and the
    last batch's per-call µs (a real sample)."""
    if min_time_s < 0 or not math.isfinite(min_time_s):
        raise ValueError(f"min_time_s must be a finite number >= 0, got {min_time_s}")
    for _ in range(warmup):
        fn()
    min_ns = min_time_s * 1e9
    loops = 1
    while True:
        elapsed = _run_loops(fn, loops, clock)
        if elapsed >= min_ns or loops >= max_loops:
            return loops, elapsed / loops / 1000.0
        loops = min(loops * 2, max_loops)


def _run_loops(fn: Callable[[], object], loops: int, clock: Callable[[], int]) -> int:
    start = clock()
    for _ in range(loops):
        fn()
    return clock() - start


def rotation_copies(
    bytes_per_copy: int,
    cache_bytes: int,
    *,
    factor: float = 2.0,
    max_copies: int = 64,
    max_total_bytes: int | None = None,
) -> int:
    """How many copies of an operand set to rotate through so that the working set is ``factor`` × the cache.

    At least 1, at most ``max_copies``, and never so many that ``copies × bytes_per_copy`` exceeds
    ``max_total_bytes`` (when given). When one copy already exceeds ``factor × cache_bytes`` this returns 1:
    a single copy is cold on every call.
    """
    if bytes_per_copy <= 0:
        raise ValueError(f"bytes_per_copy must be > 0, got {bytes_per_copy}")
    if cache_bytes < 0:
        raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
    copies = max(1, math.ceil(factor * cache_bytes / bytes_per_copy))
    copies = min(copies, max_copies)
    if max_total_bytes is not None:
        copies = min(copies, max(1, max_total_bytes // bytes_per_copy))
    return copies


def cycle(calls: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """One callable that invokes ``calls[0]``, ``calls[1]``, … in turn, wrapping around.

    Under graph capture, call *k* of the graph is bound to ``calls[k % len(calls)]``, so a graph of
    ``calls_per_graph >= len(calls)`` calls touches every copy on each replay.
    """
    if not calls:
        raise ValueError("cycle() needs at least one callable")
    it = itertools.cycle(calls)

    def call_next() -> object:
        return next(it)()

    return call_next
