"""Samples for the health gate, taken at the start and the end of a measurement window.

The host sample (psutil) records every visible process's CPU time, whose process tree each belongs to, the
host's steal and busy time on the CPUs this process may run on, and the load average. The GPU sample (NVML,
``nvidia-ml-py``) records clock-event reasons, cumulative throttle (violation) counters, clocks, temperature,
the processes holding a compute context, uncorrected ECC errors and XID events. Both modules are imported
where they are used, so a base install never needs them. Judging the samples is `pytest_moeperf.health.gate`'s job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: A process across two samples: pid alone is reused, (pid, start time) is not.
ProcessId = tuple[int, float]


@dataclass(frozen=True)
class HostSample:
    """The host at one instant. CPU times are seconds; ``ours`` is the measured process tree."""

    monotonic: float
    wall: float
    cpu: dict[ProcessId, float]  # user + system + reaped children's, for every process we could read
    parent: dict[ProcessId, int]
    ours: frozenset[ProcessId]
    pids: frozenset[int]  # every pid seen, readable or not
    names: dict[ProcessId, str]
    steal_s: float  # summed over the CPUs in this process's affinity
    busy_s: float
    busy_all_s: float  # busy time of every CPU of the host
    cpus: int
    loadavg: tuple[float, float, float]


def process_tree(parents: dict[int, int], roots: Iterable[int]) -> set[int]:
    """The roots and all their descendants, from a pid → parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, ()))
    return seen


def _busy(times: Any) -> float:
    return float(times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0))


def sample_host(roots: Iterable[int]) -> HostSample:
    """One pass over the process table (processes that vanish or deny access are left out)."""
    import psutil  # optional: only the health gate needs it

    cpu: dict[ProcessId, float] = {}
    parent: dict[ProcessId, int] = {}
    names: dict[ProcessId, str] = {}
    by_pid: dict[int, ProcessId] = {}
    pids: set[int] = set()
    for proc in psutil.process_iter(["ppid", "create_time", "cpu_times", "name"]):
        pids.add(proc.pid)
        info = proc.info
        times, started, ppid = info.get("cpu_times"), info.get("create_time"), info.get("ppid")
        if times is None or started is None or ppid is None:
            continue  # AccessDenied, ZombieProcess or gone mid-read: psutil left the value out
        ident = (proc.pid, float(started))
        cpu[ident] = times.user + times.system + times.children_user + times.children_system
        parent[ident] = int(ppid)
        names[ident] = str(info.get("name") or "?")
        by_pid[proc.pid] = ident
    tree = process_tree({pid: parent[ident] for pid, ident in by_pid.items()}, roots)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    per_cpu = psutil.cpu_times(percpu=True)
    mine = [per_cpu[i] for i in affinity if i < len(per_cpu)] if affinity else list(per_cpu)
    steal = sum(getattr(t, "steal", 0.0) for t in mine)
    busy = sum(_busy(t) for t in mine)
    busy_all = sum(_busy(t) for t in per_cpu)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return HostSample(monotonic=time.monotonic(), wall=time.time(), cpu=cpu, parent=parent,
                      ours=frozenset(by_pid[p] for p in tree if p in by_pid), pids=frozenset(pids),
                      names=names, steal_s=steal, busy_s=busy, busy_all_s=busy_all,
                      cpus=len(mine), loadavg=(float(load[0]), float(load[1]), float(load[2])))


# --------------------------------------------------------------------------------------------- GPU (NVML)
#: Clock-event reason bits (nvmlClocksEventReason*; stable across NVML versions).
REASON_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
               0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
               0x80: "hw_power_brake", 0x100: "display_clocks", 0x200: "board_limit", 0x400: "reliability"}
#: Cumulative violation counters (nvmlDeviceGetViolationStatus policy types) kept per sample.
VIOLATION_POLICIES = {"power": 0, "thermal": 1, "board_limit": 3, "reliability": 5}


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant; a field NVML would not give is None."""

    index: int
    monotonic: float
    reasons: int | None = None
    violation_ns: dict[str, int] = field(default_factory=dict)
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    energy_mj: int | None = None  # the GPU's energy counter since the driver loaded (millijoules)
    compute_pids: tuple[int, ...] | None = None
    ecc_uncorrected: int | None = None
    xids: tuple[int, ...] = ()  # XID events seen since the previous sample


def _call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises NotSupported/NoPermission per field: that field stays unknown
        return None


class NvmlProbe:
    """NVML for the health gate: initialised on first use, an XID event set per session, shut down at the end.

    ``nvml`` is the ``pynvml`` module (tests pass a stand-in: there is no GPU on the box that runs them)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles: dict[int, Any] = {}
        self.events: Any = None
        nvml.nvmlInit()
        try:
            self.events = nvml.nvmlEventSetCreate()
        except Exception:  # noqa: BLE001 - XID events unsupported (e.g. in some containers): left unknown
            self.events = None

    @classmethod
    def open(cls) -> NvmlProbe | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            return cls(pynvml)
        except Exception:  # noqa: BLE001 - no driver: nothing to probe
            return None

    def handle(self, index: int) -> Any:
        if index not in self.handles:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            self.handles[index] = handle
            if self.events is not None:
                _call(self.nvml.nvmlDeviceRegisterEvents, handle, 0x8, self.events)  # XidCriticalError
        return self.handles[index]

    def _xids(self) -> dict[int, list[int]]:
        """XID events waiting in the set, by GPU index (the set is drained)."""
        found: dict[int, list[int]] = {}
        if self.events is None:
            return found
        for _ in range(64):
            data = _call(self.nvml.nvmlEventSetWait_v2, self.events, 0)
            if data is None:  # NVML raises Timeout when no event is waiting
                break
            for index, handle in self.handles.items():
                if data.device == handle:
                    found.setdefault(index, []).append(int(data.eventData))
        return found

    def sample(self, indices: Iterable[int]) -> list[GpuSample]:
        nvml = self.nvml
        handles = {i: _call(self.handle, i) for i in indices}
        xids = self._xids()
        samples = []
        for index, h in handles.items():
            if h is None:
                continue
            reasons = _call(nvml.nvmlDeviceGetCurrentClocksEventReasons, h) \
                if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons") else None
            if reasons is None:
                reasons = _call(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
            violation = {}
            for name, policy in VIOLATION_POLICIES.items():
                status = _call(nvml.nvmlDeviceGetViolationStatus, h, policy)
                if status is not None:
                    violation[name] = int(status.violationTime)
            procs = _call(nvml.nvmlDeviceGetComputeRunningProcesses, h)
            samples.append(GpuSample(
                index=index, monotonic=time.monotonic(), reasons=reasons, violation_ns=violation,
                sm_clock_mhz=_call(nvml.nvmlDeviceGetClockInfo, h, 1),  # NVML_CLOCK_SM
                sm_clock_max_mhz=_call(nvml.nvmlDeviceGetMaxClockInfo, h, 1),
                mem_clock_mhz=_call(nvml.nvmlDeviceGetClockInfo, h, 2),  # NVML_CLOCK_MEM
                mem_clock_max_mhz=_call(nvml.nvmlDeviceGetMaxClockInfo, h, 2),
                temperature_c=_call(nvml.nvmlDeviceGetTemperature, h, 0),  # NVML_TEMPERATURE_GPU
                energy_mj=_call(nvml.nvmlDeviceGetTotalEnergyConsumption, h),
                compute_pids=None if procs is None else tuple(int(p.pid) for p in procs),
                # uncorrected errors, volatile counter (since the driver loaded)
                ecc_uncorrected=_call(nvml.nvmlDeviceGetTotalEccErrors, h, 1, 0),
                xids=tuple(xids.get(index, ())),
            ))
        return samples

    def close(self) -> None:
        if self.events is not None:
            _call(self.nvml.nvmlEventSetFree, self.events)
        _call(self.nvml.nvmlShutdown)
