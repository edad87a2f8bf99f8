#!/usr/bin/env bash
# The vLLM batch on a 1x or 2x H200 machine, after vLLM's GPU build is installed into /tmp/site (the three carry calls
# printed by ../shared/tools/vllm-gpu-carry.sh). Run from the repository root with the machine's own python3:
#   1. `moeperf topology`                                                                    -> topology.txt
#   2. vLLM's kernels (Marlin GEMM, fused Marlin MoE, custom all-reduce) with --moeperf-update -> kernels.log/.json
#   3. serving + spec-decode suites on the tiny MoE profiles (TP=2 on 2 GPUs, TP=1 on 1), --moeperf-update -> serving.log/.json
#   4. the baselines it touched as a tarball                                                 -> baselines.tar.gz
# Each pytest run has a --moeperf-deadline (remaining tests skip, the session still ends and writes its report
# and baselines) and a `timeout` behind it that sends SIGINT first, so pytest tears its fixtures down: the vLLM
# servers run in sessions of their own and outlive a killed pytest (seen on 2x H200, 2026-11-30: servers left by a
# SIGTERM-killed run were still on both GPUs in the next call, and the health gate made that call's serving
# windows INCONCLUSIVE: "gpu0: other compute process(es) on the GPU"). The deadline only stops new tests from
# starting: a serving test running at the deadline (a server start of 70-140 s plus its windows) still has to end
# before the timeout, or the session is interrupted and (by design: no partial update) writes no baselines. Seen
# 2026-11-30: SERVING_S=420 with a timeout 60 s after it: 8 tests passed, the 9th was cut, nothing was written.
# Hence 150 s after the deadline; a device call needs SERVING_S + 240 s. Leftover servers are killed at the end. Env: KERNELS_S (default 90; 0 skips the kernels), SERVING_S (default 330), ROUNDS
# (default 1; more rounds need more time than one device call has: run the batch again instead, each update appends
# a run), PYTHON (default python3), SERVING_K and KERNELS_K (pytest -k of the two runs; defaults below: the TP=2
# serving profiles with 2+ GPUs, the TP=1 ones with 1; the kernels are vLLM's custom all-reduce, which skips on one
# GPU, and the Kimi Marlin and fused Marlin MoE cases).
# All four TP=1 profiles (no spec, n-gram, draft, EAGLE-3) in one 10-minute call on 1x H200: KERNELS_S=0 SERVING_S=420
# (the pool starts the four servers together; planned 340-465 s, docs/measurements/serving.md).
# shellcheck source=scripts/device_vllm_env.sh
source "$(dirname "$0")/device_vllm_env.sh"
PY="${PYTHON:-python3}"; KERNELS_S="${KERNELS_S:-90}"; SERVING_S="${SERVING_S:-330}"; ROUNDS="${ROUNDS:-1}"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if (( GPUS >= 2 )); then TP=2; else TP=1; fi
SERVING_K="${SERVING_K:-gpu-tiny-tp$TP}"
KERNELS_K="${KERNELS_K:-vllm_custom or (kimi and (routed_moe or marlin))}"
START=$(date +%s)
note() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/topology.txt"; }
$PY -m pytest_moeperf.cli topology >>"$OUT/topology.txt" 2>&1
$PY -c 'import vllm; print("vllm", vllm.__version__)' >>"$OUT/topology.txt" 2>&1 || { note "vLLM does not import"; exit 3; }
COMMON=(-p no:cacheprovider -q -rs --moeperf-history off --moeperf-update --moeperf-rounds "$ROUNDS")
if (( KERNELS_S > 0 )); then
note "kernels"
timeout -s INT -k 30 $(( KERNELS_S + 40 )) $PY -m pytest "${COMMON[@]}" --moeperf-deadline "$KERNELS_S" \
    suites/allreduce suites/gemm/test_gemm.py -k "$KERNELS_K" \
    --moeperf-report "$OUT/kernels.json" >"$OUT/kernels.log" 2>&1
note "kernels: rc=$? ($(tail -n 1 "$OUT/kernels.log"))"
fi
note "serving"
timeout -s INT -k 60 $(( SERVING_S + 150 )) $PY -m pytest "${COMMON[@]}" -v --durations=0 --moeperf-deadline "$SERVING_S" \
    suites/serving suites/specdecode -k "$SERVING_K" \
    --moeperf-report "$OUT/serving.json" >"$OUT/serving.log" 2>&1
note "serving: rc=$? ($(tail -n 1 "$OUT/serving.log"))"
pkill -f vllm.entrypoints.openai.api_server 2>/dev/null && note "killed leftover vLLM servers"
tar czf "$OUT/baselines.tar.gz" baselines
note "done"
