"""The baseline store: ``<root>/<fingerprint-slug>/<suite>.json``, versioned, sorted, updated under a lock in one
transaction.

Schema 2 keeps per metric the summary of its last update and ``runs``: the run-level summaries (median, n, IQR,
date, git commit, host) of its last K updates per host, from which the reference and the between-run noise are
learned (`entries.BaselineEntry.reference`), and a file-level ``hosts`` table (what each host is: CPU, cores,
memory, driver, clocks policy). Schema-1 files are read as one run each and rewritten only when updated.

An update touches only the metrics that ran, only this fingerprint's directory, and never a file it cannot
read: a corrupt or schema-mismatched file raises `BaselineError` naming it and stays as it is. Updates and merges
of one baselines tree take turns on the lock of its root (`files.locked`), and each re-reads the files under the
lock, so two sessions updating at once (or an update and a merge) keep all their runs; every file of an update is
replaced in one transaction (`files.commit`). Non-finite numbers are refused on write and on read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.thresholds import MIN_RUNS_FOR_SPREAD
from pytest_moeperf.ledger import Measurement, suite_of
from pytest_moeperf.store import files
from pytest_moeperf.store.entries import BaselineEntry, BaselineError

__all__ = ["SCHEMA", "BaselineError", "BaselineFile", "BaselineStore", "dump", "parse", "read_file"]

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
DEFAULT_KEEP_RUNS = 15  # three sittings of 5 rounds
MIN_FAMILY_CASES = 3  # cases of a family with a spread on this host before their median spread stands in


@dataclass(frozen=True)
class BaselineFile:
    path: Path
    fingerprint: Mapping[str, Any]
    entries: Mapping[str, BaselineEntry]
    hosts: Mapping[str, Any]


def parse(data: Any, where: str) -> BaselineFile:
    """A parsed baseline document (from a file or a git revision); `BaselineError` names ``where``."""
    if not isinstance(data, dict) or "metrics" not in data:
        raise BaselineError(f"baseline file {where} is not a moeperf baseline (no 'metrics'); left untouched")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise BaselineError(f"baseline file {where} has schema {data.get('schema')!r}; this version reads "
                            f"{' and '.join(map(str, READABLE_SCHEMAS))} (left untouched)")
    metrics, fingerprint, hosts = data["metrics"], data.get("fingerprint", {}), data.get("hosts", {})
    for name, value in (("metrics", metrics), ("fingerprint", fingerprint), ("hosts", hosts)):
        if not isinstance(value, dict):
            raise BaselineError(f"baseline file {where}: {name!r} must be an object; left untouched")
    entries = {key: BaselineEntry.from_json(key, value, where) for key, value in metrics.items()}
    return BaselineFile(path=Path(where), fingerprint=dict(fingerprint), entries=entries, hosts=dict(hosts))


def read_file(path: Path) -> BaselineFile:
    """Parse one baseline file; `BaselineError` (naming the file) when it is unreadable."""
    try:
        data = files.read_json_object(path, "baseline file")
    except files.FileFormatError as exc:
        raise BaselineError(f"{exc}; fix or delete it (it was left untouched)") from None
    return parse(data, str(path))


def dump(fingerprint: Mapping[str, Any], entries: Mapping[str, BaselineEntry],
         hosts: Mapping[str, Any] | None = None) -> str:
    doc: dict[str, Any] = {"schema": SCHEMA, "fingerprint": dict(fingerprint),
                           "metrics": {key: entries[key].to_json() for key in sorted(entries)}}
    if hosts:
        doc["hosts"] = dict(hosts)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


class BaselineStore:
    """The baselines of one fingerprint, as seen from one host: reads lazily, one file per suite."""

    def __init__(self, root: Path, slug: str, host: str | None = None) -> None:
        self.root = root
        self.slug = slug
        self.host = host
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

    def entry(self, key: str) -> BaselineEntry | None:
        found = self.file(suite_of(key.rsplit("::", 1)[0]))
        return found.entries.get(key) if found else None

    def entries_of(self, test_id: str) -> list[BaselineEntry]:
        """The stored metrics of one test (raises `BaselineError` for an unusable file)."""
        found = self.file(suite_of(test_id))
        return [e for e in found.entries.values() if e.test_id == test_id] if found else []

    def family_spread(self, key: str) -> tuple[float, str] | None:
        """For a metric with fewer than 3 runs on this host: the median relative spread of the other cases of its
        family (same test file, same metric name) that have 3 or more runs here, and what it came from."""
        if self.host is None:
            return None
        test_id, _, name = key.rpartition("::")
        found = self.file(suite_of(test_id))
        family = test_id.split("::", 1)[0]
        spreads = []
        for entry in (found.entries.values() if found else ()):
            if entry.name != name or entry.key == key or entry.test_id.split("::", 1)[0] != family:
                continue
            mine = [r.median for r in entry.all_runs if r.host == self.host]
            spread = stats.relative_spread(mine) if len(mine) >= MIN_RUNS_FOR_SPREAD else None
            if spread is not None:
                spreads.append(spread)
        if len(spreads) < MIN_FAMILY_CASES:
            return None
        return stats.median(spreads), f"median spread of {len(spreads)} '{name}' cases"

    def _entries(self, keys: Iterable[str]) -> Iterator[tuple[str, BaselineEntry]]:
        """The stored entries of ``keys`` that have one; unusable files are left out."""
        for key in keys:
            try:
                entry = self.entry(key)
            except BaselineError:
                continue
            if entry is not None:
                yield key, entry

    def run_medians(self, keys: Iterable[str]) -> dict[str, list[tuple[str | None, float]]]:
        """Each stored metric's runs as (date of its update, median), oldest first; unusable files are left out."""
        return {key: [(r.date, r.median) for r in entry.all_runs] for key, entry in self._entries(keys)}

    def host_medians(self, keys: Iterable[str]) -> dict[str, tuple[float, ...]]:
        """Each stored metric's run medians measured on this host (every run when the host is unknown), oldest
        first: the canary's stored figures (`judging.machine`); unusable files are left out."""
        return {key: tuple(r.median for r in entry.all_runs if self.host is None or r.host == self.host)
                for key, entry in self._entries(keys)}

    def foreign_hash(self, suite: str, current_hash: str) -> str | None:
        """The fingerprint hash stored in a suite's file when it differs from ``current_hash``; else None."""
        found = self.file(suite)
        stored = found.fingerprint.get("hash") if found else None
        return str(stored) if stored and stored != current_hash else None

    def other_slugs(self) -> list[str]:
        """Fingerprint directories beside this one that hold baselines (a changed slug hides them all)."""
        if not self.root.is_dir():
            return []
        return sorted(d.name for d in self.root.iterdir()
                      if d.is_dir() and d.name != self.slug and any(d.glob("*.json")))

    def update(self, measurements: Iterable[Measurement], fingerprint: Mapping[str, Any],
               provenance: Mapping[str, Any], keep_runs: int = DEFAULT_KEEP_RUNS,
               host_facts: Mapping[str, Any] | None = None, lock_timeout: float | None = None,
               progress: Callable[[str], None] | None = None) -> list[Path]:
        """Merge the given measurements into their suites' files; other metrics are kept as they are. Each
        measurement adds one run to its metric (a key given N times adds N runs: one per round).

        Under the directory's lock, every file is re-read and every text prepared first, so a corrupt file (or a
        bad value) stops the update before anything is written; then all files are replaced in one transaction.
        Waiting for the lock, ``progress`` lines name its holder; after ``lock_timeout`` s `files.LockTimeout`."""
        by_suite: dict[str, list[Measurement]] = {}
        for m in measurements:
            by_suite.setdefault(m.suite, []).append(m)
        if not by_suite:
            return []
        # the tree's lock: a merge (`trees.merge_trees`) takes the same
        with files.locked(self.root, lock_timeout, progress, "--moeperf-lock-timeout"):
            self._files.clear()  # what another session wrote while we measured
            texts: dict[Path, str] = {}
            for suite, items in sorted(by_suite.items()):
                existing = self.file(suite)  # raises for a corrupt file: nothing written yet
                entries = dict(existing.entries) if existing else {}
                hosts = dict(existing.hosts) if existing else {}
                if self.host is not None and host_facts is not None:
                    hosts[self.host] = dict(host_facts)
                for m in items:
                    old = entries.get(m.key)
                    entries[m.key] = (old.updated(m, provenance, keep_runs) if old
                                      else BaselineEntry.from_measurement(m, provenance))
                texts[self.path(suite)] = dump(fingerprint, entries, hosts)
            written = files.commit(self.root, texts)
        self._files.clear()
        return written
