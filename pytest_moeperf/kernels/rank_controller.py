"""The controller side of the rank runner: run a function on N ranks, one process per rank, with a hard timeout.

A :class:`RankGroup` is N worker processes (``python -c`` of
:func:`~pytest_moeperf.kernels.rank_worker.worker_main`), each started in its own session, each with an
initialised process group (``nccl`` with one GPU per rank, or ``gloo`` on the CPU) over a TCP store that the
parent hosts on a free loopback port. The parent sends a picklable task (a module-level function and its
arguments) to every rank through a pipe; each rank calls ``fn(rank, *args)`` and sends back the result, or the
exception with its traceback. Groups stay alive between tasks (spawning ranks and initialising NCCL costs
seconds), so :class:`RankPool` keeps one group per (world size, backend).

When a rank does not answer within the timeout, dies, or raises, the whole group is torn down
(SIGUSR1 → Python stacks dumped by ``faulthandler``, then SIGTERM, then SIGKILL to each session) and
:class:`RankFailure` names the rank(s), what happened and the state of the others; the parent then checks
``/proc`` that no process of those sessions is left (:mod:`pytest_moeperf.processes.lifecycle`).
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Literal, TypeVar

from pytest_moeperf.kernels.rank_worker import Backend, Rank
from pytest_moeperf.processes.lifecycle import (
    KILL_GRACE_S,
    describe_returncode,
    leftover_processes,
    log_tail,
    start_in_session,
    terminate_sessions,
)

__all__ = [
    "DEFAULT_RANK_TIMEOUT_S",
    "MULTICAST_OFF_ENV",
    "Backend",
    "Rank",
    "RankFailure",
    "RankGroup",
    "RankPool",
    "leftover_processes",
]

T = TypeVar("T")

DEFAULT_RANK_TIMEOUT_S = 180.0
#: Set in every rank process: NVLink multicast (NVLS) stays off on every backend that could use it.
MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
#: Starting ranks (importing torch, initialising NCCL) may take longer than a task on a busy machine: a group's
#: start gets at least this long unless told otherwise.
MIN_START_TIMEOUT_S = 120.0
_STACK_DUMP_WAIT_S = 0.5
_PEER_GRACE_S = 2.0


class RankFailure(Exception):
    """A multi-rank run failed; the message names the rank(s) and what happened to each.

    ``culprits``: the ranks to blame, most likely first; ``during``: ``"start"`` (the group could not start) or
    the task's name; ``timed_out``: whether some rank was still running at the timeout (else one raised or died)."""

    def __init__(self, message: str, culprits: Sequence[int], during: str = "", timed_out: bool = False) -> None:
        super().__init__(message)
        self.culprits = tuple(culprits)
        self.during = during
        self.timed_out = timed_out


@dataclass
class _Outcome:
    """What the parent knows about one rank after a task (or the group's start)."""

    state: Literal["running", "finished", "raised", "exited"]
    result: Any = None
    error: str = ""  # "ValueError: ..." plus the traceback text
    returncode: int | None = None
    stack: str = ""  # the main thread's Python stack, dumped before a hung rank was killed


_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")


def _main_thread_stack(log_text: str, main_ident: int | None) -> str:
    """The last faulthandler dump of the rank's main thread in its log (most recent call first)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in log_text.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            is_main = main_ident is None or int(header.group(1), 16) == main_ident
            current = [] if is_main else None
            if current is not None:
                blocks.append(current)
        elif current is not None:
            if line.startswith("  File "):
                current.append(line.strip())
            elif line.strip():
                current = None
    return "\n".join(blocks[-1]) if blocks else ""


def _in_torch_distributed(stack: str) -> bool:
    """Whether the innermost frame of a faulthandler stack (most recent call first) is in torch.distributed."""
    first = stack.splitlines()[0] if stack else ""
    return "torch/distributed" in first.replace("\\", "/")


def _last_frame(traceback_text: str) -> str:
    """The innermost ``File ...`` line of a formatted traceback (most recent call last)."""
    frames = [line.strip() for line in traceback_text.splitlines() if line.strip().startswith("File ")]
    return frames[-1] if frames else ""


class RankGroup:
    """N live rank processes with an initialised process group; run tasks on all of them."""

    def __init__(self, world_size: int, backend: Backend, *, timeout_s: float,
                 start_timeout_s: float | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        self.world_size = world_size
        self.backend: Backend = backend
        self.timeout_s = timeout_s
        self.start_timeout_s = max(timeout_s, MIN_START_TIMEOUT_S) if start_timeout_s is None else start_timeout_s
        self._logdir = Path(tempfile.mkdtemp(prefix="moeperf-ranks-"))
        self._procs: list[subprocess.Popen[bytes]] = []
        self._to_rank: list[Connection] = []
        self._from_rank: list[Connection] = []
        self._main_idents: list[int | None] = [None] * world_size
        self._store: Any = None
        self._keep_logs = False  # after a failure the message points at the logs
        self.alive = False
        self._start()

    # ----------------------------------------------------------------------------------------- lifecycle

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def log_path(self, rank: int) -> Path:
        return self._logdir / f"rank{rank}.log"

    def _start(self) -> None:
        import torch.distributed as dist

        self._store = dist.TCPStore(  # type: ignore[attr-defined, unused-ignore]
            "127.0.0.1", 0, self.world_size + 1, is_master=True, timeout=timedelta(seconds=self.start_timeout_s),
            wait_for_workers=False)
        env_common = dict(os.environ)
        env_common.update(MULTICAST_OFF_ENV)
        env_common["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env_common["MOEPERF_RANK_STORE"] = f"127.0.0.1:{self._store.port}"
        env_common["MOEPERF_RANK_BACKEND"] = self.backend
        env_common["MOEPERF_RANK_TIMEOUT"] = repr(max(self.timeout_s, self.start_timeout_s))
        env_common["WORLD_SIZE"] = str(self.world_size)
        if self.backend == "gloo":
            env_common.setdefault("OMP_NUM_THREADS", "1")
        elif os.environ.get("MOEPERF_ALL_GPUS"):
            # an xdist worker sees only its own GPU (machine.placement); its ranks need every GPU of the box
            env_common["CUDA_VISIBLE_DEVICES"] = os.environ["MOEPERF_ALL_GPUS"]
        try:
            for rank in range(self.world_size):
                task_r, task_w = os.pipe()
                result_r, result_w = os.pipe()
                env = dict(env_common, RANK=str(rank), LOCAL_RANK=str(rank),
                           MOEPERF_RANK_FDS=f"{task_r},{result_w}")
                proc = start_in_session(
                    [sys.executable, "-c", "from pytest_moeperf.kernels.rank_worker import worker_main; worker_main()"],
                    log=self.log_path(rank), env=env, pass_fds=(task_r, result_w))
                os.close(task_r)
                os.close(result_w)
                self._procs.append(proc)
                self._to_rank.append(Connection(task_w, readable=False))
                self._from_rank.append(Connection(result_r, writable=False))
            self.alive = True
            outcomes = self._collect("start", self.start_timeout_s)
            for rank, outcome in enumerate(outcomes):
                self._main_idents[rank] = outcome.result
        except BaseException:
            self.close(graceful=False)
            raise

    def close(self, *, graceful: bool = True) -> None:
        """Stop every rank (a shutdown message first when ``graceful``), then make sure none is left."""
        if graceful and self.alive:
            for conn in self._to_rank:
                try:
                    conn.send(None)
                except OSError:
                    pass
            deadline = time.monotonic() + KILL_GRACE_S * 3
            for proc in self._procs:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        self.alive = False
        terminate_sessions(self._procs)
        for conn in (*self._to_rank, *self._from_rank):
            conn.close()
        self._to_rank, self._from_rank = [], []
        self._store = None
        if not self._keep_logs:
            shutil.rmtree(self._logdir, ignore_errors=True)

    # ----------------------------------------------------------------------------------------- tasks

    def run(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> list[T]:
        """``fn(Rank(...), *args)`` on every rank; the per-rank results, in rank order.

        Raises :class:`RankFailure` (after tearing the group down) when a rank raises, dies or does not answer
        within ``timeout_s`` (default: the group's timeout).
        """
        if not self.alive:
            raise RuntimeError("this rank group has been closed")
        # Two layers: the rank extends sys.path before it unpickles (imports) the task's module.
        payload = pickle.dumps((list(sys.path), pickle.dumps((fn, args))))
        for conn in self._to_rank:
            try:
                conn.send_bytes(payload)
            except OSError:
                pass  # a dead rank: _collect reports it
        name = getattr(fn, "__qualname__", repr(fn))
        outcomes = self._collect(name, self.timeout_s if timeout_s is None else timeout_s)
        return [o.result for o in outcomes]

    def _collect(self, what: str, timeout_s: float) -> list[_Outcome]:
        outcomes = [_Outcome("running") for _ in range(self.world_size)]
        pending = dict(enumerate(self._from_rank))
        started = time.monotonic()
        deadline = started + timeout_s
        failed_at: float | None = None
        while pending:
            now = time.monotonic()
            limit = deadline if failed_at is None else min(deadline, failed_at + _PEER_GRACE_S)
            if now >= limit:
                break
            ready = wait(list(pending.values()), timeout=limit - now)
            for rank in [r for r, c in pending.items() if c in ready]:
                outcomes[rank] = self._receive(rank, pending.pop(rank))
                if outcomes[rank].state != "finished" and failed_at is None:
                    failed_at = time.monotonic()
        if failed_at is None and not pending:
            return outcomes
        elapsed = time.monotonic() - started
        for rank in pending:
            proc = self._procs[rank]
            if proc.poll() is not None:
                outcomes[rank] = _Outcome("exited", returncode=proc.returncode)
        self._dump_stacks(pending, outcomes)
        self._keep_logs = True
        self.close(graceful=False)
        timed_out = failed_at is None
        raise RankFailure(self._failure_message(what, outcomes, timeout_s, elapsed, timed_out),
                          self._culprits(outcomes), what, timed_out)

    def _receive(self, rank: int, conn: Connection) -> _Outcome:
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            proc = self._procs[rank]
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                return _Outcome("exited", error="closed its result pipe but is still running")
            return _Outcome("exited", returncode=proc.returncode)
        if kind == "ok":
            return _Outcome("finished", result=value)
        return _Outcome("raised", error=str(value))

    def _dump_stacks(self, pending: dict[int, Connection], outcomes: list[_Outcome]) -> None:
        running = [r for r in pending if outcomes[r].state == "running"]
        for rank in running:
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if running:
            time.sleep(_STACK_DUMP_WAIT_S)
        for rank in running:
            log = self.log_path(rank).read_text(errors="replace") if self.log_path(rank).exists() else ""
            outcomes[rank].stack = _main_thread_stack(log, self._main_idents[rank])

    @staticmethod
    def _culprits(outcomes: list[_Outcome]) -> list[int]:
        """The ranks to blame, most likely first: a rank that died beats one that raised (its peers raise
        because it died), a rank that raised on its own beats one that raised inside torch.distributed, and a
        rank stuck outside torch.distributed beats one waiting in a collective."""
        def pick(states: tuple[str, ...], test: Callable[[_Outcome], bool] = lambda o: True) -> list[int]:
            return [r for r, o in enumerate(outcomes) if o.state in states and test(o)]

        return (pick(("exited",))
                or pick(("raised",), lambda o: not _in_torch_distributed(_last_frame(o.error)))
                or pick(("raised",))
                or pick(("running",), lambda o: not _in_torch_distributed(o.stack))
                or pick(("running",)))

    def _failure_message(self, what: str, outcomes: list[_Outcome], timeout_s: float, elapsed: float,
                         timed_out: bool) -> str:
        culprits = self._culprits(outcomes)
        who = ("rank " if len(culprits) == 1 else "ranks ") + ", ".join(map(str, culprits))
        if timed_out:
            headline = f"{who} did not finish {what} within the {timeout_s:g} s timeout"
        else:
            states = {outcomes[r].state for r in culprits}
            verb = "raised" if states == {"raised"} else "died" if states == {"exited"} else "failed"
            headline = f"{who} {verb} during {what}"
        lines = [f"{headline} ({self.world_size} {self.backend} ranks, {elapsed:.1f} s)"]
        for rank, outcome in enumerate(outcomes):
            lines.append(f"  rank {rank} (pid {self._procs[rank].pid}): {self._describe(outcome, elapsed)}")
            if outcome.error:
                lines.extend("      " + line for line in outcome.error.rstrip().splitlines())
            if outcome.stack:
                lines.append("      Python stack when killed (most recent call first):")
                lines.extend("        " + line for line in outcome.stack.splitlines())
            if outcome.state == "exited":
                tail = log_tail(self.log_path(rank))
                if tail:
                    lines.append("      last lines of its output:")
                    lines.extend("        " + line for line in tail.splitlines())
        left = leftover_processes(self.pids)
        if left:
            lines.append("  processes LEFT BEHIND: " + ", ".join(f"{pid} ({cmd})" for pid, cmd in left))
        else:
            lines.append(f"  all rank processes ended (pids {', '.join(map(str, self.pids))}); "
                         f"logs in {self._logdir}")
        return "\n".join(lines)

    @staticmethod
    def _describe(outcome: _Outcome, elapsed: float) -> str:
        if outcome.state == "finished":
            return "finished"
        if outcome.state == "raised":
            return "raised an exception"
        if outcome.state == "exited":
            code = "" if outcome.returncode is None else describe_returncode(outcome.returncode)
            return f"{code} {outcome.error}".strip() or "died"
        if _in_torch_distributed(outcome.stack):
            return f"still running after {elapsed:.1f} s, blocked in torch.distributed (waiting for a peer); killed"
        return f"still running after {elapsed:.1f} s; killed"


class RankPool:
    """Rank groups kept alive between tests, one per (world size, backend); a failed group is replaced."""

    def __init__(self, *, timeout_s: float = DEFAULT_RANK_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._groups: dict[tuple[int, Backend], RankGroup] = {}

    def group(self, world_size: int, backend: Backend) -> RankGroup:
        key = (world_size, backend)
        group = self._groups.get(key)
        if group is None or not group.alive:
            group = RankGroup(world_size, backend, timeout_s=self.timeout_s)
            self._groups[key] = group
        return group

    def run(self, fn: Callable[..., T], *args: Any, world_size: int, backend: Backend = "gloo",
            timeout_s: float | None = None) -> list[T]:
        """``fn(Rank(...), *args)`` on ``world_size`` ranks of ``backend``; per-rank results in rank order."""
        group = self.group(world_size, backend)
        return group.run(fn, *args, timeout_s=timeout_s)

    def close(self) -> None:
        for group in self._groups.values():
            group.close()
        self._groups.clear()
