"""What a measured window records besides its latencies (pure units on the real ``Perf``): the warm pass's size and
cost, the drift check (first against last quarter), the server's own figures (``engine_*``) and the tail
percentiles with their order-statistic bounds, and the verdict rule for those tails."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pytest_moeperf.judging.stats import quantile_bound_ranks
from pytest_moeperf.judging.thresholds import Reference, Threshold
from pytest_moeperf.judging.verdict import Status, judge
from pytest_moeperf.perf import Perf
from pytest_moeperf.serving.analysis.arbiter import EngineFigures, engine_figures
from pytest_moeperf.serving.analysis.drift import DEFAULT_MIN_EFFECT, check_drift, in_flight, rank_test
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, compute
from pytest_moeperf.serving.analysis.plateau import find
from pytest_moeperf.serving.analysis.prometheus import parse
from pytest_moeperf.serving.analysis.tails import judge_tail, requests_needed, tail_bound
from pytest_moeperf.serving.lifecycle.served import SpecWindow
from pytest_moeperf.serving.load.loadgen import ClosedLoop, Endpoint, OpenLoop, Request, WindowResult
from pytest_moeperf.serving.load.warm import ALREADY_WARM, WarmPass, shape_key, warm_count
from pytest_moeperf.serving.models.profiles import Tolerances
from pytest_moeperf.serving.recording import CLIENT_TIMED, record_latencies, record_window


def answer(start: float, ttft: float = 0.02, tpot: float = 0.006, tokens: int = 64) -> RequestOutcome:
    gaps = (tpot,) * (tokens - 1)
    return RequestOutcome(success=True, prompt_tokens=128, output_tokens=tokens, ttft_s=ttft,
                          latency_s=ttft + tpot * (tokens - 1), itl_s=gaps, start_s=start)  # fmt: skip


def jitter(rng: random.Random, value: float) -> float:
    return value * rng.uniform(0.95, 1.05)


def window(outcomes: list[RequestOutcome]) -> WindowResult:
    return WindowResult(ClosedLoop(1), tuple(outcomes), 10.0, compute(outcomes, 10.0), Endpoint.COMPLETIONS)


# ------------------------------------------------------------------------------------------------ warm pass
def test_the_warm_pass_has_the_windows_shape_and_reaches_its_batches() -> None:
    assert warm_count(ClosedLoop(1), 48, floor=8) == 8
    assert warm_count(ClosedLoop(16), 299, floor=8) == 32  # two waves of 16: prefills together, full batch, drain
    assert warm_count(OpenLoop(4.0), 48, floor=2) == 12  # a quarter of the window at the window's own rate
    ids = [Request(prompt=(1, 2, 3), max_tokens=8, prompt_tokens=3)]
    other_ids = [Request(prompt=(9, 9, 9), max_tokens=8, prompt_tokens=3)]
    assert shape_key(ids, ClosedLoop(4), Endpoint.COMPLETIONS) == shape_key(other_ids, ClosedLoop(4),
                                                                            Endpoint.COMPLETIONS)  # fmt: skip
    assert shape_key(ids, ClosedLoop(4), Endpoint.COMPLETIONS) != shape_key(ids, ClosedLoop(8), Endpoint.COMPLETIONS)
    text = [Request(prompt="hello", max_tokens=8)]
    assert shape_key(text, ClosedLoop(4), Endpoint.CHAT) != shape_key(ids, ClosedLoop(4), Endpoint.CHAT)
    assert WarmPass(32, 1.23456, 0).context() == {"warm_requests": 32, "warm_s": 1.235, "warm_failed": 0,
                                                  "warm_passes": 1, "warm_compiles": None}
    assert WarmPass(0, note=ALREADY_WARM).context()["warm"].startswith("none: this server already ran a pass")


# ------------------------------------------------------------------------------------------------ drift
def test_a_steady_window_does_not_drift_and_says_what_it_compared() -> None:
    rng = random.Random(1)
    steady = [answer(i * 0.5, ttft=jitter(rng, 0.02), tpot=jitter(rng, 0.006)) for i in range(48)]
    check = check_drift(steady, ramp=1, min_effects={})
    assert check.part == 11 and not check.drifted and check.reason() is None
    facts = check.facts()
    assert facts["drift"] == "none (first vs last 11 of 46 requests)"
    assert set(facts) >= {"drift_ttft_ratio", "drift_ttft_p", "drift_tpot_ratio", "drift_tpot_p"}


def test_a_server_that_warmed_up_during_the_window_drifts() -> None:
    """As on 1x H200: the first requests met just-in-time compiles (TTFT 745 ms), the later ones did not (35 ms)."""
    rng = random.Random(2)
    cold = [answer(i * 0.5, ttft=jitter(rng, 0.745)) for i in range(16)]
    warm = [answer((16 + i) * 0.5, ttft=jitter(rng, 0.035)) for i in range(32)]
    check = check_drift(cold + warm, ramp=1, min_effects={"ttft": 0.05})
    (moved,) = check.drifted
    assert moved.metric == "ttft" and moved.ratio < 0.1 and moved.p < 0.01
    reason = str(check.reason())
    assert "the window drifted" in reason and "TTFT" in reason and "first vs last 11 of 46 requests" in reason
    perf = Perf("t")
    steady = find(cold + warm, 1)  # as Served.measure scores it: the first and the last completion set aside
    result = SpecWindow(window(list(steady.outcomes)), None, EngineFigures(ttft_ms=30.0, tpot_ms=6.0),
                        WarmPass(2, 0.5), plateau=steady)
    record_window(perf, result, Tolerances(ttft=0.05))
    assert perf.unusable_for("ttft_ms") == (reason,) and perf.unusable_for("output_throughput") == (reason,)
    assert perf.unusable_for("engine_ttft_mean_ms") == () and perf.unusable_for("failed_rate") == ()
    assert perf.records[0].context["warm_requests"] == 2 and perf.records[0].context["drift"] == "drifted"


def test_a_small_significant_move_within_the_minimum_effect_is_not_drift() -> None:
    first = [answer(i, ttft=0.0200 + i * 1e-6) for i in range(12)]
    last = [answer(12 + i, ttft=0.0204 + i * 1e-6) for i in range(12)]  # +2 %, every request: p tiny
    check = check_drift(first + last, ramp=0, min_effects={"ttft": 0.10})
    (ttft,) = [d for d in check.checks if d.metric == "ttft"]
    assert ttft.p < 0.01 and not ttft.drifted
    assert DEFAULT_MIN_EFFECT == 0.05 and check_drift(first + last, ramp=0, min_effects={}).drifted == ()


def test_the_ramp_is_left_out_and_small_windows_are_not_checked() -> None:
    # a closed loop's first C requests prefill together and its last C finish in a draining batch
    ramp_up = [answer(0.0, ttft=0.5) for _ in range(8)]
    middle = [answer(1.0 + i * 0.1) for i in range(40)]
    drain = [answer(9.0 + i * 0.01, tpot=0.002) for i in range(8)]
    assert check_drift(ramp_up + middle + drain, ramp=8, min_effects={}).drifted == ()
    assert check_drift(ramp_up + middle + drain, ramp=0, min_effects={}).drifted != ()
    small = check_drift([answer(i) for i in range(17)], ramp=4, min_effects={})
    assert small.skipped.startswith("17 requests leave 9 requests after 4 ramp request(s) at each end; the check "
                                    "needs 10") and small.checks == ()
    # 10 to 19 steady requests: the first and the last 5 (halves at 10), not quarters of fewer than 5
    assert check_drift([answer(i) for i in range(18)], ramp=4, min_effects={}).part == 5
    assert small.facts() == {"drift": f"not checked: {small.skipped}"}


def closed_loop(rng: random.Random, concurrency: int, count: int, batch_factor: list[float]) -> list[RequestOutcome]:
    """A closed loop's requests in send order, each block of ``concurrency`` sharing its batch's factor."""
    return [answer(i * 0.01, ttft=jitter(rng, 0.02) * batch_factor[i // concurrency],
                   tpot=jitter(rng, 0.0025) * batch_factor[i // concurrency]) for i in range(count)]


def test_concurrent_requests_that_share_a_batch_are_one_observation() -> None:
    """As on 1x H200 at c=16 (100-request windows): whole batches moved (TPOT x0.72 to x1.59 first to last quarter,
    either way, every request of one quarter beyond every request of the other); the server had not changed."""
    rng = random.Random(4)
    c = 16
    factors = [rng.uniform(0.75, 1.3) for _ in range(40)]  # each batch its own luck, no trend
    flagged = per_request = 0
    for start in range(0, 20):
        outcomes = closed_loop(rng, c, 12 * c, factors[start:start + 12])
        flagged += bool(check_drift(outcomes, ramp=c, block=c, min_effects={}).drifted)
        per_request += bool(check_drift(outcomes, ramp=c, min_effects={}).drifted)
    assert flagged == 0 and per_request >= 10  # a request a sample reads such luck as drift, a block a sample not
    short = check_drift(closed_loop(rng, c, 100, [1.0] * 7), ramp=c, block=c, min_effects={})
    assert short.skipped.startswith("100 requests leave 4 blocks of 16 requests (requests in flight together share "
                                    "a batch: a block is one observation) after 16 ramp request(s) at each end")
    # a server that changes does drift, block by block: 20 blocks, the first 8 at 1.4x
    trend = [1.4] * 8 + [1.0] * 12
    moved = check_drift(closed_loop(rng, c, 22 * c, [1.0] + trend + [1.0]), ramp=c, block=c, min_effects={})
    assert {d.metric for d in moved.drifted} == {"ttft", "tpot"} and moved.part == 5 and moved.blocks == 20
    assert "first vs last 5 of 20 blocks of 16 requests, each block one observation" in str(moved.reason())


def test_an_open_loop_blocks_by_what_it_has_in_flight() -> None:
    assert in_flight([answer(i * 1.0) for i in range(10)]) == 1  # 0.4 s requests a second apart
    assert in_flight([answer(i * 0.1) for i in range(50)]) == 4  # 0.4 s each, ten a second: ~4 at once (Little)
    assert in_flight([]) == 1
    with pytest.raises(ValueError, match="block must be >= 1"):
        check_drift([], ramp=0, block=0, min_effects={})


def test_the_rank_test_is_exact_for_small_samples_and_normal_beyond() -> None:
    assert rank_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)  # all apart: 2 / C(10, 5)
    assert rank_test([1, 2, 3], [1, 2, 3]) == 1.0
    rng = random.Random(3)
    same = [rng.random() for _ in range(60)], [rng.random() for _ in range(60)]
    shifted = [rng.random() + 0.5 for _ in range(60)]
    assert rank_test(*same) > 0.05 and rank_test(same[0], shifted) < 1e-6
    # the normal approximation agrees with the exact test where both apply (20 x 20 = the exact limit)
    x, y = [rng.gauss(0, 1) for _ in range(20)], [rng.gauss(0.8, 1) for _ in range(20)]
    exact = rank_test(x, y)
    approx = rank_test(x + x, y + y)  # 40 x 40: approximated; doubling the data makes it more significant
    assert exact < 0.05 and approx < exact


# ------------------------------------------------------------------------------------------------ arbiter
def histogram(name: str, total: float, count: int) -> str:
    return f"# TYPE {name} histogram\n{name}_sum{{engine=\"0\"}} {total}\n{name}_count{{engine=\"0\"}} {count}\n"


def exposition(scale: float, requests: int, tokens: int) -> str:
    return "".join([
        histogram("vllm:time_to_first_token_seconds", 0.02 * requests * scale, requests),
        histogram("vllm:request_time_per_output_token_seconds", 0.006 * requests * scale, requests),
        histogram("vllm:inter_token_latency_seconds", 0.006 * tokens * scale, tokens),
        histogram("vllm:e2e_request_latency_seconds", 0.4 * requests * scale, requests),
        histogram("vllm:request_queue_time_seconds", 0.0001 * requests * scale, requests),
        f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{engine=\"0\"}} {tokens}\n",
    ])  # fmt: skip


def test_the_servers_figures_are_its_histogram_means_over_the_window() -> None:
    before, after = parse(exposition(1.0, 10, 640)), parse(exposition(1.5, 30, 1920))  # 20 requests in the window
    figures = engine_figures(before, after)
    # (0.02 * 30 * 1.5 - 0.02 * 10) / 20 = 0.035 s
    assert figures.ttft_ms == pytest.approx(35.0) and figures.tpot_ms == pytest.approx(10.5)
    assert figures.itl_ms == pytest.approx(10.5) and figures.e2el_ms == pytest.approx(700.0)
    assert figures.queue_ms == pytest.approx(0.175)
    assert (figures.requests, figures.output_tokens) == (20, 1280)
    assert set(figures.metrics()) == {"engine_ttft_mean_ms", "engine_tpot_mean_ms", "engine_itl_mean_ms",
                                      "engine_e2el_mean_ms", "engine_queue_mean_ms"}
    renamed = parse(exposition(1.5, 30, 1920).replace("inter_token_latency", "time_per_output_token"))
    assert engine_figures(before, renamed).itl_ms is None  # the old name on one side only: nothing to subtract
    old = parse(exposition(1.0, 10, 640).replace("inter_token_latency", "time_per_output_token"))
    assert engine_figures(old, renamed).itl_ms == pytest.approx(10.5)  # an older vLLM's name
    assert engine_figures(before, before) == EngineFigures(requests=0, output_tokens=0)  # nothing observed


def test_engine_figures_are_metrics_that_stand_when_the_client_timing_does_not() -> None:
    lumped = [answer(i * 0.1, ttft=0.4, tpot=0.00001) for i in range(8)]  # the stream came in bursts
    perf = Perf("t")
    engine = EngineFigures(ttft_ms=20.0, tpot_ms=6.0, itl_ms=6.0, e2el_ms=400.0, queue_ms=0.02, requests=8,
                           output_tokens=512)
    record_window(perf, SpecWindow(window(lumped), None, engine), Tolerances())
    names = {m.name: m for m in perf.records}
    assert {"engine_ttft_mean_ms", "engine_tpot_mean_ms", "engine_itl_mean_ms", "engine_e2el_mean_ms",
            "engine_queue_mean_ms"} <= set(names)
    assert names["engine_queue_mean_ms"].abs_tolerance == 1.0  # microseconds of queueing: no relative change counts
    assert all(perf.unusable_for(n) == () for n in names if n.startswith("engine_"))
    assert perf.unusable_for("ttft_ms") != () and names["ttft_ms"].context["engine_output_tokens"] == 512


# ------------------------------------------------------------------------------------------------ tails
def test_windows_are_sized_from_the_percentiles_they_gate() -> None:
    assert (requests_needed(90.0), requests_needed(99.0)) == (29, 299)


def test_a_tail_is_recorded_with_its_bounds_and_gated_only_when_bounded() -> None:
    rng = random.Random(4)
    outcomes = [answer(i, ttft=rng.uniform(0.01, 0.05)) for i in range(40)]
    perf = Perf("t")
    record_latencies(perf, window(outcomes), Tolerances(), e2el=True, tails=(90.0, 99.0))
    rec = {m.name: m for m in perf.records}
    assert {"ttft_p90_ms", "ttft_p99_ms", "itl_p90_ms", "itl_p99_ms", "e2el_p90_ms", "e2el_p99_ms"} <= set(rec)
    p90 = rec["ttft_p90_ms"]
    ordered = sorted(o.ttft_s * 1000 for o in outcomes)
    low, high = quantile_bound_ranks(40, 0.9, 0.95)
    assert low is not None and high is not None
    assert p90.context["tail_ci_low"] == ordered[low - 1] and p90.context["tail_ci_high"] == ordered[high - 1]
    assert p90.context["tail_requests_needed"] == 29 and perf.unusable_for("ttft_p90_ms") == ()
    (why,) = perf.unusable_for("ttft_p99_ms")
    assert "40 requests cannot bound the p99 at 95 %" in why and "n >= 299" in why and "not gated" in why
    # ITL pools 63 gaps a request (2520 samples here): its p99 has bounds, but 40 requests are what count
    assert rec["itl_p99_ms"].context["tail_samples"] == 2520 and perf.unusable_for("itl_p99_ms") != ()
    assert set(perf.unusable_for("e2el_p99_ms")) == {why.replace("ttft", "e2el")}
    assert {f"{m}_p{p}_ms" for m in ("ttft", "itl", "e2el") for p in (90, 99)} <= set(CLIENT_TIMED)


def test_a_coalesced_window_has_no_itl_tail() -> None:
    lumped = [RequestOutcome(success=True, prompt_tokens=8, output_tokens=64, ttft_s=0.4, latency_s=0.4,
                             start_s=float(i)) for i in range(30)]  # fmt: skip
    perf = Perf("t")
    record_latencies(perf, window(lumped), Tolerances(), e2el=True, tails=(90.0,))
    names = {m.name for m in perf.records}
    assert "itl_p90_ms" not in names and {"ttft_p90_ms", "e2el_p90_ms"} <= names
    assert perf.unusable_for("ttft_p90_ms") != ()  # coalesced: every client-timed metric INCONCLUSIVE


def tail_verdict(value: float, low: float, high: float, reference: float = 100.0) -> tuple[Status, str]:
    bound = tail_bound("ttft", [low, value, high], 90.0, 100)
    context = dataclasses.replace(bound, low=low, high=high).context()
    plain = judge("k", "ttft_p90_ms", "ms", "lower", [(value,)] * 2, Reference((reference,) * 5), Threshold(0.05))
    verdict = judge_tail(plain, context)
    return verdict.status, verdict.reason


def test_a_tail_regression_needs_the_windows_bound_beyond_the_threshold() -> None:
    status, reason = tail_verdict(130.0, low=121.0, high=140.0)
    assert status is Status.REGRESSED and "95 % bound 121 is beyond the threshold too" in reason
    status, reason = tail_verdict(130.0, low=101.0, high=170.0)  # the point moved, the window cannot tell
    assert status is Status.INCONCLUSIVE and "lower bound of the percentile, 101 ms, is within 5.0 %" in reason
    status, reason = tail_verdict(70.0, low=60.0, high=99.0)  # better, but the upper bound reaches the baseline
    assert status is Status.INCONCLUSIVE and "upper bound" in reason
    assert tail_verdict(70.0, low=60.0, high=80.0)[0] is Status.IMPROVED
    assert tail_verdict(102.0, low=60.0, high=300.0)[0] is Status.PASS  # within the threshold: PASS stands
