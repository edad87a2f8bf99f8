"""Pytest surface of the serving wing, registered by the core ``plugin.py``: profiles found at collection, the
server pool fixtures, the draft-candidate report table, and fast failure of a test whose server died.

* :func:`profiles_for` (collection): the profiles of the session: every ``*.json`` of ``--moeperf-profiles``
  (default ``suites/serving/profiles``), or, with ``--moeperf-server-url``, one synthesised per attached server.
  The suites parametrize over them in ``pytest_generate_tests`` (:func:`profile_params`), so a new file yields tests.
* ``serve_profiles`` (session): the same mapping.
* ``serve`` (session): the :class:`~pytest_moeperf.serving.lifecycle.pool.ServerPool`; ``serve(name)`` returns the
  :class:`Served` for a profile, launching its server if need be (within what the box holds). Profiles this host
  cannot launch skip with the reason; a server that failed to start fails every test that asks for it, at once.
* ``served``: the same for an indirectly parametrized profile name.
* ``pytest_moeperf_verdict`` (a wrapper around whichever judge answers): a tail percentile (its context carries
  the order-statistic bounds, `pytest_moeperf.serving.analysis.tails`) stays REGRESSED or IMPROVED only when the
  window's bound nearest the reference is beyond the threshold too (`tails.judge_tail`). Other metrics: untouched.

In attach mode the attached servers' processes on this host (found from their ports, or named with
``--moeperf-server-pid``) are adopted by the health gate as ours (`HealthGate.adopt`), so the server under test is
not foreign load. The pool starts the profiles the session's tests need together where the host allows
(`pool.parallel_starts`; not on an xdist worker, which does not know which tests it will run).

Nothing here imports aiohttp, vllm, prometheus_client, transformers or tokenizers at module level.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.health.gate import HealthGate, usable_cpus
from pytest_moeperf.judging.verdict import Verdict
from pytest_moeperf.ledger import Measurement, Section
from pytest_moeperf.machine.topology import Topology
from pytest_moeperf.processes.children import CACHE_ENV
from pytest_moeperf.serving.analysis.agreement import AGREE, PAIRS, ratio_of, which_moved
from pytest_moeperf.serving.analysis.metrics import percentile
from pytest_moeperf.serving.analysis.tails import LOW, judge_tail
from pytest_moeperf.serving.lifecycle.attach import AttachError, attached_profiles
from pytest_moeperf.serving.lifecycle.caches import COMPILED_DIR, MODELS_DIR
from pytest_moeperf.serving.lifecycle.pool import Adopt, ServerPool, ServeSkip, Watch, parallel_starts
from pytest_moeperf.serving.lifecycle.served import Served
from pytest_moeperf.serving.lifecycle.server import ServerDied, ServerStartError
from pytest_moeperf.serving.lifecycle.starts import gpu_local_cpus
from pytest_moeperf.serving.models.profiles import (
    ProfileError,
    ServeProfile,
    launch_blocker,
    load_profile_dirs,
    workload_misfit,
)
from pytest_moeperf.serving.models.variants import with_variants
from pytest_moeperf.serving.speculation import spec_sections
from pytest_moeperf.settings import Settings

log = logging.getLogger("pytest_moeperf.serving")

_profiles_key = pytest.StashKey[dict[str, ServeProfile]]()


class Pool:
    """What the ``serve`` fixture hands out: ``serve(name)`` for a test (skips, fails fast), and the pool itself."""

    def __init__(self, pool: ServerPool) -> None:
        self.pool = pool

    def __call__(self, name: str, *, keep: Sequence[str] = ()) -> Served:
        try:
            return self.pool.get(name, keep=keep)
        except KeyError as exc:
            raise pytest.UsageError(str(exc.args[0])) from None
        except ServeSkip as exc:
            message = str(exc)
        except (ServerStartError, ServerDied) as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None
        pytest.skip(message)  # outside the except: no "during handling" chain


def profiles_for(config: pytest.Config) -> dict[str, ServeProfile]:
    """The session's profiles, read once (at collection): attached servers, else the profile directories."""
    found = config.stash.get(_profiles_key, None)
    if found is not None:
        return found
    settings: Settings = config.stash[_settings_key()]
    try:
        if settings.server_urls:
            found = attached_profiles(settings.server_urls, local_gpus=_local_gpus(config))
        else:
            dirs = settings.profile_dirs or tuple(d for found_dirs in config.hook.pytest_moeperf_profile_dirs(
                config=config) for d in found_dirs)
            found = load_profile_dirs(dirs)
        found = with_variants(found, settings.acceptance_lengths)  # pinned profiles at other acceptance lengths
    except (ProfileError, AttachError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_profiles_key] = found
    return found


Case = tuple[str, tuple[Any, ...]]  # (id suffix, values of the other argnames)


def profile_params(
    metafunc: pytest.Metafunc,
    profiles: Iterable[ServeProfile],
    argnames: Sequence[str] = (),
    cases: Callable[[ServeProfile], Sequence[Case]] = lambda profile: [("", ())],
    *,
    lengths: Callable[[ServeProfile], tuple[int, int]] | None = None,
    argname: str = "served",
) -> None:
    """Parametrize ``served`` (indirect: the test gets the running server) and ``argnames`` over ``profiles`` x their
    ``cases``, profile-major (so one server serves its tests in a row); ids ``<profile>[-<case id>]``. With another
    ``argname`` the test gets the profile's name and starts nothing by itself. ``lengths`` (input and output tokens of
    the workload) is checked against each profile's ``max_model_len`` here, at collection: a misfit is an error."""
    params = []
    for profile in profiles:
        if lengths is not None:
            problem = workload_misfit(profile, *lengths(profile), what=metafunc.definition.nodeid)
            if problem is not None:
                raise pytest.UsageError(problem)
        for suffix, values in cases(profile):
            case_id = profile.name + (f"-{suffix}" if suffix else "")
            params.append(pytest.param(profile.name, *values, id=case_id))
    if not params:
        reason = f"no serve profile for {metafunc.definition.name} in this session" + (
            " (attach mode: only servers this session launches have a start-up to time)"
            if metafunc.config.stash[_settings_key()].server_urls
            else ""
        )
        params = [pytest.param(None, *([None] * len(argnames)), id="none", marks=pytest.mark.skip(reason=reason))]
    metafunc.parametrize([argname, *argnames], params, indirect=["served"] if argname == "served" else False)


@pytest.fixture(scope="session")
def serve_profiles(pytestconfig: pytest.Config) -> dict[str, ServeProfile]:
    return profiles_for(pytestconfig)


def pytest_sessionstart(session: pytest.Session) -> None:
    settings: Settings = session.config.stash[_settings_key()]
    if settings.server_pids and not settings.server_urls:
        raise pytest.UsageError("--moeperf-server-pid names an attached server's processes: it needs "
                                "--moeperf-server-url")
    for pid in settings.server_pids:
        if not _pid_exists(pid):
            raise pytest.UsageError(f"--moeperf-server-pid {pid}: no such process on this host")


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: it exists
    return True


def wanted_profiles(session: pytest.Session, profiles: dict[str, ServeProfile]) -> list[str]:
    """The profiles the session's tests use, in test order (a speedup test uses its candidate's reference too)."""
    wanted: dict[str, None] = {}
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for key in ("served", "candidate_name"):
            name = params.get(key)
            if isinstance(name, str) and name in profiles:
                reference = profiles[name].reference if key == "candidate_name" else None
                wanted.update({n: None for n in (reference, name) if n is not None})
    return list(wanted)


@pytest.fixture(scope="session")
def serve(
    request: pytest.FixtureRequest,
    pytestconfig: pytest.Config,
    moeperf_settings: Settings,
    topology: Topology,
    serve_profiles: dict[str, ServeProfile],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pool]:
    cache = getattr(pytestconfig, "cache", None)  # absent under -p no:cacheprovider
    shared = os.environ.get(CACHE_ENV)  # a parent's, for its children's starts (`processes.children.CACHE_ENV`)

    def folder(name: str, shared_name: str) -> Path:
        if cache is not None:
            return Path(cache.mkdir(name))
        if shared:  # a root `moeperf serve` shares too (`lifecycle.caches.MODELS_DIR`)
            (Path(shared) / shared_name).mkdir(parents=True, exist_ok=True)
            return Path(shared) / shared_name
        return tmp_path_factory.mktemp(name)

    model_cache = folder("moeperf-models", MODELS_DIR)
    # vLLM's compile caches and bytecode between sessions: beside the models (`lifecycle.caches`)
    compile_cache = folder("moeperf-vllm", COMPILED_DIR)
    pool = ServerPool(
        serve_profiles,
        timeout_s=moeperf_settings.server_timeout_s,
        gpu_count=0 if topology.simulated else topology.gpu_count,  # a topology file cannot launch servers
        model_cache=Path(model_cache),
        log_dir=tmp_path_factory.mktemp("vllm-logs", numbered=True),
        progress_sink=progress_sink(pytestconfig),
        watch=health_watch(pytestconfig),
        wanted=wanted_profiles(request.session, serve_profiles),
        # an xdist worker collects every test but runs a share it does not know yet: it starts what it is asked for
        parallel=1 if hasattr(pytestconfig, "workerinput") else parallel_starts(usable_cpus()),
        adopt=health_adopt(pytestconfig),
        server_pids=moeperf_settings.server_pids,
        compile_cache=Path(compile_cache),
        gpu_cpus=gpu_local_cpus(topology),
    )
    try:
        yield Pool(pool)
    finally:
        pool.close()


def health_watch(config: pytest.Config) -> Watch | None:
    """The health gate's window judge, for server start-ups (None when the gate is off)."""
    gate = config.pluginmanager.get_plugin("moeperf-health")
    return gate.watch if isinstance(gate, HealthGate) else None


def health_adopt(config: pytest.Config) -> Adopt | None:
    """The health gate's adoption of extra process trees as ours (None when the gate is off)."""
    gate = config.pluginmanager.get_plugin("moeperf-health")
    return gate.adopt if isinstance(gate, HealthGate) else None


def progress_sink(config: pytest.Config) -> Callable[[str], None] | None:
    """Live progress of long serving windows on the terminal (requests done / total, elapsed), about four lines
    a window, written past output capture as live logging is; none with ``-q`` or on an xdist worker (its
    output never reaches a terminal). Lines, not a redrawn status, so non-tty output (CI logs) reads the same."""
    if config.get_verbosity() < 0 or hasattr(config, "workerinput"):
        return None
    reporter = config.pluginmanager.getplugin("terminalreporter")
    capman = config.pluginmanager.getplugin("capturemanager")
    if reporter is None:
        return None

    def sink(line: str) -> None:
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            reporter.write_line(f"  moeperf: {line}")

    return sink


@pytest.fixture
def served(request: pytest.FixtureRequest, serve: Pool) -> Served:
    name = getattr(request, "param", None)
    if not isinstance(name, str):
        raise pytest.UsageError("parametrize 'served' with profile names and indirect=True")
    return serve(name)


def pytest_moeperf_report_sections(config: pytest.Config, measurements: list[Measurement],
                                   verdicts: dict[str, Verdict] | None = None) -> list[Section]:
    """The spec-decode tables (`speculation.spec_sections`: the draft candidates, built from what the spec-decode
    tests recorded, whose context carries ``spec_method``; the break-even acceptance), and the client/server table
    of every window (`client_server_section`)."""
    return [*spec_sections(measurements), *client_server_section(measurements, verdicts or {})]


def client_server_section(measurements: list[Measurement], verdicts: dict[str, Verdict]) -> list[Section]:
    """Per window: client mean / server mean of TPOT and TTFT over its plateau (the median over its rounds), and,
    where one left ±3 %, which side moved against its own baseline (`agreement.which_moved`)."""
    windows: dict[str, dict[str, Measurement]] = {}
    for m in measurements:
        if m.name in {name for pair in PAIRS.values() for name in pair}:
            windows.setdefault(m.test_id, {})[m.name] = m
    rows = []
    for test_id, found in windows.items():
        def value(name: str, found: dict[str, Measurement] = found, test_id: str = test_id) -> float | None:
            v = verdicts.get(f"{test_id}::{name}")
            if v is not None and v.estimate is not None:
                return v.estimate
            return percentile(found[name].samples, 50.0) if name in found else None

        cells: list[str] = []
        moved: list[str] = []
        for metric in PAIRS:
            ratio = ratio_of({name: value(name) for name in PAIRS[metric]}, metric)
            cells.append("-" if ratio is None else f"{ratio:.3f}")
            if ratio is not None and abs(ratio - 1.0) > AGREE:
                changes = [getattr(verdicts.get(f"{test_id}::{name}"), "change", None) for name in PAIRS[metric]]
                moved.append(f"{metric.upper()}: {which_moved(ratio, *changes)}")
        if any(c != "-" for c in cells):
            rows.append((test_id, *cells, "; ".join(moved) or "agree"))
    if not rows:
        return []
    note = (f"client mean / server mean over each window's plateau (medians over its rounds); outside ±{AGREE * 100:g} "
            "%: the side that moved more against its own baseline. TTFT: the client's adds the request's parsing and "
            "the first chunk's delivery")
    return [Section("Client and server", ("window", "TPOT client/server", "TTFT client/server", "outside ±3 %"),
                    tuple(rows), note)]


#: what a serving or spec-decode test's round stands for on a server this session launches
SERVER_START = "server start"


def pytest_moeperf_round_unit(config: pytest.Config, item: pytest.Item) -> str | None:
    """A test on a server this session launches (``served``, or a speed-up's ``candidate_name``) measures that
    server's start: one observation of it a process (`pytest_moeperf.processes.starts`). An attached server is
    somebody else's, and a profile this host cannot launch skips: their tests are ordinary."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    profiles = config.stash.get(_profiles_key, None)
    for key in ("served", "candidate_name"):
        name = params.get(key)
        profile = profiles.get(name) if isinstance(name, str) and profiles is not None else None
        if profile is not None and profile.attached_url is None and launch_blocker(
                profile, gpu_count=_local_gpus(config), vllm_importable=_vllm_importable()) is None:
            return SERVER_START
    return None


def _vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.hookimpl(wrapper=True)
def pytest_moeperf_verdict(measurement: Measurement) -> Generator[None, Verdict | None, Verdict | None]:
    """Tail percentiles: whichever judge gave the verdict (the core's default, or a conftest's), a REGRESSED or
    IMPROVED one must be confirmed by the window's own confidence bound (`tails.judge_tail`)."""
    verdict = yield
    if verdict is None or LOW not in measurement.context:
        return verdict
    return judge_tail(verdict, measurement.context)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A server that died under a test fails that test with the reason and log tail, not a traceback."""
    try:
        return (yield)
    except ServerDied as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)  # outside the except: no "during handling" chain in the report


def _settings_key() -> pytest.StashKey[Settings]:
    from pytest_moeperf.runtime import settings_key

    return settings_key


def _local_gpus(config: pytest.Config) -> int:
    from pytest_moeperf.runtime import session_key

    topo = config.stash[session_key].topology
    return 0 if topo.simulated else topo.gpu_count
