"""pytest-moeperf's pytest plugin: options, markers, fixtures and wiring. The work is done elsewhere."""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Generator

import pytest

from pytest_moeperf import health as health_mod
from pytest_moeperf import hookspec
from pytest_moeperf import placement as placement_mod
from pytest_moeperf import settings as settings_mod
from pytest_moeperf import topology as topology_mod
from pytest_moeperf.perf import Perf
from pytest_moeperf.session import MoePerfSession, perf_key
from pytest_moeperf.settings import Settings
from pytest_moeperf.topology import Topology, TopologyError

session_key = pytest.StashKey[MoePerfSession]()

#: Modules whose fixtures and hooks belong to the plugin (registered when importable).
PLUGIN_MODULES = (
    "pytest_moeperf.kernels.collectives",
    "pytest_moeperf.kernels.budget",
    "pytest_moeperf.serving.plugin",
)

MARKERS = (
    "gpus(n): needs at least n GPUs",
    "interconnect(kind): needs GPUs linked by 'nvlink' or 'pcie' (every pair)",
    "compute_capability(major, minor=0): needs GPUs of at least this compute capability",
    "arch(*names): needs GPUs of one of these architectures, e.g. arch('sm90', 'sm120')",
    "requires(*modules): needs these Python modules to be importable (e.g. 'vllm')",
    "moeperf_threshold(tolerance=None, abs_tolerance=None, noise_k=None): thresholds for the metrics of a test",
    "gemm: GEMM suite",
    "allreduce: AllReduce suite",
    "serving: end-to-end serving suite",
    "specdecode: speculative-decoding suite",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings_mod.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    settings = settings_mod.resolve(config)
    config.stash[settings_key] = settings
    for name in PLUGIN_MODULES:
        if not config.pluginmanager.has_plugin(name):
            config.pluginmanager.register(importlib.import_module(name), name)
    try:
        topo = config.hook.pytest_moeperf_topology(config=config)
    except TopologyError as exc:
        raise pytest.UsageError(f"--moeperf-topology: {exc}") from None
    placed = placement_mod.install(config, topo.gpu_count, settings.share_gpus)
    limits = health_mod.HealthLimits(settings.health_foreign_cores, settings.health_steal_pct)
    health_mod.install(config, limits if settings.health else None, placement_mod.session_roots(placed),
                       (lambda item: ()) if topo.simulated else placed.nvml_indices)
    config.stash[started_key] = time.monotonic()
    state = MoePerfSession(config, settings, topo)
    config.stash[session_key] = state
    config.pluginmanager.register(state, "moeperf-session")


settings_key = pytest.StashKey[Settings]()
started_key = pytest.StashKey[float]()


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    return placement_mod.auto_workers(config)


@pytest.hookimpl(trylast=True)
def pytest_moeperf_topology(config: pytest.Config) -> Topology:
    settings = config.stash[settings_key]
    if settings.topology_file is not None:
        return topology_mod.load_topology(settings.topology_file)
    return topology_mod.probe()


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(session_key, None)
    if state is None:
        return []
    topo = state.topology
    gpus = f"{topo.gpu_count}x {topo.gpus[0].name}" if topo.gpus else "no GPU"
    return [f"moeperf: {state.fingerprint.slug} (hash {state.fingerprint.hash}), {gpus}, "
            f"interconnect {topo.interconnect}{', simulated' if topo.simulated else ''}; "
            f"baselines {state.store.directory}{' (update)' if state.settings.update else ''}"]


# ---------------------------------------------------------------------------------------------- markers
def unmet_requirement(item: pytest.Item, topo: Topology) -> str | None:
    """Why ``item`` cannot run on ``topo`` (what was required, what was found), or None."""
    found_gpus = f"found {topo.gpu_count} GPU(s)" + (f" ({topo.gpus[0].name})" if topo.gpus else "")
    for marker in item.iter_markers("gpus"):
        need = int(marker.args[0] if marker.args else marker.kwargs.get("n", 1))
        if topo.gpu_count < need:
            return f"requires {need} GPU(s), {found_gpus}"
    for marker in item.iter_markers("interconnect"):
        kind = str(marker.args[0] if marker.args else marker.kwargs["kind"]).lower()
        if kind not in {"nvlink", "pcie"}:
            raise pytest.UsageError(f"{item.nodeid}: interconnect({kind!r}) must be 'nvlink' or 'pcie'")
        if topo.interconnect != kind:
            return f"requires a {kind} interconnect, found {topo.interconnect} ({found_gpus})"
    for marker in item.iter_markers("compute_capability"):
        args = list(marker.args) + [marker.kwargs.get("minor", 0)]
        need_cc = (int(marker.kwargs.get("major", args[0])), int(args[1]))
        have = topo.compute_capability
        if have is None or have < need_cc:
            have_text = "no GPU" if have is None else f"{have[0]}.{have[1]}"
            return f"requires compute capability >= {need_cc[0]}.{need_cc[1]}, found {have_text}"
    for marker in item.iter_markers("arch"):
        wanted = {str(a).lower() for a in marker.args}
        archs = {g.arch for g in topo.gpus}
        if not archs or not archs <= wanted:
            return f"requires architecture {' or '.join(sorted(wanted))}, found {', '.join(sorted(archs)) or 'no GPU'}"
    for marker in item.iter_markers("requires"):
        missing = [m for m in marker.args if importlib.util.find_spec(str(m)) is None]
        if missing:
            return f"requires importable module(s) {', '.join(missing)}, not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    topo = config.stash[session_key].topology
    for item in items:
        reason = unmet_requirement(item, topo)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


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


@pytest.fixture(autouse=True)
def _moeperf_deadline(request: pytest.FixtureRequest) -> None:
    """``--moeperf-deadline``: once the session has run that long, the remaining tests that measure skip."""
    deadline = request.config.stash[settings_key].deadline_s
    if deadline is None or "perf" not in request.fixturenames:
        return
    elapsed = time.monotonic() - request.config.stash[started_key]
    if elapsed > deadline:
        pytest.skip(f"--moeperf-deadline {deadline:g} s passed ({elapsed:.0f} s into the session): "
                    "the batch's time slot is used up")
