"""Degenerate windows must not read as improvements: a short answer is a failure, a window whose stream
coalesced (whole answers in <= 2 SSE chunks) records no client TPOT or ITL, and a window whose first tokens
reached the client far later than the engine made them is INCONCLUSIVE on its client timing (pure units on the
real ``Perf``)."""

from __future__ import annotations

import pytest

from pytest_moeperf.perf import Perf
from pytest_moeperf.serving.analysis.arbiter import EngineFigures
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, coalesced, compute, delivery_delayed
from pytest_moeperf.serving.analysis.specdecode import AcceptanceStats
from pytest_moeperf.serving.lifecycle.served import SpecWindow
from pytest_moeperf.serving.load.loadgen import ClosedLoop, Endpoint, Request, WindowResult, stream_outcome
from pytest_moeperf.serving.models.profiles import Tolerances
from pytest_moeperf.serving.recording import (
    CLIENT_TIMED,
    FailedRequests,
    batch_shortfall,
    record_serving,
    record_window_facts,
)
from pytest_moeperf.serving.speculation import record_steps


def answer(chunks: int, tokens: int = 64, ttft: float = 0.02, latency: float = 0.40) -> RequestOutcome:
    gaps = tuple([(latency - ttft) / (chunks - 1)] * (chunks - 1)) if chunks > 1 else ()
    return RequestOutcome(success=True, prompt_tokens=128, output_tokens=tokens, ttft_s=ttft, latency_s=latency,
                          itl_s=gaps)  # fmt: skip


def window(outcomes: list[RequestOutcome]) -> WindowResult:
    return WindowResult(ClosedLoop(1), tuple(outcomes), 2.0, compute(outcomes, 2.0), Endpoint.COMPLETIONS)


def recorded(outcomes: list[RequestOutcome]) -> tuple[dict[str, list[float]], dict[str, object]]:
    perf = Perf("t")
    record_serving(perf, window(outcomes))
    return {m.name: list(m.samples) for m in perf.records}, dict(perf.records[-1].context)


def test_a_window_that_streams_records_client_tpot_and_itl() -> None:
    metrics, context = recorded([answer(64) for _ in range(6)])
    assert metrics["tpot_ms"][0] == pytest.approx(380 / 63) and metrics["itl_mean_ms"][0] == pytest.approx(380 / 63)
    assert "client_timing" not in context


def test_a_coalesced_window_records_no_client_tpot_or_itl_and_says_why() -> None:
    # whole answers in one chunk: TTFT == E2EL, TPOT (E2EL - TTFT)/(n - 1) = 0 and no ITL, which read as a speed-up
    lumped = [answer(1, ttft=0.4) for _ in range(4)] + [answer(2, ttft=0.39), answer(64)]
    metrics, context = recorded(lumped)
    assert "tpot_ms" not in metrics and "itl_mean_ms" not in metrics
    assert "5 of 6 answers arrived in <= 2 SSE chunks" in str(context["client_timing"])
    assert {"ttft_ms", "e2el_ms", "output_throughput", "failed_rate"} <= set(metrics)


def test_a_few_lumped_answers_do_not_silence_the_window() -> None:
    assert coalesced([answer(1)] * 2 + [answer(40)] * 4) is None


def test_a_short_answer_is_a_failure_not_a_fast_success() -> None:
    req = Request(prompt=(1, 2, 3), max_tokens=64, prompt_tokens=3)
    usage = {"completion_tokens": 17, "prompt_tokens": 3}
    short = stream_outcome(req, sent=0.0, chunks=17, ttft_s=0.01, latency_s=0.1, itl_s=[0.005] * 16, usage=usage)
    assert not short.success and "17 of 64 requested tokens" in short.error
    full = stream_outcome(req, sent=0.0, chunks=64, ttft_s=0.01, latency_s=0.4, itl_s=[0.006] * 63,
                          usage={"completion_tokens": 64})  # fmt: skip
    assert full.success and full.output_tokens == 64 and full.chunks == 64
    with pytest.raises(FailedRequests, match="short answer: 17 of 64"):
        record_serving(Perf("t"), window([full, short]))


def test_an_answer_that_may_end_early_is_not_short() -> None:
    req = Request(prompt="hi", max_tokens=64, ignore_eos=False)
    done = stream_outcome(req, sent=0.0, chunks=5, ttft_s=0.01, latency_s=0.05, itl_s=[0.01] * 4,
                          usage={"completion_tokens": 5})  # fmt: skip
    assert done.success and done.output_tokens == 5


def test_answers_in_bursts_of_several_chunks_are_coalesced_against_the_engines_tpot() -> None:
    """Seen in a clean-clone CI run on 2 cores: client TPOT 0.025 ms against the engine's 6.8 ms, TTFT 33 -> 206 ms
    read REGRESSED, and the chunk rule did not fire (answers came in >= 3 chunks, all at once after the first)."""
    bursts = [answer(4, ttft=0.6, latency=0.6016) for _ in range(6)]
    assert coalesced(bursts) is None  # the chunk count alone cannot tell
    assert "below 0.1 of the engine's 6.8 ms" in str(coalesced(bursts, engine_tpot_ms=6.8))
    perf = Perf("t")
    from pytest_moeperf.serving.recording import record_latencies

    record_latencies(perf, window(bursts), Tolerances(), e2el=False, engine_tpot_ms=6.8)
    assert "tpot_ms" not in {m.name for m in perf.records} and "below 0.1" in perf.unusable[0]
    assert coalesced([answer(64) for _ in range(6)], engine_tpot_ms=6.8) is None  # streams at the engine's pace


def test_a_serving_window_in_bursts_is_told_by_the_engines_tpot_too() -> None:
    """Seen in a clean-clone CI run: chat closed loop on 2 cores, client TTFT 31 -> 401 ms (= E2EL), TPOT 0.013 ms,
    every answer in >= 3 chunks; ``record_serving`` did not pass the engine's TPOT on, and TTFT read REGRESSED."""
    bursts = [answer(4, ttft=0.401, latency=0.4018) for _ in range(6)]
    perf = Perf("t")
    record_serving(perf, window(bursts), engine_tpot_ms=7.5)
    assert "tpot_ms" not in {m.name for m in perf.records} and "below 0.1 of the engine's 7.5 ms" in perf.unusable[0]
    assert {"ttft_ms", "e2el_ms", "output_throughput"} <= {m.name for m in perf.records}  # shown, INCONCLUSIVE
    streaming = Perf("t")
    record_serving(streaming, window([answer(64) for _ in range(6)]), engine_tpot_ms=6.0)
    assert streaming.unusable == () and "tpot_ms" in {m.name for m in streaming.records}


def test_first_tokens_far_later_than_the_engines_ttft_make_the_client_timing_inconclusive() -> None:
    """Seen in a clean-clone CI run: TTFT 51 -> 439 ms REGRESSED while client TPOT 4.5 ms ~ the engine's 4.9 ms, so
    neither coalescing rule fired; reproduced here with a busy loop: client TTFT 433 ms, the engine's 21.7 ms."""
    late = [answer(64, ttft=0.433, latency=0.433 + 63 * 0.0043) for _ in range(6)]
    assert coalesced(late, engine_tpot_ms=4.5) is None  # the rest of each answer streamed at the engine's pace
    reason = str(delivery_delayed(late, engine_ttft_ms=21.7))
    assert "client TTFT median 433 ms" in reason and "the engine's 21.7 ms" in reason
    perf = Perf("t")
    record_serving(perf, window(late), engine_tpot_ms=4.5, engine_ttft_ms=21.7)
    names = {m.name for m in perf.records}
    assert {"ttft_ms", "tpot_ms", "itl_mean_ms", "e2el_ms", "output_throughput"} <= names  # shown, INCONCLUSIVE
    assert all(perf.unusable_for(n) == (reason,) for n in CLIENT_TIMED) and perf.unusable_for("failed_rate") == ()
    assert perf.unusable_for("engine_ttft_mean_ms") == () and perf.unusable_for("acceptance_length") == ()
    assert perf.records[0].name == "ttft_ms" and perf.records[0].context["client_timing"] == reason


def test_a_first_token_within_factor_or_margin_of_the_engines_ttft_is_judged() -> None:
    assert delivery_delayed([answer(64, ttft=0.020)] * 6, engine_ttft_ms=18.0) is None  # streaming: 1.1x
    assert delivery_delayed([answer(64, ttft=0.054)] * 6, engine_ttft_ms=17.2) is None  # 3.1x but only +37 ms
    assert delivery_delayed([answer(64, ttft=0.62, latency=0.9)] * 6, engine_ttft_ms=500.0) is None  # +120 ms, 1.24x
    assert delivery_delayed([answer(64, ttft=0.433)] * 6, engine_ttft_ms=None) is None  # no engine TTFT: no rule
    assert delivery_delayed([], engine_ttft_ms=21.7) is None
    streaming = Perf("t")
    record_serving(streaming, window([answer(64) for _ in range(6)]), engine_tpot_ms=6.0, engine_ttft_ms=18.0)
    assert streaming.unusable == () and "client_timing" not in streaming.records[0].context


def _spec_window(concurrency: int, output_tokens: int, steps: int, accepted_per_draft: float | None) -> SpecWindow:
    outcomes = [answer(64) for _ in range(6)]
    result = WindowResult(ClosedLoop(concurrency), tuple(outcomes), 2.0, compute(outcomes, 2.0), Endpoint.COMPLETIONS)
    acceptance = None if accepted_per_draft is None else AcceptanceStats(
        100, 300, 100 * accepted_per_draft, accepted_per_draft / 3, 1 + accepted_per_draft, ())
    return SpecWindow(result, acceptance, engine=EngineFigures(tpot_ms=1.0, ttft_ms=6.0, output_tokens=output_tokens,
                                                               steps=steps))


def test_a_closed_loop_whose_steps_carried_one_sequence_did_not_measure_its_concurrency() -> None:
    """Seen in the canary_check runs of 2026-12-06 (n-gram, 4 clients, 96 tokens an answer): windows whose answers
    reached the client ~400 ms after the engine's 5-10 ms TTFT read 2304 tokens in 644 steps at acceptance 3.84
    (0.93 sequences a step, tokens a step 3.58), the others 13.8: decided as a x3.8 regression by the gross rule."""
    serial = _spec_window(4, 2304, 644, accepted_per_draft=2.8375)
    reason = str(batch_shortfall(serial))
    assert "0.93 sequences on average, under 0.75 of the 4" in reason
    perf = Perf("t")
    record_window_facts(perf, serial, Tolerances())
    record_steps(perf, serial, Tolerances())
    assert perf.unusable_for("tokens_per_step") == (reason,) and perf.unusable_for("engine_step_ms") == (reason,)
    assert perf.unusable_for("engine_tpot_mean_ms") == (reason,) and perf.unusable_for("output_throughput") == (reason,)
    assert perf.unusable_for("acceptance_length") == ()  # the drafter's acceptance does not depend on the batch
    assert perf.records[-1].context["batch_shortfall"] == reason
    # the same tokens in a quarter of the steps: 3.7 sequences a step, the window stands
    batched = _spec_window(4, 2304, 167, accepted_per_draft=2.8375)
    assert batch_shortfall(batched) is None
    quiet = Perf("t")
    record_window_facts(quiet, batched, Tolerances())
    record_steps(quiet, batched, Tolerances())
    assert quiet.unusable == ()


def test_the_batch_rule_reads_one_token_a_sequence_without_speculation_and_skips_one_client() -> None:
    assert "1.00 sequences" in str(batch_shortfall(_spec_window(4, 2304, 2304, accepted_per_draft=None)))
    assert batch_shortfall(_spec_window(4, 2304, 600, accepted_per_draft=None)) is None  # 3.84 a step
    assert batch_shortfall(_spec_window(1, 2304, 2304, accepted_per_draft=None)) is None  # one client: batch 1 is it
    assert batch_shortfall(_spec_window(4, 2304, 0, accepted_per_draft=None)) is None  # no steps exported: no rule
