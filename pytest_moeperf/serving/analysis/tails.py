"""Tail latencies with confidence: p90/p99 of TTFT, ITL and E2EL, bounded by order statistics, and their gate.

A window's p-th percentile is vLLM's (linear interpolation, what ``vllm bench serve`` prints), and beside it the
distribution-free bounds of the true quantile from the window's own order statistics
(`pytest_moeperf.judging.stats.quantile_bound_ranks`): a lower bound X_(r) and an upper bound X_(s), each holding with
`TAIL_CONFIDENCE` on its own, for any continuous latency distribution. The upper bound needs enough requests: the
largest of n observations bounds the q-quantile only when 1 - q^n >= confidence, so p90 needs 29 and p99 needs 299
requests at 95 % (`requests_needed`); each window is sized from the percentiles it gates.

A percentile whose window is too small to bound it is recorded with the reason and INCONCLUSIVE: never gated as a
point value. One that is bounded is judged by `judge_tail`: the core's verdict (rounds against stored runs,
threshold) stands, except that REGRESSED or IMPROVED also needs the bound nearest the reference beyond the
threshold; otherwise the change is within what the window itself could tell, and the verdict is INCONCLUSIVE.

ITL is vLLM's pooled gaps between chunks: the gaps of one request are not independent of each other, so its
interval is narrower than the truth; the number of requests is what the sizing counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.verdict import Status, Verdict, inconclusive
from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.serving.analysis.metrics import percentile

__all__ = ["TAIL_CONFIDENCE", "TAIL_METRICS", "TailBound", "judge_tail", "requests_needed", "tail_bound",
           "tail_names", "window_count"]

#: each bound of a tail percentile holds with this probability on its own
TAIL_CONFIDENCE = 0.95
#: the latencies whose tails are gated: their per-request (ITL: pooled) samples in `metrics.latency_samples`
TAIL_METRICS = ("ttft", "itl", "e2el")
#: context keys a tail metric carries (read back by `judge_tail`)
LOW, HIGH, CONFIDENCE, NEEDED = "tail_ci_low", "tail_ci_high", "tail_confidence", "tail_requests_needed"


def requests_needed(pct: float, confidence: float = TAIL_CONFIDENCE) -> int:
    """Requests a window needs before its largest observation bounds the ``pct``-th percentile from above."""
    return stats.quantile_sample_size(pct / 100.0, confidence)


def window_count(requested: int, pcts: Sequence[float], quick: bool, *, edge: int = 0, blocks: int = 0) -> int:
    """Requests in a window whose plateau is asked ``requested``: the plateau raised to what its gated percentiles
    ``pcts`` need and to ``blocks`` drift blocks of ``edge`` requests, plus ``edge`` requests set aside at each end
    (the ramp and the drain, `pytest_moeperf.serving.analysis.plateau`); ``--moeperf-quick`` halves the plateau (at
    least 8) and raises nothing (its tails are not gated, its drift not checked)."""
    if quick:
        return max(8, requested // 2) + 2 * edge
    return max(requested, *(requests_needed(p) for p in pcts), blocks * max(1, edge)) + 2 * edge


def tail_names(pcts: Sequence[float], metrics: Sequence[str] = TAIL_METRICS) -> tuple[str, ...]:
    return tuple(f"{m}_p{p:g}_ms" for m in metrics for p in pcts)


@dataclass(frozen=True)
class TailBound:
    """One percentile of one latency over a window: the point value, its bounds (None: too few samples for that
    bound), the samples it came from and the requests the bound needs."""

    metric: str
    pct: float
    value: float
    low: float | None
    high: float | None
    samples: int
    requests: int
    needed: int
    confidence: float = TAIL_CONFIDENCE

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.pct:g}_ms"

    @property
    def unbounded(self) -> str | None:
        """Why this percentile is not gated (None: it is bounded on both sides)."""
        if self.requests >= self.needed and self.low is not None and self.high is not None:
            return None
        return (f"{self.name}: {self.requests} requests cannot bound the p{self.pct:g} at {self.confidence * 100:g} % "
                f"(the largest of n bounds it only from n >= {self.needed}): recorded, not gated")

    def context(self) -> dict[str, JSONScalar]:
        return {LOW: self.low, HIGH: self.high, CONFIDENCE: self.confidence, NEEDED: self.needed,
                "tail_samples": self.samples}


def tail_bound(metric: str, samples: Sequence[float], pct: float, requests: int,
               confidence: float = TAIL_CONFIDENCE) -> TailBound:
    """The ``pct``-th percentile of ``samples`` (ms) with its order-statistic bounds; ``requests`` is the number of
    requests the samples came from (ITL pools several samples per request)."""
    if not samples:
        raise ValueError(f"{metric}: no samples for a tail percentile")
    ordered = sorted(samples)
    lower, upper = stats.quantile_bound_ranks(len(ordered), pct / 100.0, confidence)
    return TailBound(metric, pct, percentile(ordered, pct), None if lower is None else ordered[lower - 1],
                     None if upper is None else ordered[upper - 1], len(ordered), requests,
                     requests_needed(pct, confidence), confidence)


def judge_tail(verdict: Verdict, context: Mapping[str, JSONScalar]) -> Verdict:
    """``verdict`` (the core's, on the point values) unless it is REGRESSED or IMPROVED while the window's bound
    nearest the reference is within the threshold: then INCONCLUSIVE, saying so."""
    if verdict.status not in (Status.REGRESSED, Status.IMPROVED) or verdict.reference is None:
        return verdict
    if verdict.mde is None:
        return verdict
    low, high = context.get(LOW), context.get(HIGH)
    went_up = (verdict.status is Status.REGRESSED) == (verdict.better == "lower")
    near = low if went_up else high
    if not isinstance(near, (int, float)) or isinstance(near, bool):
        return inconclusive(verdict, f"{verdict.name}: no confidence bound to confirm the change with")
    ref, allowed = verdict.reference, verdict.mde
    beyond = near > ref * (1.0 + allowed) if went_up else near < ref * (1.0 - allowed)
    if beyond:
        return dataclasses.replace(verdict, reason="; ".join(
            r for r in (verdict.reason, f"its {_conf(context)} bound {near:.4g} is beyond the threshold too") if r))
    side = "lower" if went_up else "upper"
    return inconclusive(verdict, f"the window's {_conf(context)} {side} bound of the percentile, {near:.4g} "
                                 f"{verdict.unit}, is within {allowed * 100:.1f} % of the baseline {ref:.4g}: "
                                 "the change is within what the window can tell")


def _conf(context: Mapping[str, JSONScalar]) -> str:
    level = context.get(CONFIDENCE)
    return f"{level * 100:g} %" if isinstance(level, float) else "confidence"
