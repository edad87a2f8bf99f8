"""The baseline store: ``<root>/<fingerprint-slug>/<suite>.json``, versioned, sorted, written atomically.

Schema 2 keeps per metric the summary of its last update and ``runs``: the run-level summaries (median, n, IQR,
date, git commit) of its last K updates, from which the reference and the between-run noise are learned
(`reference`). Schema-1 files are read as one run each and rewritten only when updated.

An update touches only the metrics that ran, only this fingerprint's directory, and never a file it cannot
read: a corrupt or schema-mismatched file raises `BaselineError` naming it and stays as it is. Every file of an
update is prepared before the first is written. Non-finite numbers are refused on write and on read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_moeperf.records import Measurement, suite_of
from pytest_moeperf.stats import Summary, summarize
from pytest_moeperf.thresholds import Reference

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
DEFAULT_KEEP_RUNS = 15  # three sittings of 5 rounds
_SIGNIFICANT = 6


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file."""


def _round(value: float) -> float:
    return float(f"{value:.{_SIGNIFICANT}g}")


def _finite(where: str, key: str, values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise BaselineError(f"{where}: metric {key!r} has a non-finite {name} ({value}); a baseline must be "
                                "a finite number (left untouched)")


@dataclass(frozen=True)
class RunSummary:
    """One update's run of a metric, as a baseline keeps it."""

    median: float
    n: int
    iqr: float
    date: str | None = None
    git_commit: str | None = None

    @classmethod
    def of(cls, summary: Summary, provenance: Mapping[str, Any]) -> RunSummary:
        return cls(summary.median, summary.n, summary.iqr, provenance.get("date"), provenance.get("git_commit"))


@dataclass(frozen=True)
class BaselineEntry:
    key: str
    test_id: str
    name: str
    unit: str
    better: str
    summary: Summary  # the last update's run
    context: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    runs: tuple[RunSummary, ...] = ()  # oldest first; empty means "the summary is the only run"

    @property
    def all_runs(self) -> tuple[RunSummary, ...]:
        return self.runs or (RunSummary.of(self.summary, self.provenance),)

    def reference(self) -> Reference:
        """The values a verdict needs: the stored run medians and their largest within-run IQR/median."""
        runs = self.all_runs
        return Reference(tuple(r.median for r in runs),
                         max((r.iqr / abs(r.median) if r.median else 0.0) for r in runs),
                         sittings=len({r.date for r in runs}))

    def to_json(self) -> dict[str, Any]:
        summary = {k: (_round(v) if isinstance(v, float) else v) for k, v in asdict(self.summary).items()}
        runs = [{k: (_round(v) if isinstance(v, float) else v) for k, v in asdict(r).items()} for r in self.all_runs]
        for values in (summary, *runs):
            _finite("baseline update", self.key, values)
        return {"test": self.test_id, "name": self.name, "unit": self.unit, "better": self.better,
                "summary": summary, "runs": runs, "context": dict(self.context), "provenance": dict(self.provenance)}

    @classmethod
    def from_json(cls, key: str, data: Mapping[str, Any], where: str) -> BaselineEntry:
        try:
            raw = dict(data["summary"])
            _finite(where, key, raw)
            summary = Summary(n=int(raw.pop("n")), **{k: float(v) for k, v in raw.items()})
            runs = []
            for run in data.get("runs", []):
                _finite(where, key, run)
                runs.append(RunSummary(float(run["median"]), int(run["n"]), float(run["iqr"]), run.get("date"),
                                       run.get("git_commit")))
            return cls(key=key, test_id=str(data["test"]), name=str(data["name"]), unit=str(data["unit"]),
                       better=str(data["better"]), summary=summary, context=dict(data.get("context", {})),
                       provenance=dict(data.get("provenance", {})), runs=tuple(runs))
        except (KeyError, TypeError, ValueError) as exc:
            raise BaselineError(f"{where}: metric {key!r} is malformed ({type(exc).__name__}: {exc})") from None

    def updated(self, m: Measurement, provenance: Mapping[str, Any], keep: int) -> BaselineEntry:
        """This entry with one more run (``m``); a changed unit or direction starts the runs afresh."""
        fresh = BaselineEntry.from_measurement(m, provenance)
        if (self.unit, self.better) != (m.unit, m.better):
            return fresh
        return dataclasses.replace(fresh, runs=(self.all_runs + fresh.runs)[-keep:])

    @classmethod
    def from_measurement(cls, m: Measurement, provenance: Mapping[str, Any]) -> BaselineEntry:
        summary = summarize(m.samples)
        return cls(key=m.key, test_id=m.test_id, name=m.name, unit=m.unit, better=m.better, summary=summary,
                   context=dict(m.context), provenance=dict(provenance), runs=(RunSummary.of(summary, provenance),))


def merge_entries(a: BaselineEntry, b: BaselineEntry, keep: int) -> BaselineEntry:
    """One metric's runs from two copies of a baseline that were updated apart (e.g. two GPU runners, or two device
    calls that each started from the same committed file): the union of their runs by date (a run both hold
    counts once), the last ``keep``; summary, context and provenance of the copy updated last. Copies whose unit
    or direction differ cannot be merged (`BaselineError`)."""
    if (a.unit, a.better) != (b.unit, b.better):
        raise BaselineError(f"metric {a.key!r}: cannot merge {a.unit}/{a.better} with {b.unit}/{b.better}")
    runs = sorted(set(a.all_runs) | set(b.all_runs), key=lambda r: (r.date or "", r.median))
    newer = b if (b.provenance.get("date") or "") >= (a.provenance.get("date") or "") else a
    return dataclasses.replace(newer, runs=tuple(runs[-keep:]))


def merge_trees(target: Path, sources: Iterable[Path], keep: int = DEFAULT_KEEP_RUNS) -> list[Path]:
    """Merge every ``<slug>/<suite>.json`` under each source directory into ``target`` (created as needed); the
    files are read and every text prepared before the first is written. Files of one slug and suite whose
    fingerprint hashes differ are refused: they were measured on different machines."""
    merged: dict[Path, tuple[Mapping[str, Any], dict[str, BaselineEntry]]] = {}
    for root in (target, *sources):
        if not root.is_dir():
            raise BaselineError(f"baselines directory {root} does not exist")
        for path in sorted(root.glob("*/*.json")):
            dest = target / path.parent.name / path.name
            found = read_file(path)
            if dest not in merged:
                merged[dest] = (found.fingerprint, dict(found.entries))
                continue
            fingerprint, entries = merged[dest]
            if fingerprint.get("hash") != found.fingerprint.get("hash"):
                raise BaselineError(f"{path}: fingerprint {found.fingerprint.get('hash')} differs from "
                                    f"{fingerprint.get('hash')} of the same file elsewhere: not merged")
            for key, entry in found.entries.items():
                entries[key] = merge_entries(entries[key], entry, keep) if key in entries else entry
    texts = {dest: dump(fingerprint, entries) for dest, (fingerprint, entries) in merged.items()}
    texts = {dest: text for dest, text in texts.items() if not dest.exists() or dest.read_text() != text}
    for dest, text in texts.items():
        atomic_write(dest, text)  # creates the slug directory as needed
    return sorted(texts)


@dataclass(frozen=True)
class BaselineFile:
    path: Path
    fingerprint: Mapping[str, Any]
    entries: Mapping[str, BaselineEntry]


def read_file(path: Path) -> BaselineFile:
    """Parse one baseline file; `BaselineError` (naming the file) when it is unreadable."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise BaselineError(f"baseline file {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise BaselineError(f"baseline file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            "left untouched") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline file {path} is corrupt: {exc}; fix or delete it "
                            "(it was left untouched)") from None
    if not isinstance(data, dict) or "metrics" not in data:
        raise BaselineError(f"baseline file {path} is not a moeperf baseline (no 'metrics'); left untouched")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise BaselineError(f"baseline file {path} has schema {data.get('schema')!r}; this version reads "
                            f"{' and '.join(map(str, READABLE_SCHEMAS))} (left untouched)")
    metrics = data["metrics"]
    if not isinstance(metrics, dict):
        raise BaselineError(f"baseline file {path}: 'metrics' must be an object; left untouched")
    fingerprint = data.get("fingerprint", {})
    if not isinstance(fingerprint, dict):
        raise BaselineError(f"baseline file {path}: 'fingerprint' must be an object; left untouched")
    entries = {key: BaselineEntry.from_json(key, value, str(path)) for key, value in metrics.items()}
    return BaselineFile(path=path, fingerprint=dict(fingerprint), entries=entries)


def dump(fingerprint: Mapping[str, Any], entries: Mapping[str, BaselineEntry]) -> str:
    doc = {"schema": SCHEMA, "fingerprint": dict(fingerprint),
           "metrics": {key: entries[key].to_json() for key in sorted(entries)}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename, so a crash leaves the old file whole.
    The file gets the mode a plain ``open()`` would give it (0666 less the umask), not mkstemp's 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class BaselineStore:
    """The baselines of one fingerprint: reads lazily, one file per suite."""

    def __init__(self, root: Path, slug: str) -> None:
        self.root = root
        self.slug = slug
        self._files: dict[str, BaselineFile | BaselineError | None] = {}

    @property
    def directory(self) -> Path:
        return self.root / self.slug

    def path(self, suite: str) -> Path:
        return self.directory / f"{suite}.json"

    def file(self, suite: str) -> BaselineFile | None:
        if suite not in self._files:
            path = self.path(suite)
            try:
                self._files[suite] = read_file(path) if path.exists() else None
            except BaselineError as exc:
                self._files[suite] = exc
        cached = self._files[suite]
        if isinstance(cached, BaselineError):
            raise cached
        return cached

    def lookup(self, measurement: Measurement) -> BaselineEntry | None:
        found = self.file(measurement.suite)
        return found.entries.get(measurement.key) if found else None

    def entries_of(self, test_id: str) -> list[BaselineEntry]:
        """The stored metrics of one test (raises `BaselineError` for an unusable file)."""
        found = self.file(suite_of(test_id))
        return [e for e in found.entries.values() if e.test_id == test_id] if found else []

    def run_medians(self, keys: Iterable[str]) -> dict[str, list[tuple[str | None, float]]]:
        """Each stored metric's runs as (date of its update, median), oldest first; unusable files are left out."""
        out: dict[str, list[tuple[str | None, float]]] = {}
        for key in keys:
            try:
                found = self.file(suite_of(key.rsplit("::", 1)[0]))
            except BaselineError:
                continue
            entry = found.entries.get(key) if found else None
            if entry is not None:
                out[key] = [(r.date, r.median) for r in entry.all_runs]
        return out

    def foreign_hash(self, suite: str, current_hash: str) -> str | None:
        """The fingerprint hash stored in a suite's file when it differs from ``current_hash``; else None."""
        found = self.file(suite)
        stored = found.fingerprint.get("hash") if found else None
        return str(stored) if stored and stored != current_hash else None

    def update(self, measurements: Iterable[Measurement], fingerprint: Mapping[str, Any],
               provenance: Mapping[str, Any], keep_runs: int = DEFAULT_KEEP_RUNS) -> list[Path]:
        """Merge the given measurements into their suites' files; other metrics are kept as they are. Each
        measurement adds one run to its metric (a key given N times adds N runs: one per round).

        Every file is read and every text prepared first, so a corrupt file (or a bad value) stops the update
        before anything is written."""
        by_suite: dict[str, list[Measurement]] = {}
        for m in measurements:
            by_suite.setdefault(m.suite, []).append(m)
        texts: dict[Path, str] = {}
        for suite, items in sorted(by_suite.items()):
            self._files.pop(suite, None)
            existing = self.file(suite)  # raises for a corrupt file: nothing written yet
            entries = dict(existing.entries) if existing else {}
            for m in items:
                old = entries.get(m.key)
                entries[m.key] = (old.updated(m, provenance, keep_runs) if old
                                  else BaselineEntry.from_measurement(m, provenance))
            texts[self.path(suite)] = dump(fingerprint, entries)
        for path, text in texts.items():
            atomic_write(path, text)
        self._files.clear()
        return list(texts)


def load_tree(root: Path) -> dict[str, dict[str, BaselineEntry]]:
    """Every baseline under ``root``: ``{"<slug>/<suite>": {key: entry}}`` (for diffs and budgets)."""
    if not root.is_dir():
        raise BaselineError(f"baselines directory {root} does not exist")
    tree: dict[str, dict[str, BaselineEntry]] = {}
    for path in sorted(root.glob("*/*.json")):
        tree[f"{path.parent.name}/{path.stem}"] = dict(read_file(path).entries)
    return tree


def parse_tree_texts(texts: Mapping[str, str]) -> dict[str, dict[str, BaselineEntry]]:
    """Like `load_tree`, from ``{"<slug>/<suite>": json text}`` (e.g. read from a git revision)."""
    tree: dict[str, dict[str, BaselineEntry]] = {}
    for name, text in sorted(texts.items()):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BaselineError(f"baseline file {name}.json is corrupt: {exc}") from None
        where = f"{name}.json"
        metrics = data.get("metrics", {}) if isinstance(data, dict) else None
        if not isinstance(metrics, dict):
            raise BaselineError(f"baseline file {where} is not a moeperf baseline (no 'metrics' object)")
        tree[name] = {k: BaselineEntry.from_json(k, v, where) for k, v in metrics.items()}
    return tree


@dataclass(frozen=True)
class Change:
    """One metric that differs between two baseline trees."""

    file: str  # "<slug>/<suite>"
    key: str
    kind: str  # added | removed | changed
    unit: str
    old: float | None
    new: float | None

    @property
    def relative(self) -> float | None:
        if self.old is None or self.new is None or self.old == 0:
            return None
        return (self.new - self.old) / abs(self.old)


def diff_trees(old: Mapping[str, Mapping[str, BaselineEntry]],
               new: Mapping[str, Mapping[str, BaselineEntry]]) -> list[Change]:
    """What an update changed: metrics added, removed, or whose runs changed (values: the references)."""
    changes: list[Change] = []
    for file in sorted(set(old) | set(new)):
        before, after = old.get(file, {}), new.get(file, {})
        for key in sorted(set(before) | set(after)):
            a, b = before.get(key), after.get(key)
            if a is None and b is not None:
                changes.append(Change(file, key, "added", b.unit, None, b.reference().value))
            elif b is None and a is not None:
                changes.append(Change(file, key, "removed", a.unit, a.reference().value, None))
            elif a is not None and b is not None and (a.summary, a.all_runs) != (b.summary, b.all_runs):
                changes.append(Change(file, key, "changed", b.unit, a.reference().value, b.reference().value))
    return changes


def software_changes(baseline: BaselineEntry | None, current: dict[str, str]) -> str:
    """What changed in the software versions since ``baseline`` was recorded ("" when nothing did)."""
    if baseline is None:
        return ""
    before = baseline.provenance.get("software", {})
    if not isinstance(before, dict):
        return ""
    changed = [f"{k} {before.get(k, '-')} -> {current.get(k, '-')}" for k in sorted(set(before) | set(current))
               if before.get(k) != current.get(k)]
    return ("software changed since the baseline: " + ", ".join(changed)) if changed else ""
