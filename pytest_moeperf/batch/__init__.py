"""``moeperf batch``: the perf suites of a checkout on one machine in one command (steps, rounds, update and the
A/A check, a time budget), every output in one folder, and only the processes it started stopped at the end."""
