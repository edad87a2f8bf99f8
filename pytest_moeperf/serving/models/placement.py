"""Where a launched server's processes and the load generator run on the host's CPUs (a profile's ``cpu_placement``).

A tiny model's decode step on a GPU is host work (scheduler, launches, sampling, the API server's streaming), so
the engine, the API server and the load generator compete for cores, and where the kernel puts them differs from
one start to the next. A placement gives each its own CPUs: ``engine`` (vLLM's engine core and everything it
starts: workers, compile workers), ``api`` (the API server and the rest of its processes) and ``client`` (the
pytest process while it measures a window). A profile says ``"off"`` (the default: nothing is pinned), ``"auto"``
(:func:`split_cpus` of the CPUs this process may use, the GPU's own CPUs first for the engine) or the three CPU lists
(``{"engine": "0-7", "api": "8-11", "client": "12-15"}``, ``numactl``/``taskset -c`` syntax). Pure: the pinning
itself is `pytest_moeperf.serving.lifecycle.pinning`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["AUTO", "MIN_AUTO_CPUS", "OFF", "ROLES", "CpuSets", "cpus_of_mask", "format_cpu_list", "parse_cpu_list",
           "split_cpus"]

OFF = "off"
AUTO = "auto"
ROLES = ("engine", "api", "client")
#: fewer usable CPUs than this and "auto" places nothing: on the 2-core CI box every role would share a core
MIN_AUTO_CPUS = 4


@dataclass(frozen=True)
class CpuSets:
    """The CPUs of each role (disjoint in an automatic split; a profile's explicit lists may overlap)."""

    engine: frozenset[int]
    api: frozenset[int]
    client: frozenset[int]

    def describe(self) -> str:
        """``engine 0-7, api 8-11, client 12-15``: the context's ``cpu_placement``."""
        return ", ".join(f"{role} {format_cpu_list(getattr(self, role))}" for role in ROLES)

    @classmethod
    def from_lists(cls, lists: Mapping[str, str]) -> CpuSets:
        return cls(**{role: frozenset(parse_cpu_list(lists[role])) for role in ROLES})


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> (0, 1, 2, 3, 8, 10, 11); raises ValueError naming the bad part."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"CPU list {text!r}: {part!r} is not a CPU number or range (e.g. '0-3,8')")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ValueError(f"CPU list {text!r}: range {part!r} is descending")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> ``"0-3,8"``."""
    ordered = sorted(set(cpus))
    runs: list[list[int]] = []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def cpus_of_mask(mask: str) -> frozenset[int]:
    """The CPUs of a hex affinity mask as NVML reports a GPU's (``"0xffff"`` -> 0-15); raises ValueError."""
    value = int(mask, 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def split_cpus(allowed: Iterable[int], gpu_local: Iterable[int] = (), siblings: Mapping[int, int] | None = None
               ) -> CpuSets | None:
    """An automatic placement over the ``allowed`` CPUs: half for the engine (the GPU's local CPUs first, when
    known), a quarter each for the API server and the client; None with fewer than `MIN_AUTO_CPUS`. ``siblings``
    maps a CPU to its physical core: the hyperthreads of one core stay in one role."""
    cpus = sorted(set(allowed))
    if len(cpus) < MIN_AUTO_CPUS:
        return None
    local = set(gpu_local) & set(cpus)
    core = dict(siblings or {})
    cores: dict[int, list[int]] = {}
    for cpu in cpus:
        cores.setdefault(core.get(cpu, cpu), []).append(cpu)
    # the GPU's own cores first (for the engine), in CPU order within each kind
    groups = sorted(cores.values(), key=lambda g: (not (set(g) & local), g[0]))
    if len(groups) < len(ROLES):
        return None
    engine_n = max(1, len(groups) // 2)
    api_n = max(1, (len(groups) - engine_n) // 2)
    take = [groups[:engine_n], groups[engine_n:engine_n + api_n], groups[engine_n + api_n:]]
    engine, api, client = (frozenset(c for g in part for c in g) for part in take)
    return CpuSets(engine=engine, api=api, client=client)
