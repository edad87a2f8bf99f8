"""Pure: which sessions a dashboard shows, and the lanes they fall into.

A **lane** is one machine's series: a fingerprint slug (series of different hardware never mix, as in
`history.trend.split_by_fingerprint`) and a host (``--moeperf-host-id``'s name, else the node name). The window keeps
the last ``last`` sessions of each lane, so a history of 10,000 sessions costs what its last few hundred do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_moeperf.history.records import SessionRecord, StoredSession


@dataclass(frozen=True, order=True)
class Lane:
    fingerprint: str
    host: str

    @property
    def label(self) -> str:
        return f"{self.host} · {self.fingerprint}"


def lane_of(run: SessionRecord) -> Lane:
    return Lane(run.fingerprint, run.host_id or run.host or "?")


@dataclass(frozen=True)
class Window:
    """The sessions shown, oldest first, each lane's last ``last``; ``lanes`` sorted; ``lane`` maps a session id to
    its lane's index; ``total`` counts every session of the history."""

    sessions: tuple[StoredSession, ...]
    lanes: tuple[Lane, ...]
    lane: Mapping[int, int]
    total: int

    @property
    def ids(self) -> list[int]:
        return [s.id for s in self.sessions]

    @property
    def latest(self) -> str:
        return max(s.run.finished for s in self.sessions) if self.sessions else ""


def select(sessions: Sequence[StoredSession], last: int) -> Window:
    """The window of ``sessions`` (any order): each lane's ``last`` most recent by finish time (then id)."""
    if last < 1:
        raise ValueError(f"sessions per host must be at least 1, got {last}")
    ordered = sorted(sessions, key=lambda s: (s.run.finished, s.id))
    by_lane: dict[Lane, list[StoredSession]] = {}
    for session in ordered:
        by_lane.setdefault(lane_of(session.run), []).append(session)
    lanes = tuple(sorted(by_lane))
    kept = {s.id for lane in lanes for s in by_lane[lane][-last:]}
    shown = tuple(s for s in ordered if s.id in kept)
    index = {lane: i for i, lane in enumerate(lanes)}
    return Window(sessions=shown, lanes=lanes, lane={s.id: index[lane_of(s.run)] for s in shown},
                  total=len(sessions))
