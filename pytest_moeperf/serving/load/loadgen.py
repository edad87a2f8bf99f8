"""Async streaming load generator for vLLM's OpenAI-compatible server.

Sends streaming ``/v1/completions`` or ``/v1/chat/completions`` requests under a load shape, times each SSE chunk
the way ``vllm bench serve`` does (`pytest_moeperf.serving.analysis.metrics`), and returns every request's outcome:
failures are kept and counted, never dropped. Warm-up requests run before the window, excluded from it. A liveness
check runs beside it (a server that dies mid-run aborts it at once with its own explanation, not a hang), and
``/metrics`` is scraped right after given numbers of completions (``probes``: the plateau's edges)."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp


from pytest_moeperf.serving.analysis.metrics import RequestOutcome, ServingMetrics, Slo, compute

__all__ = ["ClosedLoop", "Endpoint", "LoadGenerator", "LoadShape", "OpenLoop", "Probe", "Request", "WindowResult",
           "arrival_offsets", "stream_outcome"]

log = logging.getLogger("pytest_moeperf.serving")

LivenessCheck = Callable[[], Awaitable[None]]
Progress = Callable[[int, int, int, float], None]  # done, total, failed, seconds since the window began


class Endpoint(enum.Enum):
    COMPLETIONS = "/v1/completions"
    CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Request:
    """One request: a text prompt or token ids, and how many tokens to generate."""

    prompt: str | tuple[int, ...]
    max_tokens: int
    prompt_tokens: int = 0
    ignore_eos: bool = True


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` clients, each sending its next request when the previous one finished."""

    concurrency: int

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"ClosedLoop.concurrency must be >= 1, got {self.concurrency}")

    @property
    def label(self) -> str:
        return f"c{self.concurrency}"


@dataclass(frozen=True)
class OpenLoop:
    """Arrivals at ``rate`` requests/s; gaps are gamma(burstiness, 1/(rate*burstiness)): 1.0 is Poisson,
    below 1 burstier, above 1 more even; ``inf`` rate sends everything at once."""

    rate: float
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"OpenLoop.rate must be > 0, got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"OpenLoop.burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"OpenLoop.max_concurrency must be >= 1, got {self.max_concurrency}")

    @property
    def label(self) -> str:
        return f"r{self.rate:g}" + ("" if self.burstiness == 1.0 else f"b{self.burstiness:g}")


LoadShape = ClosedLoop | OpenLoop


@dataclass(frozen=True)
class Probe:
    """The server's ``/metrics`` right after the ``done``-th request of a window completed (``at_s`` from the
    window's start); ``body`` None when the scrape failed (``error`` says why)."""

    done: int
    at_s: float
    body: str | None
    error: str = ""


@dataclass(frozen=True)
class WindowResult:
    """The measured window: every outcome, its wall time, the metrics computed from them, the endpoint the
    requests went to and the scrapes taken during it (``probes``)."""

    shape: LoadShape
    outcomes: tuple[RequestOutcome, ...]
    duration_s: float
    metrics: ServingMetrics
    endpoint: Endpoint = Endpoint.COMPLETIONS
    probes: tuple[Probe, ...] = ()


def arrival_offsets(shape: OpenLoop, count: int) -> list[float]:
    """Send times (s from the window start) of ``count`` requests under an open-loop shape; seeded."""
    if math.isinf(shape.rate):
        return [0.0] * count
    rng = random.Random(shape.seed)
    theta = 1.0 / (shape.rate * shape.burstiness)
    offsets, t = [], 0.0
    for _ in range(count):
        offsets.append(t)
        t += rng.gammavariate(shape.burstiness, theta)
    return offsets


@dataclass
class LoadGenerator:
    """Client for one server. ``liveness`` is awaited every ``liveness_interval_s`` during a window and
    should raise when the server is gone; that exception aborts the window and propagates."""

    base_url: str
    model: str
    endpoint: Endpoint = Endpoint.COMPLETIONS
    request_timeout_s: float = 300.0
    liveness: LivenessCheck | None = None
    liveness_interval_s: float = 0.5
    progress: Progress | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def run(
        self,
        requests: Sequence[Request],
        shape: LoadShape,
        *,
        warmup: Sequence[Request] = (),
        slo: Slo | None = None,
        probes: Sequence[int] = (),
    ) -> WindowResult:
        """Blocking wrapper around :meth:`run_async` for synchronous tests."""
        return asyncio.run(self.run_async(requests, shape, warmup=warmup, slo=slo, probes=probes))

    async def run_async(
        self,
        requests: Sequence[Request],
        shape: LoadShape,
        *,
        warmup: Sequence[Request] = (),
        slo: Slo | None = None,
        probes: Sequence[int] = (),
    ) -> WindowResult:
        """The window; ``probes``: scrape ``/metrics`` right after that many requests completed (tasks beside it)."""
        if not requests:
            raise ValueError("no requests to send")
        import aiohttp  # optional dependency ([serving] extra): imported where used

        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=10.0)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            if warmup:
                warm = await self._guarded(self._closed(session, warmup, _concurrency(shape), 0.0, None))
                bad = [o.error for o in warm if not o.success]
                if bad:
                    log.warning("%d of %d warm-up requests failed; first error: %s", len(bad), len(warm), bad[0])
            start = time.perf_counter()
            marks, scrapes = set(probes), []

            def done(count: int) -> None:
                if count in marks:
                    scrapes.append(asyncio.ensure_future(self._probe(session, count, start)))

            if isinstance(shape, ClosedLoop):
                job = self._closed(session, requests, shape.concurrency, start, self.progress, done)
            else:
                job = self._open(session, requests, shape, start, done)
            try:
                outcomes = await self._guarded(job)
            except BaseException:  # the window is cut (a dead server): its scrapes with it
                for task in scrapes:
                    task.cancel()
                await asyncio.gather(*scrapes, return_exceptions=True)
                raise
            duration = time.perf_counter() - start
            taken = tuple(await asyncio.gather(*scrapes))
        return WindowResult(shape, tuple(outcomes), duration, compute(outcomes, duration, slo), self.endpoint,
                            taken)

    async def _probe(self, session: aiohttp.ClientSession, done: int, start: float) -> Probe:
        at = time.perf_counter() - start
        try:
            async with session.get(self.base_url.rstrip("/") + "/metrics") as resp:
                body = await resp.text()
                if resp.status != 200:
                    return Probe(done, at, None, f"HTTP {resp.status}: {body[:200]}")
                return Probe(done, at, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (a failed scrape is said, the window stands)
            return Probe(done, at, None, f"{type(exc).__name__}: {exc}")

    async def _guarded(self, job: Awaitable[list[RequestOutcome]]) -> list[RequestOutcome]:
        """Run ``job`` beside the liveness watch; whichever ends first wins, the other is cancelled."""
        work = asyncio.ensure_future(job)
        if self.liveness is None:
            return await work
        watch = asyncio.ensure_future(self._watch())
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done:
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                watch.result()  # raises the liveness failure
                raise RuntimeError("liveness watch ended without a verdict")
            return work.result()
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _watch(self) -> None:
        assert self.liveness is not None
        while True:
            await self.liveness()
            await asyncio.sleep(self.liveness_interval_s)

    async def _closed(
        self,
        session: aiohttp.ClientSession,
        requests: Sequence[Request],
        concurrency: int,
        start: float,
        progress: Progress | None,
        done: Callable[[int], None] | None = None,
    ) -> list[RequestOutcome]:
        results: list[RequestOutcome | None] = [None] * len(requests)
        queue = iter(enumerate(requests))
        tally = _Tally(len(requests), progress, done)

        async def client() -> None:
            for index, req in queue:
                results[index] = outcome = await self._send_checked(session, req, start)
                tally.add(outcome)

        await asyncio.gather(*(client() for _ in range(min(concurrency, len(requests)))))
        return [r for r in results if r is not None]

    async def _open(
        self, session: aiohttp.ClientSession, requests: Sequence[Request], shape: OpenLoop, start: float,
        done: Callable[[int], None] | None = None,
    ) -> list[RequestOutcome]:
        gate = asyncio.Semaphore(shape.max_concurrency or len(requests))
        tally = _Tally(len(requests), self.progress, done)

        async def one(req: Request, offset: float) -> RequestOutcome:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            async with gate:
                outcome = await self._send_checked(session, req, start)
            tally.add(outcome)
            return outcome

        offsets = arrival_offsets(shape, len(requests))
        return list(await asyncio.gather(*(one(r, t) for r, t in zip(requests, offsets, strict=True))))

    def _payload(self, req: Request) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
            "ignore_eos": req.ignore_eos,
        }
        if self.endpoint is Endpoint.CHAT:
            if not isinstance(req.prompt, str):
                raise ValueError("the chat endpoint needs text prompts, not token ids")
            body["messages"] = [{"role": "user", "content": req.prompt}]
            body["max_completion_tokens"] = req.max_tokens
        else:
            body["prompt"] = req.prompt if isinstance(req.prompt, str) else list(req.prompt)
            body["max_tokens"] = req.max_tokens
        body.update(self.extra_body)
        return body

    async def _send_checked(self, session: aiohttp.ClientSession, req: Request, start: float) -> RequestOutcome:
        """`_send`, then, after a failed request, the liveness check at once: a dead server's port refuses requests
        faster than the watch's interval (a quiet CI box saw 1,978 requests fail in 0.2 s after a kill, and the
        window ran to its end before the watch looked)."""
        outcome = await self._send(session, req, start)
        if not outcome.success and self.liveness is not None:
            await self.liveness()
        return outcome

    async def _send(self, session: aiohttp.ClientSession, req: Request, start: float) -> RequestOutcome:
        url = self.base_url.rstrip("/") + self.endpoint.value
        sent = time.perf_counter()
        ttft = 0.0
        last = sent
        itl: list[float] = []
        chunks = 0
        usage: dict[str, Any] = {}
        try:
            async with session.post(url, json=self._payload(req)) as resp:
                if resp.status != 200:
                    body = (await resp.text())[:300]
                    return _failed(req, sent - start, f"HTTP {resp.status} {resp.reason}: {body}")
                async for raw in resp.content:
                    line = raw.strip()
                    if not line or line.startswith(b":"):
                        continue
                    data = line.removeprefix(b"data:").strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if event.get("choices"):
                        now = time.perf_counter()
                        if chunks == 0:
                            ttft = now - sent
                        else:
                            itl.append(now - last)
                        last = now
                        chunks += 1
                    elif event.get("usage"):
                        usage = event["usage"]
                    elif "error" in event:
                        return _failed(req, sent - start, f"stream error: {event['error']}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (every failure is an outcome, never a silent drop)
            return _failed(req, sent - start, f"{type(exc).__name__}: {exc}")
        return stream_outcome(
            req, sent=sent - start, chunks=chunks, ttft_s=ttft, latency_s=last - sent, itl_s=itl, usage=usage
        )


def stream_outcome(
    req: Request,
    *,
    sent: float,
    chunks: int,
    ttft_s: float,
    latency_s: float,
    itl_s: Sequence[float],
    usage: dict[str, Any],
) -> RequestOutcome:
    """The outcome of a stream that ended normally. No token-bearing chunk, or (with ``ignore_eos``) fewer tokens
    than requested, is a failure: a short answer finishes sooner and would read as a faster server."""
    if chunks == 0:
        return _failed(req, sent, "no token-bearing chunk arrived before the stream ended")
    reported = usage.get("completion_tokens")  # None: a server without usage events; chunks are a lower bound
    tokens = int(reported or chunks)
    if req.ignore_eos and reported is not None and tokens < req.max_tokens:
        return _failed(req, sent, f"short answer: {tokens} of {req.max_tokens} requested tokens (ignore_eos)")
    return RequestOutcome(
        success=True,
        prompt_tokens=int(usage.get("prompt_tokens") or req.prompt_tokens),
        output_tokens=tokens,
        ttft_s=ttft_s,
        latency_s=latency_s,
        itl_s=tuple(itl_s),
        start_s=sent,
    )


def _failed(req: Request, start_s: float, error: str) -> RequestOutcome:
    return RequestOutcome(success=False, prompt_tokens=req.prompt_tokens, start_s=start_s, error=error)


def _concurrency(shape: LoadShape) -> int:
    return shape.concurrency if isinstance(shape, ClosedLoop) else shape.max_concurrency or 1


class _Tally:
    """Counts finished requests, tells ``on_done`` each count, and reports progress about every quarter of the
    window."""

    def __init__(self, total: int, progress: Progress | None, on_done: Callable[[int], None] | None = None) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.progress = progress
        self.on_done = on_done
        self.step = max(1, total // 4)
        self.started = time.monotonic()

    def add(self, outcome: RequestOutcome) -> None:
        self.done += 1
        self.failed += 0 if outcome.success else 1
        if self.on_done is not None:
            self.on_done(self.done)
        if self.progress is not None and (self.done % self.step == 0 or self.done == self.total):
            self.progress(self.done, self.total, self.failed, time.monotonic() - self.started)
