"""The baseline store: ``<root>/<fingerprint-slug>/<suite>.json``, versioned, sorted, written atomically.

An update touches only the metrics that ran, only this fingerprint's directory, and never a file it cannot
read: a corrupt or schema-mismatched file raises `BaselineError` naming it and stays as it is.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_moeperf.records import Measurement
from pytest_moeperf.stats import Summary, summarize

SCHEMA = 1
_SIGNIFICANT = 6


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file."""


def _round(value: float) -> float:
    return float(f"{value:.{_SIGNIFICANT}g}")


@dataclass(frozen=True)
class BaselineEntry:
    key: str
    test_id: str
    name: str
    unit: str
    better: str
    summary: Summary
    context: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test_id, "name": self.name, "unit": self.unit, "better": self.better,
            "summary": {k: (_round(v) if isinstance(v, float) else v) for k, v in asdict(self.summary).items()},
            "context": dict(self.context), "provenance": dict(self.provenance),
        }

    @classmethod
    def from_json(cls, key: str, data: Mapping[str, Any], where: str) -> BaselineEntry:
        try:
            raw = dict(data["summary"])
            summary = Summary(n=int(raw.pop("n")), **{k: float(v) for k, v in raw.items()})
            return cls(key=key, test_id=str(data["test"]), name=str(data["name"]), unit=str(data["unit"]),
                       better=str(data["better"]), summary=summary, context=dict(data.get("context", {})),
                       provenance=dict(data.get("provenance", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise BaselineError(f"{where}: metric {key!r} is malformed ({type(exc).__name__}: {exc})") from None

    @classmethod
    def from_measurement(cls, m: Measurement, provenance: Mapping[str, Any]) -> BaselineEntry:
        return cls(key=m.key, test_id=m.test_id, name=m.name, unit=m.unit, better=m.better,
                   summary=summarize(m.samples), context=dict(m.context), provenance=dict(provenance))


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
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline file {path} is corrupt: {exc}; fix or delete it "
                            "(it was left untouched)") from None
    if not isinstance(data, dict) or "metrics" not in data:
        raise BaselineError(f"baseline file {path} is not a moeperf baseline (no 'metrics'); left untouched")
    if data.get("schema") != SCHEMA:
        raise BaselineError(f"baseline file {path} has schema {data.get('schema')!r}; this version reads {SCHEMA} "
                            "(left untouched)")
    metrics = data["metrics"]
    if not isinstance(metrics, dict):
        raise BaselineError(f"baseline file {path}: 'metrics' must be an object; left untouched")
    entries = {key: BaselineEntry.from_json(key, value, str(path)) for key, value in metrics.items()}
    return BaselineFile(path=path, fingerprint=dict(data.get("fingerprint", {})), entries=entries)


def dump(fingerprint: Mapping[str, Any], entries: Mapping[str, BaselineEntry]) -> str:
    doc = {"schema": SCHEMA, "fingerprint": dict(fingerprint),
           "metrics": {key: entries[key].to_json() for key in sorted(entries)}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename, so a crash leaves the old file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
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

    def update(self, measurements: Iterable[Measurement], fingerprint: Mapping[str, Any],
               provenance: Mapping[str, Any]) -> list[Path]:
        """Merge the given measurements into their suites' files; other metrics are kept as they are.

        Every file is read first, so a corrupt one stops the update before anything is written."""
        by_suite: dict[str, list[Measurement]] = {}
        for m in measurements:
            by_suite.setdefault(m.suite, []).append(m)
        merged: dict[str, dict[str, BaselineEntry]] = {}
        for suite in by_suite:
            self._files.pop(suite, None)
            existing = self.file(suite)  # raises for a corrupt file: nothing written yet
            merged[suite] = dict(existing.entries) if existing else {}
        written: list[Path] = []
        for suite, items in sorted(by_suite.items()):
            entries = merged[suite]
            for m in items:
                entries[m.key] = BaselineEntry.from_measurement(m, provenance)
            path = self.path(suite)
            atomic_write(path, dump(fingerprint, entries))
            self._files.pop(suite, None)
            written.append(path)
        return written


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
        tree[name] = {k: BaselineEntry.from_json(k, v, where) for k, v in data.get("metrics", {}).items()}
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
    """What an update changed: metrics added, removed, or whose median moved."""
    changes: list[Change] = []
    for file in sorted(set(old) | set(new)):
        before, after = old.get(file, {}), new.get(file, {})
        for key in sorted(set(before) | set(after)):
            a, b = before.get(key), after.get(key)
            if a is None and b is not None:
                changes.append(Change(file, key, "added", b.unit, None, b.summary.median))
            elif b is None and a is not None:
                changes.append(Change(file, key, "removed", a.unit, a.summary.median, None))
            elif a is not None and b is not None and a.summary != b.summary:
                changes.append(Change(file, key, "changed", b.unit, a.summary.median, b.summary.median))
    return changes
