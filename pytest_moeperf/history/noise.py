"""The noise model's reader of the perf history: the medians of a metric's last accepted sessions on this machine.

A baseline file keeps the last ``--moeperf-noise-runs`` run summaries of an update; the history keeps every
session. When the history holds more accepted sessions (verdict PASS, IMPROVED or NEW, same fingerprint hash) of a
metric than its baseline holds runs, the between-run spread is learned from them (`thresholds.Reference`), and the
report says so ("spread … from N history sessions"). A missing or broken history changes nothing: the baseline's
noise stands, and the session notes why.
"""

from __future__ import annotations

from pathlib import Path

from pytest_moeperf.history.plugin import resolve_target
from pytest_moeperf.history.store import HistoryStore

__all__ = ["HistoryNoise"]


class HistoryNoise:
    """Opened lazily on the first question, once per session; answers are cached per metric."""

    def __init__(self, option: str | Path | None, baselines_dir: Path, fingerprint_hash: str, limit: int) -> None:
        self._target = resolve_target(option, baselines_dir)
        self._hash, self._limit = fingerprint_hash, limit
        self._store: HistoryStore | None = None
        self._closed = False
        self._cache: dict[str, tuple[float, ...]] = {}
        self.problem: str | None = None  # why the history was not read, once that happened

    def medians(self, key: str) -> tuple[float, ...]:
        """Medians of ``key``'s last accepted sessions, newest first (empty: no history, or none recorded)."""
        if key not in self._cache:
            self._cache[key] = self._read(key)
        return self._cache[key]

    def _read(self, key: str) -> tuple[float, ...]:
        if self._closed or self._target is None:
            return ()
        if self._store is None:
            if not (self._target.startswith("postgresql") or Path(self._target).is_file()):
                self._closed = True  # nothing recorded yet: do not create the database just to read it
                return ()
            try:
                self._store = HistoryStore.open(self._target)
            except Exception as exc:  # noqa: BLE001 - a broken history must not fail a verdict
                return self._give_up(exc)
        try:
            return tuple(r.median for r in self._store.recent(key, self._hash, self._limit))
        except Exception as exc:  # noqa: BLE001 - the same
            return self._give_up(exc)

    def _give_up(self, exc: Exception) -> tuple[float, ...]:
        self.problem = f"history: not read for the noise model ({type(exc).__name__}: {exc})"
        self.close()
        return ()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        self._store, self._closed = None, True
