#!/usr/bin/env bash
# Host-aware verdicts on real noise (a benchmark, not a test: run by hand on a GPU box; numbers go to
# docs/measurements/). One call:
#   1. cross-host: the GEMM and all-reduce suites against the committed baselines (recorded on other hosts of the
#      same fingerprint)                                               -> false REGRESSED (must be 0)
#   2. SITTINGS update sessions of SELECT on this host into a fresh baselines directory (host id HOST)
#   3. A/A against them                                                -> false REGRESSED (aim <= 1 %)
#   4. every GEMM `time` x 1.05, then x 1.03 (tests/benchmarks/moeperf_inject.py)
#                                                                      -> share REGRESSED among the `time` cases
# Env: SELECT (pytest args of the same-host part, shell-quoted; default the 112 DeepSeek-V3 GEMM cases), SITTINGS (3),
# HOST (this-host), PYTHON (python3), OUT (reports and logs; default moeperf-hosts/ here), CROSS=0 skips step 1,
# ROUNDS (1: each session one process; N: --moeperf-rounds N, N processes per session, in steps 2-4).
set -u
cd "$(dirname "$0")/../.."
OUT="$(realpath -m "${OUT:-moeperf-hosts}")"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"; HOST="${HOST:-this-host}"; SITTINGS="${SITTINGS:-3}"
eval "SELECT=(${SELECT:-suites/gemm/test_gemm.py -k deepseek})"  # shell words: SELECT='a -k "x and y"'
RARGS=(); [ "${ROUNDS:-1}" -gt 1 ] && RARGS=(--moeperf-rounds "$ROUNDS")
BL="$OUT/baselines"; rm -rf "$BL"
export PYTHONPATH="$PWD/tests/benchmarks:$PWD${PYTHONPATH:+:$PYTHONPATH}"
counts() {  # report.json label
  "$PY" - "$1" "$2" <<'PY' | tee -a "$OUT/hosts.txt"
import collections, json, sys
doc = json.load(open(sys.argv[1]))
records = doc["moeperf"]["records"]
by = collections.defaultdict(collections.Counter)
for r in records:
    v = r["verdict"] or {}
    by[r["metric"]["name"]][v.get("status", "?")] += 1
for name, c in sorted(by.items()):
    judged = sum(n for s, n in c.items() if s not in ("NEW", "MISSING"))
    share = f"  REGRESSED {c['REGRESSED'] / judged:.1%}" if judged else ""
    print(f"{sys.argv[2]:28s} {name:18s} judged {judged:4d}  " + "  ".join(f"{s} {n}" for s, n in sorted(c.items()))
          + share)
mdes = sorted(r["verdict"]["mde"] for r in records if r["verdict"] and r["verdict"].get("mde") is not None
              and r["metric"]["name"] == "time")
if mdes:
    print(f"{sys.argv[2]:28s} time mde: median {mdes[len(mdes) // 2]:.1%}, p90 {mdes[int(len(mdes) * 0.9)]:.1%}, "
          f"max {mdes[-1]:.1%}")
PY
}
step() {  # label, then pytest args
  local label=$1; shift
  local t0=$SECONDS
  "$PY" -m pytest -p moeperf_inject -p no:cacheprovider -q --moeperf-history off \
      --moeperf-report "$OUT/$label.json" "$@" >"$OUT/$label.log" 2>&1
  echo "$label: exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/hosts.txt"
  [ -f "$OUT/$label.json" ] && counts "$OUT/$label.json" "$label"
}
"$PY" -m pytest_moeperf.cli topology | tee "$OUT/topology.txt" | tail -3
[ "${CROSS:-1}" = "1" ] && step cross-host suites/gemm suites/allreduce
for i in $(seq 1 "$SITTINGS"); do
  step "sitting-$i" "${SELECT[@]}" "${RARGS[@]}" --moeperf-update --moeperf-baselines "$BL" --moeperf-host-id "$HOST"
done
step aa "${SELECT[@]}" "${RARGS[@]}" --moeperf-baselines "$BL" --moeperf-host-id "$HOST"
MOEPERF_INJECT='suites/gemm/*::time=1.05' step x1.05 "${SELECT[@]}" "${RARGS[@]}" --moeperf-baselines "$BL" --moeperf-host-id "$HOST"
MOEPERF_INJECT='suites/gemm/*::time=1.03' step x1.03 "${SELECT[@]}" "${RARGS[@]}" --moeperf-baselines "$BL" --moeperf-host-id "$HOST"
