#!/bin/bash
# sitting B of the code-identity GEMM baselines, then 5 judged sessions (the same-box A/A)
cd /work/main
echo "== sitting B $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/aa2/progress.txt
.tox/tests/bin/python -m pytest suites/gemm --moeperf-update --moeperf-accept-shift --moeperf-rounds 3 -q -rs \
  -p no:cacheprovider --moeperf-history off --moeperf-report /tmp/sitB/report.json --moeperf-markdown /tmp/sitB/summary.md > /tmp/sitB/log.txt 2>&1
echo "   exit $? $(date -u +%H:%M:%S) $(tail -1 /tmp/sitB/log.txt)" >> /tmp/aa2/progress.txt
for i in 1 2 3 4 5; do
  echo "== judged $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/aa2/progress.txt
  .tox/tests/bin/python -m pytest suites/gemm -q -rs -p no:cacheprovider --moeperf-history off \
    --moeperf-report /tmp/aa2/run-$i.json --moeperf-markdown /tmp/aa2/run-$i.md > /tmp/aa2/run-$i.log 2>&1
  echo "   exit $? $(date -u +%H:%M:%S) $(tail -1 /tmp/aa2/run-$i.log)" >> /tmp/aa2/progress.txt
done
echo DONE >> /tmp/aa2/progress.txt
