"""Pure: has the whole machine moved since its baselines were recorded?

Each verdict compares one metric with its own stored runs. When every case of a family (one test file, one
metric name: the 26 CPU GEMM ``time`` cases, say) moves the same way at once, the code under test rarely did it:
the box did. Seen on a fresh 2-core CI VM, the same commit that recorded the CPU baselines, every family of
every suite 10-24 % faster (GEMM ``time`` median -18.3 % over 26 of 26 cases, gloo latency -13.7 %, serving
TPOT -17.1 %). Two things follow, and the report says both:

* a change of the whole family smaller than the shift cannot be told from the box's own move, whichever way;
* a case that is inside its threshold in absolute terms can be well beyond it against its family's move
  (``shared_gate_up-m32`` -4.2 % while its family moved -18.3 %: +17.2 % relative, threshold 5.0 %). It is
  listed as a relative outlier, a lead to look at, not a verdict: the per-case between-run noise (6-8 % on that
  box) is not removed by dividing out the family's median.

A family counts as moved when an exact two-sided sign test over its cases rejects "no common direction" at
``ALPHA`` and the median change is at least ``MIN_SHIFT``. Nothing here changes a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf import stats
from pytest_moeperf.records import Section
from pytest_moeperf.verdict import Status, Verdict

__all__ = ["ALPHA", "MIN_SHIFT", "Outlier", "Shift", "family_shifts", "shift_notes", "shift_sections", "sign_test_p"]

ALPHA = 0.01  # several families per session: at 0.01 a family needs >= 8 cases all one way
MIN_SHIFT = 0.05  # the default minimum effect: a smaller common move is within what one sitting shows
TIE = 0.001  # |change| at or below 0.1 % is no move (acceptance rates repeat exactly)
SHOWN_OUTLIERS = 5


@dataclass(frozen=True)
class Outlier:
    key: str
    change: float  # absolute, signed
    relative: float  # against the family's median change, signed
    allowed: float


@dataclass(frozen=True)
class Shift:
    family: str  # the test file
    name: str  # the metric name
    unit: str
    better: str
    cases: int
    same_direction: int  # cases that moved the way the median did
    median_change: float  # signed, relative
    low: float
    high: float
    p: float  # two-sided sign test
    median_allowed: float
    outliers: tuple[Outlier, ...]
    improved: int = 0  # IMPROVED verdicts in the family
    regressed: int = 0  # REGRESSED verdicts in the family

    @property
    def word(self) -> str:
        worse = self.median_change > 0 if self.better == "lower" else self.median_change < 0
        return "worse" if worse else "better"


def sign_test_p(plus: int, minus: int) -> float:
    """Exact two-sided sign test: the chance of a split at least this lopsided if each way were equally likely."""
    n, k = plus + minus, max(plus, minus)
    if n == 0:
        return 1.0
    tail: float = sum(math.comb(n, i) for i in range(k, n + 1)) / 2.0 ** n
    return min(1.0, 2 * tail)


def _worse(better: str, change: float) -> float:
    return change if better == "lower" else -change


def family_shifts(verdicts: Sequence[Verdict], alpha: float = ALPHA, min_shift: float = MIN_SHIFT) -> list[Shift]:
    """The families of ``verdicts`` whose cases moved together (see the module docstring)."""
    families: dict[tuple[str, str], list[Verdict]] = {}
    for v in verdicts:
        if v.change is not None and v.allowed is not None and math.isfinite(v.change):
            families.setdefault((v.key.split("::")[0], v.name), []).append(v)
    shifts = []
    for (family, name), members in sorted(families.items()):
        changes = [v.change for v in members if v.change is not None]
        plus = sum(1 for c in changes if c > TIE)
        minus = sum(1 for c in changes if c < -TIE)
        median = stats.median(changes)
        p = sign_test_p(plus, minus)
        if p >= alpha or abs(median) < min_shift:
            continue
        first = members[0]
        outliers = []
        for v in members:
            assert v.change is not None and v.allowed is not None
            relative = (1.0 + v.change) / (1.0 + median) - 1.0
            if v.status is not Status.REGRESSED and _worse(first.better, relative) > v.allowed:
                outliers.append(Outlier(v.key, v.change, relative, v.allowed))
        outliers.sort(key=lambda o: _worse(first.better, o.relative) - o.allowed, reverse=True)
        shifts.append(Shift(family, name, first.unit, first.better, len(members), plus if median > 0 else minus,
                            median, min(changes), max(changes), p,
                            stats.median([v.allowed for v in members if v.allowed is not None]), tuple(outliers),
                            sum(1 for v in members if v.status is Status.IMPROVED),
                            sum(1 for v in members if v.status is Status.REGRESSED)))
    return shifts


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _outliers(s: Shift) -> str:
    shown = ", ".join(f"{o.key.split('::')[-2]} {_pct(o.relative)} (threshold {100 * o.allowed:.1f} %)"
                      for o in s.outliers[:SHOWN_OUTLIERS])
    more = len(s.outliers) - SHOWN_OUTLIERS
    return f"{s.family} {s.name}: {shown}" + (f", and {more} more" if more > 0 else "")


def shift_sections(shifts: Sequence[Shift]) -> list[Section]:
    """The report table of the moved families: none when none moved."""
    if not shifts:
        return []
    rows = tuple((s.family, s.name, f"{s.same_direction} of {s.cases} {s.word}", _pct(s.median_change),
                  f"{_pct(s.low)} .. {_pct(s.high)}", f"{100 * s.median_allowed:.1f} %", f"{s.p:.1g}",
                  str(len(s.outliers))) for s in shifts)
    note = ("Every case of these families moved the same way at once (sign test p), which is rarely the code: the "
            "machine runs faster or slower than when its baselines were recorded. A change of a whole family "
            "smaller than its median move cannot be told from the machine's. Relative outliers are cases beyond "
            "their threshold against their family's move: leads to look at, not verdicts (the per-case noise "
            "stays). Nothing here changes a verdict; re-record the baselines if the machine's new state is the "
            "one to guard.")
    leads = [_outliers(s) for s in shifts if s.outliers]
    if leads:
        note += "\nRelative outliers: " + "; ".join(leads) + "."
    return [Section("Machine shift: whole families moved together",
                    ("family", "metric", "cases", "median change", "range", "median threshold", "p",
                     "relative outliers"), rows, note)]


def shift_notes(shifts: Sequence[Shift]) -> list[str]:
    """One summary line for the terminal, when a family moved."""
    if not shifts:
        return []
    named = ", ".join(f"{s.family.rsplit('/', 1)[-1]} {s.name} {_pct(s.median_change)} ({s.same_direction} of "
                      f"{s.cases})" for s in shifts[:3])
    more = f" and {len(shifts) - 3} more" if len(shifts) > 3 else ""
    improved, regressed = sum(s.improved for s in shifts), sum(s.regressed for s in shifts)
    flagged = (f"; {improved} IMPROVED and {regressed} REGRESSED verdicts are in them: look at the machine before "
               "re-recording or bisecting") if improved or regressed else ""
    return [f"moeperf: machine shift: {len(shifts)} metric famil{'y' if len(shifts) == 1 else 'ies'} moved together "
            f"({named}{more}){flagged}; see 'Machine shift' in the report"]
