"""The health gate: was the host (and the GPU) quiet while a test measured?

Around the call of every test that uses the ``perf`` fixture, the gate samples the host and the test's GPUs
(`pytest_moeperf.health.probes`) in each round of its call (the call and each confirmation re-run) and keeps a
`HealthReport` per round in ``item.stash[health_key]``; the ledger records it with the round, and a round whose
report is not ok cannot decide a verdict or be written to the baselines.

What trips the gate (each limit an option with an ini twin):

- **host**: CPU time used by processes outside the measured process tree, as cores busy over the window
  (``--moeperf-health-foreign-cores``); steal time, as a percentage of the window on our CPUs
  (``--moeperf-health-steal``). The tree is the pytest process and its descendants (a launched vLLM server,
  rank workers); under xdist with one GPU per worker, the whole session (controller and workers), since the
  other workers measure on other GPUs; and the trees of the processes adopted with `HealthGate.adopt` (an
  attached server's, so that the server under test is not foreign load). CPU accounting ticks at 10 ms, so a
  window shorter than `MIN_JUDGED_WINDOW_S` is recorded but not judged on the host. The load average is
  recorded, not judged: it counts the test's own threads.
- **GPU** (when NVML sees one): a clocks-event reason that slows the clocks for a reason other than the load
  itself (HW slowdown, HW or SW thermal slowdown, HW power brake) at either end of the window; the cumulative
  thermal-violation counter moving during the window; an uncorrected ECC error or an XID event; a compute
  process on the GPU that is visible here and not ours. The SW power cap is *not* a failure: a GPU under full
  load sits at its power limit by design, and the baselines were measured the same way (the share of the
  window spent power-capped is a fact). Clocks and temperature at the window's end are facts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_moeperf.health.probes import REASON_BITS, GpuSample, HostSample, NvmlProbe, ProcessId, sample_host
from pytest_moeperf.ledger import HealthReport, JSONScalar

#: Shorter windows are not judged on host CPU time (per-process times tick at 10 ms).
MIN_JUDGED_WINDOW_S = 0.2
#: Foreign CPU seconds a window always allows on top of its limit: a daemon's wake-up of a few ticks is 0.05
#: cores of a 1-s window (seen: 0.054 and 0.066 in quiet 1-s windows) and nothing of a 10-s one.
FOREIGN_SLACK_S = 0.05
#: Clock-event reasons that mean the clocks were held down by something other than the load.
BAD_REASONS = 0x8 | 0x20 | 0x40 | 0x80


#: The automatic foreign-CPU limit: this share of the CPUs we may use, and never below `MIN_FOREIGN_CORES`.
AUTO_FOREIGN_SHARE = 0.035
MIN_FOREIGN_CORES = 0.07


def auto_foreign_cores(cpus: int) -> float:
    """The default foreign-CPU limit for a process that may use ``cpus`` CPUs (0.07 on 2 CPUs, 0.56 on 16).

    Measured on a 2-core VM: quiet windows show at most 0.035 foreign cores (114 windows of two CI runs). Under two
    busy loops, serving windows showed only 0.1-0.27: our own tree (client, API server, engine) keeps both cores
    busy and the scheduler lets the loops run little, yet TTFT was 10-20x slower. A fixed 0.5 let those windows
    pass; twice the quiet maximum separates them. (Run-queue wait would show the loops' demand, but beside a tree
    that saturates the cores the kernel's own threads wait as long: 0.4-1.6 cores of wait in quiet windows.)"""
    return max(MIN_FOREIGN_CORES, AUTO_FOREIGN_SHARE * max(cpus, 1))


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class HealthLimits:
    foreign_cores: float = MIN_FOREIGN_CORES
    steal_pct: float = 10.0

    @classmethod
    def resolve(cls, foreign_cores: float | None, steal_pct: float, cpus: int | None = None) -> HealthLimits:
        """The limits of a session; ``foreign_cores`` None means auto (`auto_foreign_cores`)."""
        if foreign_cores is None:
            foreign_cores = auto_foreign_cores(usable_cpus() if cpus is None else cpus)
        return cls(foreign_cores, steal_pct)


# --------------------------------------------------------------------------------------------- host
def foreign_cpu(start: HostSample, end: HostSample) -> dict[ProcessId, float]:
    """CPU seconds each process outside our tree used between two samples.

    A process's time includes its reaped children's, so short-lived processes count once their parent reaps
    them. A process that exited in between is taken off its parent's figure where the parent is still there (its
    time moved into the parent's children total); one whose time is lost is left out rather than subtracted.
    """
    ours = start.ours | end.ours
    used: dict[ProcessId, float] = {}
    for ident, seconds in end.cpu.items():
        if ident in ours:
            continue
        before = start.cpu.get(ident)
        if before is not None:
            used[ident] = max(0.0, seconds - before)
        elif ident[1] >= start.wall - 1.0:  # born during the window; one unreadable at start is skipped
            used[ident] = seconds
    alive = {ident[0]: ident for ident in end.cpu}
    started = {ident[0]: ident for ident in start.cpu}
    for ident, seconds in start.cpu.items():
        if ident in ours or ident in end.cpu:
            continue
        # its time moved into the children total of the nearest ancestor still there (reaped up the chain)
        pid, hops = start.parent.get(ident, -1), 0
        while pid not in alive and pid in started and hops < 64:
            pid, hops = start.parent.get(started[pid], -1), hops + 1
        heir = alive.get(pid)
        if heir is not None and heir in used:
            used[heir] = max(0.0, used[heir] - seconds)
    return used


def judge_host(start: HostSample, end: HostSample, limits: HealthLimits) -> tuple[list[str], dict[str, JSONScalar]]:
    window = max(end.monotonic - start.monotonic, 1e-9)
    used = foreign_cpu(start, end)
    # no more than the whole host was busy (a lifetime reaped into a process we cannot tell apart stays bounded)
    foreign = min(sum(used.values()), max(0.0, end.busy_all_s - start.busy_all_s)) / window
    steal = max(0.0, end.steal_s - start.steal_s) / (window * max(end.cpus, 1)) * 100.0
    facts: dict[str, JSONScalar] = {
        "health_window_s": round(window, 4), "foreign_cores": round(foreign, 3),
        "host_busy_cores": round(max(0.0, end.busy_s - start.busy_s) / window, 3),
        "steal_pct": round(steal, 2), "loadavg_1m": round(end.loadavg[0], 2),
        "host_judged": window >= MIN_JUDGED_WINDOW_S,
    }
    reasons: list[str] = []
    if window < MIN_JUDGED_WINDOW_S:
        return reasons, facts
    allowed = limits.foreign_cores + FOREIGN_SLACK_S / window
    facts["foreign_cores_allowed"] = round(allowed, 3)
    if foreign > allowed:
        top = sorted(used.items(), key=lambda kv: -kv[1])[:3]
        busiest = ", ".join(f"{end.names.get(i, '?')} pid {i[0]} {s / window:.2f}" for i, s in top if s > 0)
        reasons.append(f"host: {foreign:.2f} foreign cores busy during the window "
                       f"(limit {limits.foreign_cores:g} + {FOREIGN_SLACK_S:g} s over {window:.1f} s; "
                       f"busiest: {busiest})")
    if steal > limits.steal_pct:
        reasons.append(f"host: {steal:.0f} % of the window stolen by the hypervisor (limit {limits.steal_pct:g} %)")
    return reasons, facts


# --------------------------------------------------------------------------------------------- GPU
def reason_names(bits: int) -> list[str]:
    return [name for bit, name in sorted(REASON_BITS.items()) if bits & bit]


def judge_gpus(start: Sequence[GpuSample], end: Sequence[GpuSample], ours: set[int], visible: set[int]
               ) -> tuple[list[str], dict[str, JSONScalar]]:
    """Reasons and facts for each GPU sampled at both ends. ``ours``: pids of the measured tree; ``visible``:
    every pid this process can see (a pid NVML reports from another PID namespace cannot be told apart)."""
    reasons: list[str] = []
    facts: dict[str, JSONScalar] = {}
    before = {s.index: s for s in start}
    for after in end:
        first = before.get(after.index)
        if first is None:
            continue
        gpu = f"gpu{after.index}"
        window_ns = max((after.monotonic - first.monotonic) * 1e9, 1.0)
        bits = (first.reasons or 0) | (after.reasons or 0)
        if first.reasons is not None or after.reasons is not None:
            facts[f"{gpu}_clock_events"] = "+".join(reason_names(bits)) or "none"
        bad = reason_names(bits & BAD_REASONS)
        if bad:
            reasons.append(f"{gpu}: clocks held down by {', '.join(bad)} during the window")
        deltas = {k: after.violation_ns[k] - first.violation_ns[k]
                  for k in after.violation_ns.keys() & first.violation_ns.keys()}
        if "power" in deltas:
            facts[f"{gpu}_power_capped_pct"] = round(100.0 * max(0, deltas["power"]) / window_ns, 1)
        if first.energy_mj is not None and after.energy_mj is not None and after.energy_mj >= first.energy_mj:
            # the window's mean power draw: with its clocks and temperature, what a first-token drift is read against
            facts[f"{gpu}_power_w"] = round((after.energy_mj - first.energy_mj) * 1e6 / window_ns, 1)
        if first.temperature_c is not None:
            facts[f"{gpu}_temperature_start_c"] = int(first.temperature_c)
        if deltas.get("thermal", 0) > 0:
            facts[f"{gpu}_thermal_ms"] = round(deltas["thermal"] / 1e6, 1)
            reasons.append(f"{gpu}: thermal limit held the clocks down for {deltas['thermal'] / 1e6:.0f} ms "
                           "of the window")
        for name, value in (("sm_clock_mhz", after.sm_clock_mhz), ("sm_clock_max_mhz", after.sm_clock_max_mhz),
                            ("mem_clock_mhz", after.mem_clock_mhz), ("mem_clock_max_mhz", after.mem_clock_max_mhz),
                            ("temperature_c", after.temperature_c)):
            if value is not None:
                facts[f"{gpu}_{name}"] = int(value)
        if first.ecc_uncorrected is not None and after.ecc_uncorrected is not None \
                and after.ecc_uncorrected > first.ecc_uncorrected:
            reasons.append(f"{gpu}: {after.ecc_uncorrected - first.ecc_uncorrected} uncorrected ECC error(s) "
                           "during the window")
        if after.xids:
            reasons.append(f"{gpu}: XID event(s) {', '.join(map(str, after.xids))} during the window")
        pids = set(first.compute_pids or ()) | set(after.compute_pids or ())
        others = sorted(p for p in pids if p in visible and p not in ours)
        unresolved = sorted(p for p in pids if p not in visible)
        if unresolved:
            facts[f"{gpu}_unresolved_pids"] = len(unresolved)
        if others:
            reasons.append(f"{gpu}: other compute process(es) on the GPU: pid {', '.join(map(str, others))}")
    return reasons, facts


# --------------------------------------------------------------------------------------------- the gate
class HealthGate:
    """The plugin object: samples around each ``perf`` test's call and stores the `HealthReport`."""

    def __init__(self, limits: HealthLimits, roots: Sequence[int], gpu_indices: Any) -> None:
        """``gpu_indices(item)`` names the NVML indices a test measures on (empty: none)."""
        self.limits = limits
        self.roots = tuple(roots)
        self.gpu_indices = gpu_indices
        self.nvml: NvmlProbe | None = None
        self.nvml_tried = False

    def adopt(self, pids: Iterable[int]) -> None:
        """Count these processes and their descendants as ours from the next window on (e.g. an attached server's,
        found by the serving wing): their CPU time is not foreign, their GPU compute contexts are not other
        processes."""
        self.roots = tuple(dict.fromkeys((*self.roots, *pids)))

    def _probe(self) -> NvmlProbe | None:
        if not self.nvml_tried:
            self.nvml_tried = True
            self.nvml = NvmlProbe.open()
        return self.nvml

    def _gpu_samples(self, indices: Iterable[int]) -> list[GpuSample]:
        indices = list(indices)
        probe = self._probe() if indices else None
        return probe.sample(indices) if probe is not None else []

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        """Each round of a ``perf`` test (its call, each confirmation re-run) is one window: its report is kept
        under the round's index."""
        from pytest_moeperf.runtime import health_key, perf_key

        perf = pyfuncitem.stash.get(perf_key, None)
        if perf is None:
            return (yield)
        index = len(perf.rounds) - 1
        indices: tuple[int, ...] = tuple(self.gpu_indices(pyfuncitem))
        host_start = sample_host(self.roots)
        gpu_start = self._gpu_samples(indices)
        try:
            return (yield)
        finally:
            gpu_end = self._gpu_samples(indices)
            host_end = sample_host(self.roots)
            reports = pyfuncitem.stash.setdefault(health_key, {})
            reports[index] = self.judge(host_start, host_end, gpu_start, gpu_end)

    def judge(self, host_start: HostSample, host_end: HostSample, gpu_start: Sequence[GpuSample],
              gpu_end: Sequence[GpuSample]) -> HealthReport:
        reasons, facts = judge_host(host_start, host_end, self.limits)
        ours = {pid for pid, _ in host_end.ours | host_start.ours}
        gpu_reasons, gpu_facts = judge_gpus(gpu_start, gpu_end, ours, set(host_end.pids))
        return HealthReport(ok=not reasons and not gpu_reasons, reasons=tuple(reasons + gpu_reasons),
                            facts={**facts, **gpu_facts})

    @contextlib.contextmanager
    def watch(self, gpu_indices: Iterable[int] = ()) -> Iterator[list[HealthReport]]:
        """Judge a window that is not a test's call (e.g. a server's start-up): the report is appended to the
        yielded list when the block ends, however it ends."""
        indices = tuple(gpu_indices)
        out: list[HealthReport] = []
        host_start, gpu_start = sample_host(self.roots), self._gpu_samples(indices)
        try:
            yield out
        finally:
            out.append(self.judge(host_start, sample_host(self.roots), gpu_start, self._gpu_samples(indices)))

    def pytest_report_header(self) -> str:
        return (f"moeperf: health gate: foreign CPU <= {self.limits.foreign_cores:g} cores, steal <= "
                f"{self.limits.steal_pct:g} %, GPU throttling and foreign GPU processes")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None


class GateOff:
    """Says in the report header why windows are not judged (the gate needs psutil)."""

    def pytest_report_header(self) -> str:
        return "moeperf: health gate off: psutil is not installed (pip install psutil)"


def install(config: pytest.Config, limits: HealthLimits | None, roots: Sequence[int] | None,
            gpu_indices: Any) -> HealthGate | None:
    """Register the gate (``limits`` None: ``--moeperf-health off``, nothing registered). Without psutil (a base
    install) the gate is off and the report header says so."""
    if limits is None:
        return None
    if importlib.util.find_spec("psutil") is None:
        config.pluginmanager.register(GateOff(), "moeperf-health")
        return None
    gate = HealthGate(limits, roots or (os.getpid(),), gpu_indices)
    config.pluginmanager.register(gate, "moeperf-health")
    return gate
