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

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.thresholds import MIN_RUNS_FOR_SPREAD
from pytest_moeperf.ledger import Measurement, suite_of
from pytest_moeperf.store import files, jsontext
from pytest_moeperf.store.entries import BaselineEntry, BaselineError, checked

__all__ = ["SCHEMA", "BaselineError", "BaselineFile", "BaselineStore", "StoredEntries", "dump", "parse", "read_file"]

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
DEFAULT_KEEP_RUNS = 15  # three sittings of 5 rounds
MIN_FAMILY_CASES = 3  # cases of a family with a spread on this host before their median spread stands in


#: what a file's scan keeps of each metric (`jsontext.loads_spans`): its test id and name, or why it is unusable
Kept = tuple[str, str] | BaselineError


def _kept(where: str) -> Callable[[str, Any], Kept]:
    def keep(key: str, value: Any) -> Kept:
        try:
            checked(key, value, where)
        except BaselineError as exc:
            return exc  # raised once the document is known to be a readable baseline (`parse`)
        return str(value["test"]), str(value["name"])
    return keep


class StoredEntries(Mapping[str, BaselineEntry]):
    """The metrics of one baseline file, every one checked when the file is read (`entries.checked`: one corrupt
    metric makes the whole file unusable) and made a `BaselineEntry` when first used; looked up by test and by family
    through an index made once. Read from a file, only the file's text and where each metric lies in it are kept
    (`jsontext.loads_spans`): a metric is decoded again when used, and one an update does not touch is written back
    as that text (`text_of`). A document already decoded (a git revision) keeps its objects."""

    def __init__(self, where: str, raw: Mapping[str, Any] | None = None, text: str | None = None,
                 spans: Mapping[str, tuple[int, int, Kept]] | None = None, verbatim: bool = True) -> None:
        self._where, self._raw, self._text, self._verbatim = where, raw, text, verbatim
        self._spans = spans or {}
        self._made: dict[str, BaselineEntry] = {}
        self._shared: dict[Any, dict[str, Any]] = {}  # provenances, one object each (`BaselineEntry.from_json`)
        self._index: tuple[dict[str, list[str]], dict[tuple[str, str], list[str]]] | None = None
        kept = ((key, _kept(where)(key, value)) for key, value in raw.items()) if raw is not None else (
            (key, span[2]) for key, span in self._spans.items())
        self._meta: dict[str, tuple[str, str]] = {}
        for key, found in kept:
            if isinstance(found, BaselineError):
                raise found
            self._meta[key] = found

    def _json(self, key: str) -> Any:
        if self._raw is not None:
            return self._raw[key]
        assert self._text is not None
        return jsontext.decode_at(self._text, self._spans[key][0])

    def __getitem__(self, key: str) -> BaselineEntry:
        if key not in self._made:
            self._made[key] = BaselineEntry.from_json(key, self._json(key), self._where, self._shared)
        return self._made[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._meta)

    def __len__(self) -> int:
        return len(self._meta)

    def __contains__(self, key: object) -> bool:
        return key in self._meta

    def _indexed(self) -> tuple[dict[str, list[str]], dict[tuple[str, str], list[str]]]:
        """The keys by test id, and by family (test file, metric name)."""
        if self._index is None:
            by_test: dict[str, list[str]] = {}
            by_family: dict[tuple[str, str], list[str]] = {}
            for key, (test, name) in self._meta.items():
                by_test.setdefault(test, []).append(key)
                by_family.setdefault((test.split("::", 1)[0], name), []).append(key)
            self._index = by_test, by_family
        return self._index

    def of_test(self, test_id: str) -> list[BaselineEntry]:
        """The stored metrics of one test."""
        return [self[key] for key in self._indexed()[0].get(test_id, ())]

    def of_family(self, test_file: str, name: str) -> list[BaselineEntry]:
        """The stored metrics named ``name`` of the tests of one test file."""
        return [self[key] for key in self._indexed()[1].get((test_file, name), ())]

    def text_of(self, key: str) -> str | None:
        """A metric's text as read, to be written back as it was (None: not kept, or of a file of schema 1, whose
        metrics are rewritten with their run)."""
        if self._text is None or not self._verbatim:
            return None
        start, end, _ = self._spans[key]
        return self._text[start:end]


@dataclass(frozen=True)
class BaselineFile:
    path: Path
    fingerprint: Mapping[str, Any]
    entries: StoredEntries
    hosts: Mapping[str, Any]
    version: files.Version | None = None  # of the file it was read from (`files.version`)


def parse(data: Any, where: str, text: str | None = None,
          spans: Mapping[str, tuple[int, int, Kept]] | None = None) -> BaselineFile:
    """A baseline document (decoded from a git revision; or read from a file: its ``text`` and the ``spans`` of its
    metrics, `jsontext.loads_spans`); `BaselineError` names ``where``."""
    if not isinstance(data, dict) or "metrics" not in data:
        raise BaselineError(f"baseline file {where} is not a moeperf baseline (no 'metrics'); left untouched")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise BaselineError(f"baseline file {where} has schema {data.get('schema')!r}; this version reads "
                            f"{' and '.join(map(str, READABLE_SCHEMAS))} (left untouched)")
    metrics, fingerprint, hosts = data["metrics"], data.get("fingerprint", {}), data.get("hosts", {})
    for name, value in (("metrics", metrics), ("fingerprint", fingerprint), ("hosts", hosts)):
        if not isinstance(value, dict):
            raise BaselineError(f"baseline file {where}: {name!r} must be an object; left untouched")
    # schema 1 kept no runs: an update rewrites its metrics (with their run) rather than copying them
    entries = (StoredEntries(where, raw=metrics) if text is None
               else StoredEntries(where, text=text, spans=spans, verbatim=data["schema"] == SCHEMA))
    return BaselineFile(path=Path(where), fingerprint=dict(fingerprint), entries=entries, hosts=dict(hosts))


def read_file(path: Path) -> BaselineFile:
    """Read one baseline file (`StoredEntries`); `BaselineError` (naming the file) when it is unusable."""
    try:
        text, version = files.read_versioned(path, "baseline file")
        with files.json_errors(f"baseline file {path}"):
            data, spans = jsontext.loads_spans(text, "metrics", _kept(str(path)))
    except files.FileFormatError as exc:
        raise BaselineError(f"{exc}; fix or delete it (it was left untouched)") from None
    return dataclasses.replace(parse(data, str(path), text, spans), version=version)


def present(root: Path, path: Path) -> bool:
    """Whether the baseline file ``path`` of the tree ``root`` exists (False: it, or its fingerprint's folder, is not
    there yet); `BaselineError` naming the path when something stands there that is not one (`files.present`)."""
    try:
        return files.present(root, path, "baselines")
    except files.FileFormatError as exc:
        raise BaselineError(f"{exc}: the baselines there cannot be read; fix or remove it (it was left untouched)"
                            ) from None


def _placed(text: str, level: int) -> str:
    """JSON text made at the top level by ``json.dumps(indent=2)``, placed at nesting ``level``."""
    return text.replace("\n", "\n" + "  " * level)  # a JSON string holds no raw newline


def _pretty(value: Any, level: int) -> str:
    return _placed(json.dumps(value, indent=2, sort_keys=True), level)


def _document(fingerprint: Mapping[str, Any], hosts: Mapping[str, Any] | None,
              metrics: Iterable[tuple[str, str]]) -> Iterator[str]:
    """A baseline file's text in pieces: ``json.dumps(document, indent=2, sort_keys=True)`` byte for byte, given the
    text of each metric at its level (in key order)."""
    members = {"schema": json.dumps(SCHEMA), "fingerprint": _pretty(dict(fingerprint), 1), "metrics": ""}
    if hosts:
        members["hosts"] = _pretty(dict(hosts), 1)
    yield "{"
    for i, name in enumerate(sorted(members)):
        yield f"{',' if i else ''}\n  {json.dumps(name)}: {members[name]}"
        if name == "metrics":
            empty = True
            for key, text in metrics:
                yield f"{'{' if empty else ','}\n    {json.dumps(key)}: "
                yield text
                empty = False
            yield "{}" if empty else "\n  }"
    yield "\n}\n"


def dump(fingerprint: Mapping[str, Any], entries: Mapping[str, BaselineEntry],
         hosts: Mapping[str, Any] | None = None) -> str:
    """A baseline file's text: ``json.dumps(document, indent=2, sort_keys=True)``."""
    metrics = ((key, _pretty(entries[key].to_json(), 2)) for key in sorted(entries))
    return "".join(_document(fingerprint, hosts, metrics))


def update_text(fingerprint: Mapping[str, Any], hosts: Mapping[str, Any], stored: StoredEntries | None,
             changed: Mapping[str, BaselineEntry]) -> Iterator[str]:
    """A file's text after an update (`_document`, in pieces): the ``changed`` metrics encoded here, before the first
    piece (a bad value stops the update before anything is written); the others written as they were read."""
    texts = {key: _pretty(entry.to_json(), 2) for key, entry in changed.items()}
    keys = sorted(set(stored or ()) | set(texts))

    def text(key: str) -> str:
        if key in texts:
            return texts[key]
        assert stored is not None
        return stored.text_of(key) or _pretty(stored[key].to_json(), 2)
    return _document(fingerprint, hosts, ((key, text(key)) for key in keys))


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
                self._files[suite] = read_file(path) if present(self.root, path) else None
            except BaselineError as exc:
                self._files[suite] = exc
        cached = self._files[suite]
        if isinstance(cached, BaselineError):
            raise cached
        return cached

    def _current(self, suite: str) -> BaselineFile | None:
        """A suite's file as it is now (under the lock: what another session wrote while we measured): the one read
        before when the file was not replaced or changed since."""
        path = self.path(suite)
        cached = self._files.get(suite)
        if isinstance(cached, BaselineFile) and cached.version is not None and cached.version == files.version(path):
            return cached
        return read_file(path) if present(self.root, path) else None

    def entry(self, key: str) -> BaselineEntry | None:
        found = self.file(suite_of(key.rsplit("::", 1)[0]))
        return found.entries.get(key) if found else None

    def entries_of(self, test_id: str) -> list[BaselineEntry]:
        """The stored metrics of one test (raises `BaselineError` for an unusable file)."""
        found = self.file(suite_of(test_id))
        return found.entries.of_test(test_id) if found else []

    def family_spread(self, key: str) -> tuple[float, str] | None:
        """For a metric with fewer than 3 runs on this host: the median relative spread of the other cases of its
        family (same test file, same metric name) that have 3 or more runs here, and what it came from."""
        if self.host is None:
            return None
        name = key.rpartition("::")[2]
        spreads = []
        for entry in self._family(key):
            if entry.key == key:
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

    def _family(self, key: str) -> list[BaselineEntry]:
        """The stored metrics of ``key``'s family: same test file, same metric name (raises `BaselineError` for an
        unusable file)."""
        test_id, _, name = key.rpartition("::")
        found = self.file(suite_of(test_id))
        return found.entries.of_family(test_id.split("::", 1)[0], name) if found else []

    def family_runs(self, key: str) -> dict[str, list[tuple[str | None, float]]]:
        """`run_medians` of the stored metrics of ``key``'s family; none for an unusable file."""
        try:
            family = self._family(key)
        except BaselineError:
            return {}
        return {e.key: [(r.date, r.median) for r in e.all_runs] for e in family}

    def run_medians(self, keys: Iterable[str]) -> dict[str, list[tuple[str | None, float]]]:
        """Each stored metric's runs as (date of its update, median), oldest first; unusable files are left out."""
        return {key: [(r.date, r.median) for r in entry.all_runs] for key, entry in self._entries(keys)}

    def host_medians(self, keys: Iterable[str], others: bool = False) -> dict[str, tuple[float, ...]]:
        """Each stored metric's run medians measured on this host (every run when the host is unknown), oldest
        first: the canary's stored figures (`judging.machine`); with ``others``, those of every other host instead.
        Unusable files are left out."""
        def wanted(host: str | None) -> bool:
            return (host != self.host) if others else (self.host is None or host == self.host)

        return {key: tuple(r.median for r in entry.all_runs if wanted(r.host)) for key, entry in self._entries(keys)}

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

        Under the directory's lock, every file is re-read (unless it is the version read before: `_current`) and
        every text prepared first, so a corrupt file (or a bad value) stops the update before anything is written;
        then all files are replaced in one transaction. The metrics not measured are written back as they were read
        (`StoredEntries.text_of`).
        Waiting for the lock, ``progress`` lines name its holder; after ``lock_timeout`` s `files.LockTimeout`."""
        by_suite: dict[str, list[Measurement]] = {}
        for m in measurements:
            by_suite.setdefault(m.suite, []).append(m)
        if not by_suite:
            return []
        for suite in by_suite:  # a link to nothing in the way: named before the lock creates anything
            present(self.root, self.path(suite))
        # the tree's lock: a merge (`trees.merge_trees`) takes the same
        with files.locked(self.root, lock_timeout, progress, "--moeperf-lock-timeout"):
            texts: dict[Path, Iterator[str]] = {}
            for suite, items in sorted(by_suite.items()):
                existing = self._current(suite)  # raises for a corrupt file: nothing written yet
                stored = existing.entries if existing else None
                hosts = dict(existing.hosts) if existing else {}
                if self.host is not None and host_facts is not None:
                    hosts[self.host] = dict(host_facts)
                changed: dict[str, BaselineEntry] = {}
                for m in items:
                    old = changed.get(m.key) or (stored.get(m.key) if stored is not None else None)
                    changed[m.key] = (old.updated(m, provenance, keep_runs) if old
                                      else BaselineEntry.from_measurement(m, provenance))
                texts[self.path(suite)] = update_text(fingerprint, hosts, stored, changed)
            written = files.commit(self.root, texts)
        self._files.clear()
        return written
