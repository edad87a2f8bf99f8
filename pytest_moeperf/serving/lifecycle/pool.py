"""The servers of a session on one box: at most what fits runs at once.

A launched server occupies GPUs and a share of each one's memory (its ``--gpu-memory-utilization``); the shares
on one GPU may sum to at most `fit.GPU_SHARE_BUDGET`. On CPU at most `fit.CPU_SERVERS` run at once: a
reference and a candidate, so a speedup alternates windows on the same prompts instead of restarting servers
(a vLLM CPU server takes 100-180 s to start on 2 cores; an idle one takes no measurable CPU). A profile that does
not fit stops the least recently used servers until it does (``CUDA_VISIBLE_DEVICES`` pins each to its GPUs).
Attached servers are somebody else's: never started, stopped or counted; their processes here (from the port, or
``--moeperf-server-pid``) are the health gate's (``adopt``).

What fits and which starts run at once: `fit`. Each server's ``startup_s`` is timed from its own launch; what
else goes with a start (its phases, caches, CPU placement) is `starts`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from pytest_moeperf.ledger import HealthReport
from pytest_moeperf.serving.lifecycle.fit import (
    GPU_SHARE_BUDGET,
    Placement,
    companions,
    fixes_kv_cache,
    parallel_starts,
    place,
)
from pytest_moeperf.serving.lifecycle.served import Served, vocab_size_of
from pytest_moeperf.serving.lifecycle.server import (
    HEALTH_POLL_S,
    AttachedServer,
    LaunchedServer,
    PortTaken,
    ServerDied,
    ServerStartError,
    free_port,
)
from pytest_moeperf.serving.lifecycle.starts import StartKit
from pytest_moeperf.serving.models.profiles import TARGETS, ServeProfile, launch_blocker

__all__ = ["GPU_SHARE_BUDGET", "Placement", "ServerPool", "ServeSkip", "companions", "fixes_kv_cache",
           "parallel_starts", "pin_gpus", "place"]

log = logging.getLogger("pytest_moeperf.serving")

#: The health gate's window judge: ``watch(gpus)`` yields a list that holds the window's report when it ends.
Watch = Callable[[Iterable[int]], AbstractContextManager[list[HealthReport]]]

Adopt = Callable[[Iterable[int]], None]
PORT_ATTEMPTS = 3  # starts of one server on fresh ports when another process took the port first


class ServeSkip(Exception):
    """This host cannot launch the profile (the message says why): the test skips."""


class ServerPool:
    """Servers by profile name, launched on demand within what the box holds, reused until they must make room."""

    def __init__(
        self,
        profiles: Mapping[str, ServeProfile],
        *,
        timeout_s: float,
        gpu_count: int,
        model_cache: Path,
        log_dir: Path,
        progress_sink: Callable[[str], None] | None = None,
        watch: Watch | None = None,
        wanted: Sequence[str] = (),
        parallel: int = 1,
        adopt: Adopt | None = None,
        server_pids: Sequence[int] = (),
        ports: Callable[[], int] = free_port,
        compile_cache: Path | None = None,
        gpu_cpus: Mapping[int, frozenset[int]] | None = None,
    ) -> None:
        """``progress_sink``: where windows' progress lines go besides the log; ``watch(gpus)``: a context manager
        that judges the health of a window (the health gate's), used around each server's start-up; ``wanted``:
        the profiles the session's tests use, in order, and ``parallel``: how many may start at once;
        ``adopt(pids)``: the health gate's, for an attached server's processes (and ``server_pids``, named);
        ``ports``: picks each start's loopback port; ``compile_cache``: where vLLM's compile caches and bytecode are
        kept between starts (`starts.StartKit`; None: vLLM's defaults); ``gpu_cpus``: each GPU's local CPUs."""
        self.profiles = profiles
        self.timeout_s = timeout_s
        self.gpu_count = gpu_count
        self.model_cache = model_cache
        self.log_dir = log_dir
        self.progress_sink = progress_sink
        self.watch = watch
        self.wanted = tuple(dict.fromkeys(wanted))
        self.parallel = max(1, parallel)
        self.adopt = adopt
        self.server_pids = tuple(server_pids)
        self.ports = ports
        self.kit = StartKit(compile_cache, gpu_cpus)
        self.starts: dict[str, list[float]] = {}  # seconds to healthy of every start, per profile
        self._served: dict[str, Served] = {}  # insertion order = least recently used first
        self._placement: dict[str, Placement] = {}
        self._broken: dict[str, str] = {}

    def fits_together(self, *names: str) -> bool:
        """Whether these profiles' servers can all run at once on this box (attached ones always can)."""
        placed: list[Placement] = []
        for name in names:
            profile = self.profiles[name]
            if profile.attached_url is not None:
                continue
            spot = place(profile, placed, self.gpu_count)
            if spot is None:
                return False
            placed.append(spot)
        return True

    def running(self) -> list[str]:
        return list(self._served)

    def get(self, name: str, *, keep: Sequence[str] = ()) -> Served:
        """The profile's server, started if need be (stopping others, least recently used first, but never those
        in ``keep``). Raises :class:`ServeSkip` when the host cannot launch it, ``ServerStartError`` when the
        start failed (then and for every later call) and ``ServerDied`` when it died since."""
        profile = self.profiles.get(name)
        if profile is None:
            raise KeyError(f"no serve profile {name!r}; known: {sorted(self.profiles)}")
        if name in self._broken:
            raise ServerStartError(self._broken[name])
        served = self._served.pop(name, None)
        if served is not None:
            self._served[name] = served  # most recently used now
            try:
                served.server.alive_or_raise()
            except ServerDied as exc:
                self._broken[name] = f"serve profile {name!r}: {exc}"
                raise
            return served
        if profile.attached_url is not None:
            server = AttachedServer(profile.attached_url)
            server.wait_healthy(min(self.timeout_s, 60.0))
            self._served[name] = fresh = Served(profile=profile, server=server, vocab_size=None,
                                                progress_sink=self.progress_sink,
                                                server_pids=self._adopt_attached(profile.attached_url),
                                                first_seed=1 + secrets.randbelow(1 << 30))
            return fresh
        reason = self._blocker(profile)
        if reason is not None:
            raise ServeSkip(reason)
        group = [(profile, self._make_room(profile, keep))]
        group += self._companions(group)
        started = self._launch_group(group)
        if name not in started:
            raise ServerStartError(self._broken[name])
        return started[name]

    def _blocker(self, profile: ServeProfile) -> str | None:
        return launch_blocker(profile, gpu_count=self.gpu_count,
                              vllm_importable=importlib.util.find_spec("vllm") is not None)

    def _companions(self, group: list[tuple[ServeProfile, Placement]]) -> list[tuple[ServeProfile, Placement]]:
        candidates = [self.profiles[n] for n in self.wanted if n in self.profiles and n not in self._served
                      and n not in self._broken and self._blocker(self.profiles[n]) is None]
        return companions(group[0], candidates, list(self._placement.values()), self.gpu_count, self.parallel)

    def _adopt_attached(self, url: str) -> tuple[int, ...]:
        """The attached server's processes on this host (and those named), handed to the health gate as ours."""
        pids: tuple[int, ...] = ()
        if importlib.util.find_spec("psutil") is not None:
            from pytest_moeperf.serving.lifecycle.attach import listening_pids

            pids, note = listening_pids(url)
            log.info("attached server at %s: %s%s", url, note, f" (pids {list(pids)})" if pids else "")
        pids = tuple(dict.fromkeys((*pids, *self.server_pids)))
        if self.adopt is not None and pids:
            self.adopt(pids)
        return pids

    def stop(self, name: str) -> None:
        served = self._served.pop(name, None)
        self._placement.pop(name, None)
        if served is not None:
            log.info("stopping %s", served.server.describe())
            served.server.stop()

    def close(self) -> None:
        for name in reversed(list(self._served)):
            self.stop(name)

    def _make_room(self, profile: ServeProfile, keep: Sequence[str]) -> Placement:
        while True:
            spot = place(profile, list(self._placement.values()), self.gpu_count)
            if spot is not None:
                return spot
            victims = [n for n in self._served if n in self._placement and n not in keep]
            if not victims:
                raise ServeSkip(
                    f"profile {profile.name!r} does not fit beside {sorted(keep)} on this box "
                    f"({self.gpu_count} GPU(s), share budget {GPU_SHARE_BUDGET} per GPU)"
                )
            log.info("stopping %s to make room for %s", victims[0], profile.name)
            self.stop(victims[0])

    def _generated(self, target: str) -> dict[str, str]:
        from pytest_moeperf.serving.models.generated import generated_dirs

        return generated_dirs(self.model_cache, target)

    def launch(self, profile: ServeProfile) -> Served:
        """Start ``profile``'s server outside the pool's bookkeeping (``moeperf serve``); the caller stops it."""
        spot = place(profile, [], self.gpu_count)
        if spot is None:
            raise ServeSkip(f"profile {profile.name!r} needs {profile.gpus_needed} GPU(s), this box has "
                            f"{self.gpu_count}")
        return self._launch(profile, spot)

    def _launch(self, profile: ServeProfile, spot: Placement) -> Served:
        with self.watch(spot.gpus) if self.watch is not None else contextlib.nullcontext([]) as health:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                server, vocab = self._prepare(profile, spot)
                server.start()
                log.info("started %s on %s", server.describe(), spot.gpus or "cpu")
                try:
                    startup = server.wait_healthy(self._timeout(profile))  # stops the server itself when it fails
                    break
                except PortTaken as exc:
                    if attempt == PORT_ATTEMPTS:
                        raise
                    log.warning("%s; starting it again on another port", str(exc).splitlines()[0])
                except BaseException:
                    server.stop()  # interrupted while starting: leave nothing behind
                    raise
        return self._started(profile, server, vocab, startup, health, 1, spot)

    def _launch_group(self, group: Sequence[tuple[ServeProfile, Placement]]) -> dict[str, Served]:
        """Start every profile of ``group`` at once, wait for all; a start that failed is remembered (`_broken`)."""
        prepared = {profile.name: self._prepare(profile, spot) for profile, spot in group}
        servers = {name: server for name, (server, _) in prepared.items()}
        placed = {profile.name: spot for profile, spot in group}
        gpus = sorted({g for _, spot in group for g in spot.gpus})
        took: dict[str, float] = {}
        with self.watch(gpus) if self.watch is not None else contextlib.nullcontext([]) as health:
            try:
                for i, server in enumerate(servers.values(), 1):
                    server.start()
                    log.info("started %s (%d of %d starting together)", server.describe(), i, len(servers))
                pending = dict(servers)
                attempts = dict.fromkeys(servers, 1)
                while pending:
                    for name, server in list(pending.items()):
                        try:
                            seconds = server.check_start(self._timeout(self.profiles[name]))
                        except PortTaken as exc:
                            if attempts[name] < PORT_ATTEMPTS:  # another process took its port: a fresh one
                                log.warning("%s; starting it again on another port", str(exc).splitlines()[0])
                                attempts[name] += 1
                                servers[name] = pending[name] = self._prepare(self.profiles[name], placed[name])[0]
                                pending[name].start()
                                continue
                            self._broken[name] = f"serve profile {name!r}: {exc}"
                            del pending[name]
                            continue
                        except ServerStartError as exc:
                            self._broken[name] = f"serve profile {name!r}: {exc}"
                            del pending[name]
                            continue
                        if seconds is not None:
                            took[name] = seconds
                            del pending[name]
                    if pending:
                        time.sleep(HEALTH_POLL_S)
            except BaseException:
                for server in servers.values():
                    server.stop()  # interrupted while starting: leave nothing behind
                raise
        started = {}
        for name, seconds in took.items():
            profile = self.profiles[name]
            started[name] = self._served[name] = self._started(profile, servers[name], prepared[name][1], seconds,
                                                               health, len(servers), placed[name])
            self._placement[name] = placed[name]
        return started

    def _timeout(self, profile: ServeProfile) -> float:
        return min(self.timeout_s, profile.startup_timeout_s or self.timeout_s)

    def _prepare(self, profile: ServeProfile, spot: Placement) -> tuple[LaunchedServer, int | None]:
        """The server to launch for ``profile`` at ``spot`` (its generated models written first), and the model's
        vocabulary size where a local config says it."""
        generated = self._generated(profile.model) if profile.model in TARGETS else {}
        model = generated[profile.model] if profile.model in TARGETS else profile.model
        vocab = vocab_size_of(Path(model)) if Path(model).is_dir() else None
        port = self.ports()
        env = {**self.kit.env(profile), **profile.env}
        if spot.gpus:
            env.update(pin_gpus(spot.gpus, os.environ.get("CUDA_VISIBLE_DEVICES")))
        server = LaunchedServer(
            profile.name,
            profile.argv(model, "127.0.0.1", port, generated),
            port=port,
            log_path=self.log_dir / f"{profile.name}{_nth(len(self.starts.get(profile.name, [])))}.log",
            env=env,
        )
        return server, vocab

    def _started(self, profile: ServeProfile, server: LaunchedServer, vocab: int | None, startup: float,
                 health: Sequence[HealthReport], together: int, spot: Placement) -> Served:
        unhealthy = tuple(r for report in health if not report.ok for r in report.reasons)
        self.starts.setdefault(profile.name, []).append(startup)
        log.info("%s healthy after %.1f s", server.describe(), startup)
        return Served(profile=profile, server=server, vocab_size=vocab, startup_s=startup, startup_health=unhealthy,
                      progress_sink=self.progress_sink, started_together=together,
                      start=self.kit.finish(server, startup, profile, spot.gpus))


def pin_gpus(gpus: Sequence[int], visible: str | None) -> dict[str, str]:
    """The environment that pins a server to ``gpus`` (NVML indices, PCI order; within an existing
    ``CUDA_VISIBLE_DEVICES`` list, its entries)."""
    listed = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    ids = [listed[g] if g < len(listed) else str(g) for g in gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _nth(earlier_starts: int) -> str:
    return "" if earlier_starts == 0 else f".{earlier_starts + 1}"
