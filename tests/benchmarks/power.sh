#!/usr/bin/env bash
# Power and false alarms of the verdicts on real noise (a benchmark, not a test: run by hand, tables in README).
#   tests/benchmarks/power.sh SUITES... [-- PYTEST ARGS]
# Runs the given suites against the committed baselines three times:
#   quiet-1.00   nothing injected                          -> false REGRESSED (should be ~0)
#   quiet-1.30   every metric made 30 % worse (moeperf_inject) -> share detected (REGRESSED)
#   busy-1.00    nothing injected, two busy loops running  -> REGRESSED must be 0, the windows INCONCLUSIVE
# FACTOR (default 1.30) and GLOB (default '*') choose the injection. Reports land in ${OUT:-/tmp/moeperf-power}.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/moeperf-power}"; mkdir -p "$OUT"
FACTOR="${FACTOR:-1.30}"; GLOB="${GLOB:-*}"
suites=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do suites+=("$1"); shift; done; [ "${1:-}" = "--" ] && shift
extra=("$@")
export PYTHONPATH="$PWD/tests/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
run() {  # name [VAR=value...]
  local name=$1; shift
  env "$@" python -m pytest -p moeperf_inject -p no:cacheprovider -q --moeperf-history off \
      --moeperf-report "$OUT/$name.json" "${suites[@]}" ${extra[@]+"${extra[@]}"} >"$OUT/$name.log" 2>&1
  python - "$OUT/$name.json" "$name" <<'PY'
import collections, json, sys
doc = json.load(open(sys.argv[1]))
counts = collections.Counter(b["extra_info"]["verdict"] for b in doc["benchmarks"])
judged = sum(n for s, n in counts.items() if s not in ("NEW",))
print(f"{sys.argv[2]:12s} metrics {judged:4d}  " + "  ".join(f"{s} {n}" for s, n in sorted(counts.items()))
      + (f"  detected {counts['REGRESSED'] / judged:.0%}" if judged else ""))
PY
}
run quiet-1.00
run quiet-$FACTOR MOEPERF_INJECT="$GLOB=$FACTOR"
python -c 'while True: pass' & b1=$!; python -c 'while True: pass' & b2=$!
run busy-1.00
kill $b1 $b2
