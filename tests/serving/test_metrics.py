"""Serving metric arithmetic against hand-computed values (vllm bench serve definitions)."""

from __future__ import annotations

import pytest

from pytest_moeperf.serving.analysis.metrics import RequestOutcome, Slo, compute, distribution, percentile


def ok(ttft: float, latency: float, out: int, itl: tuple[float, ...] = (), prompt: int = 10) -> RequestOutcome:
    return RequestOutcome(
        success=True, prompt_tokens=prompt, output_tokens=out, ttft_s=ttft, latency_s=latency, itl_s=itl
    )


def test_percentile_interpolates_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile([], 50) == 0.0
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_distribution_uses_population_std() -> None:
    s = distribution([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert s.mean == 5.0 and s.std == 2.0 and s.median == 4.5 and s.count == 8
    with pytest.raises(KeyError):
        s.p(75)


def test_tpot_excludes_first_token_and_single_token_requests() -> None:
    assert ok(0.1, 1.1, 11).tpot_s == pytest.approx(0.1)
    assert ok(0.1, 0.1, 1).tpot_s is None
    assert RequestOutcome(success=False, prompt_tokens=3, error="x").tpot_s is None


def test_compute_window() -> None:
    outcomes = [
        ok(0.10, 1.10, 11, itl=(0.1,) * 10),
        ok(0.30, 2.30, 21, itl=(0.1,) * 20),
        RequestOutcome(success=False, prompt_tokens=10, error="HTTP 500"),
    ]
    m = compute(outcomes, duration_s=4.0)
    assert (m.completed, m.failed) == (2, 1)
    assert m.failed_rate == pytest.approx(1 / 3)
    assert m.errors == ("HTTP 500",)
    assert m.request_throughput == 0.5
    assert m.output_throughput == (11 + 21) / 4.0
    assert m.total_token_throughput == (20 + 32) / 4.0  # failed requests' prompts are not counted
    assert m.ttft_ms.mean == pytest.approx(200.0)
    assert m.tpot_ms.mean == pytest.approx(100.0)
    assert m.itl_ms.count == 30 and m.itl_ms.median == pytest.approx(100.0)
    assert m.e2el_ms.p(99) == pytest.approx(1100 + 1200 * 0.99)
    assert m.request_goodput is None


def test_goodput_counts_requests_meeting_every_slo() -> None:
    outcomes = [ok(0.05, 0.55, 11), ok(0.5, 1.0, 11), ok(0.05, 2.05, 11), ok(0.05, 0.05, 1)]
    # TPOTs: 50 ms, 50 ms, 200 ms, 0 (one token counts as 0 for goodput, as in vLLM)
    m = compute(outcomes, duration_s=2.0, slo=Slo(ttft_ms=100, tpot_ms=100))
    assert m.request_goodput == 2 / 2.0
    m = compute(outcomes, duration_s=2.0, slo=Slo(e2el_ms=1000))
    assert m.request_goodput == 3 / 2.0
    with pytest.raises(ValueError, match="ttft_ms"):
        Slo(ttft_ms=0)


def test_compute_rejects_empty_window() -> None:
    with pytest.raises(ValueError):
        compute([], duration_s=0.0)
