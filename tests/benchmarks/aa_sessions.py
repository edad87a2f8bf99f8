"""A same-box A/A of stored-baseline verdicts (a benchmark tool, not a test): record baselines in a fresh directory
with ``--moeperf-update`` sittings, then judge sessions of the same, unchanged code against them and count what
they flag. Every IMPROVED or REGRESSED is a false alarm.

    python tests/benchmarks/aa_sessions.py --updates 2 --sessions 5 --rounds 3 -- suites/gemm -k "m1"

The updates run back to back, so they are one sitting (`store.entries.sittings`): the case of issue 30's item 15,
where two updates 1.5 minutes apart unlocked the quiet floor and an A/A read 2 of 19 GEMM cases IMPROVED on 1x H200.
The health gate stays on (pass ``--moeperf-health off`` after ``--`` to turn it off); a round it finds unhealthy
cannot decide, so the counts name the INCONCLUSIVE verdicts whose cause is ``health``. Each session's JSON report
is kept in ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def session(args: list[str], report: Path) -> tuple[int, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                           "--moeperf-report", str(report)], capture_output=True, text=True)
    if done.returncode not in (0, 1):
        print(done.stdout[-3000:] + done.stderr[-3000:], flush=True)
    return done.returncode, time.monotonic() - started


def counts(report: Path) -> tuple[collections.Counter[str], list[str]]:
    """Verdicts by status (INCONCLUSIVE split by cause) and the flagged ones, from a session's report."""
    found: collections.Counter[str] = collections.Counter()
    flagged = []
    for record in json.loads(report.read_text())["moeperf"]["records"]:
        verdict = record.get("verdict") or {}
        status = verdict.get("status", "?")
        found[f"{status} ({verdict.get('cause')})" if status == "INCONCLUSIVE" else status] += 1
        if status in ("IMPROVED", "REGRESSED"):
            flagged.append(f"{status} {verdict['key']}: change {verdict['change'] * 100:+.1f} % against mde "
                           f"{verdict['mde'] * 100:.1f} % ({verdict['spread']})")
    return found, flagged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s [options] -- PYTEST ARGS")
    parser.add_argument("--updates", type=int, default=2, help="update sittings, back to back (default: 2)")
    parser.add_argument("--sessions", type=int, default=5, help="judged sessions (default: 5)")
    parser.add_argument("--rounds", type=int, default=3, help="--moeperf-rounds of every session (default: 3)")
    parser.add_argument("--out", type=Path, help="keep the baselines and reports here (default: a temporary dir)")
    argv = sys.argv[1:]
    at = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:at]), argv[at + 1:]
    out = args.out or Path(tempfile.mkdtemp(prefix="moeperf-aa-"))
    out.mkdir(parents=True, exist_ok=True)
    common = [*extra, "--moeperf-baselines", str(out / "baselines"), "--moeperf-history", "off",
              "--moeperf-rounds", str(args.rounds)]
    print(f"A/A in {out}: {args.updates} update(s), then {args.sessions} judged session(s), --moeperf-rounds "
          f"{args.rounds}; pytest {' '.join(extra)}", flush=True)
    for i in range(1, args.updates + 1):
        code, seconds = session([*common, "--moeperf-update"], out / f"update-{i}.json")
        print(f"update {i}: exit {code} in {seconds:.0f} s", flush=True)
    total: collections.Counter[str] = collections.Counter()
    alarms = 0
    for i in range(1, args.sessions + 1):
        report = out / f"session-{i}.json"
        code, seconds = session(common, report)
        found, flagged = counts(report) if report.exists() else (collections.Counter({"no report": 1}), [])
        total += found
        alarms += len(flagged)
        text = ", ".join(f"{k} {v}" for k, v in sorted(found.items()))
        print(f"session {i}: exit {code} in {seconds:.0f} s: {text}", flush=True)
        for line in flagged:
            print(f"  {line}", flush=True)
    print(f"total over {args.sessions} session(s): {alarms} flagged (IMPROVED or REGRESSED); "
          + ", ".join(f"{k} {v}" for k, v in sorted(total.items())), flush=True)


if __name__ == "__main__":
    main()
