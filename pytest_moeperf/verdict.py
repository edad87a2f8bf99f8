"""Pure verdicts: a baseline, the current samples and a threshold decide PASS/REGRESSED/IMPROVED/NEW."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf.stats import Summary, relative_change
from pytest_moeperf.thresholds import Threshold


class Status(enum.Enum):
    """Ordered by severity; a test's status is its worst metric's.

    Reserved for what comes next, so records need no rewrite: INCONCLUSIVE (noise too large to judge) and
    INVALID (a health gate such as a throttling GPU voided the measurement)."""

    NEW = "NEW"
    PASS = "PASS"
    IMPROVED = "IMPROVED"
    REGRESSED = "REGRESSED"

    @property
    def severity(self) -> int:
        return {"PASS": 0, "NEW": 1, "IMPROVED": 2, "REGRESSED": 3}[self.value]

    @property
    def fails(self) -> bool:
        return self is Status.REGRESSED


@dataclass(frozen=True)
class Verdict:
    key: str
    name: str
    unit: str
    better: str
    status: Status
    current: Summary
    baseline: Summary | None
    change: float | None  # relative, signed: current vs baseline median
    allowed: float | None  # relative change allowed in the worse direction
    threshold: Threshold
    significant: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, "unit": self.unit, "better": self.better,
                "status": self.status.value, "current": asdict(self.current),
                "baseline": asdict(self.baseline) if self.baseline else None, "change": self.change,
                "allowed": self.allowed, "threshold": asdict(self.threshold), "significant": self.significant}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(key=data["key"], name=data["name"], unit=data["unit"], better=data["better"],
                   status=Status(data["status"]), current=Summary(**data["current"]),
                   baseline=Summary(**data["baseline"]) if data["baseline"] else None, change=data["change"],
                   allowed=data["allowed"], threshold=Threshold(**data["threshold"]),
                   significant=data["significant"])

    def message(self) -> str:
        cur = f"{self.current.median:.4g} {self.unit}"
        if self.baseline is None or self.change is None or self.allowed is None:
            return f"{self.name}: {cur} (NEW: no baseline for this fingerprint)"
        direction = "lower" if self.better == "lower" else "higher"
        return (f"{self.name}: baseline {self.baseline.median:.4g} {self.unit} (n={self.baseline.n}) -> "
                f"current {cur} (n={self.current.n}), change {self.change * 100:+.1f} % "
                f"[{direction} is better; tolerance {self.allowed * 100:.1f} %"
                f"{f', abs {self.threshold.abs_tolerance:g} {self.unit}' if self.threshold.abs_tolerance else ''}]"
                f" -> {self.status.value}")


def _ci_separated(baseline: Summary, current: Summary) -> bool:
    """True when the current median's confidence interval excludes the baseline median, or when there are too
    few samples on either side to tell (then the tolerance alone decides)."""
    if current.n < 3:
        return True
    return not current.ci_low <= baseline.median <= current.ci_high


def judge(key: str, name: str, unit: str, better: str, current: Summary, baseline: Summary | None,
          threshold: Threshold) -> Verdict:
    if baseline is None:
        return Verdict(key, name, unit, better, Status.NEW, current, None, None, None, threshold)
    change = relative_change(baseline.median, current.median)
    worse = change if better == "lower" else -change
    allowed = threshold.allowed(baseline.rel_spread)
    abs_delta = abs(current.median - baseline.median)
    significant = _ci_separated(baseline, current) and abs_delta > threshold.abs_tolerance
    if worse > allowed and significant:
        status = Status.REGRESSED
    elif -worse > allowed and significant:
        status = Status.IMPROVED
    else:
        status = Status.PASS
    return Verdict(key, name, unit, better, status, current, baseline, change, allowed, threshold, significant)


def worst(statuses: Iterable[Status]) -> Status:
    """A test's status: the most severe of its metrics' (PASS when it recorded none)."""
    return max(statuses, key=lambda s: s.severity, default=Status.PASS)
