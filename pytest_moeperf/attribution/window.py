"""Profile a decode-only window of a running vLLM server.

``batch`` streaming completions with long outputs (``ignore_eos``) are started; once every one has
received its first token (no prefill left), ``POST /start_profile`` is sent; after each stream has received
``decode_tokens`` more chunks, ``POST /stop_profile``; then the streams are closed (vLLM aborts them). The
server must have been started with the torch profiler on, e.g.
``--profiler-config '{"profiler": "torch", "torch_profiler_dir": "/abs/dir", "ignore_frontend": true}'``
(vLLM 0.26 and 0.32 alike); it writes one trace per worker into that directory.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pytest_moeperf.attribution.trace import worker_traces

__all__ = ["EndedEarly", "ProfileWindow", "WindowError", "profile_decode_window", "profiler_args"]


class WindowError(RuntimeError):
    """The window could not be profiled (profiling off, a stream ended early, no trace appeared)."""


class EndedEarly(WindowError):
    """Streams finished before the profiler was started: nothing was profiled, so the window can be tried again.

    Seen on a 2-core CI box: all 4 streams of 600 tokens reached the client only at their end (the API server
    fell behind and coalesced the answers), so no stream was still decoding when the window should open."""


@dataclass(frozen=True)
class ProfileWindow:
    """What one profiled window produced: the new worker trace files, rank 0 first."""

    batch: int
    traces: tuple[Path, ...]
    profiled_s: float
    chunks: int  # token-bearing chunks all streams received while the profiler ran


def profiler_args(trace_dir: Path) -> list[str]:
    """The vLLM arguments that turn its torch profiler on, writing worker traces to ``trace_dir``."""
    config = {"profiler": "torch", "torch_profiler_dir": str(trace_dir.resolve()), "ignore_frontend": True,
              "torch_profiler_with_stack": False}  # Python stacks multiply the trace size and the overhead
    return ["--profiler-config", json.dumps(config, sort_keys=True)]


class _Stream:
    def __init__(self) -> None:
        self.chunks = 0
        self.first = asyncio.Event()
        self.done = asyncio.Event()
        self.error: str | None = None


async def _consume(session: object, url: str, body: dict[str, object], state: _Stream) -> None:
    import aiohttp

    assert isinstance(session, aiohttp.ClientSession)
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                state.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return
            async for raw in resp.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                # one chunk per decode step, text or not: a random-weight model's tokens may decode to ""
                # (vLLM still sends the chunk, with its token ids); counting only text saw none (2x H200)
                if event.get("choices"):
                    state.chunks += 1
                    state.first.set()
    except (TimeoutError, aiohttp.ClientError) as exc:
        state.error = f"{type(exc).__name__}: {exc}"
    finally:
        state.first.set()
        state.done.set()


async def _model(session: object, base: str) -> str:
    import aiohttp

    assert isinstance(session, aiohttp.ClientSession)
    async with session.get(base + "/v1/models") as resp:
        data = await resp.json()
    return str(data["data"][0]["id"])


async def _post(session: object, url: str, body: dict[str, object] | None = None) -> None:
    import aiohttp

    assert isinstance(session, aiohttp.ClientSession)
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            hint = " (is the server started with --profiler-config?)" if resp.status == 404 else ""
            raise WindowError(f"POST {url}: HTTP {resp.status}{hint}: {(await resp.text())[:300]}")


async def _window(base: str, trace_dir: Path, batch: int, decode_tokens: int, max_tokens: int,
                  prompt: str, timeout_s: float, settle_s: float) -> ProfileWindow:
    import aiohttp

    before = worker_traces(trace_dir) if trace_dir.is_dir() else []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        model = await _model(session, base)
        streams = [_Stream() for _ in range(batch)]
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "temperature": 0.0, "skip_special_tokens": False}
        tasks = [asyncio.create_task(_consume(session, base + "/v1/completions", body, s)) for s in streams]
        try:
            await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), timeout_s)
            _raise_errors(streams)
            await asyncio.sleep(settle_s)
            ended = [s.chunks for s in streams if s.done.is_set()]
            if ended:
                raise EndedEarly(f"{len(ended)} of {batch} streams ended before the window (after {min(ended)} "
                                 f"chunks): raise max_tokens ({max_tokens}) so the streams outlast it, unless the "
                                 "server delivered whole answers at once (a busy host)")
            await _post(session, base + "/start_profile", {"profile_prefix": f"moeperf-b{batch}"})
            t0, seen = time.monotonic(), [s.chunks for s in streams]
            while not all(s.chunks - c >= decode_tokens for s, c in zip(streams, seen, strict=True)):
                if any(s.done.is_set() for s in streams) or time.monotonic() - t0 > timeout_s:
                    break
                await asyncio.sleep(0.01)
            chunks = sum(s.chunks - c for s, c in zip(streams, seen, strict=True))
            await _post(session, base + "/stop_profile")
            profiled = time.monotonic() - t0
            _raise_errors(streams)
            if chunks == 0:
                ended = [s.chunks for s in streams if s.done.is_set()]
                if ended:  # seen on a loaded 2-core box: the rest of each answer arrived at once as the window opened
                    raise EndedEarly(f"{len(ended)} of {batch} streams ended before the window, as it opened (no "
                                     f"decode step reached the client in its {profiled:.2f} s): the server "
                                     "delivered whole answers at once (a busy host)")
                raise WindowError(f"no decode step reached the client in the {profiled:.2f} s window")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    traces = await _new_traces(trace_dir, before, timeout_s)
    return ProfileWindow(batch, tuple(traces), profiled, chunks)


def _raise_errors(streams: list[_Stream]) -> None:
    errors = [s.error for s in streams if s.error]
    if errors:
        raise WindowError(f"{len(errors)} of {len(streams)} streams failed: {errors[0]}")


async def _new_traces(trace_dir: Path, before: list[Path], timeout_s: float) -> list[Path]:
    """The worker traces the window wrote, once their sizes stop changing."""
    deadline, sizes = time.monotonic() + timeout_s, dict[Path, int]()
    while time.monotonic() < deadline:
        found = worker_traces(trace_dir, newer_than=before) if trace_dir.is_dir() else []
        now = {p: p.stat().st_size for p in found}
        if found and now == sizes:
            return found
        sizes = now
        await asyncio.sleep(1.0)
    raise WindowError(f"no new worker trace in {trace_dir} {timeout_s:.0f} s after /stop_profile: is it the "
                      "server's torch_profiler_dir (as seen from here)?")


def profile_decode_window(base_url: str, trace_dir: Path, *, batch: int, decode_tokens: int = 32,
                          max_tokens: int = 512, prompt: str = "the model expert token layer",
                          timeout_s: float = 300.0, settle_s: float = 0.2, attempts: int = 3) -> ProfileWindow:
    """Profile one decode-only window of ``batch`` concurrent streams (blocking; see the module docstring).

    A window whose streams all ended before the profiler could start (:class:`EndedEarly`: nothing was
    profiled) is tried again with fresh streams, up to ``attempts`` times in all; the last error says how many."""
    if batch < 1 or decode_tokens < 1 or attempts < 1:
        raise ValueError(f"batch, decode_tokens and attempts must be >= 1, got {batch}, {decode_tokens}, {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return asyncio.run(_window(base_url.rstrip("/"), trace_dir, batch, decode_tokens, max_tokens, prompt,
                                       timeout_s, settle_s))
        except EndedEarly as exc:
            if attempt == attempts:
                raise EndedEarly(f"{exc} (in each of {attempts} attempts)") from None
            print(f"moeperf attribute: batch {batch}, attempt {attempt} of {attempts}: {exc}; trying again",
                  file=sys.stderr)
    raise AssertionError("unreachable")
