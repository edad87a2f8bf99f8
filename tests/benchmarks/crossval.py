"""Power and false alarms of the stored-baseline verdicts on real noise, offline, by leaving one sitting out (a
benchmark tool, not a test).

Give it the JSON reports of N >= 3 ``--moeperf-update`` sessions of the same cases on one host (each a sitting,
best with ``--moeperf-rounds 3``: three processes each). For each sitting in turn, the other sittings' rounds are
stored into a fresh baselines directory exactly as ``--moeperf-update`` stores them (`plan_update`, then
`BaselineStore.update`, each sitting under its own date), and the left-out sitting's records are judged against it
under this checkout's rules, its samples of ``--metric`` made worse by each ``--factor`` (1.0: A/A). Only the rounds
the session measured are judged: confirmation re-runs, which a live session would add to an undecided metric, are
not simulated, so the power printed is a lower bound.

    python tests/benchmarks/crossval.py sitting-1.json sitting-2.json sitting-3.json --factor 1.0 1.03 1.05

Reports may be gzipped (``.gz``): ``docs/notes/h200-2026-12-01-c/sitting-*.time.json.gz`` are the 1x H200 sittings
of docs/measurements/h200-2026-12-01-c.md, cut to the ``time`` metric. They were recorded 2-3 minutes apart on one
boot, so they store as one sitting (`store.entries.sittings`) unless ``--hours-apart H`` dates them H hours apart
(what the quiet floor would make of the same noise had they been real sittings).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

from rejudge import referee, with_quiet_floor  # this folder's: run as python tests/benchmarks/crossval.py

from pytest_moeperf.judging.verdict import Status
from pytest_moeperf.ledger import Record
from pytest_moeperf.reports.document import ledger_of
from pytest_moeperf.store.baselines import BaselineStore
from pytest_moeperf.store.update import plan_update


def store_sittings(root: Path, docs: list[dict[str, Any]], hours_apart: float | None = None) -> BaselineStore:
    """A baselines directory holding every round of ``docs``' records, one update (date) per document: its own
    date, or ``hours_apart`` after the previous one."""
    first = docs[0]["moeperf"]
    store = BaselineStore(root, first["fingerprint"], first.get("host"))
    for i, doc in enumerate(docs):
        plan = plan_update(ledger_of(doc), [], accept_shift=True, simulated=False)
        date = doc["datetime"] if hours_apart is None else (
            dt.datetime(2026, 12, 1, tzinfo=dt.UTC) + dt.timedelta(hours=hours_apart * i)).isoformat()
        provenance = {"date": date, "fingerprint_hash": doc["moeperf"]["hash"],
                      "host_id": doc["moeperf"].get("host")}
        store.update(plan.measurements, {"slug": first["fingerprint"]}, provenance)
    return store


def worse(record: Record, factor: float) -> Record:
    """The record with every round's samples made worse by ``factor`` (the direction its metric calls worse)."""
    if factor == 1.0:
        return record
    scale = factor if record.metric.better == "lower" else 1.0 / factor
    rounds = tuple(dataclasses.replace(r, samples=tuple(s * scale for s in r.samples)) for r in record.rounds)
    return dataclasses.replace(record, rounds=rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--factor", type=float, nargs="+", default=[1.0, 1.03, 1.05])
    parser.add_argument("--metric", default="time", help="the metric name the factor applies to (default: time)")
    parser.add_argument("--quiet-floor", type=float, default=None, metavar="FRAC",
                        help="judge with this quiet floor instead of the recorded one, where the metric had one "
                             "(1 turns it off)")
    parser.add_argument("--hours-apart", type=float, default=None, metavar="H",
                        help="store the sittings H hours apart instead of at their own dates")
    args = parser.parse_args()
    if len(args.reports) < 3:
        parser.error("give 3 or more sittings: 2 to store (the quiet floor needs 2 sittings) and 1 to judge")
    docs = [json.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()) for p in args.reports]
    # (factor, metric name) -> verdict counts; a factor only touches --metric, the other metrics are an A/A
    counts: dict[tuple[float, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    mdes: list[float] = []
    for left_out, doc in enumerate(docs):
        others = [d for i, d in enumerate(docs) if i != left_out]
        with tempfile.TemporaryDirectory() as tmp:
            store = store_sittings(Path(tmp), others, args.hours_apart)
            judged = referee(store, doc["moeperf"]["hash"])
            for record in ledger_of(doc).records.values():
                record = with_quiet_floor(record, args.quiet_floor)
                for factor in args.factor:
                    scaled = worse(record, factor) if record.metric.name == args.metric else record
                    verdict = judged.judge(scaled)
                    counts[(factor, record.metric.name)][verdict.status.value] += 1
                    if factor == 1.0 and record.metric.name == args.metric and verdict.mde is not None:
                        mdes.append(verdict.mde)
    apart = "at their own dates" if args.hours_apart is None else f"{args.hours_apart:g} h apart"
    print(f"{len(docs)} update sessions, each judged against the other {len(docs) - 1} (stored {apart}); "
          f"'{args.metric}' made worse by the factor, the other metrics unchanged (an A/A)")
    for (factor, name), found in sorted(counts.items()):
        judged = sum(n for s, n in found.items() if s not in ("NEW", "MISSING"))
        share = found[Status.REGRESSED.value] / judged if judged else 0.0
        flagged = found[Status.REGRESSED.value] + found[Status.IMPROVED.value]  # at x1, every one a false alarm
        print(f"x{factor:<5g} {name:14s} judged {judged:4d}  REGRESSED {share:6.1%}  flagged {flagged:3d}  "
              + "  ".join(f"{s} {n}" for s, n in sorted(found.items())))
    if mdes:
        mdes.sort()
        print(f"'{args.metric}' mde at x1: median {mdes[len(mdes) // 2]:.1%}, p90 {mdes[int(len(mdes) * 0.9)]:.1%}, "
              f"max {mdes[-1]:.1%}")


if __name__ == "__main__":
    main()
