"""The plateau of a window: its steady part at the target batch size, the part a window's figures are scored on.

A closed loop's first C requests are sent together into an idle server (the ramp: C prefills at once, then C decodes
in lockstep) and its last C are answered while the batch drains; neither runs at the batch size the window is
about, and how much of a short window they are depends on its length, not on the server. TensorRT-LLM's perf tests
keep only the plateau for that reason (``tests/integration/defs/perf``: the most common batch size). So a window's
successful requests are ordered by when they completed, the first ``edge`` and the last ``edge`` are set aside and
counted (``ramp_requests``, ``drain_requests`` in the context), and the rest — the plateau — are what the latencies,
the tails and the drift check see. ``edge`` is the closed loop's concurrency; for an open loop, the requests it had
in flight on average (Little's law, `drift.in_flight`).

By completion order, because that is when the server counts a request in its own histograms
(`pytest_moeperf.serving.analysis.arbiter`): the load generator scrapes ``/metrics`` right after the ``edge``-th and
the ``(n - edge)``-th completion (`loadgen.LoadGenerator.run`, ``probes``), so the server's figures cover the
requests completed between those two instants, the same plateau.

The plateau's throughputs are taken over its span, from the ``edge``-th to the ``(n - edge)``-th completion: the
requests completed in it (the plateau's), and the output tokens delivered in it (each answer's chunks by their arrival
time, an answer's tokens spread evenly over its chunks), over the span's length. A window too short for a plateau
(at most ``2 * edge`` requests: ``--moeperf-quick``) is scored whole, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.serving.analysis.drift import in_flight
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, ServingMetrics, Slo, distribution, latency_samples

__all__ = ["Plateau", "edge_of", "find", "plateau_metrics"]


@dataclass(frozen=True)
class Plateau:
    """The steady requests of a window (by completion), what was set aside at each end, and the span they cover
    (seconds from the window's start)."""

    outcomes: tuple[RequestOutcome, ...]
    edge: int
    ramp: int
    drain: int
    start_s: float
    end_s: float
    basis: str

    @property
    def whole(self) -> bool:
        """Whether the window was too short for a plateau and is scored whole."""
        return self.ramp == 0 and self.drain == 0 and self.edge > 0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def facts(self) -> dict[str, JSONScalar]:
        return {"plateau": self.basis, "plateau_requests": len(self.outcomes), "ramp_requests": self.ramp,
                "drain_requests": self.drain, "plateau_s": round(self.duration_s, 3)}


def edge_of(closed_concurrency: int, outcomes: Sequence[RequestOutcome]) -> int:
    """Requests set aside at each end: a closed loop's concurrency; an open loop's (``closed_concurrency`` 0)
    average requests in flight."""
    return closed_concurrency if closed_concurrency > 0 else in_flight(outcomes)


def _end(o: RequestOutcome) -> float:
    return o.start_s + o.latency_s


def find(outcomes: Sequence[RequestOutcome], edge: int, what: str = "") -> Plateau:
    """The plateau of a window's ``outcomes`` with ``edge`` requests set aside at each end (``what``: how the edge
    was chosen, for the context)."""
    ok = sorted((o for o in outcomes if o.success), key=_end)
    first = min((o.start_s for o in ok), default=0.0)
    last = max((_end(o) for o in ok), default=first)
    if len(ok) <= 2 * edge or edge <= 0:
        why = (f"whole window: {len(ok)} requests leave no plateau after {edge} at each end"
               if edge > 0 else "whole window")
        return Plateau(tuple(ok), edge, 0, 0, first, last, why)
    steady = ok[edge:len(ok) - edge]
    basis = (f"completions {edge + 1}-{len(ok) - edge} of {len(ok)} (the first and last {edge} set aside"
             f"{': ' + what if what else ''})")
    return Plateau(tuple(steady), edge, edge, edge, _end(ok[edge - 1]), _end(ok[len(ok) - edge - 1]), basis)


def _chunk_times(o: RequestOutcome) -> list[float]:
    times = [o.start_s + o.ttft_s]
    for gap in o.itl_s:
        times.append(times[-1] + gap)
    return times


def plateau_metrics(plateau: Plateau, window: Sequence[RequestOutcome], whole: ServingMetrics,
                    slo: Slo | None = None) -> ServingMetrics:
    """The serving metrics of the plateau: latencies of its requests, throughputs over its span (tokens delivered in
    it by any request of the ``window``); failures are the ``whole`` window's (a failed request is never set
    aside)."""
    if plateau.whole or plateau.duration_s <= 0:
        return whole
    lo, hi = plateau.start_s, plateau.end_s
    out_tokens = 0.0
    in_tokens = 0
    for o in window:
        if not o.success:
            continue
        times = _chunk_times(o)
        per_chunk = o.output_tokens / len(times)
        out_tokens += per_chunk * sum(1 for t in times if lo < t <= hi)
        if lo < times[0] <= hi:
            in_tokens += o.prompt_tokens
    ms = 1000.0
    samples = latency_samples(plateau.outcomes)
    span = plateau.duration_s
    good = None if slo is None else sum(1 for o in plateau.outcomes if slo.met_by(o)) / span
    return replace(
        whole,
        duration_s=span,
        completed=len(plateau.outcomes),
        total_input_tokens=sum(o.prompt_tokens for o in plateau.outcomes),
        total_output_tokens=sum(o.output_tokens for o in plateau.outcomes),
        request_throughput=len(plateau.outcomes) / span,
        output_throughput=out_tokens / span,
        total_token_throughput=(out_tokens + in_tokens) / span,
        request_goodput=good,
        ttft_ms=distribution(samples["ttft"]),
        tpot_ms=distribution(samples["tpot"]),
        itl_ms=distribution(samples["itl"]),
        e2el_ms=distribution([o.latency_s * ms for o in plateau.outcomes]),
    )

