"""Judge a recorded session again, offline: every record of a ``--moeperf-report`` document against a baselines
directory, under the verdict rules of this checkout (a benchmark tool, not a test).

The ledger keeps every round's samples, health and window reasons, so a rule change can be measured on real GPU
noise without a GPU: ``python tests/benchmarks/rejudge.py REPORT.json BASELINES_DIR [--host ID]`` prints the
verdict counts per metric name, then each REGRESSED and IMPROVED record with its reason.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
from pathlib import Path

from pytest_moeperf.judging.judge import Judge
from pytest_moeperf.judging.verdict import Status, judge
from pytest_moeperf.reports.document import ledger_of
from pytest_moeperf.store.baselines import BaselineStore


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
    referee = Judge(store, lambda m, rounds, ref, threshold: judge(m.key, m.name, m.unit, m.better, rounds, ref,
                                                                    threshold), section["hash"])
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    flagged = []
    for record in ledger.records.values():
        if args.quiet_floor is not None and record.threshold.quiet_floor is not None:
            record = dataclasses.replace(record, threshold=dataclasses.replace(
                record.threshold, quiet_floor=None if args.quiet_floor >= 1 else args.quiet_floor))
        verdict = referee.judge(record)
        counts[record.metric.name][verdict.status.value] += 1
        if verdict.status in (Status.REGRESSED, Status.IMPROVED):
            flagged.append(f"{verdict.status.value} {record.key}: {verdict.message()}")
    for name, found in sorted(counts.items()):
        print(f"{name:20s} " + "  ".join(f"{s} {n}" for s, n in sorted(found.items())))
    print("\n".join(flagged))


if __name__ == "__main__":
    main()
