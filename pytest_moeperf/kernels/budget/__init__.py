"""Decode-step time budget: Σ over a model's layers of its per-rank GEMMs and all-reduces, and each one's share.

* :mod:`~pytest_moeperf.kernels.budget.calc`: the pure arithmetic (:class:`Piece`, :class:`AllReducePoint`,
  :class:`Budget`, :func:`build_budget`, :func:`guard_metrics`);
* :mod:`~pytest_moeperf.kernels.budget.inputs`: pieces and points from declared context keys, out of this
  session's measurements, a JSON report or the baseline store;
* :mod:`~pytest_moeperf.kernels.budget.sources`: where the all-reduce term comes from, or why a step has none;
* :mod:`~pytest_moeperf.kernels.budget.render`: Markdown lines and report sections;
* :mod:`~pytest_moeperf.kernels.budget.cli`: ``moeperf budget``.
"""

from __future__ import annotations

from pytest_moeperf.kernels.budget.calc import (
    ROUTED_IMPL_CHOICES,
    ROUTED_PREFERENCE,
    AllReducePoint,
    Budget,
    BudgetRow,
    GuardMetric,
    Piece,
    allreduce_latency,
    build_budget,
    guard_metrics,
    select_points,
)
from pytest_moeperf.kernels.budget.inputs import (
    allreduce_points_from_store,
    inputs_from_baselines,
    inputs_from_measurements,
    inputs_from_report,
)
from pytest_moeperf.kernels.budget.render import budget_lines, budget_section, budget_sections_from
from pytest_moeperf.kernels.budget.sources import AllReduceChoice, Candidate, choose_allreduce

__all__ = [
    "ROUTED_IMPL_CHOICES",
    "ROUTED_PREFERENCE",
    "AllReduceChoice",
    "AllReducePoint",
    "Budget",
    "BudgetRow",
    "Candidate",
    "GuardMetric",
    "Piece",
    "allreduce_latency",
    "allreduce_points_from_store",
    "choose_allreduce",
    "budget_lines",
    "budget_section",
    "budget_sections_from",
    "build_budget",
    "guard_metrics",
    "inputs_from_baselines",
    "inputs_from_measurements",
    "inputs_from_report",
    "select_points",
]
