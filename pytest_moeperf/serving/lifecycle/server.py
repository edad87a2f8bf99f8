"""A vLLM OpenAI-compatible server: launched on a free loopback port in its own process group, or attached.

Launch waits on ``GET /health`` with a timeout and, on failure, raises with the tail of the server log. A
``/health`` answer counts only when the server's own process session holds the listening socket: a port taken
by another process before the server bound it raises :class:`PortTaken` (the pool starts again on a fresh port).
``stop()`` tears down the whole process group (SIGTERM, then SIGKILL). ``check_alive()`` is the liveness
check the load generator runs beside a measured window: a launched server that exited, or an attached one
that stopped answering ``/health``, raises :class:`ServerDied` at once with the log tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from pytest_moeperf.processes.lifecycle import leftover_processes
from pytest_moeperf.serving.lifecycle.ports import ADDRESS_IN_USE, free_port, session_listens

#: seconds between two looks at a starting server: a quarter second adds at most that to its time to healthy
HEALTH_POLL_S = 0.25

__all__ = ["HEALTH_POLL_S", "AttachedServer", "LaunchedServer", "PortTaken", "ServerDied", "ServerStartError",
           "free_port", "http_get"]


class ServerStartError(RuntimeError):
    """The server did not become healthy; the message carries the reason and the log tail."""


class PortTaken(ServerStartError):
    """Another process took the server's port before the server bound it: worth a start on another port."""


class ServerDied(RuntimeError):
    """The server went away while it was in use; the message carries the reason and the log tail."""


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET; status 0 and the error text when the server cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (loopback or user URL)
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), str(exc)
    except (urllib.error.URLError, OSError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"


class LaunchedServer:
    """A server process this session started and owns."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.argv = tuple(argv)
        self.port = port
        self.host = host
        self.log_path = log_path
        self.env = dict(env or {})
        self.base_url = f"http://{host}:{port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started = 0.0
        self.launched_at = 0.0  # epoch seconds of the launch: the server log's timestamps are wall-clock
        self._impostor = False  # another process answered /health on our port

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def describe(self) -> str:
        return f"vLLM server '{self.name}' (pid {self.pid}, {self.base_url}, log {self.log_path})"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,  # own process group: stop() reaches the engine workers too
        )
        self._started = time.monotonic()
        self.launched_at = time.time()

    def wait_healthy(self, timeout_s: float, poll_s: float = HEALTH_POLL_S) -> float:
        """Seconds from `start` until ``/health`` answered 200 from this server (its own session listens on the
        port); raises :class:`PortTaken` when another process had taken the port, :class:`ServerStartError`
        otherwise (and stops the server either way)."""
        while True:
            took = self.check_start(timeout_s)
            if took is not None:
                return took
            time.sleep(poll_s)

    def check_start(self, timeout_s: float) -> float | None:
        """One look at a starting server: seconds from `start` to now once ``/health`` answers 200 from it, None
        while it is still starting; raises as `wait_healthy` does when it exited or ran out of time."""
        rc = self.returncode()
        if rc is not None:
            self.stop()
            if self._lost_port():
                raise PortTaken(f"{self.describe()} exited with code {rc} while starting: port {self.port} was "
                                f"taken by another process before the server bound it ({ADDRESS_IN_USE})\n"
                                f"{self.log_tail()}")
            raise ServerStartError(f"{self.describe()} exited with code {rc} while starting\n{self.log_tail()}")
        status, _ = http_get(self.base_url + "/health", timeout_s=2.0)
        if status == 200 and self.pid is not None and session_listens(self.pid, self.port) is False:
            self._impostor, status = True, 0  # another process answers on our port: ours has not bound it
        took = time.monotonic() - self._started
        if status == 200:
            return took
        if took > timeout_s:
            self.stop()
            seen = f"another process answers on port {self.port}" if self._impostor else f"last /health status {status}"
            raise ServerStartError(f"{self.describe()} not healthy after {timeout_s:.0f} s ({seen})\n{self.log_tail()}")
        return None

    def _lost_port(self) -> bool:
        try:
            return ADDRESS_IN_USE in self.log_path.read_text(errors="replace")
        except OSError:
            return False

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def alive_or_raise(self) -> None:
        rc = self.returncode()
        if rc is not None:
            how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            raise ServerDied(f"{self.describe()} {how} while the test was using it\n{self.log_tail()}")

    async def check_alive(self) -> None:
        self.alive_or_raise()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(no server log: {exc})"
        tail = text.splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s``; idempotent."""
        proc = self._proc
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
                deadline = time.monotonic() + wait
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=wait)
                while leftover_processes([proc.pid]) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not leftover_processes([proc.pid]):  # zombies aside: nothing may reap them
                    break
        if self._log is not None:
            self._log.close()
            self._log = None


class AttachedServer:
    """A server somebody else runs (a production box): never started or stopped here."""

    def __init__(self, base_url: str, *, failures_to_die: int = 2) -> None:
        self.name = "attached"
        self.base_url = base_url.rstrip("/")
        self.pid: int | None = None
        self._failures_to_die = failures_to_die
        self._failures = 0

    def describe(self) -> str:
        return f"attached vLLM server at {self.base_url}"

    def wait_healthy(self, timeout_s: float, poll_s: float = 2.0) -> float:
        t0 = time.monotonic()
        while True:
            status, body = http_get(self.base_url + "/health", timeout_s=5.0)
            if status == 200:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise ServerStartError(f"{self.describe()}: /health not 200 after {timeout_s:.0f} s: {body}")
            time.sleep(poll_s)

    def alive_or_raise(self) -> None:
        status, body = http_get(self.base_url + "/health", timeout_s=5.0)
        if status == 200:
            self._failures = 0
            return
        self._failures += 1
        if self._failures >= self._failures_to_die:
            raise ServerDied(f"{self.describe()} stopped answering /health: {body}")

    async def check_alive(self) -> None:
        await asyncio.to_thread(self.alive_or_raise)

    def log_tail(self, lines: int = 40) -> str:
        return "(attached server: its log is on the server host)"

    def stop(self, grace_s: float = 0.0) -> None:
        """Attached servers are not ours to stop."""
