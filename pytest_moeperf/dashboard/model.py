"""Pure: the dashboard's data, from the window's sessions and their metrics, as the JSON the pages draw.

* **suite**: the folder of a test file under ``suites/`` (``gemm``); **family**: one metric name in one test file
  (the glossary's: the 16 CPU GEMM ``time`` cases). The index has one row per suite and family.
* A family's **level** on a lane, per session: the median over its cases of each case's value divided by that case's
  median over the lane's window. 1.0 is the case's usual value; a step of the whole family moves it; the sparkline
  draws it. A case whose median is 0 counts 1.0 where it is 0 and nothing elsewhere (`family_level`).
* A family's **change points** on a lane: its cases' change points (`changes.all_steps`) grouped by the session
  where each step starts, with how many cases stepped there and their median size.
* **machine**: the canary's figures (`machine.canary`) are a suite of their own, first in the index: one family per
  workload, whose cases are the test files it was read beside, so its level is the machine's per lane.

Numbers keep 6 significant digits; sessions are referred to by their history id everywhere.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_moeperf.dashboard.window import Window
from pytest_moeperf.history.records import MetricRecord
from pytest_moeperf.history.trend import Step
from pytest_moeperf.machine.canary import is_canary

STATUSES = ("REGRESSED", "INCONCLUSIVE", "IMPROVED", "MISSING", "NEW", "PASS")  # the order of the count arrays
FLAGGED = ("REGRESSED", "IMPROVED", "INCONCLUSIVE")  # verdicts a point is marked with
MACHINE = "machine"  # the canary's suite and the file of its families

# key -> lane index -> [(session id, record)], oldest first
Series = dict[str, dict[int, list[tuple[int, MetricRecord]]]]


def num(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def suite_of(test_id: str) -> str:
    """``suites/gemm/test_gemm.py::test_x[a]`` -> ``gemm``; a file elsewhere: its folder, or the file itself; the
    canary's figures: ``machine``."""
    if is_canary(test_id):
        return MACHINE
    parts = test_id.split("::", 1)[0].split("/")
    if parts[0] == "suites" and len(parts) > 2:
        return parts[1]
    return "/".join(parts[:-1]) or parts[-1]


def family_of(key: str) -> tuple[str, str]:
    """``(test file, metric name)`` of a ``test_id::name`` key; ``(machine, workload)`` of the canary's."""
    test_id, _, name = key.rpartition("::")
    return (MACHINE if is_canary(key) else test_id.split("::", 1)[0]), name


def case_of(key: str) -> str:
    """The part of a key that tells the cases of one family apart: ``test_gemm[kimi-k2.5-o_proj-m1-bf16]``; of the
    canary's, the test file it was read beside."""
    test_id = key.rpartition("::")[0]
    if is_canary(key):
        return test_id.split("::", 1)[0]
    return test_id.split("::", 1)[1] if "::" in test_id else test_id


def page_of(key: str) -> str:
    """The metric page's file name: readable, unique (a hash of the key), safe on any file system."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", key.split("/")[-1]).strip("_")[-80:]
    return f"m/{readable}-{hashlib.sha1(key.encode()).hexdigest()[:10]}.html"


def collect(window: Window, rows: Iterable[tuple[int, MetricRecord]]) -> Series:
    """The window's metric rows as series: per key, per lane, in the window's order."""
    position = {sid: i for i, sid in enumerate(window.ids)}
    series: Series = {}
    for sid, metric in rows:
        if sid in position:
            series.setdefault(metric.key, {}).setdefault(window.lane[sid], []).append((sid, metric))
    for lanes in series.values():
        for points in lanes.values():
            points.sort(key=lambda p: position[p[0]])
    return series


def medians(series: Series) -> dict[tuple[str, int], list[float]]:
    """What the change-point detector reads: each (key, lane)'s medians, oldest first."""
    return {(key, lane): [m.median for _, m in points] for key, lanes in series.items()
            for lane, points in lanes.items()}


def family_level(cases: Sequence[Sequence[tuple[int, MetricRecord]]]) -> list[tuple[int, float | None]]:
    """Per session (in the order first seen over ``cases``), the median over its cases of value over the case's own
    median. A case whose median is 0 (a ``failed_rate`` that stays 0) has no ratio: it counts 1.0 (its usual value)
    where its value is 0 too, and nothing where it is not; a session where no case counts has no level (None, a gap
    in the sparkline). Every session of ``cases`` is listed, with or without a level."""
    ratios: dict[int, list[float]] = {}
    for points in cases:
        typical = statistics.median(m.median for _, m in points)
        for sid, m in points:
            found = ratios.setdefault(sid, [])
            if typical != 0:
                found.append(m.median / typical)
            elif m.median == 0:
                found.append(1.0)
    return [(sid, statistics.median(values) if values else None) for sid, values in ratios.items()]


def worse(better: str, relative: float) -> bool:
    return relative > 0 if better == "lower" else relative < 0


def _step_groups(cases: Mapping[str, Sequence[tuple[int, MetricRecord]]],
                 steps: Mapping[tuple[str, int], Sequence[Step]], lane: int) -> list[dict[str, Any]]:
    by_session: dict[int, list[tuple[str, float]]] = {}
    for key, points in cases.items():
        for step in steps.get((key, lane), ()):
            relative = step.relative
            if relative is not None:
                by_session.setdefault(points[step.index][0], []).append((key, relative))
    groups = [{"s": sid, "n": len(found), "rel": num(statistics.median(r for _, r in found)),
               "pages": sorted(page_of(k) for k, _ in found)} for sid, found in by_session.items()]
    return sorted(groups, key=lambda g: (-g["n"], g["s"]))


def index_rows(window: Window, series: Series, steps: Mapping[tuple[str, int], Sequence[Step]]
               ) -> list[dict[str, Any]]:
    """One row per suite and family: its cases, and per lane the level series, each session's verdict counts and
    the change points found."""
    families: dict[tuple[str, str], list[str]] = {}
    for key in series:
        families.setdefault(family_of(key), []).append(key)
    rows = []
    order = {sid: i for i, sid in enumerate(window.ids)}
    for (path, name), keys in sorted(families.items(), key=lambda f: (f[0][0] != MACHINE, suite_of(f[0][0]), f[0])):
        keys.sort()
        first = series[keys[0]][min(series[keys[0]])][0][1]
        lanes = []
        for lane in sorted({lane for k in keys for lane in series[k]}):
            cases = {k: series[k][lane] for k in keys if lane in series[k]}
            level = sorted(family_level(list(cases.values())), key=lambda p: order[p[0]])
            counts: dict[int, list[int]] = {sid: [0] * len(STATUSES) for sid, _ in level}
            for points in cases.values():
                for sid, m in points:
                    if m.status in STATUSES:
                        counts[sid][STATUSES.index(m.status)] += 1
            lanes.append({"lane": lane, "of": len(cases), "s": [sid for sid, _ in level],
                          "y": [num(y) for _, y in level], "k": [counts[sid] for sid, _ in level],
                          "steps": _step_groups(cases, steps, lane)})
        rows.append({"suite": suite_of(path), "file": path, "metric": name, "unit": first.unit,
                     "better": first.better, "lanes": lanes,
                     "cases": [{"page": page_of(k), "case": case_of(k)} for k in keys]})
    return rows


def sessions_payload(window: Window, commit_url: str | None, source: str) -> dict[str, Any]:
    """Every session the pages refer to: ``[finished, commit, dirty, branch, lane, versions index]`` by id, each
    distinct set of versions once."""
    versions: list[dict[str, str]] = []
    seen: dict[tuple[tuple[str, str], ...], int] = {}
    sessions: dict[str, list[Any]] = {}
    for s in window.sessions:
        frozen = tuple(sorted(s.run.versions.items()))
        if frozen not in seen:
            seen[frozen] = len(versions)
            versions.append(dict(frozen))
        sessions[str(s.id)] = [s.run.finished, s.run.git_commit, s.run.git_dirty, s.run.branch,
                               window.lane[s.id], seen[frozen]]
    return {"lanes": [{"fingerprint": lane.fingerprint, "host": lane.host} for lane in window.lanes],
            "sessions": sessions, "versions": versions, "commit_url": commit_url, "latest": window.latest,
            "shown": len(window.sessions), "total": window.total, "source": source}


def _step_json(step: Step, points: Sequence[tuple[int, MetricRecord]], window: Window) -> dict[str, Any]:
    runs = {s.id: s.run for s in window.sessions}
    at, before = points[step.index][0], points[step.index - 1][0]
    return {"s": at, "before": num(step.before), "after": num(step.after), "rel": num(step.relative),
            "p": num(step.pvalue), "versions": runs[at].changed_versions(runs[before])}


def metric_payload(key: str, lanes: Mapping[int, Sequence[tuple[int, MetricRecord]]],
                   steps: Mapping[tuple[str, int], Sequence[Step]], window: Window,
                   ab: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """One metric page: per lane its points ``[session, median, iqr, verdict, baseline, allowed, change, reason]``
    and change points; the A/B results of its sessions' commits."""
    first = next(iter(lanes.values()))[0][1]
    path, name = family_of(key)
    return {"key": key, "suite": suite_of(path), "file": path, "metric": name, "unit": first.unit,
            "better": first.better, "ab": list(ab),
            "lanes": [{"lane": lane, "p": [[sid, num(m.median), num(m.iqr), m.status, num(m.baseline),
                                             num(m.allowed), num(m.change), m.reason] for sid, m in points],
                       "steps": [_step_json(s, points, window) for s in steps.get((key, lane), ())]}
                      for lane, points in sorted(lanes.items())]}
