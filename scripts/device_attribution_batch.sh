#!/usr/bin/env bash
# Decode attribution and the load-generator cross-check on a 2x H200 machine, after vLLM's GPU build is installed
# into /tmp/site (the three carry calls printed by ../shared/tools/vllm-gpu-carry.sh). Run from the repository
# root with the machine's own python3. For each (profile, emulation) in $PLAN, in order, while time is left:
#   `moeperf serve PROFILE --profiler-dir … [--interconnect-emulation E]`, then on the first plan entry the
#   cross-check (ours vs vllm.benchmarks.serve, concurrency 1 and 16), then `moeperf attribute --url` for decode
#   batches 1 / 8 / 32, then the server is stopped (SIGINT, then the process group).
# Output in $OUT: run-<profile>-<emulation>.tgz (rank 0's traces, vLLM's log, moeperf serve's log, the
# attribution table .md/.json), crosscheck-c<N>.txt, topology.txt.
# Env: PLAN (default below), TOTAL_S (the call's budget, default 540), BATCHES (default "1 8 32"), CROSSCHECK
# (default 1; 0 skips it), PYTHON.
# Seen: a tiny MoE TP=2 server is healthy in 60-100 s; each attribution window takes a few seconds.
# shellcheck source=scripts/device_vllm_env.sh
source "$(dirname "$0")/device_vllm_env.sh"
PY="${PYTHON:-python3}"; TOTAL_S="${TOTAL_S:-540}"; BATCHES="${BATCHES:-1 8 32}"
PLAN="${PLAN:-gpu-tiny-tp2-nospec:none gpu-tiny-tp2-nospec:pcie-no-p2p gpu-kimishape-tp2-nospec:none gpu-kimishape-tp2-nospec:pcie-no-p2p}"
START=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
note() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/topology.txt"; }
$PY -m pytest_moeperf.cli topology >>"$OUT/topology.txt" 2>&1
first=1
for entry in $PLAN; do
    profile=${entry%%:*}; emu=${entry##*:}
    if (( $(left) < 150 )); then note "skip $entry: $(left) s left"; continue; fi
    tag="$profile-$emu"; traces="/tmp/traces-$tag"; url_file="/tmp/url-$tag"; rm -rf "$traces" "$url_file"
    emu_args=(); [[ $emu != none ]] && emu_args=(--interconnect-emulation "$emu")
    note "serve $tag"
    setsid $PY -m pytest_moeperf.cli serve "$profile" --profiler-dir "$traces" --url-file "$url_file" \
        --model-cache /tmp/moeperf-models --log-dir /tmp/serve-logs "${emu_args[@]}" >"$OUT/serve-$tag.log" 2>&1 &
    pid=$!
    while [[ ! -s $url_file ]] && kill -0 $pid 2>/dev/null && (( $(left) > 25 )); do sleep 2; done
    if [[ ! -s $url_file ]]; then
        note "$tag: no healthy server ($(tail -n 3 "$OUT/serve-$tag.log" | tr '\n' ' '))"
        kill -INT $pid 2>/dev/null; sleep 10; kill -KILL -- -$pid 2>/dev/null
        cp /tmp/serve-logs/"$profile"*.log "$OUT/vllm-$tag.log" 2>/dev/null; continue
    fi
    url=$(cat "$url_file"); note "$tag healthy: $(grep healthy "$OUT/serve-$tag.log")"
    tokenizer=$(dirname "$(ls /tmp/moeperf-models/tiny-moe-*/tokenizer.json | head -n 1)")
    served=$(curl -s "$url/v1/models" | $PY -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    if (( first )) && [[ ${CROSSCHECK:-1} == 1 ]] && (( $(left) > 200 )); then
        for c in 1 16; do
            n=$(( c == 1 ? 40 : 160 ))
            timeout -s INT 120 $PY -m pytest_moeperf.serving.crosscheck --base-url "$url" --model "$served" \
                --tokenizer "$tokenizer" --concurrency $c --num-prompts $n >"$OUT/crosscheck-c$c.txt" 2>&1
            note "crosscheck c$c: rc=$?"
        done
    fi
    first=0
    # shellcheck disable=SC2086
    timeout -s INT $(( $(left) > 60 ? $(left) - 30 : 30 )) $PY -m pytest_moeperf.cli attribute --url "$url" \
        --trace-dir "$traces" --batch $BATCHES --max-tokens 1024 --json "$OUT/attr-$tag.json" --markdown \
        >"$OUT/attr-$tag.md" 2>&1
    note "attribute $tag: rc=$? ($(grep -c '^|' "$OUT/attr-$tag.md") table rows)"
    # rank 0's traces, the server's log and the tables in one file per entry (at most 8 files come back);
    # `moeperf attribute --trace` re-attributes them anywhere HolisticTraceAnalysis is installed
    cp /tmp/serve-logs/"$profile"*.log "/tmp/vllm-$tag.log" 2>/dev/null
    tar czf "$OUT/run-$tag.tgz" -C / $(cd / && ls -d "${traces#/}"/*rank0*.json.gz "tmp/vllm-$tag.log" 2>/dev/null) \
        -C "$OUT" "serve-$tag.log" "attr-$tag.md" $(cd "$OUT" && ls "attr-$tag.json" 2>/dev/null)
    [[ -s $OUT/run-$tag.tgz ]] && rm -f "$OUT/serve-$tag.log" "$OUT/attr-$tag.md" "$OUT/attr-$tag.json"
    kill -INT $pid 2>/dev/null
    for _ in $(seq 30); do kill -0 $pid 2>/dev/null || break; sleep 1; done
    kill -KILL -- -$pid 2>/dev/null
    pkill -f vllm.entrypoints.openai.api_server 2>/dev/null
    sleep 3
done
note "done"
