"""The worker side of the rank runner: what runs inside each rank process.

:func:`worker_main` is the entry point a :class:`~pytest_moeperf.kernels.rank_controller.RankGroup` starts in each
process (``python -c``): it initialises the process group (``nccl`` with one GPU per rank, or ``gloo`` on the CPU)
over the controller's TCP store, answers the controller with its main thread's id, then loops: receive a pickled
task (a module-level function and its arguments), call ``fn(Rank(...), *args)``, send back ``("ok", result)`` or
``("error", traceback text)``. A ``None`` message or a closed pipe ends the loop. ``SIGUSR1`` dumps every thread's
Python stack (``faulthandler``) into the rank's log, which the controller reads when a rank hangs.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["Backend", "Rank", "worker_main"]

Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class Rank:
    """What a task learns about the process it runs in (its first argument)."""

    rank: int
    world_size: int
    backend: Backend

    @property
    def device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.rank) if self.backend == "nccl" else torch.device("cpu")



def worker_main() -> None:
    """Entry point of a rank process (started by :class:`~pytest_moeperf.kernels.rank_controller.RankGroup`)."""
    task_fd, result_fd = (int(x) for x in os.environ["MOEPERF_RANK_FDS"].split(","))
    tasks = Connection(task_fd, writable=False)
    results = Connection(result_fd, readable=False)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rank = Rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                "nccl" if os.environ["MOEPERF_RANK_BACKEND"] == "nccl" else "gloo")
    try:
        _init_process_group(rank)
    except BaseException as exc:  # noqa: BLE001 - the parent reports why this rank could not start
        results.send(("error", _format_exception(exc)))
        sys.exit(1)
    results.send(("ok", threading.main_thread().ident))
    while True:
        try:
            payload = tasks.recv_bytes()
        except EOFError:
            break
        message = pickle.loads(payload)
        if message is None:
            break
        results.send(_run_task(rank, message))
    _destroy_process_group()


def _init_process_group(rank: Rank) -> None:
    import torch
    import torch.distributed as dist

    host, port = os.environ["MOEPERF_RANK_STORE"].rsplit(":", 1)
    timeout = timedelta(seconds=float(os.environ["MOEPERF_RANK_TIMEOUT"]))  # start and collectives
    store = dist.TCPStore(  # type: ignore[attr-defined, unused-ignore]
        host, int(port), rank.world_size + 1, is_master=False, timeout=timeout)
    if rank.backend == "nccl":
        torch.cuda.set_device(rank.rank)
        dist.init_process_group("nccl", store=store, rank=rank.rank, world_size=rank.world_size,
                                timeout=timeout, device_id=torch.device("cuda", rank.rank))
    else:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=store, rank=rank.rank, world_size=rank.world_size, timeout=timeout)
    dist.barrier()


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _run_task(rank: Rank, message: tuple[list[str], bytes]) -> tuple[str, Any]:
    path, task = message
    sys.path.extend(p for p in path if p not in sys.path)
    try:
        fn, args = pickle.loads(task)
        result = fn(rank, *args)
        pickle.dumps(result)
    except BaseException as exc:  # noqa: BLE001 - everything a task raises goes back to the parent
        return ("error", _format_exception(exc))
    return ("ok", result)


def _format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc)).rstrip()
