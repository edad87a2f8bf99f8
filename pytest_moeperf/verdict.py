"""Pure verdicts: the current rounds of a metric, its reference and a threshold decide its status.

The rule (stated in the README's "Verdicts" section):

1. Each round (one execution of the test: the first, a confirmation re-run, or one ``--moeperf-rounds``
   process) gives a median. The estimate is the median of the round medians; the change is taken against the
   reference (the median of the stored run medians).
2. A change within the threshold (see `thresholds`) — or within ``abs_tolerance`` — is PASS.
3. Beyond it, the verdict is REGRESSED (or IMPROVED) only when the evidence agrees:
   every round's median is beyond the threshold in the same direction, and
   * when the sizes allow a significant result (1 / C(n+m, n) ≤ α = 0.05: e.g. 3 rounds against 5 stored runs),
     a one-sided exact Mann-Whitney test of the round medians against the stored run medians gives p ≤ α;
   * otherwise the quartile of all current samples nearest to the reference is beyond the threshold too, so a
     lucky sample (or a lucky quarter of them) cannot hide a change, and a scattered set cannot make one.
   When it does not agree, the verdict is INCONCLUSIVE and the reason says why.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf import stats
from pytest_moeperf.stats import Summary
from pytest_moeperf.thresholds import Reference, Threshold

ALPHA = 0.05


class Status(enum.Enum):
    NEW = "NEW"
    PASS = "PASS"
    IMPROVED = "IMPROVED"
    REGRESSED = "REGRESSED"
    INCONCLUSIVE = "INCONCLUSIVE"  # the run cannot decide (noise, disagreeing rounds, health gate)
    MISSING = "MISSING"  # baselined, but not measured this run


@dataclass(frozen=True)
class Verdict:
    key: str
    name: str
    unit: str
    better: str
    status: Status
    current: Summary | None  # all current samples pooled (None: MISSING)
    round_medians: tuple[float, ...] = ()
    reference: float | None = None  # median of the stored run medians
    runs: int = 0  # stored runs behind the reference
    change: float | None = None  # relative, signed: estimate vs reference
    allowed: float | None = None  # the threshold used: the minimum detectable effect (relative)
    spread: str = ""  # where the noise term of the threshold came from
    #: what set the spread: "baseline" (its stored runs), "history" (accepted sessions), "within-run" (fewer than
    #: 3 stored runs: their IQR), "" (no reference)
    noise_source: str = ""
    threshold: Threshold = Threshold()
    reason: str = ""

    @property
    def estimate(self) -> float | None:
        return stats.median(self.round_medians) if self.round_medians else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["round_medians"] = list(self.round_medians)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        values = dict(data)
        values["status"] = Status(values["status"])
        values["current"] = Summary(**values["current"]) if values.get("current") else None
        values["round_medians"] = tuple(values.get("round_medians", ()))
        values["threshold"] = Threshold(**values["threshold"])
        return cls(**values)

    def message(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if self.status is Status.MISSING:
            return f"{self.name}: MISSING ({self.reason})"
        cur = f"{self.estimate:.4g}{unit}" if self.estimate is not None else "-"
        rounds = f", {len(self.round_medians)} rounds" if len(self.round_medians) > 1 else ""
        n = self.current.n if self.current else 0
        if self.reference is None or self.change is None or self.allowed is None:
            tail = f": {self.reason}" if self.reason else " (no baseline for this fingerprint)"
            return f"{self.name}: {cur} -> {self.status.value}{tail}"
        direction = "lower" if self.better == "lower" else "higher"
        abs_tol = f", abs {self.threshold.abs_tolerance:g}{unit}" if self.threshold.abs_tolerance else ""
        text = (f"{self.name}: baseline {self.reference:.4g}{unit} ({self.runs} run{'s' if self.runs != 1 else ''})"
                f" -> current {cur} (n={n}{rounds}), change {self.change * 100:+.1f} % "
                f"[{direction} is better; threshold {self.allowed * 100:.1f} %{abs_tol}; {self.spread}]"
                f" -> {self.status.value}")
        return text + (f": {self.reason}" if self.reason else "")


def _worse(better: str, reference: float, value: float) -> float:
    """Relative change of ``value`` against ``reference``, positive when it is worse."""
    change = stats.relative_change(reference, value)
    return change if better == "lower" else -change


def judge(key: str, name: str, unit: str, better: str, rounds: Sequence[Sequence[float]],
          reference: Reference | None, threshold: Threshold) -> Verdict:
    """Judge one metric from its current rounds (each a sequence of samples) against its reference."""
    if not rounds or not all(rounds):
        raise ValueError(f"{key}: every round needs samples")
    pooled = [x for r in rounds for x in r]
    medians = tuple(stats.median(r) for r in rounds)
    base = Verdict(key, name, unit, better, Status.NEW, stats.summarize(pooled), medians, threshold=threshold)
    if reference is None:
        return base
    ref = reference.value
    allowed, spread = threshold.allowed(reference)
    estimate = stats.median(medians)
    source = reference.noise_source if reference.between_run_spread is not None else "within-run"
    known = dataclasses.replace(base, reference=ref, runs=reference.runs, allowed=allowed, spread=spread,
                                noise_source=source)

    def verdict(status: Status, change: float | None, reason: str = "") -> Verdict:
        return dataclasses.replace(known, status=status, change=change, reason=reason)

    if ref == 0:
        if estimate == 0:
            return verdict(Status.PASS, 0.0)
        return verdict(Status.INCONCLUSIVE, None, "baseline median is 0: unusable, a relative change from 0 is "
                       "undefined (re-record it, or judge this metric with abs_tolerance on a non-zero unit)")
    change = stats.relative_change(ref, estimate)
    worse = _worse(better, ref, estimate)
    if abs(worse) <= allowed or abs(estimate - ref) <= threshold.abs_tolerance:
        return verdict(Status.PASS, change)
    sign = 1.0 if worse > 0 else -1.0
    status = Status.REGRESSED if sign > 0 else Status.IMPROVED
    word = "worse" if sign > 0 else "better"
    beyond = sum(1 for m in medians if sign * _worse(better, ref, m) > allowed)
    if beyond < len(medians):
        return verdict(Status.INCONCLUSIVE, change, f"rounds disagree: {beyond} of {len(medians)} round medians "
                       f"are {word} than the threshold")
    if stats.min_p(len(medians), reference.runs) <= ALPHA:
        # orient both sides so that "greater" means the direction of the change
        def oriented(v: float) -> float:
            return sign * (v if better == "lower" else -v)

        p = stats.mann_whitney_greater([oriented(m) for m in medians], [oriented(m) for m in reference.run_medians])
        # p must be *below* alpha: at 3 rounds against 3 stored runs the smallest p the test can give is exactly
        # 1/C(6,3) = 0.05, and two clean-clone CI runs on the 2-core box gave 14 false REGRESSED verdicts at that p
        # (CPU GEMM +10-21 %, open-loop latencies, against a 3-run spread of 0.4-5 %): that is no evidence
        if p >= ALPHA:
            return verdict(Status.INCONCLUSIVE, change, f"not significant: rank test of {len(medians)} round "
                           f"medians against {reference.runs} stored runs gives p = {p:.3f}, not below {ALPHA} "
                           "(more rounds or stored runs resolve it)")
        return verdict(status, change, f"rank test p = {p:.3f}")
    # lower is better and worse, or higher is better and better: the low quartile is the one nearest the reference
    near = stats.quantile(pooled, 0.25 if (better == "lower") == (sign > 0) else 0.75)
    if sign * _worse(better, ref, near) <= allowed:
        return verdict(Status.INCONCLUSIVE, change, f"too noisy to resolve {allowed * 100:.1f} %: a quarter of the "
                       f"samples are within the threshold (quartile {near:.4g}{' ' + unit if unit else ''})")
    return verdict(status, change)


def missing(key: str, name: str, unit: str, better: str, reference: float | None, reason: str) -> Verdict:
    return Verdict(key, name, unit, better, Status.MISSING, None, reference=reference, reason=reason)


def inconclusive(verdict: Verdict, reason: str) -> Verdict:
    """``verdict`` made INCONCLUSIVE (e.g. the health gate tripped): it can then neither pass nor fail."""
    return dataclasses.replace(verdict, status=Status.INCONCLUSIVE, reason=reason)
