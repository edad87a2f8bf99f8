"""The kernel wing's pytest surface: the ``ranks`` fixture and the kernel report tables (all-reduce busbw,
decode-step budget). Registered by the core plugin; nothing here imports torch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_moeperf.kernels.budget import budget_sections_from
from pytest_moeperf.kernels.collectives import busbw_sections
from pytest_moeperf.kernels.rank_controller import RankPool
from pytest_moeperf.ledger import Measurement, Section
from pytest_moeperf.settings import Settings


@pytest.fixture(scope="module")
def ranks(moeperf_settings: Settings) -> Iterator[RankPool]:
    """A :class:`RankPool`: ``ranks.run(fn, *args, world_size=2, backend="gloo")`` runs ``fn(rank, *args)`` on
    every rank with the ``--moeperf-rank-timeout`` hard timeout; a hung, crashed or raising rank fails the test
    with a message naming it, and leaves no process behind. Module-scoped: the ranks end with the module that
    used them, so no rank process outlives the all-reduce suite into the suites measured after it."""
    pool = RankPool(timeout_s=moeperf_settings.rank_timeout_s)
    yield pool
    pool.close()


def pytest_moeperf_report_sections(config: pytest.Config, measurements: list[Measurement]) -> list[Section]:
    """The all-reduce busbw table and the decode-step budget, from this session's measurements."""
    return busbw_sections(measurements) + budget_sections_from(measurements)
