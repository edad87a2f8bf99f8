"""Each side's own server for the serving suites: ``moeperf ab --serve PROFILE``.

Without it, every child session of a serving test starts its own vLLM server (minutes each on a GPU box: 107-116 s
on 1x H200), so ten pairs cost forty starts. With it, ``moeperf serve PROFILE`` is started once per side, before
the first block, under the side's interpreter, environment and checkout (the side's vLLM, flags and code), and every
child of that side attaches to it (``--moeperf-server-url``). The sides' windows then alternate on two servers that
stay up, as the issue asked ("each side its own server, alternating windows when both fit"). Both servers run at
once, so the profile must leave room for two (the tiny GPU profiles take 0.2 of the GPU each). Every child is
told both servers' processes (``--moeperf-server-pid``), so the health gate counts neither as foreign load: the
other side's idle server is part of the experiment, not a disturbance.

**Fresh starts, by default.** A server start is the unit of a serving measurement: two starts of one profile
differ (1x H200, vLLM 0.26: engine TPOT at c=1 2.03 and 2.32 ms in two consecutive starts, up to 14 % in another
pair of starts), and with one start a side that difference reads as the sides'. So both servers are stopped and
started afresh before every pair (`Servers.before`): each pair has its own two starts, and the difference between
starts becomes noise between pairs, which the paired interval then carries, at a server start a pair. Where two
servers of the profile fit on the box at once (`fit_twice`), both start at the same time (the start costs one
server's time, and both share the box's state of that moment); where they do not, each process gets a server of its
own side started just before it. ``--serve-reuse`` starts one server a side for the whole run (both must fit), and
its verdicts cover those two starts.

The servers are stopped at the end, also on Ctrl-C, SIGTERM or a failed side: SIGINT to ``moeperf serve``, which
stops its vLLM server, then whatever of its session is left gets SIGTERM and SIGKILL. Should ``moeperf ab`` be
killed, the parent-death signal (SIGINT) stops them.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pytest_moeperf.ab.sides import Side
from pytest_moeperf.processes.lifecycle import (
    describe_returncode,
    log_tail,
    start_in_session,
    terminate_sessions,
    wait_all,
)
from pytest_moeperf.processes.termination import die_with_parent

__all__ = ["ServerError", "Servers"]

#: how long ``moeperf serve`` is given to stop its vLLM server after SIGINT (its own grace is 20 s + 10 s)
STOP_GRACE_S = 45.0


class ServerError(RuntimeError):
    """A side's server did not become healthy (its log's tail in the message)."""


@dataclass
class SideServer:
    side: str
    proc: subprocess.Popen[bytes]
    url_file: Path
    log: Path
    url: str = ""


class Servers:
    """One ``moeperf serve PROFILE`` per side, started together, healthy or a `ServerError` naming the side."""

    def __init__(self, profile: str, sides: Mapping[str, Side], scratch: Path, echo: Callable[[str], None],
                 timeout_s: float = 900.0, *, fresh: bool = True, together: bool = True) -> None:
        self.profile = profile
        self.sides = sides
        self.scratch = scratch
        self.echo = echo
        self.timeout_s = timeout_s
        self.fresh = fresh  # a start a pair (together) or a process (apart); else one a side for the run
        self.together = together  # both servers fit on the box at once
        self.servers: dict[str, SideServer] = {}
        self.starts = 0  # how many times servers were started

    def __enter__(self) -> Servers:
        try:
            if self.together:
                self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        self.stop()

    def start(self, only: str | None = None) -> None:
        """Start the servers of every side (``only``: of that side), at the same time; wait until all are healthy."""
        started = time.monotonic()
        self.starts += 1
        n = f"-{self.starts}" if self.starts > 1 else ""
        for name, side in self.sides.items():
            if only is not None and name != only:
                continue
            url_file, log = self.scratch / f"serve-{name}{n}.url", self.scratch / f"serve-{name}{n}.log"
            argv = [side.python, "-m", "pytest_moeperf.cli", "serve", self.profile, "--url-file", str(url_file),
                    "--timeout", f"{self.timeout_s:g}", "--log-dir", str(self.scratch / f"server-logs-{name}{n}")]
            # SIGINT when moeperf ab dies (even by SIGKILL): moeperf serve then stops its vLLM server
            proc = start_in_session(argv, log=log, env=side.environ(), cwd=side.cwd, preexec_fn=die_with_parent())
            self.servers[name] = SideServer(name, proc, url_file, log)
            self.echo(f"moeperf ab: starting {name}'s server ({self.profile}), log {log}")
        deadline = started + self.timeout_s + 60.0
        for server in [s for name, s in self.servers.items() if only is None or name == only]:
            while not server.url:
                server.url = server.url_file.read_text().strip() if server.url_file.is_file() else ""
                if server.url:
                    break
                code = server.proc.poll()
                if code is not None:
                    raise ServerError(f"{server.side}'s server ({self.profile}) {describe_returncode(code)} before it "
                                    f"was healthy:\n{log_tail(server.log)}")
                if time.monotonic() > deadline:
                    raise ServerError(f"{server.side}'s server ({self.profile}) not healthy after "
                                    f"{time.monotonic() - started:.0f} s:\n{log_tail(server.log)}")
                time.sleep(0.5)
            self.echo(f"moeperf ab: {server.side}'s server at {server.url} ({time.monotonic() - started:.0f} s)")

    def args(self, side: str) -> list[str]:
        """The pytest arguments of ``side``'s children: its server's URL, and the running servers' processes."""
        pids = [a for s in self.servers.values() for a in ("--moeperf-server-pid", str(s.proc.pid))]
        return ["--moeperf-server-url", self.servers[side].url, *pids]

    def side_args(self) -> dict[str, list[str]]:
        return {name: self.args(name) for name in self.sides if name in self.servers}

    def before(self, side: str, opens_pair: bool, first_pair: bool) -> dict[str, list[str]]:
        """Before ``side``'s process (``opens_pair``: the first of its pair): fresh and together, both servers
        started afresh before every pair after the first (the first uses the first start); fresh and apart, a fresh
        server of ``side`` alone; reused, nothing. The sides' arguments."""
        if self.fresh and not self.together:
            self.stop()
            self.servers = {}
            self.start(only=side)
        elif self.fresh and opens_pair and not first_pair:
            self.stop()
            self.servers = {}
            self.start()
        return self.side_args()

    def stop(self) -> None:
        procs = [s.proc for s in self.servers.values()]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        wait_all(procs, STOP_GRACE_S)
        terminate_sessions(procs)


def fit_twice(profile: str, cwd: Path) -> bool | None:
    """Whether two servers of ``profile`` (as ``moeperf serve`` finds it from ``cwd``) fit on this box at once
    (None: the profile is not found here; its server decides)."""
    from pytest_moeperf.machine.probe import probe_nvml
    from pytest_moeperf.serving.lifecycle.pool import place
    from pytest_moeperf.serving.models.profiles import DEFAULT_DIR, ProfileError, load_profile_dirs

    try:
        found = load_profile_dirs([cwd / DEFAULT_DIR]).get(profile) if (cwd / DEFAULT_DIR).is_dir() else None
    except (OSError, ProfileError):
        return None
    if found is None:
        return None
    nvml = probe_nvml() if found.device == "cuda" else None
    gpus = len(nvml[0]) if nvml is not None else 0
    first = place(found, [], gpus)
    return first is not None and place(found, [first], gpus) is not None
