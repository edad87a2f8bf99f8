"""What a ``--moeperf-update`` writes from the ledger, and what it leaves out and why.

Each round that can be stored adds one run to its metric: the test passed in that round, the health gate passed
its window and the test did not declare the window degenerate. The windows of one server start (rounds with a
window number, `ledger.Round.window`) are one run: their samples pooled, each window's median kept beside them
(`judging.levels` learns the start's and the window's variance from them). A metric with no such round is left
out, named.
A metric of a family that moved together (the machine-shift view: usually the machine, not the code) is left out
unless ``--moeperf-accept-shift`` says the machine's new state is the one to guard. Beside the metrics of each test
file it writes, the canary's figures of each round are written too (`canary_measurements`), whatever state the
machine is in: an update in another sitting is meant to store the machine's other state (its spread is what the
canary's move is judged against). Nothing is written from a simulated topology.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.levels import starts_of
from pytest_moeperf.judging.shift import Family
from pytest_moeperf.ledger import SUBFAMILY, Ledger, Measurement
from pytest_moeperf.machine.canary import CANARY_TEST, UNIT, Reading

SHOWN = 5


@dataclass(frozen=True)
class UpdatePlan:
    measurements: list[Measurement] = field(default_factory=list)  # one per run to store
    problems: list[str] = field(default_factory=list)  # what is left out, and why


def _named(keys: Sequence[str]) -> str:
    more = f", and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return ", ".join(keys[:SHOWN]) + more


def canary_measurements(readings: Sequence[Reading], files: Collection[str]) -> list[Measurement]:
    """The canary's figures to store beside the metrics of ``files``: one run per workload and round (its readings'
    samples pooled), as the metrics of that round are each one run."""
    pooled: dict[tuple[str, str, str], list[float]] = {}
    for reading in readings:
        if reading.file in files:
            pooled.setdefault((reading.file, reading.workload, reading.origin), []).extend(reading.samples)
    return [Measurement(f"{file}::{CANARY_TEST}", workload, tuple(samples), UNIT, "lower",
                        context={"canary": workload})
            for (file, workload, _), samples in pooled.items()]


def plan_update(ledger: Ledger, moved: Sequence[Family], accept_shift: bool, simulated: bool) -> UpdatePlan:
    """What to write: ``moved`` families are held back unless ``accept_shift``."""
    if simulated:
        return UpdatePlan(problems=["baselines not updated: the topology is simulated"] if ledger.records else [])
    shifted = list(moved) if not accept_shift else []
    plan = UpdatePlan()
    unusable: dict[str, list[str]] = {}
    held: dict[Family, list[str]] = {}
    for key, record in ledger.records.items():
        subfamily = str(record.metric.context.get(SUBFAMILY) or "")
        family = next((f for f in shifted if f.holds(key, record.metric.name, subfamily)), None)
        if family is not None:
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
    for f, keys in held.items():
        plan.problems.append(f"{len(keys)} metric(s) of {f.label} {f.name} not written: the family moved "
                             f"{f.median_change * 100:+.1f} % together ({f.same_direction} of {f.cases} cases), "
                             "usually the machine; look at it, then re-record with --moeperf-accept-shift")
    written = {m.test_id.split("::")[0] for m in plan.measurements}
    plan.measurements.extend(canary_measurements(ledger.canary, written))
    return plan
