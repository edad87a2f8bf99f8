"""Kernel compiles during a window (`pytest_moeperf.serving.analysis.jit`): read from the server's log after a mark, the
warm pass repeated while it compiled, and a window that met compiles made INCONCLUSIVE. vLLM's Triton kernels do not run
on this CPU box, so the log lines are written here in the format vLLM's ``jit_monitor`` uses; the warm pass runs
against a client that appends them (what a GPU server does when a new batch shape meets a new kernel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_moeperf.perf import Perf
from pytest_moeperf.serving.analysis.jit import MAX_WARM_PASSES, Compiles, compiles_since, mark
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, compute
from pytest_moeperf.serving.lifecycle.served import Served, SpecWindow
from pytest_moeperf.serving.lifecycle.server import LaunchedServer
from pytest_moeperf.serving.load.loadgen import ClosedLoop, Endpoint, Request, WindowResult
from pytest_moeperf.serving.models.profiles import ServeProfile
from pytest_moeperf.serving.recording import CLIENT_TIMED, record_window

COMPILE = ("WARNING 12-01 15:20:01 [jit_monitor.py:135] Triton kernel JIT compilation during inference: {kernel} "
           "({{BLOCK_SIZE_M=16}}). This causes a latency spike; consider extending warmup to cover this "
           "shape/config.\n")


def test_compiles_are_counted_after_the_mark_with_their_kernels(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO starting\n" + COMPILE.format(kernel="fused_moe_kernel"))
    start = mark(log)
    assert compiles_since(start) == Compiles(0, ())
    with log.open("a") as fh:
        fh.write("INFO 200 OK\n" + COMPILE.format(kernel="fused_moe_kernel") + COMPILE.format(kernel="_topk_kernel")
                 + "WARNING Triton autotuning during inference: matmul_kernel. This causes a latency spike\n")
    seen = compiles_since(start)
    assert (seen.count, seen.kernels) == (3, ("fused_moe_kernel", "_topk_kernel", "matmul_kernel"))
    assert seen.describe(most=2) == "3 kernel compile(s) (fused_moe_kernel, _topk_kernel and 1 more)"
    assert compiles_since(mark(None)).checked is False  # an attached server: no log here, nothing known
    assert compiles_since(mark(tmp_path / "absent.log")) == Compiles(checked=False)


def outcome(start: float) -> RequestOutcome:
    return RequestOutcome(success=True, prompt_tokens=128, output_tokens=32, ttft_s=0.02, latency_s=0.02 + 31 * 0.006,
                          itl_s=(0.006,) * 31, start_s=start)


def test_a_window_during_which_the_server_compiled_decides_nothing() -> None:
    outcomes = tuple(outcome(i * 0.3) for i in range(40))
    win = WindowResult(ClosedLoop(1), outcomes, 12.0, compute(list(outcomes), 12.0), Endpoint.COMPLETIONS)
    perf = Perf("t::w")
    record_window(perf, SpecWindow(win, None, compiles=Compiles(2, ("fused_moe_kernel",))))
    names = {m.name: m for m in perf.records}
    reasons = perf.unusable_for("tpot_ms")
    assert len(reasons) == 1 and "2 kernel compile(s) (fused_moe_kernel)" in reasons[0]
    assert all(perf.unusable_for(name) == reasons for name in names if name in CLIENT_TIMED)
    assert names["tpot_ms"].context["window_compiles"] == 2
    quiet = Perf("t::quiet")
    record_window(quiet, SpecWindow(win, None, compiles=Compiles(0)))
    assert quiet.unusable_for("tpot_ms") == () and quiet.records[0].context["window_compiles"] == 0


class CompilingClient:
    """Answers a pass at once; its first ``compiling`` passes make the 'server' log a kernel compile each."""

    def __init__(self, log: Path, compiling: int) -> None:
        self.log, self.compiling, self.passes = log, compiling, 0

    def run(self, requests: list[Request], shape: ClosedLoop, **_: object) -> WindowResult:
        self.passes += 1
        if self.passes <= self.compiling:
            with self.log.open("a") as fh:
                fh.write(COMPILE.format(kernel=f"fused_moe_kernel_m{self.passes}"))
        outcomes = tuple(outcome(0.0) for _ in requests)
        return WindowResult(shape, outcomes, 1.0, compute(list(outcomes), 1.0), Endpoint.COMPLETIONS)


def served_with_log(log: Path) -> Served:
    server = LaunchedServer("tiny", ["vllm", "serve"], port=1, log_path=log)
    return Served(profile=ServeProfile(name="tiny", model="m"), server=server, vocab_size=None)


def test_the_warm_pass_repeats_while_the_server_compiles(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    warm = [Request(prompt=(1, 2, 3), max_tokens=4, prompt_tokens=3)] * 8
    client = CompilingClient(log, compiling=1)
    done = served_with_log(log)._warm(client, warm, ClosedLoop(4), log)  # type: ignore[arg-type]
    assert (client.passes, done.passes, done.requests, done.compiles) == (2, 2, 16, 1)  # compiled once, then quiet
    endless = CompilingClient(log, compiling=99)
    done = served_with_log(log)._warm(endless, warm, ClosedLoop(4), log)  # type: ignore[arg-type]
    assert (endless.passes, done.compiles) == (MAX_WARM_PASSES, MAX_WARM_PASSES)  # bounded: the window will say so
    assert done.context()["warm_passes"] == MAX_WARM_PASSES


def test_a_window_that_compiled_was_a_warm_pass_and_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """The warm pass was quiet, the window compiled (its hundreds of requests met a shape the few warm ones did not):
    it counts as a warm pass and runs again; a window that still compiles then is measured as it is (and set aside)."""
    log = tmp_path / "server.log"
    log.write_text("")
    requests = [Request(prompt=(1, 2, 3), max_tokens=4, prompt_tokens=3)] * 8
    for compiling, runs, compiles in ((0, 1, 0), (1, 2, 0), (99, 2, 1)):
        client = CompilingClient(log, compiling)
        monkeypatch.setattr(Served, "client", lambda self, endpoint, c=client: c)
        monkeypatch.setattr(Served, "scrape", lambda self: "")  # no /metrics to read: the client stands in
        window = served_with_log(log).measure(requests, ClosedLoop(4))
        assert (client.passes, window.compiles.count) == (runs, compiles), compiling
        assert window.warm.context().get("warm_passes", 0) == runs - 1
