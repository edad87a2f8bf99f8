"""What a serving window costs in seconds: a pure model from per-token times, to plan windows that fit a batch.

A closed loop at C clients sends its warm pass of w requests and then its n requests, C at a time: (w + n) / C
waves, each one request's time, TTFT(C) + (L - 1) x TPOT(C) for L output tokens. An open loop at r requests/s runs
(w + n) / r seconds plus one request's time. Each window adds `WINDOW_OVERHEAD_S` (its scrapes, its prompts, the
test's own work). TPOT(C) and TTFT(C) come from a table measured on the box (`TokenTimes`, linear in between, the
end value beyond). A batch of S starts costs S x (the plan's windows + `PROCESS_S`) x `MEASURED_SCALE` plus S
server starts of `START_S`.

Calibrated on the one whole start measured on a GPU (1x H200, vLLM 0.26, 2026-12-02, cold compile caches,
`docs/measurements/h200-2026-12-02-f.md`): the four TP=1 tiny servers started together in 88-102 s, and the start's
23 tests ended 324 s after it began, where the table alone predicted 155 s (45 s a server start, 15 s the process,
95 s of windows). So `START_S` is the measured 102 s, and the windows and the process take `MEASURED_SCALE` = 2.02
times the table's figure (222 s measured for 110 s predicted: the warm passes and the windows a cold Triton cache
stretched, the scrapes, the drift checks; the per-window split was not kept). Three starts are ~970 s: more than one
10-minute call, so a batch under a 600 s deadline measures one start (the second is not begun: `processes.rounds`).

`H200_TP1` holds the tiny MoE's figures on 1x H200 (vLLM 0.26, TP=1, dummy weights) from the slower of the lent
hosts measured, so that a plan that fits them fits the faster ones: `docs/notes/h200-2026-12-01-d/tp1-vs-committed.txt`
(engine TPOT and client TTFT, c=1/16/64 serving windows of 1024 in; draft c=1/8/32), the n-gram figures of the faster
host (`docs/measurements/serving.md`) times 1.7 (the two hosts' ratio of no-spec TPOT at c=1, 2.40 / 1.41 ms), and
EAGLE-3 not yet measured on a GPU: a target step plus three head steps a token (its acceptance is ~0 by construction),
estimated at twice the no-spec TPOT.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_moeperf.serving.load.loadgen import ClosedLoop, LoadShape

__all__ = ["H200_TP1", "MEASURED_SCALE", "PROCESS_S", "START_S", "WINDOW_OVERHEAD_S", "Planned", "TokenTimes",
           "batch_seconds", "start_seconds", "window_seconds"]

#: per window: two or four /metrics scrapes, the prompts, the test's setup and records
WINDOW_OVERHEAD_S = 1.0
#: per start, besides the server's start: the child pytest session's own start, its generated models, the servers'
#: stop
PROCESS_S = 15.0
#: a server start of the tiny TP=1 profiles, the four together, cold compile caches: the slowest of the four
#: measured on 1x H200 (88-102 s; one started alone took 103.6 s); the target of issue 28 item 1 was 45 s
START_S = 102.0
#: the measured start's windows and process over the table's prediction of them (222 s / 110 s)
MEASURED_SCALE = 2.02


@dataclass(frozen=True)
class TokenTimes:
    """One server's per-token times on one box: (concurrency, ms) points of TPOT and of TTFT, ascending."""

    tpot_ms: tuple[tuple[int, float], ...]
    ttft_ms: tuple[tuple[int, float], ...]

    @staticmethod
    def at(points: Sequence[tuple[int, float]], concurrency: float) -> float:
        """Linear between the measured points; the nearest end value beyond them."""
        if concurrency <= points[0][0]:
            return points[0][1]
        for (c0, v0), (c1, v1) in zip(points, points[1:], strict=False):
            if concurrency <= c1:
                return v0 + (v1 - v0) * (concurrency - c0) / (c1 - c0)
        return points[-1][1]

    def request_s(self, concurrency: float, output_len: int) -> float:
        """One request's time at this concurrency: TTFT + (L - 1) x TPOT."""
        return (self.at(self.ttft_ms, concurrency) + (output_len - 1) * self.at(self.tpot_ms, concurrency)) / 1000.0


@dataclass(frozen=True)
class Planned:
    """One window a suite plans: its test, load shape, requests (ramp and drain included), warm pass, output
    tokens, and the server it runs on (a key of the token-time table)."""

    test: str
    shape: LoadShape
    requests: int
    warm: int
    output_len: int
    server: str = "none"


def window_seconds(window: Planned, times: TokenTimes) -> float:
    """Predicted seconds of one window with its warm pass."""
    sent = window.requests + window.warm
    if isinstance(window.shape, ClosedLoop):
        c = window.shape.concurrency
        return sent / c * times.request_s(c, window.output_len) + WINDOW_OVERHEAD_S
    busy = max(1.0, window.shape.rate * times.request_s(1, window.output_len))  # Little's law: requests in flight
    return sent / window.shape.rate + times.request_s(busy, window.output_len) + WINDOW_OVERHEAD_S


def start_seconds(windows: Iterable[Planned], table: Mapping[str, TokenTimes]) -> float:
    """Predicted seconds of one start's windows (the server's start and the process aside)."""
    return sum(window_seconds(w, table[w.server]) for w in windows)


def batch_seconds(windows: Iterable[Planned], table: Mapping[str, TokenTimes], starts: int,
                  start_s: float = START_S, scale: float = MEASURED_SCALE) -> float:
    """Predicted seconds of a batch of ``starts`` starts: each its windows and its process (times ``scale``, the
    measured start's ratio to the table) and its server start."""
    return starts * ((start_seconds(windows, table) + PROCESS_S) * scale + start_s)


def _times(tpot: Sequence[tuple[int, float]], ttft: Sequence[tuple[int, float]]) -> TokenTimes:
    return TokenTimes(tuple(tpot), tuple(ttft))


_TTFT = ((1, 15.9), (16, 58.7), (64, 176.1))  # client TTFT medians, ms (1024-token prompts; 320 in spec decode)
#: the tiny MoE at TP=1 on 1x H200, by speculative method ("none": no speculation); ms per output token
H200_TP1: dict[str, TokenTimes] = {
    "none": _times(((1, 2.40), (16, 2.85), (64, 4.20)), _TTFT),
    "ngram": _times(((1, 0.78), (8, 0.97), (32, 1.14)), _TTFT),
    "draft_model": _times(((1, 1.75), (8, 1.74), (32, 2.29)), _TTFT),
    "eagle3": _times(((1, 4.80), (16, 5.70), (64, 8.40)), _TTFT),
}
