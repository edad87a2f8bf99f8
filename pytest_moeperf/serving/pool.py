"""The servers of a session on one box: at most what fits runs at once.

A launched server occupies GPUs and a share of each one's memory (its ``--gpu-memory-utilization``); the shares
on one GPU may sum to at most :data:`GPU_SHARE_BUDGET`. On CPU at most :data:`CPU_SERVERS` run at once: a
reference and a candidate, so a speedup alternates windows on the same prompts instead of restarting servers
(a vLLM CPU server takes 100-180 s to start on 2 cores; an idle one takes no measurable CPU, and only one serves
at a time). Starting a profile that does not fit stops the least recently used servers
until it does (``CUDA_VISIBLE_DEVICES`` pins each server to the GPUs it was given). Attached servers (attach
mode) are somebody else's: never started, stopped or counted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from pytest_moeperf.ledger import HealthReport
from pytest_moeperf.serving.profiles import (
    KIMI_SHAPED,
    TARGETS,
    TINY_DRAFT,
    TINY_EAGLE3,
    TINY_MOE,
    ServeProfile,
    launch_blocker,
)
from pytest_moeperf.serving.served import Served, vocab_size_of
from pytest_moeperf.serving.server import (
    AttachedServer,
    LaunchedServer,
    PortTaken,
    ServerDied,
    ServerStartError,
    free_port,
)

__all__ = ["GPU_SHARE_BUDGET", "Placement", "ServerPool", "ServeSkip", "pin_gpus", "place"]

log = logging.getLogger("pytest_moeperf.serving")

#: The health gate's window judge: ``watch(gpus)`` yields a list that holds the window's report when it ends.
Watch = Callable[[Iterable[int]], AbstractContextManager[list[HealthReport]]]

GPU_SHARE_BUDGET = 0.9
PORT_ATTEMPTS = 3  # starts of one server on fresh ports when another process took the port first
CPU_SERVERS = 2  # each tiny-model server holds VLLM_CPU_KVCACHE_SPACE (1 GiB) of KV cache


class ServeSkip(Exception):
    """This host cannot launch the profile (the message says why): the test skips."""


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
        ports: Callable[[], int] = free_port,
    ) -> None:
        """``progress_sink``: where windows' progress lines go besides the log; ``watch(gpus)``: a context manager
        that judges the health of a window (the health gate's), used around each server's start-up; ``ports``:
        picks the loopback port of each start (a free one)."""
        self.profiles = profiles
        self.timeout_s = timeout_s
        self.gpu_count = gpu_count
        self.model_cache = model_cache
        self.log_dir = log_dir
        self.progress_sink = progress_sink
        self.watch = watch
        self.ports = ports
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
            fresh = Served(profile=profile, server=server, vocab_size=None, progress_sink=self.progress_sink)
        else:
            reason = launch_blocker(
                profile, gpu_count=self.gpu_count, vllm_importable=importlib.util.find_spec("vllm") is not None
            )
            if reason is not None:
                raise ServeSkip(reason)
            spot = self._make_room(profile, keep)
            try:
                fresh = self._launch(profile, spot)
            except ServerStartError as exc:
                self._broken[name] = f"serve profile {name!r}: {exc}"
                raise ServerStartError(self._broken[name]) from None
            self._placement[name] = spot
        self._served[name] = fresh
        return fresh

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
        from pytest_moeperf.serving.tinymodel import (
            ensure_tiny_eagle3,
            ensure_tiny_model,
            kimi_rank_shaped_spec,
            tiny_draft_spec,
        )

        if target in KIMI_SHAPED:
            return {target: str(ensure_tiny_model(self.model_cache, kimi_rank_shaped_spec(KIMI_SHAPED[target])))}
        return {
            TINY_MOE: str(ensure_tiny_model(self.model_cache)),
            TINY_DRAFT: str(ensure_tiny_model(self.model_cache, tiny_draft_spec())),
            TINY_EAGLE3: str(ensure_tiny_eagle3(self.model_cache)),
        }

    def launch(self, profile: ServeProfile) -> Served:
        """Start ``profile``'s server outside the pool's bookkeeping (``moeperf serve``); the caller stops it."""
        spot = place(profile, [], self.gpu_count)
        if spot is None:
            raise ServeSkip(f"profile {profile.name!r} needs {profile.gpus_needed} GPU(s), this box has "
                            f"{self.gpu_count}")
        return self._launch(profile, spot)

    def _launch(self, profile: ServeProfile, spot: Placement) -> Served:
        generated = self._generated(profile.model) if profile.model in TARGETS else {}
        if profile.model in TARGETS:
            model = generated[profile.model]
            vocab = vocab_size_of(Path(model))
        else:
            local = Path(profile.model)
            model, vocab = profile.model, vocab_size_of(local) if local.is_dir() else None
        env = dict(profile.env)
        if spot.gpus:
            env.update(pin_gpus(spot.gpus, os.environ.get("CUDA_VISIBLE_DEVICES")))
        log_path = self.log_dir / f"{profile.name}{_nth(len(self.starts.get(profile.name, [])))}.log"
        timeout = min(self.timeout_s, profile.startup_timeout_s or self.timeout_s)
        with self.watch(spot.gpus) if self.watch is not None else contextlib.nullcontext([]) as health:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                port = self.ports()
                server = LaunchedServer(profile.name, profile.argv(model, "127.0.0.1", port, generated), port=port,
                                        log_path=log_path, env=env)
                server.start()
                log.info("started %s on %s (health timeout %.0f s)", server.describe(), spot.gpus or "cpu", timeout)
                try:
                    startup = server.wait_healthy(timeout)  # stops the server itself when it fails
                    break
                except PortTaken as exc:
                    if attempt == PORT_ATTEMPTS:
                        raise
                    log.warning("%s; starting it again on another port", str(exc).splitlines()[0])
                except BaseException:
                    server.stop()  # interrupted while starting: leave nothing behind
                    raise
        unhealthy = tuple(r for report in health if not report.ok for r in report.reasons)
        self.starts.setdefault(profile.name, []).append(startup)
        log.info("%s healthy after %.1f s", server.describe(), startup)
        return Served(profile=profile, server=server, vocab_size=vocab, startup_s=startup,
                      startup_health=unhealthy, progress_sink=self.progress_sink)


def pin_gpus(gpus: Sequence[int], visible: str | None) -> dict[str, str]:
    """The environment that pins a server to ``gpus`` (NVML indices, PCI order; within an existing
    ``CUDA_VISIBLE_DEVICES`` list, its entries)."""
    listed = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    ids = [listed[g] if g < len(listed) else str(g) for g in gpus]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _nth(earlier_starts: int) -> str:
    return "" if earlier_starts == 0 else f".{earlier_starts + 1}"
