"""The health gate: real host sampling (processes, CPU time, process trees), pure judging, NVML through a
stand-in module (no GPU on the box that runs these), and real pytest sessions with and without busy loops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_moeperf.health.gate import (
    BAD_REASONS,
    HealthLimits,
    auto_foreign_cores,
    foreign_cpu,
    judge_gpus,
    judge_host,
)
from pytest_moeperf.health.probes import GpuSample, HostSample, NvmlProbe, process_tree, sample_host

#: load the plugin from the checkout unless it is installed (its pytest11 entry point registers it then)
PLUGIN: tuple[str, ...] = () if any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(
    group="pytest11")) else ("-p", "pytest_moeperf.plugin")

pytest.importorskip("psutil")

BUSY = [sys.executable, "-c", "while True: pass"]


def host(t: float, cpu: dict[tuple[int, float], float], parent: dict[tuple[int, float], int] | None = None,
         ours: frozenset[tuple[int, float]] = frozenset(), steal: float = 0.0, busy: float = 0.0,
         busy_all: float | None = None) -> HostSample:
    return HostSample(monotonic=t, wall=1000.0 + t, cpu=cpu, parent=parent or dict.fromkeys(cpu, 1), ours=ours,
                      pids=frozenset(p for p, _ in cpu), names={k: f"proc{k[0]}" for k in cpu}, steal_s=steal,
                      busy_s=busy, busy_all_s=100.0 * t if busy_all is None else busy_all, cpus=2,
                      loadavg=(1.0, 1.0, 1.0))


@pytest.fixture
def busy_child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(BUSY)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------------------------- pure
def test_process_tree_follows_parent_links() -> None:
    parents = {10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert process_tree(parents, [10]) == {10, 11, 12}
    assert process_tree(parents, [10, 20]) == {10, 11, 12, 20, 21}


def test_foreign_cpu_counts_deltas_births_and_reaped_children_once() -> None:
    ours = (5, 1.0)
    old, born, child, gone_orphan = (7, 2.0), (8, 1000.5), (9, 3.0), (30, 4.0)
    start = host(0.0, {ours: 1.0, old: 10.0, child: 4.0, gone_orphan: 50.0},
                 parent={ours: 1, old: 1, child: 7, gone_orphan: 999}, ours=frozenset({ours}))
    # child exited during the window with 4.5 s; old reaped it (its children total grew by 4.5)
    end = host(2.0, {ours: 3.0, old: 10.0 + 0.5 + 4.5, born: 0.7}, parent={ours: 1, old: 1, born: 1},
               ours=frozenset({ours}))
    used = foreign_cpu(start, end)
    assert ours not in used
    assert used[old] == pytest.approx(1.0)  # 0.5 own + the child's 0.5 inside the window
    assert used[born] == pytest.approx(0.7)
    assert sum(used.values()) == pytest.approx(1.7)  # the orphan's lifetime is neither added nor subtracted


def test_a_lifetime_reaped_up_a_chain_counts_only_its_window() -> None:
    shell, wrapper, worker = (7, 2.0), (8, 3.0), (9, 4.0)  # shell -> timeout -> python, both gone by the end
    start = host(0.0, {shell: 1.0, wrapper: 0.1, worker: 40.0}, parent={shell: 1, wrapper: 7, worker: 8})
    end = host(2.0, {shell: 1.0 + 0.1 + 40.0 + 1.5}, parent={shell: 1})  # the worker used 1.5 s more, then exited
    assert foreign_cpu(start, end) == {shell: pytest.approx(1.5)}


def test_foreign_time_is_bounded_by_what_the_host_was_busy() -> None:
    start = host(0.0, {(7, 2.0): 0.0}, busy_all=0.0)
    end = host(1.0, {(7, 2.0): 5.0}, busy_all=1.5)  # a reaped lifetime we could not trace
    assert judge_host(start, end, HealthLimits())[1]["foreign_cores"] == 1.5


def test_judge_host_names_the_foreign_load_and_the_limit() -> None:
    start = host(0.0, {(7, 2.0): 0.0}, steal=0.0, busy=0.0)
    end = host(1.0, {(7, 2.0): 1.8}, steal=0.5, busy=1.9)
    reasons, facts = judge_host(start, end, HealthLimits(foreign_cores=0.5, steal_pct=10.0))
    assert reasons == ["host: 1.80 foreign cores busy during the window (limit 0.5 + 0.05 s over 1.0 s; busiest: "
                       "proc7 pid 7 1.80)", "host: 25 % of the window stolen by the hypervisor (limit 10 %)"]
    assert facts["foreign_cores"] == 1.8 and facts["steal_pct"] == 25.0 and facts["host_busy_cores"] == 1.9
    assert facts["host_judged"] is True
    ok_reasons, _ = judge_host(start, end, HealthLimits(foreign_cores=1.9, steal_pct=30.0))
    assert ok_reasons == []


def test_a_few_ticks_of_a_daemon_do_not_trip_a_short_window_but_a_steady_load_trips_a_long_one() -> None:
    # 60 ms of foreign CPU in a 1-s window (a daemon's wake-up, seen in quiet windows) vs 0.1 cores for 10 s
    limits = HealthLimits(foreign_cores=0.07)
    short, _ = judge_host(host(0.0, {(7, 2.0): 0.0}), host(1.0, {(7, 2.0): 0.06}), limits)
    steady, facts = judge_host(host(0.0, {(7, 2.0): 0.0}), host(10.0, {(7, 2.0): 1.0}), limits)
    assert short == [] and len(steady) == 1 and facts["foreign_cores_allowed"] == 0.075


def test_the_automatic_foreign_cpu_limit_scales_with_the_cpus_we_may_use() -> None:
    assert [auto_foreign_cores(n) for n in (1, 2, 16, 128)] == pytest.approx([0.07, 0.07, 0.56, 4.48])
    assert HealthLimits.resolve(None, 10.0, cpus=2) == HealthLimits(0.07, 10.0)
    assert HealthLimits.resolve(0.5, 10.0, cpus=2) == HealthLimits(0.5, 10.0)


def test_a_window_too_short_for_cpu_accounting_is_recorded_not_judged() -> None:
    reasons, facts = judge_host(host(0.0, {(7, 2.0): 0.0}), host(0.01, {(7, 2.0): 0.01}), HealthLimits())
    assert reasons == [] and facts["host_judged"] is False and facts["foreign_cores"] == 1.0


def gpu(t: float, **kw: Any) -> GpuSample:
    return GpuSample(index=0, monotonic=t, **kw)


def test_power_cap_is_a_fact_and_thermal_hw_slowdown_ecc_xid_and_other_processes_fail() -> None:
    base = dict(violation_ns={"power": 0, "thermal": 5}, ecc_uncorrected=0, compute_pids=(100,))
    quiet_reasons, facts = judge_gpus([gpu(0.0, reasons=0x4, temperature_c=55, energy_mj=1_000_000, **base)],
                                      [gpu(2.0, reasons=0x4, sm_clock_mhz=1755, sm_clock_max_mhz=1980,
                                           temperature_c=61, violation_ns={"power": 800_000_000, "thermal": 5},
                                           energy_mj=2_300_000, ecc_uncorrected=0, compute_pids=(100, 4242))],
                                      ours={100}, visible={100})
    assert quiet_reasons == []  # SW power cap: normal under load; pid 4242 is in another PID namespace
    # the window's mean power from the energy counter (1,300 J in 2 s) and its temperature at both ends: what a
    # first-token drift is read against
    assert facts == {"gpu0_clock_events": "sw_power_cap", "gpu0_power_capped_pct": 40.0, "gpu0_power_w": 650.0,
                     "gpu0_temperature_start_c": 55, "gpu0_sm_clock_mhz": 1755, "gpu0_sm_clock_max_mhz": 1980,
                     "gpu0_temperature_c": 61, "gpu0_unresolved_pids": 1}
    bad, facts = judge_gpus([gpu(0.0, reasons=0x0, **base)],
                            [gpu(1.0, reasons=0x40 | 0x4, violation_ns={"power": 0, "thermal": 120_000_005},
                                 ecc_uncorrected=2, compute_pids=(100, 555), xids=(79,))], ours={100},
                            visible={100, 555})
    assert bad == ["gpu0: clocks held down by hw_thermal_slowdown during the window",
                   "gpu0: thermal limit held the clocks down for 120 ms of the window",
                   "gpu0: 2 uncorrected ECC error(s) during the window",
                   "gpu0: XID event(s) 79 during the window",
                   "gpu0: other compute process(es) on the GPU: pid 555"]
    assert facts["gpu0_thermal_ms"] == 120.0
    assert BAD_REASONS & 0x4 == 0


class FakeNvml(SimpleNamespace):
    """A stand-in ``pynvml`` with one GPU (only the old throttle-reasons name)."""

    def __init__(self) -> None:
        super().__init__(handle=object(), events=[], calls=[])

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlEventSetFree(self, events: str) -> None:
        self.calls.append("free")

    def nvmlDeviceRegisterEvents(self, handle: object, kinds: int, events: str) -> None:
        assert kinds == 0x8 and events == "set"

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.events:
            raise RuntimeError("NVMLError_Timeout")
        self.events.pop()
        return SimpleNamespace(device=self.handle, eventData=79)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        if index != 0:
            raise RuntimeError("NVMLError_InvalidArgument")
        return self.handle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
        return 0x4

    def nvmlDeviceGetViolationStatus(self, handle: object, policy: int) -> Any:
        if policy == 5:
            raise RuntimeError("NVMLError_NotSupported")
        return SimpleNamespace(violationTime=policy * 1000, referenceTime=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=1)]

    def nvmlDeviceGetClockInfo(self, handle: object, kind: int) -> int:
        return {1: 1755, 2: 3201}[kind]

    def nvmlDeviceGetMaxClockInfo(self, handle: object, kind: int) -> int:
        return {1: 1980, 2: 3201}[kind]

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        return 55

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        return 123_456

    def nvmlDeviceGetTotalEccErrors(self, handle: object, kind: int, counter: int) -> int:
        raise RuntimeError("NVMLError_NotSupported")


def test_nvml_probe_reads_each_field_and_leaves_unsupported_ones_unknown() -> None:
    fake = FakeNvml()
    probe = NvmlProbe(fake)
    (sample,) = probe.sample([0, 3])  # GPU 3 does not exist: left out
    assert sample.reasons == 0x4 and sample.sm_clock_mhz == 1755 and sample.mem_clock_max_mhz == 3201
    assert sample.violation_ns == {"power": 0, "thermal": 1000, "board_limit": 3000}
    assert sample.compute_pids == (os.getpid(),) and sample.ecc_uncorrected is None and sample.temperature_c == 55
    assert sample.energy_mj == 123_456
    assert sample.xids == ()
    fake.events.append("xid")
    assert probe.sample([0])[0].xids == (79,)
    probe.close()
    assert fake.calls == ["init", "free", "shutdown"]


# --------------------------------------------------------------------------------------------- real host
def test_a_busy_child_of_ours_is_ours_and_foreign_from_elsewhere(busy_child: subprocess.Popen[bytes]) -> None:
    time.sleep(0.2)  # let it start
    ours_start, other_start = sample_host([os.getpid()]), sample_host([1 << 30])
    time.sleep(0.5)
    ours_end, other_end = sample_host([os.getpid()]), sample_host([1 << 30])
    child = next(i for i in ours_end.cpu if i[0] == busy_child.pid)
    me = next(i for i in ours_end.cpu if i[0] == os.getpid())
    assert {child, me} <= ours_end.ours
    assert child not in foreign_cpu(ours_start, ours_end)
    from_elsewhere = foreign_cpu(other_start, other_end)
    assert from_elsewhere[child] > 0  # a busy loop runs for 0.5 s: it got some CPU, whoever else is busy
    assert other_end.cpus >= 1 and other_end.pids >= {busy_child.pid, os.getpid()}


# --------------------------------------------------------------------------------------------- sessions
PERF_TEST = """
import time

def test_measure(perf):
    time.sleep(1.0)
    perf.record("latency", [1.0, 1.0, 1.0], unit="ms")
"""

DUMP_HEALTH = """
import json
import pytest
from pytest_moeperf.runtime import health_key


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    if call.when == "call":
        found = item.stash.get(health_key, {}).get(0)  # the first round's window
        with open("health.json", "w") as handle:
            json.dump(None if found is None else {"ok": found.ok, "reasons": list(found.reasons),
                                                  "facts": found.facts}, handle)
"""


def run_health_session(pytester: pytest.Pytester, *args: str) -> dict[str, Any]:
    """A separate pytest process, so busy loops started by this test are outside its process tree."""
    pytester.makepyfile(test_perf=PERF_TEST)
    pytester.makeconftest(DUMP_HEALTH)
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider",
                                           "--moeperf-baselines", str(pytester.path / "baselines"), *args,
                                           timeout=300)
    assert result.ret in (0, 1), result.stdout.str()
    found: dict[str, Any] = json.loads((pytester.path / "health.json").read_text())
    return found


def test_two_busy_loops_outside_the_session_trip_the_gate(pytester: pytest.Pytester) -> None:
    loops = [subprocess.Popen(BUSY, start_new_session=True) for _ in range(2)]
    try:
        found = run_health_session(pytester, "--moeperf-health-foreign-cores", "0.5")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert found["ok"] is False
    (reason,) = [r for r in found["reasons"] if r.startswith("host:") and "foreign" in r]
    assert "foreign cores busy during the window (limit 0.5 + 0.05 s over " in reason and "; busiest: " in reason
    assert found["facts"]["foreign_cores"] > 0.5 and found["facts"]["host_judged"] is True


SATURATING_TEST = """
import subprocess, sys, time

def test_measure(perf):
    # our own tree keeps every core busy, as a vLLM CPU server, its API server and the load generator do
    ours = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range({cpus})]
    try:
        time.sleep(2.0)
    finally:
        for proc in ours:
            proc.kill()
            proc.wait()
    perf.record("latency", [1.0, 1.0, 1.0], unit="ms")
"""


def test_one_foreign_loop_beside_a_tree_that_saturates_the_cores_trips_the_default_gate(
        pytester: pytest.Pytester) -> None:
    # Seen in a serving window under two busy loops: the scheduler gave them only 0.27 cores beside our tree, far
    # below the old fixed limit of 0.5, while TTFT was 10-20x slower; the default limit (auto) catches it.
    loop = subprocess.Popen(BUSY, start_new_session=True)
    try:
        pytester.makepyfile(test_perf=SATURATING_TEST.format(cpus=os.cpu_count() or 2))
        pytester.makeconftest(DUMP_HEALTH)
        result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider",
                                               "--moeperf-baselines", str(pytester.path / "baselines"), timeout=300)
    finally:
        loop.kill()
        loop.wait()
    found = json.loads((pytester.path / "health.json").read_text())
    limit = auto_foreign_cores(len(os.sched_getaffinity(0)))
    result.stdout.fnmatch_lines([f"moeperf: health gate: foreign CPU <= {limit:g} cores, steal <= 10 %*"])
    assert found["ok"] is False, found
    assert found["facts"]["foreign_cores"] > found["facts"]["foreign_cores_allowed"] > limit
    assert any(f"(limit {limit:g} + 0.05 s over " in r for r in found["reasons"]), found["reasons"]


def test_a_quiet_window_passes_under_a_limit_the_box_allows(pytester: pytest.Pytester) -> None:
    # The box is shared: "quiet" means below a limit of nearly every core, not an idle machine.
    found = run_health_session(pytester, "--moeperf-health-foreign-cores", str((os.cpu_count() or 2) + 0.5),
                               "--moeperf-health-steal", "100")
    assert found == {"ok": True, "reasons": [], "facts": found["facts"]}
    assert {"foreign_cores", "steal_pct", "loadavg_1m", "host_busy_cores", "health_window_s"} <= set(found["facts"])
    assert found["facts"]["health_window_s"] >= 1.0


def test_health_off_registers_no_gate(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=PERF_TEST.replace("1.0)", "0.0)", 1))
    pytester.makeconftest(DUMP_HEALTH)
    pytester.makeini("[pytest]\nmoeperf_health = off\n")
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert json.loads((pytester.path / "health.json").read_text()) is None


def test_bad_threshold_values_are_usage_errors(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*PLUGIN, "--moeperf-health-foreign-cores", "lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--moeperf-health-foreign-cores: expected a number, got 'lots'*"])
    pytester.makeini("[pytest]\nmoeperf_health_steal = 150\n")
    result = pytester.runpytest(*PLUGIN)
    result.stderr.fnmatch_lines(["*moeperf_health_steal: a percentage is in [[]0, 100], got 150*"])


def test_help_shows_the_health_and_placement_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(*PLUGIN, "--help")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*--moeperf-health=on|off*", "*--moeperf-health-foreign-cores=CORES|auto*",
                                 "*--moeperf-health-steal=PCT*", "*--moeperf-share-gpus*"])


def test_without_psutil_the_gate_is_off_and_says_so(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # a base install: only pytest
    pytester.makepyfile(test_perf=PERF_TEST.replace("1.0)", "0.0)", 1))
    pytester.makeconftest(DUMP_HEALTH)
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["moeperf: health gate off: psutil is not installed (pip install psutil)"])
    assert json.loads((pytester.path / "health.json").read_text()) is None
