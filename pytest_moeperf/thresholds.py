"""Thresholds: how far a metric may move before it counts, and where that number comes from.

Precedence (first that is set wins): the ``tolerance=`` of ``perf.record``, the ``moeperf_threshold`` marker
closest to the test, ``--moeperf-tolerance`` / ``moeperf_tolerance`` (ini), the default (10 %).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Threshold:
    """A change is a regression only if it is worse by more than ``tolerance`` (relative), more than
    ``abs_tolerance`` (in the metric's unit) and more than ``noise_k`` × the baseline's relative spread
    (IQR/median), so a noisy metric is not failed on its own noise."""

    tolerance: float
    abs_tolerance: float = 0.0
    noise_k: float = 1.5

    def __post_init__(self) -> None:
        for name in ("tolerance", "abs_tolerance", "noise_k"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"Threshold.{name} must be >= 0, got {value}")

    def allowed(self, baseline_rel_spread: float) -> float:
        """The relative change allowed before a metric regresses."""
        return max(self.tolerance, self.noise_k * baseline_rel_spread)


def resolve_threshold(item: pytest.Item | None, default_tolerance: float, *,
                      tolerance: float | None = None, abs_tolerance: float | None = None) -> Threshold:
    marker = item.get_closest_marker("moeperf_threshold") if item is not None else None
    marker_kwargs = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        marker_kwargs.setdefault("tolerance", marker.args[0])
    unknown = set(marker_kwargs) - {"tolerance", "abs_tolerance", "noise_k"}
    if unknown:
        raise pytest.UsageError(f"moeperf_threshold: unknown argument(s) {sorted(unknown)}; "
                                "expected tolerance, abs_tolerance, noise_k")
    return Threshold(
        tolerance=float(tolerance if tolerance is not None else marker_kwargs.get("tolerance", default_tolerance)),
        abs_tolerance=float(abs_tolerance if abs_tolerance is not None else marker_kwargs.get("abs_tolerance", 0.0)),
        noise_k=float(marker_kwargs.get("noise_k", 1.5)),
    )
