"""Histories for the dashboard's tests, written through the real history store (`HistoryStore.append`): known
values, so a test knows where the change point is and what each filter should leave."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from pytest_moeperf.history.records import MetricRecord, SessionRecord
from pytest_moeperf.history.store import HistoryStore

GEMM = "suites/gemm/test_gemm.py::test_gemm[case{}]::time"
ALLREDUCE = "suites/allreduce/test_allreduce.py::test_allreduce[size{}]::latency"
HOSTS = ("runner-a", "runner-b")


def commit_of(index: int) -> str:
    return f"{index:04x}" + "c0ffee" * 6


@dataclass(frozen=True)
class Made:
    sessions: int
    step_at: int  # the first session (0-based) of the new GEMM level
    step_commit: dict[str, str]  # host -> the commit of its first session at the new level


def fill(target: str, sessions: int = 24, step_at: int = 12, step: float = 0.10, noise: float = 0.005,
         topic_from: int | None = 20, seed: int = 11, every: dt.timedelta = dt.timedelta(hours=8)) -> Made:
    """``sessions`` sessions ``every`` apart (24: 8 days), alternating between two hosts, each its own commit; four
    GEMM cases and three all-reduce sizes; every GEMM case ``step`` slower from session ``step_at`` on (verdict
    REGRESSED there, with a reason); sessions from ``topic_from`` on are on branch ``topic``."""
    rng = random.Random(seed)
    first: dict[str, str] = {}
    with HistoryStore.open(target) as store:
        for i in range(sessions):
            host = HOSTS[i % 2]
            branch = "topic" if topic_from is not None and i >= topic_from else "main"
            versions = {"torch": "2.13.0", "vllm": "0.32.0" if i < step_at else "0.33.0"}
            finished = dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + every * i
            run = SessionRecord(finished=finished.isoformat(timespec="seconds"), fingerprint="cpu-2c-test",
                                fingerprint_hash="0123456789ab", git_commit=commit_of(i), host="node",
                                versions=versions, host_id=host, branch=branch)
            metrics = []
            for case in range(4):
                base = 100.0 * (case + 1)
                value = base * (1 + (step if i >= step_at else 0.0)) * (1 + rng.gauss(0, noise))
                stepped = i >= step_at
                metrics.append(MetricRecord(
                    test_id=GEMM.format(case).rpartition("::")[0], name="time", unit="us", better="lower",
                    median=value, n=7, iqr=value * 0.01, status="REGRESSED" if stepped else "PASS",
                    change=value / base - 1, allowed=0.05, baseline=base,
                    reason=f"+{(value / base - 1) * 100:.1f} % beyond the 5 % mde" if stepped else None))
            for size in range(3):
                base = 50.0 * (size + 1)
                value = base * (1 + rng.gauss(0, noise))
                metrics.append(MetricRecord(
                    test_id=ALLREDUCE.format(size).rpartition("::")[0], name="latency", unit="us", better="lower",
                    median=value, n=7, iqr=value * 0.01, status="INCONCLUSIVE" if i == 5 else "PASS",
                    change=value / base - 1, allowed=0.05, baseline=base,
                    reason="the window's health gate tripped: foreign CPU load" if i == 5 else None))
            store.append(run, metrics)
            if i >= step_at:
                first.setdefault(host, commit_of(i))
    return Made(sessions=sessions, step_at=step_at, step_commit=first)
