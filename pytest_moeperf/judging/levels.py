"""Where a metric's noise lives: the nested levels of a serving measurement (a server start, then the windows measured
on it), each level's own variance, the unit a verdict is decided on, and the plan of starts x windows.

**Variance components** (Kalibera & Jones, "Rigorous benchmarking in reasonable time", ISMM 2013; here by the method
of moments of a one-way random-effects model, which is their formula for balanced data and stays unbiased when
starts have different numbers of windows): with the window medians y_ij of start i (r_i windows, N in all, n
starts),

* the window level's own variance T_w^2 = MS_within = sum_ij (y_ij - mean_i)^2 / (N - n);
* the start level's own variance T_s^2 = (MS_between - MS_within) / r0, with MS_between = sum_i r_i (mean_i -
  mean)^2 / (n - 1) and r0 = (N - sum_i r_i^2 / N) / (n - 1) (r0 = r when balanced: T_s^2 = S_s^2 - S_w^2 / r).

T_s^2 <= 0 means a start adds nothing beyond its windows: one start is enough, and its windows behave as
independent observations. **The unit of a verdict** follows: windows when the stored runs of this host, at least
`MIN_STARTS` starts of at least 2 windows each from at least `MIN_SITTINGS` sittings (`store.entries.sittings`),
show T_s^2 <= 0 (their window medians are then the reference's runs, and the current windows its rounds); otherwise
the start, with its windows pooled into one round, as before. Windows of one start are never taken as independent
unless the stored starts say they behave so, and starts of one sitting cannot say it: they share that hour's machine,
which a later session does not (the sitting is a level above the start that one sitting never samples).

**Repetitions per level** (Kalibera & Jones, eq. 7): windows per start r = ceil(sqrt((c_start / c_window) * T_w^2 /
T_s^2)), c the cost of one repetition of the level; the starts are what the rank test needs against the stored
units (`verdict.rounds_needed`). `plan` applies that to the steady metrics of the tests a session measures on
starts (start-up, first-token, queueing and tail metrics are not planned for: `verdict.steady`), within a time
budget. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.judging.thresholds import Reference
from pytest_moeperf.judging.verdict import ALPHA, rounds_needed, steady
from pytest_moeperf.ledger import Round, Section

#: the fewest stored starts (each of 2 or more windows) that may show a start adds nothing: with 2, the start
#: level's variance has one degree of freedom
MIN_STARTS = 3
#: the fewest sittings those starts must come from. Measured on the 2-core CPU box (2026-12-05, cpu-tiny-nospec,
#: c=4): 3 starts of one sitting showed the start adding nothing (start's own rCV <= 0, window's 3.2 %), yet the next
#: sitting's engine TPOT read +13.9 % and the one before -10.7 %; judged on that one sitting's windows, an A/A read
#: client TPOT +17.9 % and ITL p90 +23.1 % REGRESSED
MIN_SITTINGS = 2
WINDOW, START = "window", "start"


@dataclass(frozen=True)
class Components:
    """The variance of a metric's window medians split by level (see the module docstring)."""

    starts: int
    windows: int  # windows in all
    mean: float
    window_var: float  # T_w^2
    start_var: float  # T_s^2: may be <= 0 (a start adds nothing beyond its windows)
    sittings: int = 1  # the sittings the starts come from

    @property
    def start_adds_nothing(self) -> bool:
        return self.start_var <= 0.0

    @property
    def unit(self) -> str:
        """What a verdict is decided on: windows when at least `MIN_STARTS` starts of at least `MIN_SITTINGS`
        sittings show the start adds nothing."""
        return (WINDOW if self.starts >= MIN_STARTS and self.sittings >= MIN_SITTINGS and self.start_adds_nothing
                else START)

    def rcv(self, level: str) -> float:
        """A level's own standard deviation relative to the mean (0 for a level that adds nothing)."""
        var = self.window_var if level == WINDOW else self.start_var
        return math.sqrt(max(var, 0.0)) / abs(self.mean) if self.mean else math.inf

    def describe(self) -> str:
        start = "<= 0" if self.start_adds_nothing else f"{self.rcv(START) * 100:.2f} %"
        sittings = "1 sitting" if self.sittings == 1 else f"{self.sittings} sittings"
        return (f"{self.starts} stored starts in {sittings}, {self.windows} windows: start's own rCV {start}, "
                f"window's {self.rcv(WINDOW) * 100:.2f} %")


def components(groups: Sequence[Sequence[float]], sittings: int = 1) -> Components | None:
    """The components of window medians grouped by start, from ``sittings`` sittings (None: fewer than 2 starts, or
    no start with 2 windows)."""
    groups = [list(g) for g in groups if g]
    n = len(groups)
    total = sum(len(g) for g in groups)
    if n < 2 or total - n < 1:
        return None
    grand = sum(sum(g) for g in groups) / total
    means = [sum(g) / len(g) for g in groups]
    within = sum((y - m) ** 2 for g, m in zip(groups, means, strict=True) for y in g) / (total - n)
    between = sum(len(g) * (m - grand) ** 2 for g, m in zip(groups, means, strict=True)) / (n - 1)
    r0 = (total - sum(len(g) ** 2 for g in groups) / total) / (n - 1)
    return Components(n, total, grand, within, (between - within) / r0, sittings)


def of_reference(reference: Reference | None) -> Components | None:
    """The components of this host's stored starts in ``reference`` (None: none kept apart, or other hosts' runs)."""
    if reference is None or reference.other_hosts is not None:
        return None
    return components(reference.windows, reference.window_sittings)


def starts_of(rounds: Sequence[Round]) -> list[list[Round]]:
    """``rounds`` by the start they measured: the windows of one start (same origin, a window number) together,
    every other round its own unit; in order of first appearance."""
    groups: dict[str, list[Round]] = {}
    for i, r in enumerate(rounds):
        groups.setdefault(r.origin if r.window is not None else f"#{i}", []).append(r)
    return list(groups.values())


@dataclass(frozen=True)
class Units:
    """What a verdict is decided on: its rounds' samples, the reference they are set against, and why."""

    rounds: tuple[tuple[float, ...], ...]
    reference: Reference | None
    note: str = ""  # "" when nothing is nested
    starts: int = 0
    windows: int = 0


def judged_units(rounds: Sequence[Round], reference: Reference | None) -> Units:
    """The units of a verdict on ``rounds`` (see the module docstring): windows against the stored windows of this
    host when its stored starts show the start adds nothing, else each start's windows pooled into one round."""
    plain = tuple(r.samples for r in rounds)
    if not any(r.window is not None for r in rounds):
        return Units(plain, reference)
    groups = starts_of(rounds)
    count = f"{len(groups)} start(s), {len(rounds)} window(s)"
    found = of_reference(reference)
    if reference is not None and found is not None and found.unit == WINDOW:
        stored = tuple(w for run in reference.windows for w in run)
        at_windows = dataclasses.replace(reference, run_medians=stored, windows=())
        return Units(plain, at_windows, f"{count}; windows are the unit: {found.describe()}", len(groups),
                     len(rounds))
    why = found.describe() if found is not None else (
        f"no stored runs of this host with windows apart (fewer than {MIN_STARTS} starts of 2+ windows in "
        f"{MIN_SITTINGS} sittings teach no level)")
    pooled = tuple(tuple(x for r in g for x in r.samples) for g in groups)
    return Units(pooled, reference, f"{count}; starts are the unit: {why}", len(groups), len(rounds))


def windows_per_start(found: Components, start_s: float, window_s: float) -> int | None:
    """Kalibera & Jones' windows per start for the least cost (None: the start adds nothing, so one start holds
    them all)."""
    if found.start_adds_nothing:
        return None
    if found.window_var <= 0:
        return 1
    return max(1, math.ceil(math.sqrt((start_s / max(window_s, 1e-9)) * found.window_var / found.start_var)))


@dataclass(frozen=True)
class Planned:
    """One metric's needs: its components, how many stored units it is judged against."""

    name: str
    found: Components | None
    stored_starts: int


@dataclass(frozen=True)
class Plan:
    starts: int
    windows: int
    seconds: float
    lines: tuple[str, ...]


def plan(metrics: Sequence[Planned], start_s: float, window_s: float, budget_s: float | None = None,
         alpha: float = ALPHA) -> Plan | None:
    """Starts x windows that let every steady metric of ``metrics`` reach the rank test's p < ``alpha`` at least
    cost, cut to ``budget_s`` (seconds) if given; None when no metric has stored windows to plan from."""
    learned = [m for m in metrics if m.found is not None and steady(m.name)]
    if not learned:
        return None
    starts, windows, lines = 1, 1, []
    for m in learned:
        assert m.found is not None
        if m.found.unit == WINDOW:
            need = rounds_needed(m.found.windows, alpha) or 2
            starts, windows = max(starts, 1), max(windows, need)
        else:
            starts = max(starts, rounds_needed(m.stored_starts, alpha) or m.stored_starts + 1)
            windows = max(windows, windows_per_start(m.found, start_s, window_s) or 1)
    by_unit = {u: sorted(m.name for m in learned if m.found is not None and m.found.unit == u) for u in (WINDOW, START)}
    for unit, names in by_unit.items():
        if names:
            lines.append(f"{unit}s are the unit of {len(names)} metric(s): {', '.join(names[:4])}"
                         f"{', ...' if len(names) > 4 else ''}")
    cost = starts * (start_s + windows * window_s)
    if budget_s is not None and cost > budget_s:
        wanted = (starts, windows)
        while cost > budget_s and windows > 1:
            windows -= 1
            cost = starts * (start_s + windows * window_s)
        while cost > budget_s and starts > 1:
            starts -= 1
            cost = starts * (start_s + windows * window_s)
        lines.append(f"cut to the time budget ({budget_s:.0f} s): {wanted[0]} start(s) x {wanted[1]} window(s) "
                     f"would take {wanted[0] * (start_s + wanted[1] * window_s):.0f} s; verdicts may need more")
    skipped = sorted({m.name for m in metrics if m.found is not None and not steady(m.name)})
    if skipped:
        lines.append(f"not planned for (start-up, first-token, queueing, tails): {len(skipped)} metric(s)")
    return Plan(starts, windows, cost, tuple(lines))


LEVELS_TITLE = "Noise by level (server start > window)"


def levels_section(found: Sequence[tuple[str, Components]]) -> Section | None:
    """Each metric's variance per level, from the stored runs of this host that keep their windows apart."""
    if not found:
        return None

    def pct(c: Components, level: str) -> str:
        if level == START and c.start_adds_nothing:
            return "<= 0"
        return f"{c.rcv(level) * 100:.2f} %" if c.mean else "- (mean 0)"

    rows = tuple((key, c.starts, c.windows, pct(c, START), pct(c, WINDOW), c.unit) for key, c in sorted(found))
    return Section(LEVELS_TITLE, ("metric", "stored starts", "windows", "start's own rCV", "window's own rCV",
                                  "unit of the verdict"), rows,
                   note=f"variance components of the stored window medians (Kalibera & Jones): windows are the unit "
                        f"where at least {MIN_STARTS} starts from {MIN_SITTINGS} or more sittings show the start adds "
                        "nothing (its own variance <= 0)")


__all__ = ["MIN_SITTINGS", "MIN_STARTS", "START", "WINDOW", "Components", "Plan", "Planned", "Units", "components",
           "judged_units", "levels_section", "of_reference", "plan", "starts_of", "windows_per_start"]
