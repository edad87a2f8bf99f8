"""What the history stores: one `SessionRecord` per session and one `MetricRecord` per metric of it, and the one
adapter that builds them from the JSON report document the session writes (pytest-benchmark schema)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_moeperf.reports.document import metric_entries


class ReportFormatError(ValueError):
    """The JSON report document lacks what a history record needs."""


@dataclass(frozen=True)
class SessionRecord:
    """One session's provenance. Times are ISO 8601 in UTC; ``versions`` are software versions by name."""

    finished: str
    fingerprint: str
    fingerprint_hash: str
    started: str | None = None
    git_commit: str | None = None
    git_dirty: bool = False
    host: str = ""
    versions: Mapping[str, str] = field(default_factory=dict)
    host_id: str | None = None  # `Fingerprint.host`: which machine (a node name can repeat across machines)
    branch: str | None = None  # the git branch (a pull request's head branch in CI)

    def changed_versions(self, before: SessionRecord) -> list[str]:
        """``name old -> new`` for each version that differs from ``before``'s."""
        names = sorted(set(before.versions) | set(self.versions))
        return [f"{n} {before.versions.get(n, '-')} -> {self.versions.get(n, '-')}" for n in names
                if before.versions.get(n) != self.versions.get(n)]


@dataclass(frozen=True)
class MetricRecord:
    """One metric of one session: the summary of its samples and the verdict against the baseline.

    ``change`` is the signed relative change of ``median`` against ``baseline`` (the baseline median the verdict
    used); ``allowed`` the relative change tolerated in the worse direction."""

    test_id: str
    name: str
    unit: str
    better: str
    median: float
    n: int
    iqr: float
    status: str
    change: float | None = None
    allowed: float | None = None
    baseline: float | None = None
    reason: str | None = None  # why the verdict is what it is (the report's ``extra_info.reason``)

    @property
    def key(self) -> str:
        return f"{self.test_id}::{self.name}"


@dataclass(frozen=True)
class StoredSession:
    """A `SessionRecord` as read back from a store, with the id the store gave it."""

    id: int
    run: SessionRecord
    metrics: int = 0
    regressed: int = 0


@dataclass(frozen=True)
class Point:
    """One point of a metric's series: the run and the metric's record in it."""

    run: StoredSession
    metric: MetricRecord


# ----------------------------------------------------------------------------------------- report adapter
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _versions(machine: Mapping[str, Any]) -> dict[str, str]:
    moeperf = machine.get("moeperf") or {}
    topo = moeperf.get("topology") or {} if isinstance(moeperf, Mapping) else {}
    versions = {str(k): str(v) for k, v in (topo.get("software") or {}).items()} if isinstance(topo, Mapping) else {}
    for key, name in (("driver_version", "driver"), ("cuda_version", "cuda")):
        if isinstance(topo, Mapping) and topo.get(key):
            versions.setdefault(name, str(topo[key]))
    if machine.get("python_version"):
        versions.setdefault("python", str(machine["python_version"]))
    return versions


def _iso(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ReportFormatError(f"report: {what} is missing")
    try:
        stamp = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ReportFormatError(f"report: {what} {value!r} is not an ISO 8601 time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.astimezone(dt.UTC).isoformat(timespec="seconds")


def run_from_report(doc: Mapping[str, Any], started: str | None = None) -> SessionRecord:
    machine = doc.get("machine_info") or {}
    commit = doc.get("commit_info") or {}
    moeperf = machine.get("moeperf") or {}
    slug, digest = moeperf.get("fingerprint"), moeperf.get("hash")
    if not isinstance(slug, str) or not isinstance(digest, str):
        raise ReportFormatError("report: machine_info.moeperf has no fingerprint slug and hash")
    return SessionRecord(finished=_iso(doc.get("datetime"), "datetime"), fingerprint=slug, fingerprint_hash=digest,
                     started=_iso(started, "start time") if started else None,
                     git_commit=commit.get("id") or None, git_dirty=bool(commit.get("dirty", False)),
                     host=str(machine.get("node") or ""), versions=_versions(machine),
                     host_id=moeperf.get("host") or None, branch=commit.get("branch") or None)


def metric_from_benchmark(bench: Mapping[str, Any]) -> MetricRecord:
    info = bench.get("extra_info") or {}
    stats = bench.get("stats") or {}
    fullname = bench.get("fullname")
    metric = info.get("metric")
    if not isinstance(fullname, str) or not isinstance(metric, str):
        raise ReportFormatError(f"report: benchmark {bench.get('name')!r} has no fullname or extra_info.metric")
    suffix = f"::{metric}"
    test_id = fullname[: -len(suffix)] if fullname.endswith(suffix) else fullname.rpartition("::")[0]
    median = _number(stats.get("median"))
    if median is None:
        raise ReportFormatError(f"report: {fullname} has no numeric stats.median")
    rounds = stats.get("rounds")
    return MetricRecord(test_id=test_id, name=metric, unit=str(info.get("unit") or ""),
                        better=str(info.get("better") or "lower"), median=median,
                        n=rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else 0,
                        iqr=_number(stats.get("iqr")) or 0.0, status=str(info.get("verdict") or "UNKNOWN"),
                        change=_number(info.get("change")), allowed=_number(info.get("mde", info.get("allowed"))),
                        baseline=_number(info.get("baseline_median")),
                        reason=str(info["reason"]) if info.get("reason") else None)


def records_from_report(doc: Mapping[str, Any], started: str | None = None) -> tuple[SessionRecord, list[MetricRecord]]:
    """The run and its metrics from a ``--moeperf-report`` document; extra keys are ignored, optional ones may be
    missing. ``started`` (ISO 8601) is the session's start, which the report does not carry. The metrics come
    through the report format's reader (`document.metric_entries`: each in its own unit, whichever schema)."""
    try:
        entries = metric_entries(doc)
    except ValueError as exc:
        raise ReportFormatError(f"report: {exc}") from None
    return run_from_report(doc, started), [metric_from_benchmark(b) for b in entries]
