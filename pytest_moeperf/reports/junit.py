"""Verdicts as JUnit XML properties (``--junitxml`` writes a test item's ``user_properties``)."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_moeperf.judging.verdict import Verdict


def properties(verdicts: Iterable[Verdict]) -> list[tuple[str, str]]:
    """``moeperf:<metric>`` → ``<verdict>; current <median> <unit>; baseline …; change …; mde …; reason``."""
    out = []
    for v in verdicts:
        parts = [v.status.value]
        if v.provisional:
            parts[0] += " (provisional: against other hosts' baselines, decided at the session's end)"
        if v.current is not None:
            parts.append(f"current {v.current.median:.6g} {v.unit}")
        if v.reference is not None:
            parts.append(f"baseline {v.reference:.6g} {v.unit} ({v.runs} run(s))")
        if v.change is not None:
            parts.append(f"change {v.change * 100:+.2f} %")
        if v.mde is not None:
            parts.append(f"mde {v.mde * 100:.2f} %")
        if v.reason:
            parts.append(v.reason)
        out.append((f"moeperf:{v.name}", "; ".join(parts)))
    return out
