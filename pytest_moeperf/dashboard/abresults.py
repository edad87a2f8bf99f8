"""``moeperf ab --report`` documents beside the history: each is matched to the sessions of its head commit (and
fingerprint, when both say), and a metric page lists its paired results next to those sessions' points.

The history does not store A/B runs (their sides write none); the reports are wherever a user or CI keeps them,
named to the dashboard with ``--ab FILE|DIR`` (a folder: every ``*.json`` in it that is an A/B report). Only regular
files of at most `MAX_BYTES` are read: a FIFO would block the build and ``/dev/zero`` would never end."""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_moeperf.dashboard.window import Window

MAX_BYTES = 64 * 2**20  # the largest report read: a real one of every suite's metrics is a few MB (1x H200's serving
# and spec-decode report of 267 metrics: 3.2 MB)


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
    """One A/B report document (`ab.report.report_document`'s shape); `AbReportError` when it is not one."""
    try:
        return _parse(doc, name)
    except (AttributeError, TypeError) as exc:  # a section of the wrong type
        raise AbReportError(f"{name}: a malformed moeperf ab report ({type(exc).__name__}: {exc})") from None


def _parse(doc: Any, name: str) -> AbReport:
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


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def load(path: Path) -> Any:
    """The JSON document in ``path``, a regular file (a symlink to one) of at most `MAX_BYTES`: a FIFO or a device
    (``/dev/zero``) is refused without reading from it. `AbReportError` says why not (without the path)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer opens at once, and is refused
    except OSError as exc:
        raise AbReportError(f"cannot read it: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise AbReportError(f"not a regular file: {_kind(mode)}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise AbReportError(f"larger than {MAX_BYTES // 2**20} MiB, the most an A/B report is read to")
    try:
        return json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError too
        raise AbReportError(f"not JSON ({exc})") from None


def _folder(path: Path) -> tuple[list[AbReport], str]:
    """The A/B reports among the ``*.json`` of a folder, and a line on what was found and passed over, with why."""
    found: list[AbReport] = []
    skipped: list[str] = []
    children = sorted(path.glob("*.json"))
    for child in children:
        try:
            found.append(parse(load(child), str(child)))
        except AbReportError as exc:
            skipped.append(f"{child.name} ({str(exc).removeprefix(f'{child}: ')})")
    head = (f"--ab {path}: no *.json file in it" if not children else
            f"--ab {path}: {len(found)} A/B report(s) among {len(children)} *.json file(s)"
            if found else f"--ab {path}: no moeperf ab report among its {len(children)} *.json file(s)")
    return found, head + (f"; passed over: {', '.join(skipped)}" if skipped else "")


def read(paths: Sequence[Path]) -> tuple[list[AbReport], list[str]]:
    """The A/B reports at ``paths`` (files, or folders of ``*.json``: there, files that are not A/B reports are
    passed over), and a line per folder saying what it held and what was passed over, with why; a named file that
    is not one is an error."""
    reports: list[AbReport] = []
    notes: list[str] = []
    for path in paths:
        if path.is_dir():
            found, note = _folder(path)
            reports += found
            notes.append(note)
            continue
        try:
            reports.append(parse(load(path), str(path)))
        except AbReportError as exc:
            raise AbReportError(f"--ab {path}: {str(exc).removeprefix(f'{path}: ')}") from None
    return reports, notes


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
