"""pytest-moeperf's pytest plugin: options, markers, fixtures and wiring. The work is done elsewhere."""

from __future__ import annotations

import contextlib
import importlib
import os
import time
from collections.abc import Generator

import pytest

from pytest_moeperf import hookspec, settings
from pytest_moeperf.adoption import plugin as adoption
from pytest_moeperf.health import gate as health_gate
from pytest_moeperf.judging import verdict as verdict_mod
from pytest_moeperf.judging.thresholds import Reference, Threshold
from pytest_moeperf.ledger import Measurement
from pytest_moeperf.machine import canary, emulation, markers, placement, probe
from pytest_moeperf.machine import topology as topology_mod
from pytest_moeperf.machine.canary_plugin import CanaryPlugin
from pytest_moeperf.machine.topology import Topology, TopologyError
from pytest_moeperf.perf import Perf
from pytest_moeperf.processes import confirm_at, rounds, starts, termination, windows
from pytest_moeperf.processes.children import ONLY_ENV, read_only
from pytest_moeperf.runtime import (
    child_key,
    new_perf,
    restore_env_key,
    session_key,
    settings_key,
    skip_past_deadline,
    started_key,
)
from pytest_moeperf.session import MoePerfSession
from pytest_moeperf.settings import configfile

#: Modules whose fixtures and hooks belong to the plugin (registered when importable).
PLUGIN_MODULES = (
    "pytest_moeperf.kernels.plugin",
    "pytest_moeperf.serving.plugin",
    "pytest_moeperf.attribution.plugin",
)

MARKERS = markers.MARKERS

__all__ = ["MARKERS", "PLUGIN_MODULES", "session_key", "settings_key", "skip_past_deadline"]


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser) -> None:
    """Our first hook after pytest found its rootdir and configuration file without knowing our options: the ones
    the command line meant, when a value written after a space moved them (`settings.configfile`)."""
    configfile.detect(early_config, parser)


def _register_wings(config: pytest.Config) -> None:
    for name in PLUGIN_MODULES:
        if not config.pluginmanager.has_plugin(name):
            config.pluginmanager.register(importlib.import_module(name), name)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--moeperf-rounds N`` (N > 1): this process runs the rounds as child sessions and merges their ledgers."""
    resolved = settings.resolve(config)
    if not rounds.is_parent(config, resolved.rounds, resolved.round_of):
        return None
    config.stash[settings_key] = resolved
    _register_wings(config)  # their report tables are made from the merged ledger here
    topo = _session_topology(config, resolved)
    try:
        return rounds.run(config, MoePerfSession(config, resolved, topo))
    finally:
        config.stash[restore_env_key]()


def _session_topology(config: pytest.Config, resolved: settings.Settings) -> Topology:
    """The topology from the hook, under ``--moeperf-interconnect-emulation`` when one is asked for (its NCCL
    variables are set in this process's environment until `pytest_unconfigure`)."""
    try:
        topo = config.hook.pytest_moeperf_topology(config=config)
    except TopologyError as exc:
        raise pytest.UsageError(f"--moeperf-topology: {exc}") from None
    try:
        topo, restore = emulation.apply(resolved.emulation, topo)
    except ValueError as exc:
        raise pytest.UsageError(f"--moeperf-interconnect-emulation: {exc}") from None
    config.stash[restore_env_key] = restore
    return topo


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    resolved = settings.resolve(config)
    config.stash[settings_key] = resolved
    _register_wings(config)
    topo = _session_topology(config, resolved)
    placed = placement.install(config, topo.gpu_count, resolved.share_gpus)
    limits = health_gate.HealthLimits.resolve(resolved.health_foreign_cores, resolved.health_steal_pct)
    health_gate.install(config, limits if resolved.health else None, placement.session_roots(placed),
                        (lambda item: ()) if topo.simulated else placed.nvml_indices)
    config.stash[started_key] = time.monotonic()
    state = MoePerfSession(config, resolved, topo)
    state.placement_note = placement.shared_cores_note(config, placed)
    config.stash[session_key] = state
    config.pluginmanager.register(state, "moeperf-session")
    windowed = windows.Windows(resolved.windows or 1)
    config.pluginmanager.register(windowed, "moeperf-windows")
    at_end = (resolved.confirm_at == "end" and resolved.confirm > 0 and not resolved.update
              and resolved.round_of is None and not hasattr(config, "workerinput"))
    confirming = state.confirm_at = confirm_at.ConfirmAt(state, at_end)
    config.pluginmanager.register(confirming, "moeperf-confirm-at")
    config.pluginmanager.register(starts.Starts(state, config.stash[started_key], windowed, confirming.reserve_s),
                                  "moeperf-starts")
    adoption.install(config, state, resolved.benchmark_unit)
    if resolved.canary and not topo.simulated and not (resolved.round_of or "").startswith("ab "):
        # (a moeperf ab side's processes are judged against the other side's, not against stored runs)
        workloads = canary.Canary(lambda: config.hook.pytest_moeperf_canary(config=config) or [],
                                  resolved.round_of or "call")
        config.pluginmanager.register(CanaryPlugin(state, workloads), "moeperf-canary")
    if resolved.round_of is not None and not hasattr(config, "workerinput"):
        # a child of --moeperf-rounds or moeperf ab: SIGTERM interrupts it as Ctrl-C does (fixtures torn down)
        child = contextlib.ExitStack()
        child.enter_context(termination.sigterm_interrupts())
        config.stash[child_key] = child


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
    """An interrupted child (its parent's Ctrl-C or SIGTERM, or the parent-death signal) stops, after its fixtures'
    teardown, whatever it still runs: nothing it started outlives it."""
    if child_key in session.config.stash and exitstatus == pytest.ExitCode.INTERRUPTED:
        termination.after_interrupted_session()


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash.get(restore_env_key, lambda: None)()
    config.stash.get(child_key, contextlib.ExitStack()).close()


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    return placement.auto_workers(config)


@pytest.hookimpl(trylast=True)
def pytest_moeperf_topology(config: pytest.Config) -> Topology:
    file = config.stash[settings_key].topology_file
    found: Topology = topology_mod.load_topology(file) if file is not None else probe.probe()
    return found


@pytest.hookimpl(trylast=True)
def pytest_moeperf_verdict(measurement: Measurement, rounds: tuple[tuple[float, ...], ...],
                           reference: Reference | None, threshold: Threshold) -> verdict_mod.Verdict:
    return verdict_mod.judge(measurement.key, measurement.name, measurement.unit, measurement.better, rounds,
                             reference, threshold)


@pytest.hookimpl(trylast=True)
def pytest_moeperf_canary(config: pytest.Config) -> list[canary.Workload]:
    from pytest_moeperf.kernels.devices import cpu_device

    return canary.default_workloads(config.stash[session_key].topology.gpu_count, cpu_device().cache_bytes)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(session_key, None)
    if state is None:
        return []
    topo = state.topology
    gpus = f"{topo.gpu_count}x {topo.gpus[0].name}" if topo.gpus else "no GPU"
    lines = [f"moeperf: {state.fingerprint.slug} (hash {state.fingerprint.hash}, host {state.host or 'unknown'}), "
             f"{gpus}, interconnect {topo.interconnect}{', simulated' if topo.simulated else ''}"
             f"{f' under emulation {topo.emulation}' if topo.emulation else ''}; "
             f"baselines {state.store.directory}{' (update)' if state.settings.update else ''}"]
    return lines + ([state.placement_note] if state.placement_note else [])


# ---------------------------------------------------------------------------------------------- markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    topo = config.stash[session_key].topology
    for item in items:
        markers.apply(item, topo)
    only = os.environ.get(ONLY_ENV)
    if only:  # an extra round of a --moeperf-rounds parent: only the tests it names
        keep, ids = read_only(only), config.stash[session_key].ids  # test ids of metric keys (`store.keys`)
        deselected = [item for item in items if ids.of_item(item) not in keep]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if ids.of_item(item) in keep]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    markers.check_usage(item)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def topology(pytestconfig: pytest.Config) -> Topology:
    """The topology this session measures (probed, or loaded from ``--moeperf-topology``)."""
    return pytestconfig.stash[session_key].topology


@pytest.fixture(scope="session")
def moeperf_settings(pytestconfig: pytest.Config) -> settings.Settings:
    """Every ``--moeperf-*`` option, resolved."""
    return pytestconfig.stash[settings_key]


@pytest.fixture
def perf(request: pytest.FixtureRequest) -> Generator[Perf, None, None]:
    """Record metrics: ``perf.record(name, samples, unit=..., better="lower"|"higher")``."""
    yield new_perf(request.node)


@pytest.fixture(autouse=True)
def _moeperf_deadline(request: pytest.FixtureRequest) -> None:
    """``--moeperf-deadline``: once the session has run that long, the remaining tests that measure skip; a test
    marked ``moeperf_deadline_inside`` (its result may come from work another test already did) checks itself."""
    measures = "perf" in request.fixturenames or adoption.adopts(request.config, request.fixturenames)
    if measures and request.node.get_closest_marker("moeperf_deadline_inside") is None:
        skip_past_deadline(request.config)
