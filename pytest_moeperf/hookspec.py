"""Every hook pytest-moeperf offers. Implement them in a conftest.py or a plugin.

The plugin's own behaviour is an ordinary implementation of these hooks (``trylast``), so a conftest can replace
it: return a value from a ``firstresult`` hook to take over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_moeperf.judging.thresholds import Reference, Threshold
    from pytest_moeperf.judging.verdict import Verdict
    from pytest_moeperf.ledger import Measurement, Section
    from pytest_moeperf.machine.canary import Workload
    from pytest_moeperf.machine.topology import Topology


@pytest.hookspec(firstresult=True)
def pytest_moeperf_topology(config: pytest.Config) -> Topology | None:
    """Return the topology this session measures. The default reads ``--moeperf-topology`` or probes NVML
    (and the host without GPUs). Called once per session (per xdist worker)."""


@pytest.hookspec
def pytest_moeperf_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """Amend ``machine_info`` (the JSON report's machine section) in place."""


@pytest.hookspec(firstresult=True)
def pytest_moeperf_verdict(config: pytest.Config, measurement: Measurement, rounds: tuple[tuple[float, ...], ...],
                           reference: Reference | None, threshold: Threshold) -> Verdict | None:
    """Judge one metric on values: ``measurement`` (its last round: name, unit, direction, context), the samples
    of every current round, the baseline's ``reference`` (its stored run medians; None: no baseline) and the
    threshold. The default is ``verdict.judge`` (rule in the README's "Verdicts" section)."""


@pytest.hookspec
def pytest_moeperf_report_sections(config: pytest.Config, measurements: list[Measurement],  # type: ignore[empty-body]
                                   verdicts: dict[str, Verdict]) -> list[Section]:
    """Return extra tables for the reports, built from this session's measurements (e.g. a decode-step budget) and
    their verdicts by metric key. Results of all implementations are shown, in registration order."""


@pytest.hookspec(firstresult=True)
def pytest_moeperf_round_unit(config: pytest.Config, item: pytest.Item) -> str | None:
    """Return what one process's measurement of ``item`` stands for when a second measurement in the same process
    would not be independent of it, e.g. ``"server start"`` for a serving window on a server the session launched
    (the serving wing's answer). Such a test is never confirmed in-process, its records say so (context
    ``round_unit``), its verdicts count the rounds as that unit, and ``--moeperf-starts S`` runs it in S child
    sessions. None (the default): an ordinary test."""


@pytest.hookspec
def pytest_moeperf_profile_dirs(config: pytest.Config) -> list[Path]:  # type: ignore[empty-body]
    """Return serve-profile directories for the serving and spec-decode suites when ``--moeperf-profiles`` (or
    its ini twin) names none: a suite's conftest names its own. Results of all implementations are joined."""


@pytest.hookspec(firstresult=True)
def pytest_moeperf_canary(config: pytest.Config) -> list[Workload] | None:
    """Return the canary's workloads (`machine.canary.Workload`: a name, ``measure()`` returning µs samples, an
    optional ``release()``), read before and after each test file's perf tests while ``--moeperf-canary`` is on.
    The default: ``cpu_compute`` and ``cpu_stream``, and ``gpu_gemm`` and ``gpu_copy`` where torch sees a GPU.
    Called once per session (per xdist worker)."""
