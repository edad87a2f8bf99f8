"""Pytest fixtures of the serving suites, registered as a plugin by ``plugin.py``.

* ``serve_profiles`` (session): every profile in ``<rootdir>/suites/serving/profiles``.
* ``serve`` (session): a pool; ``serve(name)`` returns the :class:`Served` for a profile, launching its server
  on first use (one per profile, reused by every test of the session, torn down at the end) or, with
  ``--moeperf-server-url``, checking that the attached server is that profile's. Profiles this host cannot
  run skip with the reason; a server that failed to start fails every test that asks for it, at once.
* ``served``: the same for an indirectly parametrized profile name: ``parametrize("served", [...], indirect=True)``.

Any :class:`ServerDied` raised while a test uses a server becomes a test failure whose message is the reason
and the server log tail (``pytest_runtest_call`` wrapper below), so a dead server fails fast, never hangs.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.records import Measurement, Section
from pytest_moeperf.serving.metrics import percentile
from pytest_moeperf.serving.profiles import TINY_MOE, ServeProfile, load_profiles, unmet_requirement
from pytest_moeperf.serving.prometheus import parse
from pytest_moeperf.serving.served import Served, vocab_size_of
from pytest_moeperf.serving.server import (
    AttachedServer,
    LaunchedServer,
    ServerDied,
    ServerStartError,
    free_port,
    http_get,
)
from pytest_moeperf.serving.specdecode import DRAFTS, CandidateRow, comparison_table
from pytest_moeperf.serving.tinymodel import ensure_tiny_model

log = logging.getLogger("pytest_moeperf.serving")

PROFILES_DIR = Path("suites", "serving", "profiles")
DEFAULT_SERVER_TIMEOUT_S = 600.0


class ServerPool:
    """Lazily started servers, one per profile, for the whole session."""

    def __init__(
        self,
        profiles: dict[str, ServeProfile],
        *,
        server_url: str | None,
        timeout_s: float,
        gpu_count: int,
        model_cache: Path,
        log_dir: Path,
    ) -> None:
        self.profiles = profiles
        self.server_url = server_url
        self.timeout_s = timeout_s
        self.gpu_count = gpu_count
        self.model_cache = model_cache
        self.log_dir = log_dir
        self._served: dict[str, Served] = {}
        self._broken: dict[str, str] = {}
        self._launched: list[LaunchedServer] = []

    def __call__(self, name: str) -> Served:
        profile = self.profiles.get(name)
        if profile is None:
            raise pytest.UsageError(f"no serve profile {name!r}; known: {sorted(self.profiles)}")
        if name in self._broken:
            pytest.fail(self._broken[name], pytrace=False)
        served = self._served.get(name)
        if served is not None:
            try:
                served.server.alive_or_raise()
                return served
            except ServerDied as exc:
                self._broken[name] = f"serve profile {name!r}: {exc}"
            pytest.fail(self._broken[name], pytrace=False)
        fresh: Served | None = None
        if self.server_url is not None:
            fresh = self._attach(profile, self.server_url)
        else:
            reason = unmet_requirement(
                profile,
                gpu_count=self.gpu_count,
                vllm_importable=importlib.util.find_spec("vllm") is not None,
            )
            if reason is not None:
                pytest.skip(reason)
            try:
                fresh = self._launch(profile)
            except ServerStartError as exc:
                self._broken[name] = f"serve profile {name!r}: {exc}"
        if fresh is None:  # failed outside the except block: no "during handling" chain in the report
            raise pytest.fail.Exception(self._broken[name], pytrace=False)
        self._served[name] = fresh
        return fresh

    def _launch(self, profile: ServeProfile) -> Served:
        if profile.model == TINY_MOE:
            model_dir = ensure_tiny_model(self.model_cache)
            model, vocab = str(model_dir), vocab_size_of(model_dir)
        else:
            local = Path(profile.model)
            model, vocab = profile.model, vocab_size_of(local) if local.is_dir() else None
        port = free_port()
        server = LaunchedServer(
            profile.name,
            profile.argv(model, "127.0.0.1", port),
            port=port,
            log_path=self.log_dir / f"{profile.name}.log",
            env=profile.env,
        )
        timeout = min(self.timeout_s, profile.startup_timeout_s or self.timeout_s)
        server.start()
        log.info("started %s (health timeout %.0f s)", server.describe(), timeout)
        self._launched.append(server)
        startup = server.wait_healthy(timeout)
        log.info("%s healthy after %.1f s", server.describe(), startup)
        return Served(profile=profile, server=server, vocab_size=vocab, startup_s=startup)

    def _attach(self, profile: ServeProfile, url: str) -> Served:
        server = AttachedServer(url)
        server.wait_healthy(min(self.timeout_s, 60.0))
        status, body = http_get(server.base_url + "/v1/models")
        models = _model_ids(body) if status == 200 else []
        if profile.served_model_name not in models:
            wanted = f"profile {profile.name!r} ({profile.served_model_name})"
            pytest.skip(f"{server.describe()} serves {models}, not {wanted}")
        status, body = http_get(server.base_url + "/metrics")
        speculating = status == 200 and bool(parse(body).select(DRAFTS))
        if speculating != (profile.speculative is not None):
            has = "runs speculative decoding" if speculating else "runs without speculative decoding"
            pytest.skip(f"{server.describe()} {has}; profile {profile.name!r} has method {profile.method!r}")
        return Served(profile=profile, server=server, vocab_size=None)

    def close(self) -> None:
        for server in reversed(self._launched):
            log.info("stopping %s", server.describe())
            server.stop()
        self._launched.clear()


def _model_ids(body: str) -> list[str]:
    import json

    try:
        data = json.loads(body).get("data", [])
    except (ValueError, AttributeError):
        return []
    return [str(m.get("id")) for m in data if isinstance(m, dict)]


def _setting(request: pytest.FixtureRequest, field: str, default: Any) -> Any:
    """A field of the core's ``moeperf_settings`` (or the default while the core lacks it)."""
    try:
        settings = request.getfixturevalue("moeperf_settings")
    except pytest.FixtureLookupError:
        return default
    return getattr(settings, field, default)


def _gpu_count(request: pytest.FixtureRequest) -> int:
    try:
        topology = request.getfixturevalue("topology")
    except pytest.FixtureLookupError:
        return 0
    if getattr(topology, "simulated", False):
        return 0  # a topology file describes a box; launching a server needs the real GPUs
    return int(getattr(topology, "gpu_count", 0))


@pytest.fixture(scope="session")
def serve_profiles(request: pytest.FixtureRequest) -> dict[str, ServeProfile]:
    return load_profiles(request.config.rootpath / PROFILES_DIR)


@pytest.fixture(scope="session")
def serve(
    request: pytest.FixtureRequest,
    serve_profiles: dict[str, ServeProfile],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerPool]:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    model_cache = cache.mkdir("moeperf-models") if cache is not None else tmp_path_factory.mktemp("models")
    pool = ServerPool(
        serve_profiles,
        server_url=_setting(request, "server_url", None),
        timeout_s=float(_setting(request, "server_timeout_s", DEFAULT_SERVER_TIMEOUT_S)),
        gpu_count=_gpu_count(request),
        model_cache=Path(model_cache),
        log_dir=tmp_path_factory.mktemp("vllm-logs", numbered=True),
    )
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def served(request: pytest.FixtureRequest, serve: ServerPool) -> Served:
    name = getattr(request, "param", None)
    if not isinstance(name, str):
        raise pytest.UsageError("parametrize 'served' with profile names and indirect=True")
    return serve(name)


def pytest_moeperf_report_sections(config: pytest.Config, measurements: list[Measurement]) -> list[Section]:
    """The draft-candidate table: acceptance length, TPOT, throughput and speedup per profile and concurrency,
    built from what the spec-decode tests recorded (their context carries ``spec_method``)."""
    groups: dict[tuple[str, int], dict[str, Measurement]] = {}
    methods: dict[tuple[str, int], str] = {}
    for m in measurements:
        ctx = m.context
        if "spec_method" not in ctx or not isinstance(ctx.get("concurrency"), int):
            continue
        key = (str(ctx["profile"]), int(ctx["concurrency"]))  # type: ignore[arg-type]
        groups.setdefault(key, {})[m.name] = m
        methods[key] = str(ctx["spec_method"])
    rows = []
    for key, metrics in groups.items():
        if "tpot_ms" not in metrics or "output_throughput" not in metrics:
            continue

        def median(name: str, metrics: dict[str, Measurement] = metrics) -> float | None:
            found = metrics.get(name)
            return None if found is None else percentile(found.samples, 50.0)

        rows.append(
            CandidateRow(
                profile=key[0],
                method=methods[key],
                concurrency=key[1],
                tpot_ms=median("engine_tpot_ms") or median("tpot_ms") or 0.0,
                output_throughput=median("output_throughput") or 0.0,
                acceptance_length=median("acceptance_length"),
                acceptance_rate=median("acceptance_rate"),
                speedup=median("speedup"),
            )
        )
    if not rows:
        return []
    columns, table = comparison_table(rows)
    note = (
        "TPOT: the engine's mean over the window where the server exports it, else the client's median; "
        "speedup: median over rounds alternating reference and candidate (same model, build, prompts, concurrency)"
    )
    return [Section("Speculative decoding: draft candidates", columns, tuple(table), note)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A server that died under a test fails that test with the reason and log tail, not a traceback."""
    try:
        return (yield)
    except ServerDied as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)  # outside the except: no "during handling" chain in the report
