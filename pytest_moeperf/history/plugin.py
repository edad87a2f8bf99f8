"""The pytest side of the history, free of session internals: the session hands over the JSON report document
(``--moeperf-report``'s schema) at its end; this module stores it and writes the HTML report.

A history that cannot be written or an HTML report that cannot be drawn warns (`HistoryWarning`), leaves no empty
or partial file, and leaves every other report of the run as it was; the caller learns of it (None, False) and
fails the session under ``--moeperf-strict``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_moeperf.history.records import MetricRecord, ReportFormatError, SessionRecord, records_from_report
from pytest_moeperf.history.store import HistoryError, HistoryStore
from pytest_moeperf.history.targets import OFF, is_postgresql, parse_target, redact, sqlite_path
from pytest_moeperf.store.files import atomic_write

HISTORY_DIR = ".moeperf"
HISTORY_FILE = "history.sqlite"


class HistoryWarning(UserWarning):
    """The history or the HTML report could not be written; the run's other reports are unaffected."""


def parse_history_option(text: str) -> str | Path:
    """``--moeperf-history URL|PATH|off``: a PostgreSQL URL stays a string, ``off`` (any spelling) becomes ``"off"``,
    a SQLite path or ``sqlite:///`` URL becomes a `Path`, which the option table then makes absolute against the
    current directory (command line) or the ini file's (ini), as it does for every path option."""
    import argparse

    try:
        target = parse_target(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if target is None:
        return "off"
    return target if is_postgresql(target) else sqlite_path(target)


def default_target(baselines_dir: Path) -> str:
    """``<baselines>/../.moeperf/history.sqlite``: beside the baselines, not in them, because ``baselines/`` is
    committed and reviewed (the update workflow runs ``git add baselines``), while the history is a growing binary
    file that belongs to the machine, or to a shared PostgreSQL."""
    return str(baselines_dir.parent / HISTORY_DIR / HISTORY_FILE)


def resolve_target(value: str | Path | None, baselines_dir: Path) -> str | None:
    """The option's value (None: not given) as a store target, or None when the history is off."""
    if value is None:
        return default_target(baselines_dir)
    if isinstance(value, Path):
        return str(value)
    if value.strip().lower() in OFF:
        return None
    return value


def _warn(message: str) -> None:
    try:
        warnings.warn(HistoryWarning(message), stacklevel=3)
    except HistoryWarning:  # -W error: a failed history write still must not raise out of the session's end
        sys.stderr.write(f"moeperf: {message}\n")


def record_session(run: SessionRecord, metrics: Sequence[MetricRecord], target: str) -> int | None:
    """Append one session to the history at ``target`` in one transaction. Returns the run's id, or None after
    warning when the history cannot be opened or written (nothing of the session is then stored)."""
    try:
        if is_postgresql(target) or sqlite_path(target).exists():
            with HistoryStore.open(target) as store:
                return store.append(run, metrics)
        return _create(run, metrics, target)
    except HistoryError as exc:
        _warn(f"moeperf history not written: {exc}")
        return None


def _create(run: SessionRecord, metrics: Sequence[MetricRecord], target: str) -> int:
    """A new SQLite history holding this session, whole or not at all: written to a file beside its path, then
    linked into place (a session that created it meanwhile keeps it, and this one is appended there). A failure
    (a full disk) leaves no file, and none of the folders made for it."""
    path = sqlite_path(target)
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    fresh = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.new")
    done = False
    try:
        with HistoryStore.open(target, at=fresh) as store:
            run_id = store.append(run, metrics)
        if Path(f"{fresh}-wal").exists():  # the close could not fold the journal into the file: it is not whole
            raise HistoryError(f"cannot write history {target}: its write-ahead log was not checkpointed")
        try:
            os.link(fresh, path)
        except FileExistsError:
            with HistoryStore.open(target) as store:
                run_id = store.append(run, metrics)
        except OSError:  # a file system without hard links
            os.replace(fresh, path)
        done = True
        return run_id
    except OSError as exc:
        raise HistoryError(f"cannot write history {target}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            for leftover in (fresh, *(Path(f"{fresh}{suffix}") for suffix in ("-wal", "-shm", "-journal"))):
                leftover.unlink(missing_ok=True)
            for folder in [] if done else made:  # deepest first; stops at one that is not empty
                folder.rmdir()


def record_report(doc: Mapping[str, Any], target: str, started: str | None = None) -> int | None:
    """`record_session` for a ``--moeperf-report`` document."""
    try:
        run, metrics = records_from_report(doc, started)
    except ReportFormatError as exc:
        _warn(f"moeperf history not written: {exc}")
        return None
    return record_session(run, metrics, target)


def flagged_trends(doc: Mapping[str, Any], target: str | None) -> list[Any]:
    """Trends, on this run's fingerprint, of the metrics this run flagged (regressed or inconclusive)."""
    from pytest_moeperf.history import html, trend

    if target is None or (not is_postgresql(target) and not sqlite_path(target).exists()):
        return []
    run, metrics = records_from_report(doc)
    keys = html.flagged_keys(metrics)
    if not keys:
        return []
    with HistoryStore.read(target) as store:
        return [t for t in trend.trends(store, keys, fingerprint=run.fingerprint_hash) if t.key in keys]


def write_html(path: Path, doc: Mapping[str, Any], target: str | None = None) -> bool:
    """Write the HTML report of ``doc`` to ``path``, with the history's trends of flagged metrics when ``target``
    names a history (call after `record_session`, so this run is in it). Warns and returns False on failure."""
    from pytest_moeperf.history import html

    try:
        try:
            trends = flagged_trends(doc, target)
        except HistoryError as exc:
            _warn(f"moeperf HTML report drawn without history: {exc}")
            trends = []
        atomic_write(path, html.html_report(doc, trends))  # the one writer: fsync, rename, the normal file mode
    except ImportError as exc:
        _warn(f"moeperf HTML report not written: it needs the 'history' extra (matplotlib, apache-otava): {exc}")
        return False
    except (OSError, ReportFormatError, ValueError) as exc:
        _warn(f"moeperf HTML report not written to {path}: {type(exc).__name__}: {exc}")
        return False
    return True


def describe(target: str | None) -> str:
    """A header line for the terminal: where this session's history goes."""
    return "history: off" if target is None else f"history: {redact(target)}"
