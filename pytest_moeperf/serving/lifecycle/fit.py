"""What fits on the box: GPU memory shares, CPU servers, and the server starts that run at the same time.

A launched server occupies GPUs and a share of each one's memory (its ``--gpu-memory-utilization``); the shares
on one GPU may sum to at most :data:`GPU_SHARE_BUDGET`. On CPU at most :data:`CPU_SERVERS` run at once (`place`).

**Starting together.** A start is minutes of mostly single-threaded work (imports, torch.compile, CUDA-graph
capture: 64-116 s per tiny-MoE server on an H200 host), so four TP=1 profiles started one after another take most
of a 10-minute batch. When the session's tests (``wanted``, in their order) need other profiles that fit beside the
one asked for, the pool starts them at the same time, at most `parallel_starts` of them (one per
`CPUS_PER_START` usable CPUs: on a 2-core CI box, one: the starts stay sequential). Servers that share a GPU start
together only when each fixes its KV cache size (`fixes_kv_cache`: ``--kv-cache-memory-bytes``): otherwise vLLM's
memory profiling counts a neighbour's allocations during its profile run as its own. Each server's ``startup_s``
is timed from its own launch; its context says how many started together (``started_together``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.serving.models.profiles import ServeProfile

__all__ = ["CPUS_PER_START", "CPU_SERVERS", "GPU_SHARE_BUDGET", "KV_CACHE_FLAGS", "Placement", "companions",
           "fixes_kv_cache", "parallel_starts", "place"]

GPU_SHARE_BUDGET = 0.9
CPU_SERVERS = 2  # each tiny-model server holds VLLM_CPU_KVCACHE_SPACE (1 GiB) of KV cache

CPUS_PER_START = 4
KV_CACHE_FLAGS = ("--kv-cache-memory-bytes", "--kv-cache-memory")


@dataclass(frozen=True)
class Placement:
    """Where a launched server runs: its GPUs (empty on CPU) and the memory share it takes on each."""

    gpus: tuple[int, ...]
    share: float


def place(profile: ServeProfile, running: Sequence[Placement], gpu_count: int) -> Placement | None:
    """A placement for ``profile`` beside ``running`` (None: it does not fit until something stops).
    GPUs with the most free share first, so that small servers spread and a TP group finds room."""
    if profile.device != "cuda":
        return Placement((), 0.0) if len(running) < CPU_SERVERS else None
    used = [0.0] * gpu_count
    for p in running:
        for g in p.gpus:
            used[g] += p.share
    share = profile.gpu_share
    free = sorted((g for g in range(gpu_count) if used[g] + share <= GPU_SHARE_BUDGET + 1e-9), key=lambda g: used[g])
    if len(free) < profile.gpus_needed:
        return None
    return Placement(tuple(sorted(free[: profile.gpus_needed])), share)


def parallel_starts(cpus: int) -> int:
    """Server starts that may run at once on a host with ``cpus`` usable CPUs."""
    return max(1, cpus // CPUS_PER_START)


def fixes_kv_cache(profile: ServeProfile) -> bool:
    """Whether the profile's server sizes its KV cache from an argument, not from profiling the GPU's free memory."""
    return any(a == f or a.startswith(f + "=") for a in profile.vllm_args for f in KV_CACHE_FLAGS)


def companions(first: tuple[ServeProfile, Placement], candidates: Sequence[ServeProfile],
               running: Sequence[Placement], gpu_count: int, parallel: int) -> list[tuple[ServeProfile, Placement]]:
    """The profiles among ``candidates`` (in order) to start together with ``first``: those that fit beside the
    ``running`` servers and the group without stopping any, at most ``parallel`` starts in all, and on a GPU only
    profiles that fix their KV cache size (`fixes_kv_cache`), ``first`` included."""
    head = first[0]
    if parallel < 2 or (head.device == "cuda" and not fixes_kv_cache(head)):
        return []
    group = [first]
    for profile in candidates:
        if len(group) >= parallel:
            break
        if (profile.name == head.name or profile.attached_url is not None
                or (profile.device == "cuda" and not fixes_kv_cache(profile))):
            continue
        spot = place(profile, [*running, *(p for _, p in group)], gpu_count)
        if spot is not None:
            group.append((profile, spot))
    return group[1:]
