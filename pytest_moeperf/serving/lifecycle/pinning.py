"""CPU affinity of a launched server's processes and of the load generator (a placement's I/O, Linux ``/proc``).

`pin_server` runs once the server is healthy (so that its start, torch.compile's workers included, used every
core): the engine core (the process titled ``VLLM::EngineCore``, vLLM's ``setproctitle``) and everything it
started go on the engine's CPUs, the API server and its other processes on the API server's, every thread of each
(``sched_setaffinity`` takes one thread; threads and processes started later inherit from their parent). `pinned`
puts every thread of this process on the client's CPUs for a measured window and gives each back its own after.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_moeperf.serving.models.placement import CpuSets, format_cpu_list

__all__ = ["ENGINE_TITLE", "Pinned", "affinity", "descendants", "pin_server", "pinned", "title"]

PROC = Path("/proc")
ENGINE_TITLE = "VLLM::EngineCor"  # /proc/PID/comm holds 15 characters of "VLLM::EngineCore" (or "…Core_DP0")


@dataclass(frozen=True)
class Pinned:
    """The processes a placement pinned, by role."""

    engine: tuple[int, ...]
    api: tuple[int, ...]

    def describe(self, sets: CpuSets) -> str:
        return (f"engine {format_cpu_list(sets.engine)} ({len(self.engine)} processes), api "
                f"{format_cpu_list(sets.api)} ({len(self.api)}), client {format_cpu_list(sets.client)}")


def title(pid: int) -> str:
    """A process's title: its command line as ``setproctitle`` left it, else its ``comm``; "" when it is gone."""
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        return cmdline or (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def _parents() -> dict[int, int]:
    """Every process's parent, from ``/proc/PID/stat`` (the field after the parenthesised name)."""
    found = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def descendants(pid: int) -> list[int]:
    """``pid``'s children, their children, …, parents before children."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    order, queue = [], list(children.get(pid, []))
    while queue:
        current = queue.pop(0)
        order.append(current)
        queue.extend(sorted(children.get(current, [])))
    return order


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(PROC / str(pid) / "task")]
    except OSError:
        return []


def _pin(pid: int, cpus: Iterable[int]) -> bool:
    """Every thread of ``pid`` on ``cpus``; False when the process is gone."""
    mask = set(cpus)
    tids = _threads(pid)
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, mask)
    return bool(tids)


def pin_server(pid: int, sets: CpuSets) -> Pinned:
    """The server whose first process is ``pid``: the engine core's tree on ``sets.engine``, the rest on
    ``sets.api``. Raises OSError when the kernel refuses (a CPU outside this process's cpuset)."""
    tree = descendants(pid)
    cores = [p for p in tree if title(p).startswith(ENGINE_TITLE)]
    engine_tree = set(cores)
    for core in cores:
        engine_tree.update(descendants(core))
    engine = tuple(p for p in tree if p in engine_tree and _pin(p, sets.engine))
    api = tuple(p for p in (pid, *tree) if p not in engine_tree and _pin(p, sets.api))
    return Pinned(engine, api)


def affinity(pid: int) -> frozenset[int]:
    """The CPUs ``pid`` (a process's or a thread's id) may run on."""
    return frozenset(os.sched_getaffinity(pid))


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[None]:
    """Every thread of this process on ``cpus`` while the block runs (threads started meanwhile inherit it), each
    back on its own CPUs after; nothing when ``cpus`` is None."""
    if cpus is None:
        yield
        return
    before = {tid: os.sched_getaffinity(tid) for tid in _threads(os.getpid())}
    for tid in before:
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        fallback = set().union(*before.values()) if before else None
        for tid in _threads(os.getpid()):
            with contextlib.suppress(ProcessLookupError, OSError):
                os.sched_setaffinity(tid, before.get(tid, fallback) or os.sched_getaffinity(0))
