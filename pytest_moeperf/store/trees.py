"""Whole baseline trees: loading every file, merging trees updated apart, and what an update changed (for
``moeperf baselines diff`` and ``merge``, budgets and reviews)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.store import files
from pytest_moeperf.store.baselines import DEFAULT_KEEP_RUNS, dump, parse, read_file
from pytest_moeperf.store.entries import BaselineEntry, BaselineError, merge_entries


def merge_trees(target: Path, sources: Iterable[Path], keep: int = DEFAULT_KEEP_RUNS,
                lock_timeout: float | None = None, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Merge every ``<slug>/<suite>.json`` under each source directory into ``target`` (created as needed), under
    the target's lock (the one ``--moeperf-update`` takes) and in one transaction. Runs of several hosts of one
    fingerprint live side by side (their ``hosts`` tables are joined); files of one slug and suite whose fingerprint
    hashes differ are refused: they were measured on different hardware. Waiting for the lock, ``progress`` lines
    name its holder; after ``lock_timeout`` seconds `files.LockTimeout`."""
    sources = list(sources)
    for root in (target, *sources):
        if not root.is_dir():
            raise BaselineError(f"baselines directory {root} does not exist")
    with files.locked(target, lock_timeout, progress, "--lock-timeout"):
        merged: dict[Path, tuple[Mapping[str, Any], dict[str, BaselineEntry], dict[str, Any]]] = {}
        for root in (target, *sources):
            for path in sorted(root.glob("*/*.json")):
                dest = target / path.parent.name / path.name
                found = read_file(path)
                if dest not in merged:
                    merged[dest] = (found.fingerprint, dict(found.entries), dict(found.hosts))
                    continue
                fingerprint, entries, hosts = merged[dest]
                if fingerprint.get("hash") != found.fingerprint.get("hash"):
                    raise BaselineError(f"{path}: fingerprint {found.fingerprint.get('hash')} differs from "
                                        f"{fingerprint.get('hash')} of the same file elsewhere: not merged")
                hosts.update(found.hosts)
                for key, entry in found.entries.items():
                    entries[key] = merge_entries(entries[key], entry, keep) if key in entries else entry
        texts = {dest: dump(fingerprint, entries, hosts) for dest, (fingerprint, entries, hosts) in merged.items()}
        texts = {dest: text for dest, text in texts.items() if not dest.exists() or dest.read_text() != text}
        return sorted(files.commit(target, texts))


def load_tree(root: Path) -> dict[str, dict[str, BaselineEntry]]:
    """Every baseline under ``root``: ``{"<slug>/<suite>": {key: entry}}`` (for diffs and budgets)."""
    if not root.is_dir():
        raise BaselineError(f"baselines directory {root} does not exist")
    return {f"{path.parent.name}/{path.stem}": dict(read_file(path).entries) for path in sorted(root.glob("*/*.json"))}


def parse_tree_texts(texts: Mapping[str, str]) -> dict[str, dict[str, BaselineEntry]]:
    """Like `load_tree`, from ``{"<slug>/<suite>": json text}`` (e.g. read from a git revision)."""
    tree: dict[str, dict[str, BaselineEntry]] = {}
    for name, text in sorted(texts.items()):
        try:
            data = files.loads_object(text, f"baseline file {name}.json")
        except files.FileFormatError as exc:
            raise BaselineError(str(exc)) from None
        tree[name] = dict(parse(data, f"{name}.json").entries)
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
