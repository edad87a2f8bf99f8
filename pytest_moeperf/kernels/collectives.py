"""All-reduce backends measured on N ranks: message sizes, correctness check, timing, nccl-tests bandwidths.

:func:`measure_allreduce` runs inside every rank of a :class:`~pytest_moeperf.kernels.rank_controller.RankGroup`
(the ``ranks`` fixture). It builds one backend, checks that the sum is right on random data, then times it:

* ``graph`` (GPU): a CUDA graph of back-to-back all-reduces replayed with events around each replay
  (:func:`pytest_moeperf.kernels.timing.time_cuda_graph`), the figure a captured decode step sees;
* ``eager``: events around each eagerly launched call on the GPU (launch gaps included); on the CPU (gloo) the
  fastest call of each block of 25 (see :func:`_time_cpu` for why).

Backends: ``gloo`` (CPU processes), ``nccl``, torch symmetric memory ``symm_mem_one_shot`` /
``symm_mem_two_shot`` (P2P loads, never NVLink multicast) and ``vllm_custom`` (vLLM's custom all-reduce, when
importable). Every rank returns its per-call samples; the suite keeps the slowest rank (largest median), as a
collective finishes when its last rank does. Bandwidths follow nccl-tests: ``algbw = bytes / time`` and, for
all-reduce, ``busbw = algbw × 2(n−1)/n``.

Timing loops must issue the same number of collectives on every rank, so every count here is derived from the
task's arguments (or agreed with an all-reduce of a max), never from a rank's own clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_moeperf.judging import stats
from pytest_moeperf.kernels import timing
from pytest_moeperf.kernels.allreduce_impls import Impl, Unsupported, build_impl
from pytest_moeperf.kernels.models import allreduces_per_step, get_model
from pytest_moeperf.kernels.rank_worker import Backend, Rank
from pytest_moeperf.ledger import Measurement, Section

if TYPE_CHECKING:
    import torch

__all__ = [
    "BACKENDS",
    "AllReduceBackend",
    "AllReduceTask",
    "Message",
    "RankResult",
    "algbw_gbps",
    "bus_factor",
    "busbw_gbps",
    "decode_messages",
    "measure_allreduce",
    "power_of_two_sizes",
    "busbw_sections",
    "slowest_rank",
]

Mode = Literal["graph", "eager"]


# ------------------------------------------------------------------------------------------------ formulas


def algbw_gbps(nbytes: int, latency_us: float) -> float:
    """Algorithm bandwidth in GB/s (10⁹ B/s): the message size over the time of one all-reduce."""
    if latency_us <= 0:
        raise ValueError(f"latency must be > 0 us, got {latency_us}")
    return nbytes / (latency_us * 1e-6) / 1e9


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor ``2(n−1)/n``: the data each rank sends over its link,
    relative to the message, in a bandwidth-optimal all-reduce (0 for one rank)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return 2.0 * (world_size - 1) / world_size


def busbw_gbps(algbw: float, world_size: int) -> float:
    """Bus bandwidth in GB/s of an all-reduce on ``world_size`` ranks: ``algbw × 2(n−1)/n``."""
    return algbw * bus_factor(world_size)


# ------------------------------------------------------------------------------------------------ sizes


@dataclass(frozen=True)
class Message:
    """One all-reduce size to measure; ``batch`` is set for a model's decode message."""

    nbytes: int
    batch: int | None = None

    @property
    def id(self) -> str:
        size = _format_bytes(self.nbytes)
        return f"decode-b{self.batch}-{size}" if self.batch is not None else f"sweep-{size}"


def _format_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def decode_messages(model: str, batches: Sequence[int], *, tp: int) -> list[Message]:
    """The all-reduce message of one decode step of ``model`` at each batch size (``batch × hidden × 2`` B)."""
    spec = get_model(model)
    return [Message(allreduces_per_step(spec, tp, batch).bytes_each, batch) for batch in batches]


def power_of_two_sizes(lo: int, hi: int, *, step: int = 2) -> list[Message]:
    """``lo, lo·step, …`` up to ``hi`` bytes (both powers of two)."""
    if lo < 1 or hi < lo or step < 2:
        raise ValueError(f"need 1 <= lo <= hi and step >= 2, got lo={lo}, hi={hi}, step={step}")
    sizes: list[Message] = []
    size = lo
    while size <= hi:
        sizes.append(Message(size))
        size *= step
    return sizes


# ------------------------------------------------------------------------------------------------ backends


@dataclass(frozen=True)
class AllReduceBackend:
    """An all-reduce implementation: the process-group backend its ranks need and the modes it is timed in."""

    name: str
    process_group: Backend
    modes: tuple[Mode, ...]
    description: str


BACKENDS: dict[str, AllReduceBackend] = {
    b.name: b
    for b in (
        AllReduceBackend("gloo", "gloo", ("eager",), "torch.distributed gloo on CPU processes"),
        AllReduceBackend("nccl", "nccl", ("graph", "eager"), "torch.distributed NCCL"),
        AllReduceBackend("symm_mem_one_shot", "nccl", ("graph", "eager"),
                         "torch symmetric memory one_shot_all_reduce (P2P loads, no multicast)"),
        AllReduceBackend("symm_mem_two_shot", "nccl", ("graph", "eager"),
                         "torch symmetric memory two_shot_all_reduce_ (P2P, in place, no multicast)"),
        AllReduceBackend("vllm_custom", "nccl", ("graph", "eager"),
                         "vLLM CustomAllreduce, unregistered input (one staging copy per call)"),
    )
}


@dataclass(frozen=True)
class AllReduceTask:
    """What every rank is asked to do (pickled to the ranks)."""

    backend: str
    nbytes: int
    capacity_bytes: int  # the largest message this backend will be asked for (symmetric / IPC buffers)
    quick: bool = False
    seed: int = 0
    cpu_budget_s: float = 1.0


@dataclass(frozen=True)
class RankResult:
    """One rank's outcome: per-call samples (µs) per mode, or why the backend cannot run here."""

    rank: int
    samples: dict[str, list[float]] = field(default_factory=dict)
    dtype: str = ""
    unsupported: str = ""
    info: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ check


_PERIOD = 4099  # a prime: a chunk put at the wrong offset does not line up with the expected pattern


def _check_sum(rank: Rank, task: AllReduceTask, impl: Impl) -> None:
    """All-reduce random integers (exact in bf16) and compare with the sum every rank can compute itself."""
    import torch

    numel = impl.source.numel()
    gen = torch.Generator().manual_seed(task.seed)
    bases = [torch.randint(-8, 9, (_PERIOD,), generator=gen) for _ in range(rank.world_size)]
    reps = math.ceil(numel / _PERIOD)

    def tiled(base: torch.Tensor) -> torch.Tensor:
        return base.to(device=impl.source.device, dtype=impl.source.dtype).repeat(reps)[:numel]

    impl.source.copy_(tiled(bases[rank.rank]))
    result = impl.run().reshape(-1)[:numel]
    expected = tiled(torch.stack(bases).sum(0))
    wrong = (result != expected).nonzero()
    if wrong.numel():
        first = int(wrong[0, 0])
        raise AssertionError(
            f"rank {rank.rank}: {task.backend} all-reduce of {task.nbytes} B on {rank.world_size} ranks gave a "
            f"wrong sum at {wrong.shape[0]} of {numel} elements (first at index {first}: got "
            f"{float(result[first])}, expected {float(expected[first])})")
    impl.source.zero_()  # timed calls sum zeros: values stay finite however many calls run


# ------------------------------------------------------------------------------------------------ timing


def _agree_max(rank: Rank, value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=rank.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


_CPU_BLOCK = 25  # calls per block; after each block the ranks agree whether the time budget is spent
_CPU_MAX_BLOCKS = 200


def _time_cpu(rank: Rank, task: AllReduceTask, impl: Impl) -> list[float]:
    """One sample per block of :data:`_CPU_BLOCK` calls: the fastest call's wall time, in µs.

    CPU ranks share cores with whatever else runs on the machine; a descheduled rank stalls the collective for
    milliseconds. Across five A/A runs on a shared 2-core box, the median over calls of a case moved by up to
    ~150 %, the median of per-block minima by up to ~80 %: the per-block minimum is the uncontended latency, and
    still moves with anything that slows every call. Blocks continue until the slowest rank has spent the time
    budget (an all-reduce of the time spent decides, so every rank makes the same number of calls)."""
    import torch.distributed as dist

    budget_s = task.cpu_budget_s * (0.3 if task.quick else 1.0)
    dist.barrier()
    samples: list[float] = []
    spent_s = 0.0
    while len(samples) < _CPU_MAX_BLOCKS:
        block = timing.time_cpu(impl.run, iters=_CPU_BLOCK, warmup=0 if samples else 5, min_time_s=0.0)
        samples.append(min(block))
        spent_s += sum(block) * 1e-6
        if _agree_max(rank, spent_s) >= budget_s:
            break
    return samples


def _gpu_counts(nbytes: int, quick: bool) -> tuple[int, int, int]:
    """(calls per graph, replays, eager iterations) from the size alone, so every rank gets the same."""
    est_us = 10.0 + nbytes / 50e3  # a pessimistic guess: 10 µs + 50 GB/s
    calls = max(1, min(100, int(2_000 / est_us)))
    replays = max(10, min(100, int(200_000 / (calls * est_us))))
    eager = max(20, min(500, int(200_000 / est_us)))
    if quick:
        replays, eager = max(5, replays // 4), max(10, eager // 4)
    return calls, replays, eager


def _time_gpu(rank: Rank, task: AllReduceTask, impl: Impl, mode: Mode) -> list[float]:
    import torch
    import torch.distributed as dist

    calls, replays, eager = _gpu_counts(task.nbytes, task.quick)
    torch.cuda.synchronize()
    dist.barrier()
    if mode == "graph":
        return timing.time_cuda_graph(impl.run, calls_per_graph=calls, replays=replays, warmup=3,
                                      after_capture=impl.after_capture)
    return timing.time_eager_cuda(impl.run, iters=eager, warmup=10)


def measure_allreduce(rank: Rank, task: AllReduceTask) -> RankResult:
    """Run in every rank: build ``task.backend``, check the sum, time each of its modes."""
    import torch

    try:
        impl = build_impl(rank, task)
    except Unsupported as exc:
        return RankResult(rank.rank, unsupported=str(exc))
    _check_sum(rank, task, impl)
    samples: dict[str, list[float]] = {}
    for mode in BACKENDS[task.backend].modes:
        if rank.backend == "gloo":
            samples[mode] = _time_cpu(rank, task, impl)
        else:
            samples[mode] = _time_gpu(rank, task, impl, mode)
    info = dict(impl.info, torch=torch.__version__)
    return RankResult(rank.rank, samples, str(impl.source.dtype).removeprefix("torch."), info=info)


def slowest_rank(per_rank: Sequence[Sequence[float]]) -> tuple[int, list[float]]:
    """The rank with the largest median per-call time and its samples: a collective ends with its last rank."""
    if not per_rank:
        raise ValueError("no ranks")
    index = max(range(len(per_rank)), key=lambda r: stats.median(per_rank[r]))
    return index, list(per_rank[index])


# ------------------------------------------------------------------------------------------------ report


def busbw_sections(measurements: list[Measurement]) -> list[Section]:
    """One table of every all-reduce measured: latency, algbw and busbw (medians) per backend, mode and size."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for m in measurements:
        if m.context.get("op") != "allreduce" or "_" not in m.name:
            continue
        metric, mode = m.name.rsplit("_", 1)
        row = rows.setdefault((m.test_id, mode), {"ctx": m.context, "mode": mode})
        row[metric] = stats.median(m.samples)
    if not rows:
        return []
    table = []
    for (_test, mode), row in sorted(rows.items(), key=lambda kv: _row_order(kv[1])):
        ctx = row["ctx"]
        table.append((ctx.get("backend"), ctx.get("world"), ctx.get("bytes"), ctx.get("batch") or "", mode,
                      _round(row.get("latency")), _round(row.get("algbw")), _round(row.get("busbw"))))
    return [Section("All-reduce (median; busbw = algbw x 2(n-1)/n)",
                    ("backend", "ranks", "bytes", "batch", "mode", "latency us", "algbw GB/s", "busbw GB/s"),
                    tuple(table))]


def _row_order(row: dict[str, Any]) -> tuple[str, str, int]:
    ctx = row["ctx"]
    return (str(ctx.get("backend")), str(row["mode"]), int(ctx.get("bytes") or 0))


def _round(value: float | None) -> float | str:
    if value is None:
        return ""
    return round(value, 3) if value < 100 else round(value, 1)
