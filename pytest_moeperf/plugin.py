"""pytest-moeperf's pytest plugin: options, markers, fixtures and wiring. The work is done elsewhere."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Generator

import pytest

from pytest_moeperf import emulation as emulation_mod
from pytest_moeperf import health as health_mod
from pytest_moeperf import hookspec, markers, rounds
from pytest_moeperf import placement as placement_mod
from pytest_moeperf import probe as probe_mod
from pytest_moeperf import settings as settings_mod
from pytest_moeperf import topology as topology_mod
from pytest_moeperf import verdict as verdict_mod
from pytest_moeperf.perf import Perf
from pytest_moeperf.records import Measurement
from pytest_moeperf.session import MoePerfSession, perf_key
from pytest_moeperf.settings import Settings
from pytest_moeperf.thresholds import Reference, Threshold
from pytest_moeperf.topology import Topology, TopologyError
from pytest_moeperf.verdict import Verdict

session_key = pytest.StashKey[MoePerfSession]()

#: Modules whose fixtures and hooks belong to the plugin (registered when importable).
PLUGIN_MODULES = (
    "pytest_moeperf.kernels.plugin",
    "pytest_moeperf.serving.plugin",
    "pytest_moeperf.attribution.plugin",
)

MARKERS = markers.MARKERS


def pytest_addoption(parser: pytest.Parser) -> None:
    settings_mod.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--moeperf-rounds N`` (N > 1): this process runs the rounds as child sessions and merges them."""
    settings = settings_mod.resolve(config)
    if not rounds.is_parent(config, settings.rounds, settings.round_of):
        return None
    config.stash[settings_key] = settings
    topo = _session_topology(config, settings)
    try:
        return rounds.run(config, MoePerfSession(config, settings, topo))
    finally:
        config.stash[restore_env_key]()


def _session_topology(config: pytest.Config, settings: Settings) -> Topology:
    """The topology from the hook, under ``--moeperf-interconnect-emulation`` when one is asked for (its NCCL
    variables are set in this process's environment until `pytest_unconfigure`)."""
    try:
        topo = config.hook.pytest_moeperf_topology(config=config)
    except TopologyError as exc:
        raise pytest.UsageError(f"--moeperf-topology: {exc}") from None
    try:
        topo, restore = emulation_mod.apply(settings.emulation, topo)
    except ValueError as exc:
        raise pytest.UsageError(f"--moeperf-interconnect-emulation: {exc}") from None
    config.stash[restore_env_key] = restore
    return topo


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    settings = settings_mod.resolve(config)
    config.stash[settings_key] = settings
    for name in PLUGIN_MODULES:
        if not config.pluginmanager.has_plugin(name):
            config.pluginmanager.register(importlib.import_module(name), name)
    topo = _session_topology(config, settings)
    placed = placement_mod.install(config, topo.gpu_count, settings.share_gpus)
    limits = health_mod.HealthLimits.resolve(settings.health_foreign_cores, settings.health_steal_pct)
    health_mod.install(config, limits if settings.health else None, placement_mod.session_roots(placed),
                       (lambda item: ()) if topo.simulated else placed.nvml_indices)
    config.stash[started_key] = time.monotonic()
    state = MoePerfSession(config, settings, topo)
    config.stash[session_key] = state
    config.pluginmanager.register(state, "moeperf-session")


settings_key = pytest.StashKey[Settings]()
started_key = pytest.StashKey[float]()
restore_env_key = pytest.StashKey[Callable[[], None]]()


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash.get(restore_env_key, lambda: None)()


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    return placement_mod.auto_workers(config)


@pytest.hookimpl(trylast=True)
def pytest_moeperf_topology(config: pytest.Config) -> Topology:
    settings = config.stash[settings_key]
    if settings.topology_file is not None:
        return topology_mod.load_topology(settings.topology_file)
    return probe_mod.probe()


@pytest.hookimpl(trylast=True)
def pytest_moeperf_verdict(measurement: Measurement, rounds: tuple[tuple[float, ...], ...],
                           reference: Reference | None, threshold: Threshold) -> Verdict:
    return verdict_mod.judge(measurement.key, measurement.name, measurement.unit, measurement.better, rounds,
                             reference, threshold)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(session_key, None)
    if state is None:
        return []
    topo = state.topology
    gpus = f"{topo.gpu_count}x {topo.gpus[0].name}" if topo.gpus else "no GPU"
    return [f"moeperf: {state.fingerprint.slug} (hash {state.fingerprint.hash}), {gpus}, "
            f"interconnect {topo.interconnect}{', simulated' if topo.simulated else ''}"
            f"{f' under emulation {topo.emulation}' if topo.emulation else ''}; "
            f"baselines {state.store.directory}{' (update)' if state.settings.update else ''}"]


# ---------------------------------------------------------------------------------------------- markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    topo = config.stash[session_key].topology
    for item in items:
        markers.apply(item, topo)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    markers.check_usage(item)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def topology(pytestconfig: pytest.Config) -> Topology:
    """The topology this session measures (probed, or loaded from ``--moeperf-topology``)."""
    return pytestconfig.stash[session_key].topology


@pytest.fixture(scope="session")
def moeperf_settings(pytestconfig: pytest.Config) -> Settings:
    """Every ``--moeperf-*`` option, resolved."""
    return pytestconfig.stash[settings_key]


@pytest.fixture
def perf(request: pytest.FixtureRequest) -> Generator[Perf, None, None]:
    """Record metrics: ``perf.record(name, samples, unit=..., better="lower"|"higher")``."""
    state = request.config.stash[session_key]
    topo = state.topology
    recorder = Perf(request.node.nodeid, simulated_from=topo.source if topo.simulated else None)
    request.node.stash[perf_key] = recorder
    yield recorder


def skip_past_deadline(config: pytest.Config) -> None:
    """Skip the running test when ``--moeperf-deadline`` has passed. Called before every test that records
    metrics, or, for a test marked ``moeperf_deadline_inside``, by the test itself before it starts new work."""
    deadline = config.stash[settings_key].deadline_s
    if deadline is None:
        return
    elapsed = time.monotonic() - config.stash[started_key]
    if elapsed > deadline:
        pytest.skip(f"--moeperf-deadline {deadline:g} s passed ({elapsed:.0f} s into the session): "
                    "the batch's time slot is used up")


@pytest.fixture(autouse=True)
def _moeperf_deadline(request: pytest.FixtureRequest) -> None:
    """``--moeperf-deadline``: once the session has run that long, the remaining tests that measure skip; a test
    marked ``moeperf_deadline_inside`` (its result may come from work another test already did) checks itself."""
    if "perf" in request.fixturenames and request.node.get_closest_marker("moeperf_deadline_inside") is None:
        skip_past_deadline(request.config)
