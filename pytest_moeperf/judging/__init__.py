"""Judging: pure statistics, thresholds, verdicts and the machine-shift view (no I/O, no pytest)."""
