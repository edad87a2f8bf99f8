"""The judge: a ledger record, its baseline on this host and the named noise sources decide its verdict.

The judge reads; it never writes. Its inputs are explicit: the baseline store (the runs of this host, or of other
hosts of the same fingerprint), the family spread the store learns for metrics with fewer than 3 runs here, and an
optional history noise source (`NoiseSource`: medians of this metric's accepted sessions on this host, filtered by
unit, direction and the re-record that reset its runs). The verdict rule itself is the ``pytest_moeperf_verdict``
hook (default `verdict.judge`), handed in as ``decide``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pytest_moeperf.judging.levels import judged_units
from pytest_moeperf.judging.thresholds import MIN_RUNS_FOR_SPREAD, Reference, Threshold
from pytest_moeperf.judging.verdict import Cause, Status, Verdict, inconclusive
from pytest_moeperf.ledger import ROUND_UNIT, Measurement, Record
from pytest_moeperf.store.baselines import BaselineStore
from pytest_moeperf.store.entries import BaselineEntry

Decide = Callable[[Measurement, tuple[tuple[float, ...], ...], Reference | None, Threshold], Verdict]


class MetricChanged(Exception):
    """A metric's unit, direction or workload differs from its stored entry: the numbers cannot be compared."""


class NoiseSource(Protocol):
    """Medians of a metric's earlier accepted sessions on this host (newest first), beside the baseline's runs."""

    name: str

    def medians(self, key: str, unit: str, better: str, since: str | None) -> tuple[float, ...]: ...


@dataclass
class Judge:
    store: BaselineStore
    decide: Decide
    fingerprint_hash: str
    update: bool = False  # a changed unit or workload starts the metric afresh instead of failing its test
    strict: bool = False
    noise: NoiseSource | None = None

    def baseline(self, metric: Measurement) -> BaselineEntry | None:
        """The stored entry of ``metric`` (None: none, or an update re-records a changed one).
        Raises `BaselineError` for an unusable file, `MetricChanged` for a changed unit, direction or workload."""
        entry = self.store.entry(metric.key)
        change = entry.identity.change(metric.identity) if entry is not None else ""
        if change:
            if not self.update:
                raise MetricChanged(f"{metric.name}: {change}; the numbers cannot be compared: re-record with "
                                    "--moeperf-update")
            return None
        return entry

    def reference(self, metric: Measurement, entry: BaselineEntry) -> Reference:
        """The entry's reference on this host, with the family spread and the history's medians where they
        apply."""
        ref = entry.reference(self.store.host)
        if ref.other_hosts is None and ref.runs < MIN_RUNS_FOR_SPREAD:
            family = self.store.family_spread(metric.key)
            if family is not None:
                ref = dataclasses.replace(ref, family_spread=family[0], family_source=family[1])
        if ref.other_hosts is None and self.noise is not None:
            medians = self.noise.medians(metric.key, metric.unit, metric.better, entry.since)
            if medians:
                ref = dataclasses.replace(ref, history_medians=medians)
        return ref

    def judge(self, record: Record) -> Verdict:
        """The verdict of ``record``: on its usable rounds; INCONCLUSIVE with the reasons when none is usable. The
        windows of one server start are judged as one round, or each as one when this host's stored starts show the
        start adds nothing beyond its windows (`levels.judged_units`)."""
        chosen = [r for r in record.rounds if r.usable]
        entry = self.baseline(record.metric)
        units = judged_units(chosen or record.rounds, self.reference(record.metric, entry) if entry else None)
        verdict = self.decide(record.metric, units.rounds, units.reference, record.threshold)
        if units.note:
            verdict = dataclasses.replace(verdict, spread="; ".join(filter(None, (verdict.spread, units.note))))
        usable = units.rounds if chosen else ()
        unit = record.metric.context.get(ROUND_UNIT)
        if unit and len(usable) < 2 and verdict.status in (Status.REGRESSED, Status.IMPROVED) \
                and verdict.noise_source == "family":
            # the family's spread stands in for too few stored runs; it is learned from cases of one start each, so
            # one start beyond it is one observation of start-to-start noise (two starts of one profile read
            # +39 % apart in the server's TPOT on 1x H200): a second start must agree
            word = "worse" if verdict.status is Status.REGRESSED else "better"
            verdict = inconclusive(verdict, f"one {unit} is {word} than the threshold; against fewer than "
                                   f"{MIN_RUNS_FOR_SPREAD} stored runs a second {unit} must agree", Cause.FEW_ROUNDS)
        counted = counts(len(usable), len(record.rounds), str(unit)) if unit and not units.note else \
            counts_windows(len(chosen), len(record.rounds), units.starts, str(unit)) if unit else ""
        if not usable:
            problems = record.problems
            cause = Cause.HEALTH if all(p.startswith("health: ") for p in problems) else Cause.WINDOW
            verdict = inconclusive(verdict, "; ".join([counted] * bool(counted) + list(problems)), cause)
        elif len(chosen) < len(record.rounds) or counted:
            dropped = [f"{r.label}: {'; '.join(r.problems)}" for r in record.rounds if not r.usable]
            why = ": " + " | ".join(dropped) if dropped else ""
            told = f"{counted}{why}" if counted else f"rounds not judged{why}"
            verdict = dataclasses.replace(verdict, reason="; ".join([verdict.reason] * bool(verdict.reason) + [told]))
        if self.strict and verdict.reference is not None:
            other = self.store.foreign_hash(record.metric.suite, self.fingerprint_hash)
            if other is not None:
                verdict = inconclusive(verdict, f"--moeperf-strict: baseline recorded on a machine with fingerprint "
                                                f"hash {other}, this one is {self.fingerprint_hash}", Cause.STRICT)
        return verdict


def counts(judged: int, rounds: int, unit: str) -> str:
    """How many rounds of a metric whose round is a ``unit`` (a server start) were judged and set aside."""
    def many(n: int) -> str:
        return f"{n} {unit}{'' if n == 1 else 's'}"

    return f"{many(judged)} judged, {rounds - judged} set aside"


def counts_windows(judged: int, rounds: int, starts: int, unit: str) -> str:
    """`counts` for the windows of server starts (``--moeperf-windows``)."""
    return (f"{starts} {unit}{'' if starts == 1 else 's'} ({judged} windows) judged, {rounds - judged} window(s) "
            "set aside")


def settled(verdict: Verdict) -> bool:
    """Whether another round cannot change ``verdict`` (PASS, NEW, IMPROVED, a confirmed regression, or an
    INCONCLUSIVE that more rounds cannot decide)."""
    return not verdict.more_rounds_help


def budget_ended(verdict: Verdict, budget: int, how: str, ended_by: str | None = None) -> Verdict:
    """``verdict`` after its confirmation budget (or what ``ended_by`` names) ran out while more rounds could still
    have decided it."""
    if verdict.status is not Status.INCONCLUSIVE or not verdict.more_rounds_help:
        return verdict
    by = ended_by or f"the confirmation budget ({budget} more round(s))"
    return dataclasses.replace(verdict, cause=Cause.BUDGET, reason=f"{verdict.reason} — {by} ended it, not the "
                               f"evidence: raise {how}")
