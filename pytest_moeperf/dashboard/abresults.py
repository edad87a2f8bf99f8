"""``moeperf ab --report`` documents beside the history: each is matched to the sessions of its head commit (and
fingerprint, when both say), and a metric page lists its paired results next to those sessions' points.

The history does not store A/B runs (their sides write none); the reports are wherever a user or CI keeps them,
named to the dashboard with ``--ab FILE|DIR`` (a folder: every ``*.json`` in it that is an A/B report)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_moeperf.dashboard.window import Window


class AbReportError(ValueError):
    """A file named as an A/B report cannot be read as one."""


@dataclass(frozen=True)
class AbReport:
    name: str  # the file, as shown
    commit: str | None  # the head side's commit
    fingerprint_hash: str | None
    base: str  # the base side in a few words
    results: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # metric key -> its paired result


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


def _where(side: Mapping[str, Any]) -> str:
    git = side.get("git") or {}
    commit = side.get("commit") or git.get("id")
    ref = side.get("ref")
    return f"{ref} @ {str(commit)[:10]}" if ref and commit else (str(commit)[:10] if commit else "this checkout")


def parse(doc: Any, name: str) -> AbReport:
    """One A/B report document (`ab.report.report_document`'s shape)."""
    ab = doc.get("moeperf", {}).get("ab") if isinstance(doc, Mapping) and isinstance(doc.get("moeperf"),
                                                                                     Mapping) else None
    if not isinstance(ab, Mapping):
        raise AbReportError(f"{name}: not a moeperf ab report (no moeperf.ab section)")
    sides = ab.get("sides") or {}
    head, base = sides.get("head") or {}, sides.get("base") or {}
    commit = head.get("commit") or (head.get("git") or {}).get("id") or (doc.get("commit_info") or {}).get("id")
    paired = ab.get("metrics") or {}
    results: dict[str, dict[str, Any]] = {}
    for bench in doc.get("benchmarks") or []:
        key, info = bench.get("fullname"), bench.get("extra_info") or {}
        if not isinstance(key, str):
            continue
        stats = paired.get(key) or {}
        results[key] = {"status": str(info.get("verdict") or "?"), "change": _finite(info.get("change")),
                        "low": _finite(stats.get("low")), "high": _finite(stats.get("high")),
                        "p": _finite(stats.get("p")), "pairs": stats.get("pairs"),
                        "reason": info.get("reason") or None}
    return AbReport(name=name, commit=str(commit) if commit else None,
                    fingerprint_hash=doc.get("moeperf", {}).get("hash"), base=_where(base), results=results)


def read(paths: Sequence[Path]) -> list[AbReport]:
    """The A/B reports at ``paths`` (files, or folders of ``*.json``: there, files that are not A/B reports are
    passed over); a named file that is not one is an error."""
    reports: list[AbReport] = []
    for path in paths:
        if path.is_dir():
            for child in sorted(path.glob("*.json")):
                try:
                    reports.append(parse(json.loads(child.read_text()), str(child)))
                except (OSError, ValueError):
                    continue
            continue
        try:
            reports.append(parse(json.loads(path.read_text()), str(path)))
        except OSError as exc:
            raise AbReportError(f"--ab {path}: cannot read it: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise AbReportError(f"--ab {path}: not JSON ({exc})") from None
    return reports


def by_session(reports: Sequence[AbReport], window: Window) -> dict[int, list[AbReport]]:
    """The reports whose head commit is each session's commit (on the same fingerprint when both name one)."""
    by_commit: dict[str, list[AbReport]] = {}
    for report in reports:
        if report.commit:
            by_commit.setdefault(report.commit, []).append(report)
    matched: dict[int, list[AbReport]] = {}
    for s in window.sessions:
        for report in by_commit.get(s.run.git_commit or "", ()):
            if report.fingerprint_hash is None or report.fingerprint_hash == s.run.fingerprint_hash:
                matched.setdefault(s.id, []).append(report)
    return matched


def for_metric(key: str, sids: Sequence[int], matched: Mapping[int, Sequence[AbReport]]) -> list[dict[str, Any]]:
    """A metric page's A/B rows: ``{"s": session, "report", "base", **result}`` for each matched report that has
    the metric."""
    return [{"s": sid, "report": Path(r.name).name, "base": r.base, **r.results[key]}
            for sid in sids for r in matched.get(sid, ()) if key in r.results]
