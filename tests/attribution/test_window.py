"""The window's retry when every stream ended before the profiler could start.

The real server cannot be made to coalesce on demand (it does so on a busy 2-core box, in some windows and not
others), so this one scenario is injected: a local HTTP server that sends each whole answer in one burst and
counts the profiler calls it gets. The normal path runs against a real vLLM server in
test_attribute_real_server.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf.attribution.window import EndedEarly, profile_decode_window

web = pytest.importorskip("aiohttp.web")


class _BurstServer:
    """Answers every completion at once (the coalesced mode) and counts ``/start_profile`` calls."""

    def __init__(self) -> None:
        self.completions = 0
        self.start_profile = 0

    async def models(self, _request: object) -> object:
        return web.json_response({"data": [{"id": "tiny"}]})

    async def completions_(self, request: object) -> object:
        self.completions += 1
        resp = web.StreamResponse()
        await resp.prepare(request)  # type: ignore[arg-type]
        body = b"".join(b"data: " + json.dumps({"choices": [{"text": "x"}]}).encode() + b"\n\n" for _ in range(8))
        await resp.write(body + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def profile(self, _request: object) -> object:
        self.start_profile += 1
        return web.json_response({})


@pytest.fixture
def burst_server() -> Iterator[tuple[str, _BurstServer]]:
    state, loop = _BurstServer(), asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/v1/models", state.models)
    app.router.add_post("/v1/completions", state.completions_)
    app.router.add_post("/start_profile", state.profile)
    runner = web.AppRunner(app)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_streams_that_end_before_the_window_are_tried_again_then_named(
        burst_server: tuple[str, _BurstServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, state = burst_server
    with pytest.raises(EndedEarly, match=r"2 of 2 streams ended before the window .*in each of 3 attempts"):
        profile_decode_window(url, tmp_path, batch=2, decode_tokens=2, max_tokens=8, settle_s=0.1, attempts=3)
    assert state.completions == 6  # three windows of two fresh streams
    assert state.start_profile == 0  # nothing was profiled, so nothing was half-written
    err = capsys.readouterr().err
    assert "attempt 1 of 3" in err and "attempt 2 of 3" in err and "trying again" in err


def test_attempts_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="attempts"):
        profile_decode_window("http://127.0.0.1:9", tmp_path, batch=1, attempts=0)
