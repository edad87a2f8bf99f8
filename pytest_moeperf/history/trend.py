"""Change points in a metric's history, found by Apache Otava's E-divisive implementation (the method of MongoDB's
and Otava's perf CI: Matteson & James, with the split/merge steps of Fleming et al., "Hunter", ICPE 2023), and named
by the run where each step happened."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.history.records import Point
from pytest_moeperf.history.store import HistoryStore, match_keys

MAX_PVALUE = 0.001  # Otava's default significance
MIN_MAGNITUDE = 0.0  # relative; steps smaller than this are merged away even when significant
WINDOW = 50  # Otava's default sliding window, in runs


@dataclass(frozen=True)
class Step:
    """A change point: ``index`` is the first point of the new level; means of the segments either side."""

    index: int
    before: float
    after: float
    pvalue: float

    @property
    def relative(self) -> float | None:
        return None if self.before == 0 else self.after / self.before - 1.0


@dataclass(frozen=True)
class Trend:
    """One metric's series on one fingerprint, and its steps."""

    key: str
    fingerprint: str
    points: tuple[Point, ...]
    steps: tuple[Step, ...]


def find_steps(values: Sequence[float], max_pvalue: float = MAX_PVALUE, min_magnitude: float = MIN_MAGNITUDE,
               window: int = WINDOW) -> list[Step]:
    """Change points of ``values`` (oldest first) by `otava.analysis.compute_change_points`."""
    if len(values) < 3:
        return []
    from otava.analysis import compute_change_points

    found, _weak = compute_change_points([float(v) for v in values], window_len=max(window, 2),
                                         max_pvalue=max_pvalue, min_magnitude=min_magnitude)
    return [Step(index=int(cp.index), before=float(cp.stats.mean_1), after=float(cp.stats.mean_2),
                 pvalue=float(cp.stats.pvalue)) for cp in found]


def split_by_fingerprint(points: Sequence[Point]) -> dict[str, list[Point]]:
    """Series of different machines never mix: one series per fingerprint slug, in first-seen order."""
    groups: dict[str, list[Point]] = {}
    for point in points:
        groups.setdefault(point.run.run.fingerprint, []).append(point)
    return groups


def trends(store: HistoryStore, patterns: Sequence[str], fingerprint: str | None = None,
           max_pvalue: float = MAX_PVALUE, min_magnitude: float = MIN_MAGNITUDE, window: int = WINDOW) -> list[Trend]:
    """The trend of every metric named by ``patterns`` (exact keys, globs or substrings), per fingerprint."""
    found: list[Trend] = []
    for key in match_keys(store.keys(), patterns):
        for slug, points in split_by_fingerprint(store.series(key, fingerprint)).items():
            steps = find_steps([p.metric.median for p in points], max_pvalue, min_magnitude, window)
            found.append(Trend(key=key, fingerprint=slug, points=tuple(points), steps=tuple(steps)))
    return found


def _direction(better: str, relative: float) -> str:
    worse = relative > 0 if better == "lower" else relative < 0
    return "worse" if worse else "better"


def step_lines(trend: Trend) -> list[str]:
    """What a person reads: the metric, and for each step the run it started at (commit, date, versions changed since
    the run before) and its size."""
    unit = trend.points[0].metric.unit if trend.points else ""
    lines = [f"{trend.key} on {trend.fingerprint}: {len(trend.points)} run(s), "
             f"{len(trend.steps) or 'no'} change point(s)"]
    for step in trend.steps:
        at, before = trend.points[step.index], trend.points[step.index - 1]
        run = at.run.run
        commit = (run.git_commit or "unknown commit")[:12] + (" (dirty)" if run.git_dirty else "")
        relative = step.relative
        size = "" if relative is None else f" ({relative * 100:+.1f} %, {_direction(at.metric.better, relative)})"
        lines.append(f"  step at run #{at.run.id} {run.finished} commit {commit} host {run.host or '?'}: "
                     f"{step.before:.4g} -> {step.after:.4g} {unit}{size}, p={step.pvalue:.2g}")
        changed = run.changed_versions(before.run.run)
        lines.append("    versions: " + ("; ".join(changed) if changed else "unchanged since the run before"))
    return lines
