"""Module-level functions the rank-runner tests send to real gloo ranks (tasks must be importable by name)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pytest_moeperf.kernels.rank_worker import Rank


def sum_of_ranks(rank: Rank, offset: float) -> list[float]:
    """Each rank contributes ``rank + offset`` to a 4-element all-reduce; returns what it received."""
    import torch
    import torch.distributed as dist

    t = torch.full((4,), float(rank.rank) + offset)
    dist.all_reduce(t)
    return [float(x) for x in t]


def whoami(rank: Rank) -> tuple[int, int, str, int]:
    return rank.rank, rank.world_size, rank.backend, os.getpid()


def hang_on_rank_1(rank: Rank) -> str:
    """Rank 1 sleeps forever; rank 0 waits for it in an all-reduce."""
    import torch
    import torch.distributed as dist

    if rank.rank == 1:
        while True:
            time.sleep(3600)
    dist.all_reduce(torch.ones(2))
    return "unreachable"


def raise_on_rank_1(rank: Rank) -> None:
    import torch
    import torch.distributed as dist

    if rank.rank == 1:
        raise ValueError("rank 1 refuses to add")
    dist.all_reduce(torch.ones(2))


def exit_on_rank_0(rank: Rank, code: int) -> None:
    import torch
    import torch.distributed as dist

    if rank.rank == 0:
        sys.stdout.flush()
        os._exit(code)
    dist.all_reduce(torch.ones(2))


def spawn_grandchild_then_hang(rank: Rank, directory: str) -> int:
    """Start a long-lived child (a process the rank owns, pid written to ``directory``), then hang on rank 1:
    teardown must take the child too."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.path.join(directory, f"grandchild{rank.rank}.pid"), "w") as f:
        f.write(str(child.pid))
    if rank.rank == 1:
        while True:
            time.sleep(3600)
    return child.pid


def unpicklable_result(rank: Rank) -> object:
    return lambda: rank
