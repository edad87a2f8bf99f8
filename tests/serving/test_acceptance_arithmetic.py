"""Acceptance arithmetic from counter deltas; the draft comparison table."""

from __future__ import annotations

import pytest

from pytest_moeperf.serving.analysis.prometheus import parse
from pytest_moeperf.serving.analysis.specdecode import (
    CandidateRow,
    SpecDecodeCounters,
    acceptance,
    comparison_table,
    speedup,
)


def scrape(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float]) -> SpecDecodeCounters:
    lines = [
        f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}',
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {draft_tokens}',
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}',
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}'
        for i, v in enumerate(per_pos)
    ]
    counters = SpecDecodeCounters.from_scrape(parse("\n".join(lines)))
    assert counters is not None
    return counters


def test_window_acceptance_from_deltas() -> None:
    before = scrape(100, 300, 150, [80, 50, 20])
    after = scrape(200, 600, 360, [180, 120, 60])  # window: 100 drafts, 300 tokens, 210 accepted
    stats = acceptance(before, after)
    assert stats.acceptance_rate == pytest.approx(210 / 300)
    assert stats.mean_acceptance_length == pytest.approx(1 + 210 / 100)
    assert stats.per_position == pytest.approx((1.0, 0.7, 0.4))


def test_no_counters_means_no_speculation() -> None:
    assert SpecDecodeCounters.from_scrape(parse("vllm:num_requests_running 0\n")) is None


def test_restart_and_empty_window_are_errors() -> None:
    a = scrape(100, 300, 150, [80, 50, 20])
    with pytest.raises(ValueError, match="restarted"):
        acceptance(a, scrape(10, 30, 15, [8, 5, 2]))
    with pytest.raises(ValueError, match="no speculative drafts"):
        acceptance(a, a)


def test_speedup_and_table() -> None:
    assert speedup(30.0, 20.0) == 1.5
    with pytest.raises(ValueError):
        speedup(0.0, 1.0)
    cols, rows = comparison_table(
        [
            CandidateRow("nospec", "none", 1, 30.0, 33.3),
            CandidateRow("ngram", "ngram", 1, 20.0, 50.0, 2.5, 0.5, 1.5),
            CandidateRow("eagle", "eagle3", 1, 15.0, 66.6, 3.0, 0.66, 2.0),
            CandidateRow("ngram", "ngram", 4, 25.0, 150.0, 2.4, 0.47, 1.2),
        ]
    )
    assert cols[0] == "profile" and len(cols) == len(rows[0])
    assert [r[0] for r in rows] == ["eagle", "ngram", "nospec", "ngram"]
    assert rows[0][3] == "3.00" and rows[0][-1] == "2.00x" and rows[2][-1] == "-"


def test_histogram_mean_over_a_window() -> None:
    from pytest_moeperf.serving.analysis.prometheus import histogram_mean_delta

    name = "vllm:request_time_per_output_token_seconds"
    before = parse(f'{name}_sum{{engine="0"}} 1.5\n{name}_count{{engine="0"}} 10\n')
    after = parse(f'{name}_sum{{engine="0"}} 2.1\n{name}_count{{engine="0"}} 30\n')
    assert histogram_mean_delta(before, after, name) == pytest.approx(0.6 / 20)
    assert histogram_mean_delta(before, before, name) is None  # nothing observed in the window
    assert histogram_mean_delta(parse("x 1\n"), after, name) is None  # server without the metric
