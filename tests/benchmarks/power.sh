#!/usr/bin/env bash
# Power and false alarms of the verdicts on real noise (a benchmark, not a test: run by hand, tables in README).
#   tests/benchmarks/power.sh SUITES... [-- PYTEST ARGS]
# Runs the given suites against the committed baselines up to three times:
#   quiet-1.00     nothing injected                                   -> false REGRESSED (should be ~0)
#   quiet-inject   matching metrics made worse (moeperf_inject)       -> share detected (REGRESSED)
#   busy-1.00      nothing injected, two busy loops running (BUSY=1)  -> REGRESSED must be 0, the windows INCONCLUSIVE
# INJECT is the injection, moeperf_inject's GLOB=FACTOR[,GLOB=FACTOR...] (default '*=1.30': every metric 30 %
# worse); on a GPU box e.g. INJECT='suites/gemm/*=1.05,suites/allreduce/*=1.10'. BUSY=0 skips the busy run;
# PYTHON is the interpreter (default python). Reports land in $OUT (default: moeperf-power/ under the current
# directory); each run prints its verdict counts overall and per suite and metric, with the share REGRESSED among
# the metrics that were judged (NEW is not judged; MISSING metrics, e.g. cases a deadline skipped, are not in the
# JSON: the log's counts line has them).
set -u
OUT="$(realpath -m "${OUT:-moeperf-power}")"; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
INJECT="${INJECT:-*=1.30}"; BUSY="${BUSY:-1}"; PY="${PYTHON:-python}"
suites=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do suites+=("$1"); shift; done; [ "${1:-}" = "--" ] && shift
extra=("$@")
export PYTHONPATH="$PWD/tests/benchmarks:$PWD${PYTHONPATH:+:$PYTHONPATH}"
run() {  # name [VAR=value...]
  local name=$1; shift
  env "$@" "$PY" -m pytest -p moeperf_inject -p no:cacheprovider -q --moeperf-history off \
      --moeperf-report "$OUT/$name.json" "${suites[@]}" ${extra[@]+"${extra[@]}"} >"$OUT/$name.log" 2>&1
  "$PY" - "$OUT/$name.json" "$name" <<'PY' | tee -a "$OUT/power.txt"
import collections, json, sys
from pytest_moeperf.reports.document import metric_entries
doc = json.load(open(sys.argv[1]))
unjudged = ("NEW", "MISSING")
def line(label, verdicts):
    counts = collections.Counter(verdicts)
    judged = sum(n for s, n in counts.items() if s not in unjudged)
    share = f"  detected {counts['REGRESSED'] / judged:.1%}" if judged else ""
    return f"{label:40s} judged {judged:4d}  " + "  ".join(f"{s} {n}" for s, n in sorted(counts.items())) + share
rows = [(b["fullname"], b["extra_info"]) for b in metric_entries(doc)]  # times and the other units
print(line(sys.argv[2], [info["verdict"] for _, info in rows]))
families = collections.defaultdict(list)
for name, info in rows:
    families[(name.split("/")[1] if "/" in name else "?", info.get("metric", "?"))].append(info["verdict"])
for (suite, metric), verdicts in sorted(families.items()):
    print(line(f"  {suite} {metric}", verdicts))
PY
}
run quiet-1.00
run quiet-inject MOEPERF_INJECT="$INJECT"
if [ "$BUSY" = "1" ]; then
  "$PY" -c 'while True: pass' & b1=$!; "$PY" -c 'while True: pass' & b2=$!
  run busy-1.00
  kill $b1 $b2
fi
