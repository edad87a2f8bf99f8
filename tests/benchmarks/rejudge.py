"""Judge a recorded session again, offline: every record of a ``--moeperf-report`` document against a baselines
directory, under the verdict rules of this checkout (a benchmark tool, not a test).

The ledger keeps every round's samples, health and window reasons, so a rule change can be measured on real GPU
noise without a GPU: ``python tests/benchmarks/rejudge.py REPORT.json BASELINES_DIR [--host ID]`` prints the
verdict counts per metric name, then each REGRESSED and IMPROVED record with its reason. As a session does at its
end, verdicts inside families that moved as a whole are then read again (`shift.in_moved_families`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
from pathlib import Path

from pytest_moeperf.judging.judge import Judge
from pytest_moeperf.judging.shift import family_views, in_moved_families
from pytest_moeperf.judging.verdict import Status, judge
from pytest_moeperf.ledger import Record
from pytest_moeperf.reports.document import ledger_of
from pytest_moeperf.store.baselines import BaselineStore


def referee(store: BaselineStore, fingerprint_hash: str) -> Judge:
    """A judge of records against ``store`` under this checkout's verdict rule (no plugin hooks)."""
    return Judge(store, lambda m, rounds, ref, threshold: judge(m.key, m.name, m.unit, m.better, rounds, ref,
                                                                 threshold), fingerprint_hash)


def with_quiet_floor(record: Record, floor: float | None) -> Record:
    """``record`` judged with quiet floor ``floor`` (>= 1: off) instead of its recorded one, where it had one (a
    metric with its own minimum effect has no quiet floor); ``floor`` None: as recorded."""
    if floor is None or record.threshold.quiet_floor is None:
        return record
    return dataclasses.replace(record, threshold=dataclasses.replace(record.threshold,
                                                                     quiet_floor=None if floor >= 1 else floor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("report", type=Path)
    parser.add_argument("baselines", type=Path)
    parser.add_argument("--host", help="judge as this host id (default: the report's)")
    parser.add_argument("--quiet-floor", type=float, default=None, metavar="FRAC",
                        help="judge with this quiet floor instead of the recorded one (1 turns it off)")
    args = parser.parse_args()
    doc = json.loads(args.report.read_text())
    ledger = ledger_of(doc)
    section = doc["moeperf"]
    store = BaselineStore(args.baselines, section["fingerprint"], args.host or section.get("host"))
    judged = referee(store, section["hash"])
    verdicts = {key: judged.judge(with_quiet_floor(record, args.quiet_floor)) for key, record in ledger.records.items()}
    views = family_views(list(verdicts.values()), store.run_medians(verdicts))
    verdicts.update(in_moved_families(verdicts, views))
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    flagged = []
    for key, verdict in verdicts.items():
        counts[verdict.name][verdict.status.value] += 1
        if verdict.status in (Status.REGRESSED, Status.IMPROVED):
            flagged.append(f"{verdict.status.value} {key}: {verdict.message()}")
    for name, found in sorted(counts.items()):
        print(f"{name:20s} " + "  ".join(f"{s} {n}" for s, n in sorted(found.items())))
    print("\n".join(flagged))


if __name__ == "__main__":
    main()
