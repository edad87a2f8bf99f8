"""CI's reading of a CPU suites run: functional failures fail CI; perf regressions alone are reported, not gated.

    python scripts/ci-suites-verdict.py EXIT_CODE JUNIT_XML REPORT_JSON

Why advisory on the CPU CI (issue 38, docs/measurements/canary.md): on the shared 2-core VM CI runs on, unchanged
code read REGRESSED in every clean-clone run of 2026-12-05/06 (canary_check runs 1, 2, 4; CI of 7eef6f4:
shared_gate_up M=1/8/32 bf16 +57-86 % for the minutes it took to measure them and confirm them in fresh processes).
Such verdicts are printed in full (and stay in the reports); CI fails on anything else: a test that errored or failed
for another reason, a run that collected nothing, pytest's own errors (exit codes other than 0 and 1).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

REGRESSION = "moeperf: "  # how a test failed by its metrics' verdicts begins its message (session.py)


def main(argv: list[str]) -> int:
    code, junit, report = int(argv[0]), Path(argv[1]), Path(argv[2])
    if code == 0:
        return 0
    if code != 1 or not junit.exists() or not report.exists():
        print(f"suites: exit code {code} (junit {'found' if junit.exists() else 'missing'}, report "
              f"{'found' if report.exists() else 'missing'}): CI fails")
        return code or 1
    problems: list[str] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        for tag in ("error", "failure"):
            for found in case.iter(tag):
                text = (found.get("message") or "") + (found.text or "")
                if tag == "error" or "regressed against baselines" not in text:
                    problems.append(f"{tag}: {name}: {(found.get('message') or '').splitlines()[:1]}")
    verdicts = json.loads(report.read_text())["moeperf"]["records"]
    regressed = sorted(f"{r['metric']['test_id']}::{r['metric']['name']} {r['verdict']['change'] * 100:+.1f} %"
                       for r in verdicts if (r.get("verdict") or {}).get("status") == "REGRESSED")
    if problems or not regressed:
        print("suites: CI fails on what is not a perf verdict:" if problems else
              "suites: exit code 1 without a REGRESSED verdict: CI fails")
        for line in problems:
            print(f"  {line}")
        return 1
    print(f"::warning::suites: {len(regressed)} REGRESSED verdict(s) on the CPU CI box, reported, not gated "
          "(scripts/ci-suites-verdict.py says why):")
    for line in regressed:
        print(f"  REGRESSED {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
