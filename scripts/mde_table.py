"""The detectable effect of every metric of a run, by suite and metric, as a Markdown table.

    python scripts/mde_table.py .tox/moeperf-report.json

Reads a ``--moeperf-report`` JSON: each judged metric's ``mde`` is the threshold its verdict used (max of its
minimum effect and noise_k x its learned between-run spread). Prints, per suite and metric name, how many cases,
the median and the largest mde, and how many of those cases' spreads came from more than one sitting.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pytest_moeperf.reports.document import metric_entries


def rows(report: dict) -> list[tuple[str, str, int, float, float, int]]:  # type: ignore[type-arg]
    groups: dict[tuple[str, str], list[tuple[float, bool]]] = defaultdict(list)
    for bench in metric_entries(report):  # every metric: times and the other units
        info = bench["extra_info"]
        mde = info.get("mde")
        if mde is None:
            continue
        suite = Path(bench["fullname"].split("::")[0]).parent.name or "?"
        sittings = re.search(r"in (\d+) sittings", info.get("spread") or "")
        groups[(suite, info["metric"])].append((float(mde), bool(sittings)))
    return [(suite, metric, len(v), statistics.median(m for m, _ in v), max(m for m, _ in v),
             sum(1 for _, s in v if s)) for (suite, metric), v in sorted(groups.items())]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    report = json.loads(Path(argv[0]).read_text())
    print("| suite | metric | cases | mde median | mde max | spread from >1 sitting |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for suite, metric, n, median, largest, multi in rows(report):
        print(f"| {suite} | `{metric}` | {n} | {median * 100:.1f} % | {largest * 100:.1f} % | {multi} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
