"""A/A calibration (``moeperf ab --aa``): the base side against itself, judged by the same paired rule.

Nothing changed between the sides, so every REGRESSED or IMPROVED verdict is a false alarm: their share of the
judged metrics is the **false-alarm rate** of the procedure on this box (adaptive pairs and the false-discovery
control included). Each metric's **A/A noise** is the spread of one pair's ratio (1.4826 × MAD of the log ratios,
as a relative change); a metric whose A/A noise exceeds its minimum effect is **named**, with the mde its pairs
reached and the pairs it would need to resolve its minimum effect with 80 % power.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_moeperf.ab import paired
from pytest_moeperf.ab.verdicts import Outcome, relative
from pytest_moeperf.judging.verdict import Status
from pytest_moeperf.ledger import Section


@dataclass(frozen=True)
class Noise:
    """One metric's A/A noise."""

    key: str
    status: str
    pairs: int
    noise: float  # relative spread of one pair's ratio
    mde: float | None  # the change detectable at the pairs run (None: too few pairs)
    minimum_effect: float
    pairs_needed: int | None  # to detect the minimum effect with 80 % power (None: a minimum effect of 0)

    @property
    def named(self) -> bool:
        return self.noise > self.minimum_effect


@dataclass(frozen=True)
class Calibration:
    judged: int  # metrics with at least one usable pair
    false_alarms: tuple[str, ...]  # keys of REGRESSED and IMPROVED verdicts
    noises: tuple[Noise, ...]

    @property
    def rate(self) -> float | None:
        return len(self.false_alarms) / self.judged if self.judged else None

    @property
    def named(self) -> list[Noise]:
        return sorted((n for n in self.noises if n.named), key=lambda n: -n.noise)

    def to_json(self) -> dict[str, Any]:
        return {"judged": self.judged, "false_alarms": list(self.false_alarms), "false_alarm_rate": self.rate,
                "noise": [asdict(n) for n in self.noises], "named": [n.key for n in self.named]}


def calibrate(outcomes: Mapping[str, Outcome], alpha: float = paired.ALPHA) -> Calibration:
    noises = []
    alarms = []
    for key, outcome in outcomes.items():
        evidence, verdict = outcome.evidence, outcome.verdict
        if evidence is None:
            continue
        if verdict.status in (Status.REGRESSED, Status.IMPROVED):
            alarms.append(key)
        minimum = verdict.threshold.tolerance
        needed = paired.pairs_needed(evidence.sigma, math.log1p(minimum), alpha) if minimum > 0 else None
        noises.append(Noise(key, verdict.status.value, evidence.n, relative(evidence.sigma),
                            None if evidence.mde is None else relative(evidence.mde), minimum, needed))
    return Calibration(len(noises), tuple(alarms), tuple(noises))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f} %"


def section(calibration: Calibration) -> Section:
    """The named metrics: A/A noise above the minimum effect, noisiest first."""
    rows = tuple((n.key, n.pairs, _pct(n.noise), _pct(n.mde), _pct(n.minimum_effect),
                  "-" if n.pairs_needed is None else str(n.pairs_needed)) for n in calibration.named)
    return Section("A/A calibration: metrics whose A/A noise exceeds their minimum effect",
                   ("metric", "pairs", "A/A noise (1 pair)", "mde", "minimum effect", "pairs needed"), rows,
                   note="A/A noise: the spread of one pair's ratio head/base (1.4826 x MAD); mde: the change "
                        "detectable with 80 % power at the pairs run; pairs needed: to detect the minimum effect")


def lines(calibration: Calibration) -> list[str]:
    """The calibration's summary lines (the false-alarm rate, the noise of the judged metrics)."""
    if not calibration.judged:
        return ["A/A calibration: no metric had a usable pair"]
    noise = sorted(n.noise for n in calibration.noises)
    median = noise[len(noise) // 2]
    rate = calibration.rate or 0.0
    alarms = f": {', '.join(calibration.false_alarms)}" if calibration.false_alarms else ""
    return [f"A/A calibration: {len(calibration.false_alarms)} false alarm(s) in {calibration.judged} metric(s) "
            f"({rate * 100:.1f} %){alarms}",
            f"A/A noise of one pair: median {median * 100:.2f} %, largest {noise[-1] * 100:.2f} %; "
            f"{len(calibration.named)} metric(s) noisier than their minimum effect"]
