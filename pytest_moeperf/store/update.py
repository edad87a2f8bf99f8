"""What a ``--moeperf-update`` writes from the ledger, and what it leaves out and why.

Each round that can be stored adds one run to its metric: the test passed in that round, the health gate passed
its window and the test did not declare the window degenerate. The windows of one server start (rounds with a
window number, `ledger.Round.window`) are one run: their samples pooled, each window's median kept beside them
(`judging.levels` learns the start's and the window's variance from them). A metric with no such round is left
out, named.
A metric of a family that moved together (the machine-shift view: usually the machine, not the code) is left out
unless ``--moeperf-accept-shift`` says the machine's new state is the one to guard. Nothing is written from a
simulated topology.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.levels import starts_of
from pytest_moeperf.judging.shift import Family
from pytest_moeperf.ledger import Ledger, Measurement

SHOWN = 5


@dataclass(frozen=True)
class UpdatePlan:
    measurements: list[Measurement] = field(default_factory=list)  # one per run to store
    problems: list[str] = field(default_factory=list)  # what is left out, and why


def _named(keys: Sequence[str]) -> str:
    more = f", and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def plan_update(ledger: Ledger, moved: Sequence[Family], accept_shift: bool, simulated: bool) -> UpdatePlan:
    if simulated:
        return UpdatePlan(problems=["baselines not updated: the topology is simulated"] if ledger.records else [])
    shifted = {(f.family, f.name): f for f in moved} if not accept_shift else {}
    plan = UpdatePlan()
    unusable: dict[str, list[str]] = {}
    held: dict[tuple[str, str], list[str]] = {}
    for key, record in ledger.records.items():
        family = (record.metric.test_id.split("::")[0], record.metric.name)
        if family in shifted:
            held.setdefault(family, []).append(key)
            continue
        rounds = [r for r in record.rounds if r.writable]
        if not rounds:
            why = "test failed" if not any(r.test_passed for r in record.rounds) else "; ".join(record.problems)
            unusable.setdefault(why, []).append(key)
            continue
        for start in starts_of(rounds):
            pooled = tuple(x for r in start for x in r.samples)
            windows = tuple(stats.median(r.samples) for r in start) if start[0].window is not None else ()
            plan.measurements.append(dataclasses.replace(record.metric, samples=pooled, windows=windows))
    for why, keys in unusable.items():
        plan.problems.append(f"{len(keys)} metric(s) not written to the baselines ({why}): {_named(keys)}")
    for (name, metric), keys in held.items():
        f = shifted[(name, metric)]
        plan.problems.append(f"{len(keys)} metric(s) of {name} {metric} not written: the family moved "
                             f"{f.median_change * 100:+.1f} % together ({f.same_direction} of {f.cases} cases), "
                             "usually the machine; look at it, then re-record with --moeperf-accept-shift")
    return plan
