"""The start-up test's metrics (pytester sessions of the real plugin, starts read from logs): every phase a start's
log shows is a metric; the total and the phases a warm compile cache shortens are named by the cache's state, so a
cold start is never compared with a warm one, and a baseline keeps both."""

from __future__ import annotations

import pytest

from pytest_moeperf.serving.recording import startup_names

START = """
import time
import pytest
from pytest_moeperf.serving.lifecycle.served import Served
from pytest_moeperf.serving.lifecycle.server import AttachedServer
from pytest_moeperf.serving.lifecycle.startlog import parse_start
from pytest_moeperf.serving.lifecycle.starts import StartInfo
from pytest_moeperf.serving.models.profiles import ServeProfile
from pytest_moeperf.serving.recording import record_startup

STATE = {state!r}
E = "(EngineCore pid=2) INFO 12-02"
LINES = [
    "(APIServer pid=1) INFO 12-02 10:00:20 [api_utils.py:273] non-default args: {{}}",
    "(APIServer pid=1) INFO 12-02 10:00:26 [model.py:623] Resolved architecture: Qwen3MoeForCausalLM",
    "(APIServer pid=1) INFO 12-02 10:00:26 [vllm.py:1110] Asynchronous scheduling is enabled.",
    E + " 10:00:41 [core.py:117] Initializing a V1 LLM engine (v0.26.0) with config: x",
    E + " 10:00:44 [gpu_model_runner.py:5251] Starting to load model /m...",
    E + " 10:00:45 [gpu_model_runner.py:5348] Model loading took 0.07 GiB memory and 0.5 seconds",
    *([E + " 10:00:47 [decorators.py:312] Directly load AOT compilation from path /c"] if STATE in
      ("warm", "partial") else []),
    *([E + " 10:01:00 [backends.py:393] Compiling a graph for compile range x takes 9 s"] if STATE in
      ("cold", "partial") else []),
    E + " 10:01:04 [monitor.py:53] torch.compile took {compile} s in total",
    E + " 10:01:13 [gpu_model_runner.py:6845] Graph capturing finished in 3 secs, took 0.2 GiB",
    E + " 10:01:14 [core.py:333] init engine (profile, create kv cache, warmup model) took "
    "{init} s",
]

def test_startup(perf):
    launched = time.mktime(time.strptime("2026-12-02 10:00:00", "%Y-%m-%d %H:%M:%S"))
    start = StartInfo(log=parse_start("\\n".join(LINES), launched, {total}))
    served = Served(profile=ServeProfile(name="p", model="tiny-moe", device="cuda"), server=AttachedServer("http://x"),
                    vocab_size=None, startup_s={total}, start=start)
    record_startup(perf, served)
"""


def test_names_by_compile_cache_state() -> None:
    for state, total in (("cold", "startup_cold_s"), ("warm", "startup_warm_s"), ("none", "startup_s"),
                         (None, "startup_s"), ("partial", "startup_partial_s")):
        name, phase = startup_names(state)
        assert name == total
        assert phase("imports") == "startup_imports_s"
        suffix = f"_{state}" if state in ("cold", "warm", "partial") else ""
        assert phase("compile") == f"startup_compile{suffix}_s"
        assert phase("engine_init") == f"startup_engine_init{suffix}_s"
        assert phase("model_config") == f"startup_model_config{suffix}_s"
        assert phase("graphs") == f"startup_graphs{suffix}_s"
        assert phase("engine_start") == "startup_engine_start_s"


def _session(pytester: pytest.Pytester, run_moeperf, state: str, *args: str):  # type: ignore[no-untyped-def]
    compile_s, init = ("18.95", "29.60") if state == "cold" else ("3.10", "13.20")
    total = "77.5"  # the stamps are the same: only vLLM's figures differ
    pytester.makepyfile(test_once=START.format(state=state, compile=compile_s, init=init, total=total))
    return run_moeperf("-p", "no:randomly", *args)


def test_a_baseline_keeps_cold_and_warm_starts_apart(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    cold = _session(pytester, run_moeperf, "cold", "--moeperf-update")
    cold.assert_outcomes(passed=1)
    cold.stdout.fnmatch_lines(["*::startup_cold_s * s *77.5*", "*::startup_imports_s * s *20*",
                               "*::startup_weights_s * s *0.5*", "*::startup_compile_cold_s * s *18.95*",
                               "*::startup_graphs_cold_s * s *3*", "*::startup_engine_init_cold_s * s *29.6*"])
    # a warm start of the same test: its own names (NEW), no comparison with the cold ones, no failure
    warm = _session(pytester, run_moeperf, "warm")
    warm.assert_outcomes(passed=1)
    warm.stdout.fnmatch_lines(["*::startup_warm_s * s *77.5*NEW", "*::startup_imports_s * s *PASS",
                               "*::startup_compile_warm_s * s *3.1*NEW", "*::startup_graphs_warm_s * s *3*NEW",
                               "*::startup_engine_init_warm_s * s *13.2*NEW",
                               # the cold start's own figures belong to another state: noted, not MISSING
                               "*5 baselined metric(s) of another state than this run measured*compile cache cold*"])
    assert "REGRESSED" not in warm.stdout.str() and "INCONCLUSIVE" not in warm.stdout.str()
    assert not [line for line in warm.stdout.lines if line.rstrip().endswith("MISSING")]
    # so a strict session of warm starts against a baseline that also holds a cold start passes
    _session(pytester, run_moeperf, "warm", "--moeperf-update")
    strict = _session(pytester, run_moeperf, "warm", "--moeperf-strict")
    assert strict.ret == 0, strict.stdout.str()


def test_a_metric_of_the_state_measured_is_still_missing(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    """Only another state's metrics are excused: a warm start whose compile phase is gone from the log misses it."""
    _session(pytester, run_moeperf, "warm", "--moeperf-update").assert_outcomes(passed=1)
    pytester.makepyfile(test_once=pytester.path.joinpath("test_once.py").read_text().replace(
        'E + " 10:01:04 [monitor.py:53] torch.compile took 3.10 s in total",', ""))
    again = run_moeperf("-p", "no:randomly")
    again.stdout.fnmatch_lines(["*::startup_compile_warm_s * MISSING*"])


def test_a_stored_partial_start_is_not_missing_later(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    """Seen on 1x H200 (Kimi rank): a record of a partial start (part of the graphs compiled) and warm ones, then
    a session of warm starts: the partial start's figures are another state's, not MISSING."""
    partial = _session(pytester, run_moeperf, "partial", "--moeperf-update")
    partial.assert_outcomes(passed=1)
    partial.stdout.fnmatch_lines(["*::startup_partial_s * s *77.5*", "*::startup_compile_partial_s * s *3.1*"])
    _session(pytester, run_moeperf, "warm", "--moeperf-update").assert_outcomes(passed=1)
    warm = _session(pytester, run_moeperf, "warm", "--moeperf-strict")
    assert warm.ret == 0, warm.stdout.str()
    assert not [line for line in warm.stdout.lines if line.rstrip().endswith("MISSING")]
    warm.stdout.fnmatch_lines(["*baselined metric(s) of another state than this run measured*compile cache partial*"])
