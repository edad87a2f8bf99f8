"""Pure verdicts: the current rounds of a metric, its reference and a threshold decide its status.

The rule (stated in the README's "Verdicts" section):

1. Each round (one execution of the test: the first, a confirmation re-run, or one ``--moeperf-rounds``
   process) gives a median. The estimate is the median of the round medians; the change is taken against the
   reference (the median of the stored run medians).
2. A change within the threshold (see `thresholds`) — or within ``abs_tolerance`` — is PASS.
3. Beyond it, the verdict is REGRESSED (or IMPROVED) only when the evidence agrees:
   every round's median is beyond the threshold in the same direction, and
   * with at least 3 stored runs (or history sessions): a one-sided exact Mann-Whitney test of the round medians
     against the stored run medians gives p < α = 0.05. Too few rounds for that (1 / C(n+m, n) ≥ α: 3 rounds
     against 3 runs) is INCONCLUSIVE with cause ``few-rounds``, which confirmation answers with more rounds;
   * with fewer stored runs and a spread learned from the metric's family on this host: the quartile of all
     current samples nearest to the reference is beyond the threshold too;
   * with fewer stored runs and no learned spread, or a baseline of another host without a spread between hosts:
     never (INCONCLUSIVE, cause ``too-few-runs`` / ``other-host``).
   When it does not agree, the verdict is INCONCLUSIVE; the reason says why and ``cause`` says whether more
   rounds can help.
4. A gross change decides on any number of rounds: every round median at least `GROSS_FACTOR` (x3) worse (or
   better) than every stored run median, and by more than the stored runs' own max/min ratio, is REGRESSED
   (IMPROVED) with cause ``gross`` where the rules above would stay INCONCLUSIVE for want of rounds. One server start
   is one round of a serving metric: without this a x10 regression on one start read INCONCLUSIVE and exited 0.
   Only against at least 3 stored runs of this host, and only for a metric of the steady state (`steady`): a
   clean-clone CPU CI read x3.6 on a cold-cache start phase, x12.7 on an n-gram window's first-token latency
   against one run, and another host is another machine.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.stats import Summary
from pytest_moeperf.judging.thresholds import MIN_RUNS_FOR_SPREAD, Reference, Threshold

ALPHA = 0.05
#: a change decided on any evidence (rule 4): the largest move measured between two starts, or two windows of one
#: start, of a profile on 1x H200 was x1.86 (the server's TPOT, c=16, 7 starts); CPU TTFT medians of one window
#: shape moved up to x1.1-x3.5 between runs (those the runs' own max/min ratio covers where they are stored)
GROSS_FACTOR = 3.0
#: metrics a cold cache or a first window moves by more than `GROSS_FACTOR` on a healthy machine, never decided by
#: rule 4 (a clean-clone CPU CI: ``startup_engine_init_s`` x3.6 against 6 runs; an n-gram c=4 window's TTFT mean
#: x12.7 and p90 x29.9): start-up phases, first-token and queueing latencies (a compile holds the first requests),
#: and tail percentiles (one slow request is the tail)
NOT_STEADY = ("startup", "ttft", "queue", "_p9", "_max")
#: how a verdict inside a family that moved as a whole ends its reason (`shift.in_moved_families`)
LIKELY_THE_MACHINE = "likely the machine"


class Cause:
    """Why a verdict is INCONCLUSIVE; the first four are helped by more rounds of the test."""

    NOISE = "noise"  # the samples or the rank test cannot resolve the mde yet
    DISAGREE = "disagree"  # some round medians are beyond the mde and some are not
    FEW_ROUNDS = "few-rounds"  # every round is beyond, but too few rounds for the rank test
    BUDGET = "budget"  # the confirmation budget ran out while the evidence was still coming
    TOO_FEW_RUNS = "too-few-runs"  # fewer than 3 stored runs and no learned spread: re-record
    OTHER_HOST = "other-host"  # the baseline is another host's and no spread between hosts is known
    ZERO_BASELINE = "zero-baseline"
    HEALTH = "health"  # the health gate tripped in every round
    WINDOW = "window"  # the test declared its window degenerate in every round
    STRICT = "strict"  # --moeperf-strict: a baseline recorded on a machine of another fingerprint hash
    GROSS = "gross"  # not INCONCLUSIVE: a REGRESSED or IMPROVED decided by rule 4 on too little evidence for 3
    MACHINE = "machine"  # its family moved as a whole, and every stored run is of this run's code: the machine moved
    #: its family moved together within its common mde (what its stored runs moved together), and with that move
    #: divided out some round is within the mde (`shift.beside_common_moves`): not told from the machine's move
    FAMILY = "family"
    HELPED = frozenset({NOISE, DISAGREE, FEW_ROUNDS})


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
    mde: float | None = None  # the minimum detectable effect: the relative bound this verdict used
    spread: str = ""  # where the noise term of the threshold came from
    #: what set the spread: "baseline" (its stored runs), "history" (accepted sessions), "within-run" (fewer than
    #: 3 stored runs: their IQR), "" (no reference)
    noise_source: str = ""
    threshold: Threshold = Threshold()
    reason: str = ""
    #: why an INCONCLUSIVE verdict is so, as a `Cause` value ("" otherwise): says whether more rounds can decide it
    cause: str = ""

    @property
    def more_rounds_help(self) -> bool:
        """Whether another round of the test can settle this verdict (confirmation re-runs it): an INCONCLUSIVE
        whose evidence is still coming, or a regression or an improvement seen in one round only (the same bar
        both ways: an improvement invites a re-record, which would store a lucky round)."""
        if self.status in (Status.REGRESSED, Status.IMPROVED):
            return len(self.round_medians) < 2
        return self.status is Status.INCONCLUSIVE and self.change is not None and self.cause in Cause.HELPED

    @property
    def provisional(self) -> bool:
        """A REGRESSED against other hosts' baselines: its test does not fail for it; the session's end decides it,
        after the machine-shift view (a family that moved as a whole is the host: `shift.in_moved_families`)."""
        return self.status is Status.REGRESSED and self.noise_source == "hosts"

    @property
    def reason_to_rerecord(self) -> bool:
        """An IMPROVED on the evidence confirmation gives a REGRESSED: at least 2 rounds (a one-round change is
        re-run while the budget allows: `more_rounds_help`), and not inside a family that moved as a whole (the
        machine, not the code: an update would store the machine's move)."""
        return (self.status is Status.IMPROVED and len(self.round_medians) >= 2
                and LIKELY_THE_MACHINE not in self.reason)

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
        if self.reference is None or self.change is None or self.mde is None:
            tail = f": {self.reason}" if self.reason else " (no baseline for this fingerprint)"
            return f"{self.name}: {cur} -> {self.status.value}{tail}"
        direction = "lower" if self.better == "lower" else "higher"
        abs_tol = f", abs {self.threshold.abs_tolerance:g}{unit}" if self.threshold.abs_tolerance else ""
        text = (f"{self.name}: baseline {self.reference:.4g}{unit} ({self.runs} run{'s' if self.runs != 1 else ''})"
                f" -> current {cur} (n={n}{rounds}), change {self.change * 100:+.1f} % "
                f"[{direction} is better; mde {self.mde * 100:.1f} %{abs_tol}; {self.spread}]"
                f" -> {self.status.value}")
        return text + (f": {self.reason}" if self.reason else "")


def _worse(better: str, reference: float, value: float) -> float:
    """Relative change of ``value`` against ``reference``, positive when it is worse."""
    change = stats.relative_change(reference, value)
    return change if better == "lower" else -change


def steady(name: str) -> bool:
    """Whether rule 4 may decide metric ``name``: not a start-up, first-token, queueing or tail figure."""
    return not any(part in name for part in NOT_STEADY)


def gross_factor(better: str, sign: float, medians: Sequence[float], against: Sequence[float]) -> float | None:
    """Rule 4: by how many times every round median is beyond every stored run median in the direction ``sign``
    (+1: worse), when that is at least `GROSS_FACTOR` and more than the stored runs' own max/min; else None."""
    values = [*medians, *against]
    if not medians or not against or min(values) <= 0:
        return None
    up = (better == "lower") == (sign > 0)  # the change makes the value larger
    factor = min(medians) / max(against) if up else min(against) / max(medians)
    own = max(against) / min(against)
    return factor if factor >= GROSS_FACTOR and factor > own else None


def rounds_needed(stored_runs: int, alpha: float = ALPHA) -> int | None:
    """How many rounds a rank test against ``stored_runs`` run medians needs before it can give p below
    ``alpha`` (None: it never can, below 3 stored runs a verdict is not decided on ranks anyway)."""
    if stored_runs < 1:
        return None
    for n in range(1, 64):
        if stats.min_p(n, stored_runs) < alpha:
            return n
    return None


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
    bound = threshold.bound(reference)
    allowed = bound.mde
    estimate = stats.median(medians)
    known = dataclasses.replace(base, reference=ref, runs=reference.runs, mde=allowed, spread=bound.spread,
                                noise_source=bound.source)

    def verdict(status: Status, change: float | None, reason: str = "", cause: str = "") -> Verdict:
        return dataclasses.replace(known, status=status, change=change, reason=reason, cause=cause)

    if ref == 0:
        if abs(estimate) <= threshold.abs_tolerance:  # a relative change from 0 is undefined; an absolute one is not
            return verdict(Status.PASS, 0.0 if estimate == 0 else None)
        return verdict(Status.INCONCLUSIVE, None, "baseline median is 0: unusable, a relative change from 0 is "
                       "undefined (re-record it, or judge this metric with abs_tolerance on a non-zero unit)",
                       Cause.ZERO_BASELINE)
    change = stats.relative_change(ref, estimate)
    worse = _worse(better, ref, estimate)
    if abs(worse) <= allowed or abs(estimate - ref) <= threshold.abs_tolerance:
        return verdict(Status.PASS, change)
    sign = 1.0 if worse > 0 else -1.0
    status = Status.REGRESSED if sign > 0 else Status.IMPROVED
    word = "worse" if sign > 0 else "better"
    eligible = steady(name) and reference.other_hosts is None and reference.runs >= MIN_RUNS_FOR_SPREAD
    factor = gross_factor(better, sign, medians, reference.run_medians) if eligible else None

    def decided_gross(short: str) -> Verdict:
        assert factor is not None
        return verdict(status, change, f"{short}, but every round is {factor:.2f}x {word} than every stored run: "
                       f"a gross change (at least x{GROSS_FACTOR:g} and beyond the runs' own range) needs no more",
                       Cause.GROSS)

    if not bound.decisive:
        if factor is not None:
            return decided_gross(bound.why_not)
        cause = Cause.OTHER_HOST if reference.other_hosts is not None else Cause.TOO_FEW_RUNS
        return verdict(Status.INCONCLUSIVE, change, bound.why_not, cause)
    beyond = sum(1 for m in medians if sign * _worse(better, ref, m) > allowed)
    if beyond < len(medians):
        return verdict(Status.INCONCLUSIVE, change, f"rounds disagree: {beyond} of {len(medians)} round medians "
                       f"are {word} than the threshold", Cause.DISAGREE)
    runs = reference.noise_runs if bound.source == "history" else reference.runs
    if runs >= MIN_RUNS_FOR_SPREAD:
        # the rank test is the evidence; it decides once there are enough rounds for it (3 rounds against 3
        # stored runs cannot reach p < 0.05; 4 can), and confirmation adds rounds until then
        needed = rounds_needed(runs) or len(medians) + 1
        if len(medians) < needed:
            if factor is not None:
                return decided_gross(f"{len(medians)} round(s) against {runs} stored runs cannot reach p < {ALPHA}")
            return verdict(Status.INCONCLUSIVE, change, f"every round is {word} than the threshold, but "
                           f"{len(medians)} round(s) against {runs} stored runs cannot reach p < {ALPHA}: "
                           f"{needed} rounds can", Cause.FEW_ROUNDS)

        def oriented(v: float) -> float:  # "greater" means the direction of the change
            return sign * (v if better == "lower" else -v)

        against = reference.history_medians if bound.source == "history" else reference.run_medians
        p = stats.mann_whitney_greater([oriented(m) for m in medians], [oriented(m) for m in against])
        if p >= ALPHA:
            return verdict(Status.INCONCLUSIVE, change, f"not significant: rank test of {len(medians)} round "
                           f"medians against {len(against)} stored runs gives p = {p:.3f}, not below {ALPHA}",
                           Cause.NOISE)
        return verdict(status, change, f"rank test p = {p:.3f}")
    # fewer stored runs, with a spread learned from the family: the samples themselves must agree — the quartile
    # nearest the reference is beyond the threshold too, so a lucky quarter of them cannot hide a change
    near = stats.quantile(pooled, 0.25 if (better == "lower") == (sign > 0) else 0.75)
    if sign * _worse(better, ref, near) <= allowed:
        if factor is not None:
            return decided_gross("a quarter of the samples are within the threshold")
        return verdict(Status.INCONCLUSIVE, change, f"too noisy to resolve {allowed * 100:.1f} %: a quarter of the "
                       f"samples are within the threshold (quartile {near:.4g}{' ' + unit if unit else ''})",
                       Cause.NOISE)
    if factor is not None:  # decided either way; the cause says one round may decide it (`judge.Judge`)
        return decided_gross(f"{bound.spread}; quartile rule")
    return verdict(status, change, f"{bound.spread}; quartile rule")


def missing(key: str, name: str, unit: str, better: str, reference: float | None, reason: str) -> Verdict:
    return Verdict(key, name, unit, better, Status.MISSING, None, reference=reference, reason=reason)


def inconclusive(verdict: Verdict, reason: str, cause: str = "") -> Verdict:
    """``verdict`` made INCONCLUSIVE (e.g. the health gate tripped): it can then neither pass nor fail."""
    return dataclasses.replace(verdict, status=Status.INCONCLUSIVE, reason=reason, cause=cause)
