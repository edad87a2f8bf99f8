#!/usr/bin/env bash
# h200_lease.sh STEP - the steps of one planned lease of a lent 1xH200 (the device tool), run from the checkout's
# root there; everything that comes back is under $OUT (at most 8 files: each step packs its folder into one .tgz).
#
#   install  join the carried vLLM 0.26.0 parts (.vp1-.vp4, ../shared/tools/vllm-gpu-carry.sh) and the wheels in
#            .whl (HolisticTraceAnalysis), install them into /tmp/site, compile their bytecode (16 cores, ~2 s)
#   record   moeperf batch serving --update --no-aa: every TP=1 serving and spec-decode profile, its default
#            number of starts (--moeperf-starts: 3 on a GPU; those that fit LIMIT), into $BL (below); run it again
#            to add starts: the servers' compile caches stay in .moeperf/ (git-ignored, kept between calls on a
#            warm machine), so the later calls' starts are warm
#   judge    moeperf batch serving: a later sitting judged against what is stored in $BL
#   ab       moeperf ab --serve gpu-tiny-tp1-nospec, fresh starts a pair, head's TPOT and throughput samples x1.05
#            (tests/benchmarks/moeperf_inject.py); the metrics it leaves alone are the run's own A/A
#   kimi     scripts/gpu-kimi-rank.sh: the full-depth Kimi-K2.5 rank, 3 starts, windows, attribution, budget
#   gate     the serving gate on the Kimi-K2.5 rank (GATE_K: its start-up and c=1 window), stored baselines in $GBL
#            (default .moeperf/gate-baselines), minimum effect 2.5 %: PHASE=record writes 3 starts (--update);
#            PHASE=ab judges 4 starts with the server's TPOT and the output throughput x1.05 (moeperf_inject:
#            expect REGRESSED on those two; the client's TPOT, ITL and E2EL, which measure the same decode steps,
#            and the rest are left alone: the run's own A/A, expect no REGRESSED and no IMPROVED); PHASE=aa judges
#            4 starts as they are. 4 starts against 3 stored runs is the fewest that the rank test can decide on
#   levels   the Kimi-K2.5 rank's start-up and c=1, c=16, c=64 closed loops (--moeperf-quick windows, minimum effect
#            2.5 %), baselines in $LBL (default .moeperf/levels-baselines): PHASE=record stores STARTS (3) starts of
#            WINDOWS (2) windows each, their windows apart (--update); PHASE=ab judges with every decode metric of the
#            server and the client x1.05 (TPOT, ITL, output throughput: moeperf_inject) and the plan of starts x
#            windows the stored levels give (--moeperf-starts/--moeperf-windows auto); TTFT, E2EL and the request
#            throughput are left alone, the run's own A/A; PHASE=aa judges as it is
#   spec     speculative decoding on the rank at a pinned acceptance (docs/specdecode.md): the reference
#            (gpu-kimi-rank-tp1-nospec) and DRAFTER (mtp-k3) at its own length and at LENGTHS (k3=1.5,2.2), c=1 and
#            c=16 decode windows (--moeperf-quick), the speed-ups and the break-even acceptance, one start of them
#            all (servers one at a time), stored in $SBL (default .moeperf/spec-baselines)
#
# Env: OUT (required), WREQ (levels, spec: --moeperf-window-requests; with --moeperf-quick the plateau is half of it),
# LIMIT (seconds this step may take, default 560), PAIRS (ab, default 7), BL (the baselines
# record and judge use, default .moeperf/lease-baselines: a copy of baselines/ made by the first step that needs it,
# git-ignored, so it lasts between the calls of one lease; the tracked baselines/ is sent afresh with every call).
# The lease's steps are chained within ~30 s of each other (the machine goes back when idle), so each is one line.
set -uo pipefail
STEP=${1:?usage: h200_lease.sh install|record|judge|ab|kimi|gate|levels|spec}
OUT=${OUT:?set OUT}; LIMIT=${LIMIT:-560}
ROOT=$PWD
export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
W=/tmp/lease/$STEP; rm -rf "$W"; mkdir -p "$W"
BL=${BL:-$ROOT/.moeperf/lease-baselines}
moeperf() { python3 -m pytest_moeperf.cli "$@"; }
pack() {  # the step's folder (and what else is named) as one file under $OUT
  tar czf "$OUT/$STEP.tgz" -C / "${W#/}" "$@" 2>/dev/null; ls -l "$OUT"
}
facts() {
  { date -u; git log --oneline -1; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,\
power.draw --format=csv,noheader; nproc; python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch",
torch.__version__)' 2>&1 | tail -1; } > "$W/facts.txt" 2>&1
  cat "$W/facts.txt"
}

case $STEP in
install)
  mkdir -p /tmp/vp && cp .vp4/* /tmp/vp/ && cd /tmp/vp && cat vllm.tar.[0-9][0-9] > vllm.tar &&
    sha256sum -c vllm.sha256 || { echo "PARTS MISSING OR BAD"; ls -l /tmp/vp; exit 3; }
  rm -rf w /tmp/site && mkdir w && tar xf vllm.tar -C w && rm vllm.tar
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site w/*.whl \
    $(ls "$ROOT"/.whl/*.whl 2>/dev/null) || exit 4
  cd "$ROOT"
  t0=$SECONDS; python3 -m compileall -q -j 0 /tmp/site > /dev/null 2>&1; echo "bytecode: $((SECONDS - t0)) s"
  facts
  ;;
record|judge)
  facts
  [[ -d $BL ]] || { mkdir -p "$(dirname "$BL")" && cp -r "$ROOT/baselines" "$BL"; }
  args=(serving --deadline "$((LIMIT - 25))" --grace 30 --baselines "$BL" --out "$W/batch")
  [[ $STEP == record ]] && args+=(--update --no-aa)
  timeout -s INT -k 20 "$LIMIT" python3 -m pytest_moeperf.cli batch "${args[@]}"
  echo "batch exit $?"
  du -sh "$ROOT/.moeperf"/* 2>/dev/null
  pack "${BL#/}/1x-h200"
  ;;
ab)
  facts
  export PYTHONPATH=$PYTHONPATH:$ROOT/tests/benchmarks
  timeout -s INT -k 30 "$LIMIT" python3 -m pytest_moeperf.cli ab --serve gpu-tiny-tp1-nospec --pairs "${PAIRS:-7}" \
    --max-pairs "${PAIRS:-7}" --head-env 'MOEPERF_INJECT=*::*tpot*=1.05,*::*throughput*=1.05' \
    --report "$W/ab.json" --markdown "$W/ab.md" -- suites/serving -k "closed_loop and tiny-moe-c16]" \
    -p moeperf_inject --moeperf-tolerance 0.025 > "$W/ab.log" 2>&1
  echo "ab exit $?"; tail -60 "$W/ab.log"
  pack
  ;;
gate)
  facts
  GBL=${GBL:-$ROOT/.moeperf/gate-baselines}
  args=(serving --serving-k "${GATE_K:-gpu-kimi-rank-tp1-nospec and (startup or (closed_loop and c1 and not c16))}"
        --deadline "$((LIMIT - 25))" --grace 30 --baselines "$GBL" --out "$W/batch")
  export PYTEST_ADDOPTS="--moeperf-tolerance 0.025${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
  case ${PHASE:-record} in
  record) args+=(--update --no-aa --rounds 3) ;;
  ab) export PYTHONPATH=$PYTHONPATH:$ROOT/tests/benchmarks MOEPERF_INJECT='*::engine_tpot_mean_ms=1.05,*::output_throughput=1.05'
      PYTEST_ADDOPTS+=" -p moeperf_inject"; args+=(--rounds 4) ;;
  aa) args+=(--rounds 4) ;;
  *) echo "unknown PHASE ${PHASE}"; exit 2 ;;
  esac
  echo "PYTEST_ADDOPTS=$PYTEST_ADDOPTS MOEPERF_INJECT=${MOEPERF_INJECT:-}" | tee -a "$W/facts.txt"
  timeout -s INT -k 20 "$LIMIT" python3 -m pytest_moeperf.cli batch "${args[@]}"
  echo "batch exit $?"
  pack "${GBL#/}"
  ;;
levels)
  facts
  LBL=${LBL:-$ROOT/.moeperf/levels-baselines}
  args=(serving --serving-k "${LEVELS_K:-gpu-kimi-rank-tp1-nospec and (startup or closed_loop)}"
        --deadline "$((LIMIT - 25))" --grace 30 --baselines "$LBL" --out "$W/batch")
  export PYTEST_ADDOPTS="--moeperf-tolerance 0.025 --moeperf-quick${WREQ:+ --moeperf-window-requests $WREQ}${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
  case ${PHASE:-record} in
  record) args+=(--update --no-aa); PYTEST_ADDOPTS+=" --moeperf-starts ${STARTS:-3} --moeperf-windows ${WINDOWS:-2}" ;;
  ab) export PYTHONPATH=$PYTHONPATH:$ROOT/tests/benchmarks
      export MOEPERF_INJECT='*::*tpot*=1.05,*::*itl*=1.05,*::output_throughput=1.05'
      PYTEST_ADDOPTS+=" -p moeperf_inject" ;;
  aa) ;;
  *) echo "unknown PHASE ${PHASE}"; exit 2 ;;
  esac
  echo "PYTEST_ADDOPTS=$PYTEST_ADDOPTS MOEPERF_INJECT=${MOEPERF_INJECT:-}" | tee -a "$W/facts.txt"
  timeout -s INT -k 20 "$LIMIT" python3 -m pytest_moeperf.cli batch "${args[@]}"
  echo "batch exit $?"
  grep -h "plan from\|are the unit\|not planned\|cut to" "$W"/batch/serving.log 2>/dev/null | head -8
  pack "${LBL#/}"
  ;;
spec)
  facts
  SBL=${SBL:-$ROOT/.moeperf/spec-baselines}
  python3 tests/benchmarks/rank_spec_configs.py > "$W/configs.txt" 2>&1; echo "configs: exit $?"; tail -3 "$W/configs.txt"
  args=(serving --serving-k "gpu-kimi-rank-tp1 and (test_decode or test_speedup or test_break_even) and (nospec or ${DRAFTER:-mtp-k3})"
        --deadline "$((LIMIT - 25))" --grace 40 --baselines "$SBL" --out "$W/batch" --update --no-aa)
  export PYTEST_ADDOPTS="--moeperf-quick --moeperf-starts 1 --moeperf-acceptance-lengths ${LENGTHS:-k3=1.5,2.2}${WREQ:+ --moeperf-window-requests $WREQ}${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
  echo "PYTEST_ADDOPTS=$PYTEST_ADDOPTS" | tee -a "$W/facts.txt"
  timeout -s INT -k 20 "$LIMIT" python3 -m pytest_moeperf.cli batch "${args[@]}"
  echo "batch exit $?"
  grep -h "break_even\|acceptance_length\|speedup" "$W"/batch/serving.log 2>/dev/null | cut -c1-220 | head -30
  pack "${SBL#/}"
  ;;
kimi)
  OUT=$W DEADLINE=$((LIMIT - 20)) bash scripts/gpu-kimi-rank.sh
  pack
  ;;
*) echo "unknown step $STEP"; exit 2 ;;
esac
