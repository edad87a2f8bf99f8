"""The paired judge of ``moeperf ab``: each metric's pairs of process medians → a `Verdict` (pure: no I/O).

One process gives one value per metric: the median of its samples (the process, not the sample, is the unit: our
noise is between processes). A pair is the base process and the head process of one half of an ABBA block; its
log ratio ``log(head / base)`` is what `paired` tests. The rule, with ``δ`` the metric's minimum effect (its
threshold's ``tolerance``: ``perf.record(tolerance=…)``, the marker, ``--moeperf-tolerance``, 5 %) and the
Benjamini–Hochberg q-value over every metric of the run:

* **PASS** — the whole confidence interval of the change lies inside ``±δ`` (or, with an ``abs_tolerance``, its
  absolute size does): whatever changed, it is smaller than what is worth failing for;
* **REGRESSED** / **IMPROVED** — ``q <= alpha`` and the Hodges–Lehmann change is beyond ``δ`` the worse / better
  way;
* **INCONCLUSIVE** otherwise, with the reason and a cause: ``few-rounds`` (too few pairs for any decision),
  ``noise`` (the interval still reaches past ``δ``): both are answered with more pairs; pairs that cannot decide
  (health gate, degenerate window: ``health`` / ``window``), a value of 0 or below (``zero-baseline``), or a unit
  that differs between the sides (``changed``) are not.

A metric only head records is NEW, one only base records is MISSING. The verdict's ``reference`` is the median of
base's process medians, ``round_medians`` head's, ``change`` the Hodges–Lehmann estimate ``exp(HL) − 1``, and
``mde`` the change detectable with 80 % power at the pairs run (`paired.detectable`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_moeperf.ab import paired
from pytest_moeperf.judging import stats
from pytest_moeperf.judging.thresholds import Threshold
from pytest_moeperf.judging.verdict import Cause, Status, Verdict, missing
from pytest_moeperf.ledger import Record

CHANGED = "changed"  # the cause of a metric whose unit, direction or workload differs between the sides
SOURCE = "pairs"  # the verdicts' noise source: the pairs themselves


@dataclass(frozen=True)
class Observation:
    """One process's value of one metric: its median (None: no round of it could decide, ``problem`` says why)."""

    value: float | None
    problem: str = ""


def observation(record: Record) -> Observation:
    """The median of a process's usable rounds of ``record`` (one round: a side's child confirms nothing)."""
    usable = [r for r in record.rounds if r.usable]
    if not usable:
        return Observation(None, "; ".join(record.problems))
    return Observation(stats.median([stats.median(r.samples) for r in usable]))


@dataclass(frozen=True)
class Pair:
    """Pair ``number``: what its base and its head process measured of one metric (None: not measured there)."""

    number: int
    base: Observation | None
    head: Observation | None


@dataclass
class MetricPairs:
    """One metric across the run: a record of it from each side (identity and policy) and its pairs."""

    key: str
    base: Record | None = None
    head: Record | None = None
    pairs: list[Pair] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    """A metric's verdict and the paired evidence behind it (None: it had no usable pair)."""

    verdict: Verdict
    evidence: paired.Paired | None = None
    q: float | None = None


def log_ratio(base: float, head: float) -> float | None:
    """``log(head / base)``; 0 for two equal values; None when a ratio is undefined (a value of 0 or below)."""
    if base > 0 and head > 0:
        return math.log(head / base)
    return 0.0 if base == head else None


def relative(log: float) -> float:
    return math.exp(log) - 1 if math.isfinite(log) else log


def _pct(value: float) -> str:
    return f"{value * 100:+.1f} %" if math.isfinite(value) else ("+inf" if value > 0 else "-inf")


def interval_text(evidence: paired.Paired, alpha: float) -> str:
    return f"{(1 - alpha) * 100:g} % CI [{_pct(relative(evidence.low))}, {_pct(relative(evidence.high))}]"


def _usable(pairs: Sequence[Pair]) -> tuple[list[tuple[float, float, float]], list[str], bool]:
    """(base, head, log ratio) of the pairs that can decide; why the others cannot; whether a ratio was undefined."""
    used, dropped, undefined = [], [], False
    for pair in pairs:
        if pair.base is None or pair.head is None:
            continue
        if pair.base.value is None or pair.head.value is None:
            why = " | ".join(f"{side}: {o.problem}" for side, o in (("base", pair.base), ("head", pair.head))
                             if o.value is None)
            dropped.append(f"pair {pair.number} ({why})")
            continue
        ratio = log_ratio(pair.base.value, pair.head.value)
        if ratio is None:
            undefined = True
            dropped.append(f"pair {pair.number} (base {pair.base.value:g}, head {pair.head.value:g}: no ratio)")
            continue
        used.append((pair.base.value, pair.head.value, ratio))
    return used, dropped, undefined


def _identity(metric: MetricPairs) -> Verdict | Record:
    """The record whose identity and policy judge the metric, or the verdict when it cannot be paired at all."""
    base, head = metric.base, metric.head
    if base is None and head is not None:
        m = head.metric
        return Verdict(metric.key, m.name, m.unit, m.better, Status.NEW, None, threshold=head.threshold,
                       reason="only head records it")
    if head is None:
        assert base is not None
        m = base.metric
        return missing(metric.key, m.name, m.unit, m.better, None, "head does not record it")
    assert base is not None
    change = base.metric.identity.change(head.metric.identity, "base", "head")
    if change:
        m = head.metric
        return Verdict(metric.key, m.name, m.unit, m.better, Status.INCONCLUSIVE, None, threshold=base.threshold,
                       reason=f"{change}: the values cannot be paired", cause=CHANGED)
    return base  # the base side's policy: the minimum effect in force before the change


def judge_all(metrics: Sequence[MetricPairs], alpha: float = paired.ALPHA) -> dict[str, Outcome]:
    """Every metric's verdict, the false-discovery control taken across all of them."""
    prepared: dict[str, tuple[Record, list[tuple[float, float, float]], list[str], paired.Paired]] = {}
    out: dict[str, Outcome] = {}
    for metric in metrics:
        found = _identity(metric)
        if isinstance(found, Verdict):
            out[metric.key] = Outcome(found)
            continue
        used, dropped, undefined = _usable(metric.pairs)
        if not used:
            out[metric.key] = Outcome(_unpaired(metric, found, dropped, undefined))
            continue
        prepared[metric.key] = (found, used, dropped, paired.paired([d for _, _, d in used], alpha))
    keys = list(prepared)
    qvalues = paired.benjamini_hochberg([prepared[k][3].p for k in keys])
    for key, q in zip(keys, qvalues, strict=True):
        record, used, dropped, evidence = prepared[key]
        out[key] = Outcome(decide(record, used, evidence, q, len(keys), alpha, dropped), evidence, q)
    return {m.key: out[m.key] for m in metrics}


def _unpaired(metric: MetricPairs, record: Record, dropped: list[str], undefined: bool) -> Verdict:
    m = (metric.head or record).metric
    if undefined:
        cause, why = Cause.ZERO_BASELINE, "a value of 0 or below: a relative change is undefined"
    elif dropped:
        problems = " ".join(dropped)
        cause = Cause.HEALTH if "health: " in problems and "window: " not in problems else Cause.WINDOW
        why = f"no pair can decide: {'; '.join(dropped)}"
    else:
        cause, why = Cause.FEW_ROUNDS, "measured in no pair by both sides"
    return Verdict(metric.key, m.name, m.unit, m.better, Status.INCONCLUSIVE, None, threshold=record.threshold,
                   reason=why, cause=cause)


def decide(record: Record, used: Sequence[tuple[float, float, float]], evidence: paired.Paired, q: float,
           metrics: int, alpha: float = paired.ALPHA, dropped: Sequence[str] = ()) -> Verdict:
    """The verdict of one metric from its usable pairs, its evidence and its q-value over ``metrics`` metrics."""
    m, threshold = record.metric, record.threshold
    base_values = [b for b, _, _ in used]
    head_values = [h for _, h, _ in used]
    reference = stats.median(base_values)
    change = relative(evidence.estimate)
    low, high = relative(evidence.low), relative(evidence.high)
    delta = threshold.tolerance
    mde = None if evidence.mde is None else relative(evidence.mde)
    ci = interval_text(evidence, alpha)
    spread = f"paired, {evidence.n} pairs: {ci}, p = {evidence.p:.3g}, q = {q:.3g} over {metrics} metric(s)"
    known = Verdict(m.key, m.name, m.unit, m.better, Status.INCONCLUSIVE, stats.summarize(head_values),
                    tuple(head_values), reference=reference, runs=evidence.n, change=change, mde=mde,
                    spread=spread, noise_source=SOURCE, threshold=threshold)
    worse = change if m.better == "lower" else -change  # > 0: head is worse
    significant = q <= alpha
    inside = (-delta <= low and high <= delta) or _inside_abs(threshold, reference, low, high)
    note = f"; pairs not judged: {', '.join(dropped)}" if dropped else ""

    def verdict(status: Status, reason: str, cause: str = "") -> Verdict:
        return dataclasses.replace(known, status=status, reason=reason + note, cause=cause)

    if inside:
        real = f"; a real change (q = {q:.3g}) smaller than the minimum effect" if significant else ""
        return verdict(Status.PASS, f"{ci} inside ±{delta * 100:g} %{real}")
    if significant and abs(change) > delta:
        status = Status.REGRESSED if worse > 0 else Status.IMPROVED
        return verdict(status, f"significant: q = {q:.3g} <= {alpha:g} (p = {evidence.p:.3g})")
    needed = paired.min_pairs(alpha)
    if evidence.n < needed:
        return verdict(Status.INCONCLUSIVE, f"{evidence.n} pair(s): the signed-rank test needs at least {needed} "
                       f"to decide at alpha {alpha:g}", Cause.FEW_ROUNDS)
    if significant:
        why = (f"a real change (q = {q:.3g}) of {_pct(change)}, but the {ci} reaches beyond the minimum effect "
               f"±{delta * 100:g} %")
    elif abs(change) > delta:
        why = (f"change {_pct(change)} beyond the minimum effect ±{delta * 100:g} %, but not significant "
               f"(p = {evidence.p:.3g}, q = {q:.3g} over {metrics} metric(s))")
    else:
        why = f"the {ci} reaches beyond the minimum effect ±{delta * 100:g} %"
    return verdict(Status.INCONCLUSIVE, why, Cause.NOISE)


def _inside_abs(threshold: Threshold, reference: float, low: float, high: float) -> bool:
    """Whether the interval's absolute size is within ``abs_tolerance`` (in the metric's unit)."""
    if not threshold.abs_tolerance or not (math.isfinite(low) and math.isfinite(high)):
        return False
    return max(abs(low), abs(high)) * abs(reference) <= threshold.abs_tolerance


def decidable(verdict: Verdict) -> bool:
    """Whether more pairs can decide ``verdict`` (an INCONCLUSIVE whose evidence is still coming)."""
    return verdict.status is Status.INCONCLUSIVE and verdict.cause in Cause.HELPED


def budget_ended(verdict: Verdict, max_pairs: int, by: str = "") -> Verdict:
    """``verdict`` after the pair budget (or ``by``: what else) ended the run while more pairs could still have
    decided it."""
    if not decidable(verdict):
        return verdict
    return dataclasses.replace(verdict, cause=Cause.BUDGET, reason=f"{verdict.reason} — "
                               f"{by or f'the pair budget (--max-pairs {max_pairs})'} ended it, not the evidence")
