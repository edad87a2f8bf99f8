"""The arbiter of the client's timing: the server's own figures over a window, from vLLM's ``/metrics``.

Two scrapes bracket the window's plateau (`pytest_moeperf.serving.analysis.plateau`: the load generator scrapes right
after its ``edge``-th and ``(n - edge)``-th completion; an open loop, or a window without a plateau, is bracketed
whole, and the context says which: ``engine_span``); the deltas of vLLM's histograms (sum and count) give the mean
of every observation the server made in between. Means, so each is named ``…_mean_ms``, and the client's figure of
the same statistic beside it is its mean over the plateau's requests (``tpot_mean_ms`` against
``engine_tpot_mean_ms``). What each one times (vLLM 0.32, ``v1/metrics/stats.py``; a histogram observes a request's
TPOT, E2EL and ITL when its tokens are processed, in the API server's output loop before they are streamed, so a
scrape after the client saw a completion counts it):

* ``engine_ttft_mean_ms`` (``vllm:time_to_first_token_seconds``): from the request's arrival at the API server (after
  the HTTP body is parsed, before tokenization) to the output loop's receipt of the first token from the engine
  core; without the SSE delivery to the client.
* ``engine_tpot_mean_ms`` (``vllm:request_time_per_output_token_seconds``): per finished request, (last token - first
  token) / (tokens - 1) on engine-core timestamps: the client's TPOT without the delivery's jitter.
* ``engine_itl_mean_ms`` (``vllm:inter_token_latency_seconds``; ``vllm:time_per_output_token_seconds`` before it was
  renamed): every gap between two engine-core outputs of one request, pooled, as vLLM's ITL is; under speculative
  decoding one output carries several tokens, as one SSE chunk does.
* ``engine_e2el_mean_ms`` (``vllm:e2e_request_latency_seconds``): arrival to the last token, without delivery.
* ``engine_queue_mean_ms`` (``vllm:request_queue_time_seconds``): queued to first scheduled in the engine core.
* the finished requests (``vllm:e2e_request_latency_seconds_count``) and output tokens
  (``vllm:generation_tokens_total``) the server counted in the window: the client's throughput counts the same
  tokens (the ``usage`` of each answer) over its own wall time, so the counts must agree.
* the engine steps in the window (``vllm:iteration_tokens_total_count``: its histogram of tokens per engine step
  observes once per step that returned outputs, ``AsyncLLM``'s output handler): the output tokens over them are the
  tokens a step emits across the batch. vLLM exports no time per step; `pytest_moeperf.serving.speculation` derives
  a sequence's decode step from the engine's TPOT and the tokens a step emits per sequence.

Anything else reaching the server between the scrapes (attach mode: other traffic) is counted too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.serving.analysis.prometheus import Scrape, histogram_mean_delta

__all__ = ["ENGINE_HISTOGRAMS", "ENGINE_METRICS", "EngineFigures", "engine_figures"]

#: metric name -> vLLM histograms, the first the server exports wins (names of older releases after the current)
ENGINE_HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "engine_ttft_mean_ms": ("vllm:time_to_first_token_seconds",),
    "engine_tpot_mean_ms": ("vllm:request_time_per_output_token_seconds",),
    "engine_itl_mean_ms": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "engine_e2el_mean_ms": ("vllm:e2e_request_latency_seconds",),
    "engine_queue_mean_ms": ("vllm:request_queue_time_seconds",),
}
GENERATION_TOKENS = "vllm:generation_tokens_total"
FINISHED = "vllm:e2e_request_latency_seconds_count"
ITERATIONS = "vllm:iteration_tokens_total_count"
#: the metric names of `EngineFigures.metrics`
ENGINE_METRICS = tuple(ENGINE_HISTOGRAMS)


@dataclass(frozen=True)
class EngineFigures:
    """The server's means over a window, ms (None: not exported, or nothing observed), and what it counted."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    e2el_ms: float | None = None
    queue_ms: float | None = None
    requests: int | None = None
    output_tokens: int | None = None
    steps: int | None = None  # engine steps that returned outputs

    def metrics(self) -> dict[str, float]:
        """The figures by metric name (``engine_*``), leaving out what the server did not give."""
        values = (self.ttft_ms, self.tpot_ms, self.itl_ms, self.e2el_ms, self.queue_ms)
        return {k: v for k, v in zip(ENGINE_METRICS, values, strict=True) if v is not None}


def _mean_ms(before: Scrape, after: Scrape, names: Sequence[str]) -> float | None:
    for name in names:
        if after.select(name + "_count"):
            seconds = histogram_mean_delta(before, after, name)
            return None if seconds is None else seconds * 1000.0
    return None


def _delta(before: Scrape, after: Scrape, name: str) -> int | None:
    first, last = before.total(name), after.total(name)
    return None if first is None or last is None else round(last - first)


def engine_figures(before: Scrape, after: Scrape) -> EngineFigures:
    """The server's figures over the window between two scrapes."""
    ttft, tpot, itl, e2el, queue = (_mean_ms(before, after, names) for names in ENGINE_HISTOGRAMS.values())
    return EngineFigures(ttft_ms=ttft, tpot_ms=tpot, itl_ms=itl, e2el_ms=e2el, queue_ms=queue,
                         requests=_delta(before, after, FINISHED),
                         output_tokens=_delta(before, after, GENERATION_TOKENS),
                         steps=_delta(before, after, ITERATIONS))
