"""A window is scored on its plateau: its ramp (the first C completions) and drain (the last C) set aside and counted,
its throughputs over the plateau's span, sized so that the plateau holds what the verdicts need; and the client's
mean beside the server's mean of the same plateau, their ratio in every window (pure: synthetic closed loops)."""

from __future__ import annotations

import pytest

from pytest_moeperf.serving.analysis.agreement import AGREE, Agreement, agreements, facts, which_moved
from pytest_moeperf.serving.analysis.arbiter import EngineFigures
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, compute, percentile
from pytest_moeperf.serving.analysis.plateau import edge_of, find, plateau_metrics
from pytest_moeperf.serving.analysis.tails import window_count


def request(start: float, ttft: float, tpot: float, tokens: int = 64) -> RequestOutcome:
    return RequestOutcome(success=True, prompt_tokens=100, output_tokens=tokens, ttft_s=ttft,
                          latency_s=ttft + tpot * (tokens - 1), itl_s=(tpot,) * (tokens - 1), start_s=start)


def closed_loop(clients: int, waves: int) -> list[RequestOutcome]:
    """``clients`` clients, ``waves`` requests each, back to back: the first wave sent together into an idle server
    (TTFT 300 ms, TPOT 8 ms: C prefills at once, then lockstep), the steady waves at 20 ms and 6 ms, the last wave
    answered while the batch drains (4 ms)."""
    out = []
    for client in range(clients):
        t = 0.0
        for wave in range(waves):
            ttft, tpot = (0.3, 0.008) if wave == 0 else (0.02, 0.004) if wave == waves - 1 else (0.02, 0.006)
            o = request(t + client * 1e-4, ttft, tpot)
            out.append(o)
            t = o.start_s + o.latency_s
    return out


def test_the_ramp_and_the_drain_are_set_aside_and_counted() -> None:
    outcomes = closed_loop(4, 6)  # 24 requests: 4 ramp, 16 steady, 4 drain
    plateau = find(outcomes, edge_of(4, outcomes), "4 clients")
    assert (plateau.ramp, plateau.drain, len(plateau.outcomes)) == (4, 4, 16)
    assert {o.ttft_s for o in plateau.outcomes} == {0.02} and {o.itl_s[0] for o in plateau.outcomes} == {0.006}
    assert plateau.facts() == {"plateau": "completions 5-20 of 24 (the first and last 4 set aside: 4 clients)",
                               "plateau_requests": 16, "ramp_requests": 4, "drain_requests": 4,
                               "plateau_s": pytest.approx(round(plateau.duration_s, 3))}
    # the span runs from the 4th completion (the ramp's end) to the 20th
    ends = sorted(o.start_s + o.latency_s for o in outcomes)
    assert (plateau.start_s, plateau.end_s) == (ends[3], ends[19])


def test_a_short_window_is_scored_whole_and_says_so() -> None:
    outcomes = closed_loop(4, 2)
    plateau = find(outcomes, 4)
    assert plateau.whole and len(plateau.outcomes) == 8
    assert plateau.basis == "whole window: 8 requests leave no plateau after 4 at each end"
    whole = compute(outcomes, 2.0)
    assert plateau_metrics(plateau, outcomes, whole) is whole


def test_the_plateau_scores_the_steady_server_not_the_windows_length() -> None:
    """Whole windows of 3 and of 12 waves read different TTFTs of the same server (the ramp's share); their
    plateaus read the same."""
    short, long = closed_loop(8, 3), closed_loop(8, 12)
    whole_short = percentile([o.ttft_s for o in short], 90.0)
    whole_long = percentile([o.ttft_s for o in long], 90.0)
    assert whole_short == pytest.approx(0.3) and whole_long == pytest.approx(0.02)  # the ramp is a third, or 1/12
    steady = [find(w, 8) for w in (short, long)]
    assert [percentile([o.ttft_s for o in p.outcomes], 90.0) for p in steady] == [0.02, 0.02]


def test_throughputs_are_over_the_plateaus_span() -> None:
    outcomes = closed_loop(4, 10)
    plateau = find(outcomes, 4)
    whole = compute(outcomes, max(o.start_s + o.latency_s for o in outcomes))
    scored = plateau_metrics(plateau, outcomes, whole)
    assert scored.completed == 32 and scored.duration_s == pytest.approx(plateau.duration_s)
    assert scored.request_throughput == pytest.approx(32 / plateau.duration_s)
    # in steady state 4 requests of 64 tokens every 20 + 63 x 6 ms: 4 x 64 / 0.398 s
    assert scored.output_throughput == pytest.approx(4 * 64 / (0.02 + 63 * 0.006), rel=0.05)
    assert whole.output_throughput < scored.output_throughput  # the slow ramp weighs on the whole window
    assert scored.failed == whole.failed and scored.tpot_ms.median == pytest.approx(6.0)


def test_an_open_loops_edge_is_its_requests_in_flight() -> None:
    outcomes = [request(i * 0.1, 0.02, 0.006) for i in range(50)]  # 0.4 s each, ten a second: ~4 in flight
    assert edge_of(0, outcomes) == 4 and edge_of(16, outcomes) == 16


def test_windows_are_sized_for_their_plateau_and_edges() -> None:
    assert window_count(29, (90.0,), False, edge=1, blocks=10) == 31  # p90's 29 + the ramp and the drain
    assert window_count(29, (90.0,), False, edge=16, blocks=10) == 192  # 10 drift blocks of 16 + 2 x 16
    assert window_count(29, (90.0, 99.0), False, edge=64, blocks=10) == 768  # 640 on the plateau also bound p99
    assert window_count(29, (90.0,), False, edge=4) == 37
    assert window_count(29, (90.0,), True, edge=4, blocks=10) == 22  # quick: half the plateau, nothing raised


def test_the_client_and_the_server_compare_means_with_means() -> None:
    steady = [request(i, 0.020, 0.0060) for i in range(10)] + [request(10, 0.020, 0.0170)]  # one slow answer
    engine = EngineFigures(ttft_ms=20.0, tpot_ms=7.0)
    tpot, ttft = agreements(steady, engine)
    assert tpot.client_ms == pytest.approx(7.0) and tpot.ratio == pytest.approx(1.0)  # the mean sees the slow one
    assert percentile([o.tpot_s * 1000 for o in steady if o.tpot_s], 50.0) == pytest.approx(6.0)  # the median not
    assert ttft.ratio == pytest.approx(1.0) and not tpot.outside
    assert facts([tpot, ttft]) == {"tpot_client_server": 1.0, "ttft_client_server": 1.0, "client_server": None}
    off = Agreement("tpot", 7.35, 7.0)
    assert off.outside and AGREE == 0.03
    assert facts([off])["client_server"] == "TPOT client mean / server mean 1.050, outside ±3 %"
    assert agreements(steady, EngineFigures()) == []  # a server without the histograms: no ratio


def test_which_side_moved_is_the_one_that_moved_against_its_baseline() -> None:
    assert which_moved(1.01, 0.2, 0.2) == "agree"
    assert which_moved(1.05, 0.052, 0.002).startswith("client moved (client +5.2 %, server +0.2 %")
    assert which_moved(0.95, 0.001, 0.053).startswith("server moved")
    assert which_moved(1.05, None, 0.01) == "no baseline of both: cannot tell which moved"
