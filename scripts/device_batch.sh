#!/usr/bin/env bash
# One batch on a GPU machine (H200), run from the repository root with the machine's own python3:
#   1. `moeperf topology` (probe) -> topology.txt
#   2a. if vLLM imports: its kernels first (Marlin, fused Marlin MoE, custom all-reduce), --moeperf-update,
#       so the deadline of the full runs cannot cut them                                      -> vllm.log/.json
#   2. pytest suites/allreduce suites/gemm --moeperf-update   (writes baselines/<slug>/...)   -> update.log/.json
#   3. the same without --moeperf-update: an A/A run against the baselines just written        -> aa.log/.json
#   4. `moeperf budget` for Kimi-K2.5 TP=8 batch 1 from the reports, from the baselines, and from the A/A report
#      scaled to the 8x RTX PRO 6000 PCIe topology with an all-reduce latency given; roofline % per case -> summary.txt
#   5. baselines/ as a tarball                                                                  -> baselines.tar.gz
# Everything lands in $OUT (8 files at most). Each step continues when an earlier one failed. Whole batch < 8 minutes:
# each pytest run gets a GEMM deadline (remaining GEMM cases skip, the session still ends and writes its
# report and baselines) and a hard `timeout` behind it.
# Env: QUICK=1 adds --moeperf-quick to both runs (default 0); RUN1_S / RUN2_S: GEMM deadline of each run in
# seconds from its start (hard kill 30 s later); TOTAL_S: the batch's budget (default 450);
# PYTEST_ARGS: extra pytest arguments (e.g. '-k kimi'); PYTHON: the interpreter (default python3);
# BASELINES: the baselines directory (default: baselines, the repository's); VLLM_S: deadline of the vLLM
# kernels run (default 150); ROUNDS: --moeperf-rounds of the update run (default 1; 5 records a noise model: one
# run per round, each round a separate pytest process with RUN1_S as its own GEMM deadline); AA=0 skips the A/A
# run. vLLM is used when `$PYTHON -c "import vllm"` works, e.g. with PYTHONPATH set to
# the --target folder the carried vLLM was installed into (see /work/carry.log for the carry calls).
set -u
cd "$(dirname "$0")/.."

export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0  # FlashInfer is not carried
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
QUICK="${QUICK:-0}"
RUN1_S="${RUN1_S:-200}"
RUN2_S="${RUN2_S:-170}"
TOTAL_S="${TOTAL_S:-450}"  # the whole batch; the A/A run is shortened to fit
VLLM_S="${VLLM_S:-150}"
ROUNDS="${ROUNDS:-1}"
AA="${AA:-1}"
BASELINES="${BASELINES:-baselines}"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"

note() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$SUMMARY"; }

note "device batch start $(date -u +%FT%TZ) on $(hostname); python: $($PY --version 2>&1)"
$PY - <<'PY' >>"$SUMMARY" 2>&1 || true
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PY

# 1. topology
$PY -m pytest_moeperf.cli topology >"$OUT/topology.txt" 2>&1
note "moeperf topology rc=$?"
SLUG=$($PY -c "from pytest_moeperf.machine.probe import probe; print(probe().fingerprint.slug)" 2>>"$SUMMARY")
note "fingerprint slug: ${SLUG:-unknown}"

EXTRA=()
[ "$QUICK" = "1" ] && EXTRA+=(--moeperf-quick)
# shellcheck disable=SC2206
[ -n "${PYTEST_ARGS:-}" ] && EXTRA+=($PYTEST_ARGS)
# -p loads the plugin from the checkout; an installed copy registers itself (its pytest11 entry point) instead.
PLUGIN=(-p pytest_moeperf.plugin)
if $PY -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.value == 'pytest_moeperf.plugin' for e in m.entry_points(group='pytest11')) else 1)" 2>/dev/null; then
  PLUGIN=()
fi

run_suites() {  # name seconds [extra pytest args...]
  local name=$1 secs=$2; shift 2
  local hard=$(( secs + 30 ))
  if [ "$name" = update ]; then  # N rounds, each with its own deadline; never past the batch's budget
    hard=$(( (secs + 40) * ROUNDS )); local cap=$(( START + TOTAL_S - 30 - $(date +%s) ))
    [ "$hard" -gt "$cap" ] && hard=$cap
  fi
  timeout -k 10 "$hard" $PY -m pytest ${PLUGIN[@]+"${PLUGIN[@]}"} --moeperf-deadline "$secs" suites/allreduce suites/gemm \
      -p no:cacheprovider -ra -q --moeperf-baselines "$BASELINES" --moeperf-report "$OUT/$name.json" \
      ${EXTRA[@]+"${EXTRA[@]}"} "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: pytest rc=$rc ($(tail -n 1 "$OUT/$name.log"))"
}

# 2a. vLLM's kernels, when vLLM imports
if VLLM_VERSION=$($PY -c "import vllm; print(vllm.__version__)" 2>/dev/null); then
  note "vLLM $VLLM_VERSION importable: Marlin, fused Marlin MoE and custom all-reduce cases first"
  run_suites vllm "$VLLM_S" --moeperf-update -k "marlin or vllm_custom"
  grep -E "SKIPPED|FAILED|ERROR" "$OUT/vllm.log" | head -n 20 >>"$SUMMARY"
else
  note "vLLM not importable: its cases skip (Marlin, fused Marlin MoE, custom all-reduce)"
fi

# 2. update run, 3. A/A run
run_suites update "$RUN1_S" --moeperf-update --moeperf-rounds "$ROUNDS"
left=$(( START + TOTAL_S - 60 - $(date +%s) - 30 ))  # 60 s for the budget tables and the tarball
[ "$left" -lt "$RUN2_S" ] && RUN2_S=$left
[ "$RUN2_S" -lt 60 ] && RUN2_S=60
if [ "$AA" = "1" ]; then run_suites aa "$RUN2_S"; else note "A/A run skipped (AA=0)"; fi

# 4. budget tables
aa_report="$OUT/aa.json"; sources=("--from-report $OUT/update.json" "--baselines $BASELINES --fingerprint ${SLUG:-none}")
if [ -f "$aa_report" ]; then sources=("--from-report $aa_report" "${sources[@]}"); else aa_report="$OUT/update.json"; fi
for src in "${sources[@]}"; do
  note "moeperf budget --model kimi-k2.5 --tp 8 --batch 1 $src"
  # shellcheck disable=SC2086
  $PY -m pytest_moeperf.cli budget --model kimi-k2.5 --tp 8 --batch 1 $src >>"$SUMMARY" 2>&1
  note "budget rc=$?"
done
note "moeperf budget: A/A GEMMs scaled to the 8x RTX PRO 6000 PCIe topology, all-reduce 30 us given"
$PY -m pytest_moeperf.cli budget --model kimi-k2.5 --batch 1 --topology 8x-rtx-pro-6000-pcie \
  --from-report "$aa_report" --allreduce-us 30 >>"$SUMMARY" 2>&1
note "budget rc=$?"

# roofline % of a few headline cases, from the A/A report
$PY - "$aa_report" <<'PY' >>"$SUMMARY" 2>&1 || true
import json, sys
data = json.load(open(sys.argv[1]))
rows = [b for b in data["benchmarks"] if b["extra_info"].get("metric") == "roofline_pct"]
print(f"roofline_pct rows: {len(rows)}")
for b in sorted(rows, key=lambda b: b["fullname"])[:400]:
    p = b["params"]
    print(f"{p.get('model')} {p.get('op')} m={p.get('m')} {p.get('impl')}: {b['stats']['median']:.1f} %")
PY

# 5. baselines
tar -czf "$OUT/baselines.tar.gz" "$BASELINES" 2>>"$SUMMARY"
note "baselines tar rc=$?; done in $(( $(date +%s) - START ))s"
ls -la "$OUT" >>"$SUMMARY"
exit 0
