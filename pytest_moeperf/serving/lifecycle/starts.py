"""What goes with each server start the pool makes: its environment (compile caches, bytecode), and once it is
healthy, its phases from the log and its CPU placement.

:class:`StartKit` is the pool's: `env` gives a profile's server the caches of `caches` (and compiles vLLM's
bytecode on every CPU before the session's first start, when it is missing); `finish` reads the start's phases
(`startlog`) and pins the server's processes (`pinning`) as the profile's ``cpu_placement`` says
(`pytest_moeperf.serving.models.placement`). :class:`StartInfo` is what the start-up test records and names in its
context.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.machine.topology import Topology
from pytest_moeperf.serving.lifecycle import caches
from pytest_moeperf.serving.lifecycle.pinning import pin_server
from pytest_moeperf.serving.lifecycle.server import LaunchedServer
from pytest_moeperf.serving.lifecycle.startlog import StartLog, parse_start
from pytest_moeperf.serving.models.graphs import capture_sizes
from pytest_moeperf.serving.models.placement import (
    AUTO,
    MIN_AUTO_CPUS,
    OFF,
    CpuSets,
    cpus_of_mask,
    format_cpu_list,
    split_cpus,
)
from pytest_moeperf.serving.models.profiles import ServeProfile

__all__ = ["StartInfo", "StartKit", "core_of", "gpu_local_cpus"]

log = logging.getLogger("pytest_moeperf.serving")


@dataclass(frozen=True)
class StartInfo:
    """A launched start: the phases its log shows, where its processes run, where its caches and bytecode were."""

    log: StartLog = field(default_factory=StartLog)
    cpusets: CpuSets | None = None
    placement: str = OFF  # what the context says: "off", the CPU lists, or why none was applied
    bytecode: str = ""
    caches: str = ""
    graphs_asked: str = "vLLM's default"  # the capture sizes the profile asked for (`graphs`)

    def settings(self) -> dict[str, JSONScalar]:
        """What a window's figures depend on beside the workload, for its context: async scheduling as vLLM logged it,
        the captured CUDA-graph sizes (as logged, else as asked), the CPU placement."""
        facts = self.log.facts
        return {"async_scheduling": facts.get("async_scheduling"), "cpu_placement": self.placement,
                "cudagraph_capture_sizes": facts.get("cudagraph_capture_sizes", self.graphs_asked)}

    def context(self) -> dict[str, JSONScalar]:
        """The settings a start's (and its windows') figures depend on, for the test's context."""
        facts: dict[str, JSONScalar] = {"compile_cache": self.log.compile_cache, **self.log.facts,
                                        "cudagraph_sizes_asked": self.graphs_asked, "cpu_placement": self.placement}
        if self.bytecode:
            facts["bytecode"] = self.bytecode
        if self.caches:
            facts["compile_cache_dir"] = self.caches
        if self.log.missing:
            facts["phases_missing"] = "; ".join(f"{p}: {why}" for p, why in self.log.missing.items())
        return facts


def gpu_local_cpus(topology: Topology) -> dict[int, frozenset[int]]:
    """Each GPU's local CPUs as NVML reported them (for an automatic placement), where it did."""
    found = {}
    for gpu in () if topology.simulated else topology.gpus:
        with contextlib.suppress(ValueError):
            found[gpu.index] = cpus_of_mask(gpu.cpu_affinity) if gpu.cpu_affinity else frozenset()
    return {index: cpus for index, cpus in found.items() if cpus}


def core_of(cpu: int, sys_cpu: Path = Path("/sys/devices/system/cpu")) -> int:
    """The physical core of a CPU (its package and core id), so that hyperthreads stay together; the CPU itself
    when sysfs does not say."""
    try:
        topo = sys_cpu / f"cpu{cpu}" / "topology"
        return int((topo / "physical_package_id").read_text()) << 16 | int((topo / "core_id").read_text())
    except (OSError, ValueError):
        return cpu


class StartKit:
    """The pool's side of its starts (see the module's doc). ``cache_root``: the project's cache folder for vLLM's
    caches (None: vLLM's defaults); ``gpu_cpus``: each GPU's local CPUs (NVML's affinity), where known."""

    def __init__(self, cache_root: Path | None, gpu_cpus: Mapping[int, frozenset[int]] | None = None,
                 environ: Mapping[str, str] | None = None, cpus: int | None = None) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.root = None if cache_root is None else cache_root / caches.vllm_version()
        self.gpu_cpus = dict(gpu_cpus or {})
        self.allowed = frozenset(os.sched_getaffinity(0))  # before any window pins this process to the client's
        self.workers = cpus or len(self.allowed)
        self._bytecode: caches.Bytecode | None = None
        self.bytecode_note = ""

    def env(self, profile: ServeProfile) -> dict[str, str]:
        """The cache and bytecode variables of ``profile``'s server."""
        if self.root is None:
            return {}
        env = caches.cache_env(self.root, profile.env, self.environ)
        return {**env, **self.bytecode().env}

    def bytecode(self) -> caches.Bytecode:
        """The session's bytecode plan, decided (and vLLM compiled, when its bytecode is missing) once."""
        if self._bytecode is None:
            assert self.root is not None
            package = caches.vllm_package_dir()
            plan = caches.bytecode_plan(package, self.root / "pycache", self.environ)
            note = plan.note
            if package is not None and plan.marker is not None and not plan.marker.exists():
                took = caches.precompile(package, plan.env, self.workers)
                note += f"; compiled vLLM's bytecode on {self.workers} CPUs in {took:.1f} s before the first start"
                log.info("vLLM bytecode %s", note)
            self._bytecode, self.bytecode_note = plan, note
        return self._bytecode

    def cpusets(self, profile: ServeProfile, gpus: Sequence[int]) -> tuple[CpuSets | None, str]:
        """The profile's placement on this host and how the context names it."""
        setting = profile.cpu_placement
        if setting == OFF:
            return None, OFF
        if setting == AUTO:
            local = frozenset().union(*(self.gpu_cpus.get(g, frozenset()) for g in gpus))
            sets = split_cpus(self.allowed, local, {c: core_of(c) for c in self.allowed})
            if sets is None:
                return None, (f"auto: off ({len(self.allowed)} usable CPUs, {format_cpu_list(self.allowed)}; "
                              f"a placement needs {MIN_AUTO_CPUS})")
            return sets, f"auto: {sets.describe()}"
        assert not isinstance(setting, str)
        sets = CpuSets.from_lists(setting)
        outside = (sets.engine | sets.api | sets.client) - self.allowed
        if outside:
            return None, (f"off: profile {profile.name!r} cpu_placement names CPUs {format_cpu_list(outside)} "
                          f"outside this process's {format_cpu_list(self.allowed)}")
        return sets, sets.describe()

    def finish(self, server: LaunchedServer, healthy_s: float, profile: ServeProfile, gpus: Sequence[int]
               ) -> StartInfo:
        """Once ``server`` answered ``/health``: its phases, and its processes pinned where the profile says."""
        try:
            text = server.log_path.read_text(errors="replace")
        except OSError as exc:
            text = ""
            log.warning("cannot read %s for the start's phases: %s", server.log_path, exc)
        phases = parse_start(text, server.launched_at, healthy_s)
        sets, placement = self.cpusets(profile, gpus)
        if sets is not None and server.pid is not None:
            try:
                pinned = pin_server(server.pid, sets)
                placement = f"{placement} ({len(pinned.engine)} engine, {len(pinned.api)} API server processes)"
            except OSError as exc:
                sets, placement = None, f"off: pinning failed: {exc}"
        if placement not in (OFF,):
            log.info("%s: CPU placement %s", profile.name, placement)
        asked = capture_sizes(profile.cudagraph_batches, profile.speculative_tokens)
        return StartInfo(log=phases, cpusets=sets, placement=placement, bytecode=self.bytecode_note,
                         caches=self.cache_owner(profile),
                         graphs_asked=",".join(map(str, asked)) if asked else
                         "vLLM's default" if profile.device == "cuda" else "none")

    def cache_owner(self, profile: ServeProfile) -> str:
        """Whose ``VLLM_CACHE_ROOT`` the server used, for the context (not the path: it differs between hosts)."""
        if self.environ.get("VLLM_CACHE_ROOT"):
            return "the environment's VLLM_CACHE_ROOT"
        if "VLLM_CACHE_ROOT" in profile.env:
            return "the profile's VLLM_CACHE_ROOT"
        return "vLLM's default" if self.root is None else "the project's cache"
