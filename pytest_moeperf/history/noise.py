"""The history as a named noise source of the judge (`judging.judge.NoiseSource`): the medians of a metric's last
accepted sessions on this host.

A baseline file keeps the last ``--moeperf-noise-runs`` run summaries of an update; the history keeps every
session. When the history holds more accepted sessions of a metric than its baseline holds runs, the between-run
spread is learned from them (`thresholds.Reference`), and the verdict says so ("spread … from N history
sessions"). Only sessions of the same measurement count: verdict PASS, IMPROVED or NEW; same fingerprint hash,
host and git branch (a pull request's runs do not teach main's noise); same unit and direction; finished after the
re-record that reset the baseline's runs. A missing or broken history changes nothing: the baseline's noise
stands, and the session notes why.
"""

from __future__ import annotations

from pathlib import Path

from pytest_moeperf.history.plugin import resolve_target
from pytest_moeperf.history.store import HistoryStore
from pytest_moeperf.history.targets import scrub

__all__ = ["HistoryNoise"]


class HistoryNoise:
    """Opened lazily on the first question, once per session; answers are cached per metric."""

    name = "history"

    def __init__(self, option: str | Path | None, baselines_dir: Path, fingerprint_hash: str, limit: int,
                 host_id: str | None = None, branch: str | None = None) -> None:
        self._target = resolve_target(option, baselines_dir)
        self._hash, self._limit = fingerprint_hash, limit
        self._host, self._branch = host_id, branch
        self._store: HistoryStore | None = None
        self._closed = False
        self._cache: dict[tuple[str, str, str, str | None], tuple[float, ...]] = {}
        self.problem: str | None = None  # why the history was not read, once that happened

    def medians(self, key: str, unit: str, better: str, since: str | None) -> tuple[float, ...]:
        """Medians of ``key``'s last accepted sessions of the same measurement, newest first (empty: no history,
        or none recorded)."""
        found = (key, unit, better, since)
        if found not in self._cache:
            self._cache[found] = self._read(key, unit, better, since)
        return self._cache[found]

    def _read(self, key: str, unit: str, better: str, since: str | None) -> tuple[float, ...]:
        if self._closed or self._target is None:
            return ()
        if self._store is None:
            if not (self._target.startswith("postgresql") or Path(self._target).is_file()):
                self._closed = True  # nothing recorded yet: do not create the database just to read it
                return ()
            try:
                self._store = HistoryStore.read(self._target)  # never migrates, never waits for a writer
            except Exception as exc:  # noqa: BLE001 - a broken history must not fail a verdict
                return self._give_up(exc)
        try:
            return tuple(r.median for r in self._store.recent(key, self._hash, self._limit, unit=unit, better=better,
                                                              since=since, host_id=self._host, branch=self._branch))
        except Exception as exc:  # noqa: BLE001 - the same
            return self._give_up(exc)

    def _give_up(self, exc: Exception) -> tuple[float, ...]:
        text = scrub(str(exc), self._target or "")  # a HistoryError is scrubbed already; anything else now
        self.problem = f"history: not read for the noise model ({type(exc).__name__}: {text})"
        self.close()
        return ()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        self._store, self._closed = None, True
