"""A profile being served: the server, the client for it, and one measured window with its spec counters."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random
import string
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.serving.analysis.arbiter import EngineFigures, engine_figures
from pytest_moeperf.serving.analysis.jit import MAX_WARM_PASSES, MAX_WINDOW_REPEATS, Compiles, compiles_since, mark
from pytest_moeperf.serving.analysis.metrics import Slo
from pytest_moeperf.serving.analysis.plateau import Plateau, edge_of, find, plateau_metrics
from pytest_moeperf.serving.analysis.prometheus import parse
from pytest_moeperf.serving.analysis.specdecode import AcceptanceStats, SpecDecodeCounters, acceptance
from pytest_moeperf.serving.lifecycle.pinning import pinned
from pytest_moeperf.serving.lifecycle.server import AttachedServer, LaunchedServer, ServerDied, http_get
from pytest_moeperf.serving.lifecycle.starts import StartInfo
from pytest_moeperf.serving.load.loadgen import (
    ClosedLoop,
    Endpoint,
    LoadGenerator,
    LoadShape,
    Request,
    WindowResult,
)
from pytest_moeperf.serving.load.prompts import prompt_set_requests, random_token_requests
from pytest_moeperf.serving.load.warm import ALREADY_WARM, NOT_ASKED, ShapeKey, WarmPass, shape_key
from pytest_moeperf.serving.models.profiles import ServeProfile

__all__ = ["Served", "SpecWindow"]

log = logging.getLogger("pytest_moeperf.serving")

Server = LaunchedServer | AttachedServer


@dataclass(frozen=True)
class SpecWindow:
    """A measured window scored on its plateau (``window``: the steady requests, their latencies and the throughputs
    over its span, `pytest_moeperf.serving.analysis.plateau`; ``whole``: every request, for the failures); for a
    speculative server, the acceptance over the whole window; the server's own figures over the plateau where the
    load generator could scrape at its edges, else over the whole window (``engine_span`` says which;
    `pytest_moeperf.serving.analysis.arbiter`: TTFT, TPOT, ITL, E2EL and queue means, the tokens it counted); and the
    unmeasured pass that warmed the server before it (`pytest_moeperf.serving.load.warm`)."""

    window: WindowResult
    acceptance: AcceptanceStats | None
    engine: EngineFigures = EngineFigures()
    warm: WarmPass = WarmPass(0)
    #: the kernel compiles the server logged while the window ran (`pytest_moeperf.serving.analysis.jit`)
    compiles: Compiles = Compiles(checked=False)
    whole: WindowResult | None = None  # None: ``window`` is the whole window
    plateau: Plateau | None = None
    engine_span: str = "whole window"

    @property
    def all_requests(self) -> WindowResult:
        """The whole window: every request, failed ones included."""
        return self.whole if self.whole is not None else self.window

    @property
    def engine_tpot_ms(self) -> float | None:
        """The engine's mean TPOT of the requests finished in the window (engine-core timestamps: unlike the
        client's TPOT it does not move when the API server coalesces tokens into fewer SSE chunks)."""
        return self.engine.tpot_ms

    @property
    def engine_ttft_ms(self) -> float | None:
        """The server's mean TTFT of the first tokens made in the window (without their delivery to the client)."""
        return self.engine.ttft_ms


@dataclass(frozen=True)
class Served:
    """``profile`` as served by ``server``; ``vocab_size`` bounds random token ids (None if unknown)."""

    profile: ServeProfile
    server: Server
    vocab_size: int | None
    startup_s: float | None = None
    #: why the health gate judged the start-up window unhealthy (empty: healthy, or not judged)
    startup_health: tuple[str, ...] = ()
    #: where a window's progress lines go besides the log (the terminal, when the session shows progress)
    progress_sink: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    #: how many servers started at the same time as this one (the pool's parallel starts), for the context
    started_together: int = 1
    #: the server's processes on this host (attach mode: found from its port, or named), for the context
    server_pids: tuple[int, ...] = ()
    #: the window shapes (`warm.shape_key`) this server has run a warm pass of since it started
    warmed: set[ShapeKey] = field(default_factory=set, compare=False, repr=False)
    #: the first of `fresh_seed`'s seeds: 1 for a server this session started (its cache is empty), a value drawn
    #: per session for an attached one (its prefix cache may hold an earlier session's prompts)
    first_seed: int = 1
    #: a launched start's phases, caches and CPU placement (`starts`); None for an attached server
    start: StartInfo | None = None
    _seeds: Iterator[int] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_seeds", itertools.count(self.first_seed))

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def client(self, endpoint: Endpoint = Endpoint.COMPLETIONS) -> LoadGenerator:
        name = self.profile.name

        def progress(done: int, total: int, failed: int, elapsed_s: float) -> None:
            line = f"[{name}] {done}/{total} requests done, {failed} failed, {elapsed_s:.1f} s"
            log.info("%s", line)
            if self.progress_sink is not None:
                self.progress_sink(line)

        return LoadGenerator(
            base_url=self.base_url,
            model=self.profile.served_model_name,
            endpoint=endpoint,
            liveness=self.server.check_alive,
            progress=progress,
        )

    def start_settings(self) -> dict[str, JSONScalar]:
        """The settings of this server's start that its windows' figures depend on (`StartInfo.settings`); none for an
        attached server."""
        return self.start.settings() if self.start is not None else {}

    def fresh_seed(self) -> int:
        """A seed no earlier window of this server used (``first_seed``, then the next, … in the order asked): random
        prompts that this server has not seen, so that vLLM's prefix cache (on by default) cannot shorten a window's
        prefills with an earlier window's or warm pass's blocks."""
        return next(self._seeds)

    def random_requests(self, count: int, input_len: int, output_len: int, *, seed: int = 0) -> list[Request]:
        """Random-token prompts. With a known vocabulary: ids in [16, min(vocab, 32000)) (the tiny model's
        specials sit below 16). Otherwise (an attached server): ids the server's own tokenizer produced."""
        if self.vocab_size is not None:
            high = min(self.vocab_size, 32000)
            return random_token_requests(count, input_len, output_len, token_range=(16, high), seed=seed)
        return random_token_requests(count, input_len, output_len, vocabulary=self.token_pool(), seed=seed)

    def token_pool(self) -> tuple[int, ...]:
        """Distinct token ids of a seeded random-letter text, tokenized by the server (``POST /tokenize``)."""
        rng = random.Random(0)
        words = ("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(3000))
        body = json.dumps({"model": self.profile.served_model_name, "prompt": " ".join(words)}).encode()
        req = urllib.request.Request(
            self.base_url + "/tokenize", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30.0) as resp:  # noqa: S310 (the server under test)
            tokens = json.loads(resp.read())["tokens"]
        return tuple(sorted({int(t) for t in tokens}))

    @staticmethod
    def prompt_set(path: Path, count: int, output_len: int, *, seed: int = 0, distinct: bool = False) -> list[Request]:
        return prompt_set_requests(path, count, output_len, seed=seed, distinct=distinct)

    def scrape(self) -> str:
        self.server.alive_or_raise()
        status, body = http_get(self.base_url + "/metrics", timeout_s=10.0)
        if status != 200:
            self.server.alive_or_raise()
            raise ServerDied(f"{self.server.describe()}: GET /metrics answered {status}: {body[:300]}")
        return body

    def spec_counters(self) -> SpecDecodeCounters | None:
        return SpecDecodeCounters.from_scrape(parse(self.scrape()))

    def measure(
        self,
        requests: Sequence[Request],
        shape: LoadShape,
        *,
        warm: Sequence[Request] = (),
        slo: Slo | None = None,
        endpoint: Endpoint = Endpoint.COMPLETIONS,
    ) -> SpecWindow:
        """Warm the server with ``warm`` under the window's own shape (unless it already ran a pass of this shape),
        then scrape, run the window (a closed loop scraping at its plateau's edges), scrape again: the acceptance
        covers exactly the window, the client's and the server's figures its plateau (an open loop's server figures:
        the whole window). Under a CPU placement this process runs on the client's CPUs meanwhile."""
        with pinned(self.start.cpusets.client if self.start and self.start.cpusets else None):
            return self._measure(requests, shape, warm=warm, slo=slo, endpoint=endpoint)

    def _measure(self, requests: Sequence[Request], shape: LoadShape, *, warm: Sequence[Request],
                 slo: Slo | None, endpoint: Endpoint) -> SpecWindow:
        client = self.client(endpoint)
        key = shape_key(requests, shape, endpoint)
        log_path = self.server.log_path if isinstance(self.server, LaunchedServer) else None
        done = WarmPass(0, note=ALREADY_WARM if warm else NOT_ASKED)
        if warm and key not in self.warmed:
            done = self._warm(client, warm, shape, log_path)
            self.warmed.add(key)
        closed = shape.concurrency if isinstance(shape, ClosedLoop) else 0
        edges: tuple[int, ...] = (closed, len(requests) - closed) if closed and len(requests) > 2 * closed else ()
        for repeat in range(MAX_WINDOW_REPEATS + 1):
            first = parse(self.scrape())
            before_window = mark(log_path)
            window = client.run(requests, shape, slo=slo, probes=edges)
            compiled = compiles_since(before_window)
            if not compiled.count or repeat == MAX_WINDOW_REPEATS:
                break
            # the window met shapes its warm pass did not (a closed loop's mixes of prefills and decodes): it was
            # one more warm pass, and the window runs again on the server that has now compiled them
            log.info("%s: the %s window compiled %s: it counts as a warm pass; measuring it again",
                     self.profile.name, shape.label, compiled.describe())
            done = dataclasses.replace(done, requests=done.requests + len(requests),
                                       passes=(done.passes if done.requests else 0) + 1,
                                       seconds=done.seconds + window.duration_s,
                                       failed=done.failed + window.metrics.failed,
                                       compiles=(done.compiles or 0) + compiled.count)
        last = parse(self.scrape())
        before, after = SpecDecodeCounters.from_scrape(first), SpecDecodeCounters.from_scrape(last)
        stats = None
        if before is not None and after is not None and after.drafts > before.drafts:
            stats = acceptance(before, after)
        plateau = find(window.outcomes, edge_of(closed, window.outcomes),
                       f"{closed} clients" if closed else "the requests in flight on average (Little's law)")
        scored = dataclasses.replace(window, outcomes=plateau.outcomes,
                                     metrics=plateau_metrics(plateau, window.outcomes, window.metrics, slo))
        engine, span = engine_figures(first, last), "whole window"
        bodies = [p.body for p in window.probes]
        if len(bodies) == 2 and bodies[0] is not None and bodies[1] is not None and not plateau.whole:
            engine = engine_figures(parse(bodies[0]), parse(bodies[1]))
            span = f"plateau: after completion {edges[0]} to after completion {edges[1]} of {len(requests)}"
        elif window.probes:
            span = "whole window (a scrape at the plateau's edges failed: " + "; ".join(
                p.error for p in window.probes if p.error) + ")"
        return SpecWindow(scored, stats, engine=engine, warm=done, compiles=compiled, whole=window, plateau=plateau,
                          engine_span=span)

    def _warm(self, client: LoadGenerator, warm: Sequence[Request], shape: LoadShape,
              log_path: Path | None) -> WarmPass:
        """The warm pass, again (up to `MAX_WARM_PASSES`) while the server's log shows it compiled kernels: the
        window should meet none."""
        t0, passes, failed, compiled = time.perf_counter(), 0, 0, 0
        while True:
            before = mark(log_path)
            failed += client.run(warm, shape).metrics.failed
            passes += 1
            now = compiles_since(before)
            compiled += now.count
            if not now.count or passes >= MAX_WARM_PASSES:
                break
            log.info("%s: warm pass %d of %s compiled %s: warming again", self.profile.name, passes, shape.label,
                     now.describe())
        if failed:
            log.warning("%s: %d of %d warm-pass requests failed", self.profile.name, failed, passes * len(warm))
        return WarmPass(passes * len(warm), time.perf_counter() - t0, failed, passes=passes,
                        compiles=compiled if log_path is not None else None)


def vocab_size_of(model_dir: Path) -> int | None:
    """``vocab_size`` from a local HF model directory's config.json (None when unreadable or not said)."""
    from pytest_moeperf.kernels.models import read_config, vocab_size

    try:
        return vocab_size(read_config(model_dir))
    except (OSError, ValueError):
        return None
