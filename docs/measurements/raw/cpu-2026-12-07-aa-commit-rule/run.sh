#!/bin/bash
cd /work/main
for i in 1 2 3 4 5; do
  echo "== run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/aa/progress.txt
  .tox/tests/bin/python -m pytest suites/gemm suites/allreduce -q -rs -p no:cacheprovider --moeperf-history off \
    --moeperf-report /tmp/aa/run-$i.json --moeperf-markdown /tmp/aa/run-$i.md > /tmp/aa/run-$i.log 2>&1
  echo "   exit $? $(date -u +%H:%M:%S) $(tail -1 /tmp/aa/run-$i.log)" >> /tmp/aa/progress.txt
done
echo DONE >> /tmp/aa/progress.txt
