"""Thresholds: how far a metric may move before it counts, and where that number comes from.

The threshold of a metric — its minimum detectable effect — is the larger of

* ``tolerance``: the smallest change worth failing for (relative; default 5 %), and
* the noise the baseline has learned: ``noise_k`` × the between-run spread of its stored run medians
  (1.4826 × MAD / reference, which estimates σ of one run's median). With fewer than 3 stored runs the spread
  between runs is unknown; then the within-run IQR/median of the stored runs is the floor (not × ``noise_k``:
  a whole IQR already overstates how far a median moves).

``noise_k`` defaults to 3: for a normal spread, a run median lands more than 3 σ on the worse side about 1 time in
740, so a 1,000-metric GPU session sees about one false crossing per run before confirmation re-measures it.

Precedence for ``tolerance`` (first that is set wins): the ``tolerance=`` of ``perf.record``, the
``moeperf_threshold`` marker closest to the test, ``--moeperf-tolerance`` / ``moeperf_tolerance``, 5 %. For
``noise_k``: the marker, then ``--moeperf-noise-k`` / ``moeperf_noise_k``, then 3.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_moeperf import stats

DEFAULT_TOLERANCE = 0.05
DEFAULT_NOISE_K = 3.0
MIN_RUNS_FOR_SPREAD = 3
MARKER_ARGS = ("tolerance", "abs_tolerance", "noise_k")


class ThresholdError(ValueError):
    """Bad ``moeperf_threshold`` marker or ``perf.record`` threshold arguments (a usage error of one test)."""


@dataclass(frozen=True)
class Reference:
    """What a baseline says about one metric: the medians of its stored runs and their within-run spread."""

    run_medians: tuple[float, ...]
    within_rel_iqr: float = 0.0  # the largest IQR/median among the stored runs
    #: Medians of the last accepted sessions in the perf history, when it holds more of them than the baseline
    #: holds runs: the between-run spread is learned from these instead (the reference value stays the baseline's)
    history_medians: tuple[float, ...] = ()
    #: how many updates (sittings) the stored runs came from: the rounds of one update share the box's state of
    #: that hour, so a spread learned from one sitting misses the variation between sittings
    sittings: int = 1

    def __post_init__(self) -> None:
        if not self.run_medians:
            raise ValueError("a reference needs at least one run")

    @property
    def value(self) -> float:
        """The reference value: the median of the stored run medians."""
        return stats.median(self.run_medians)

    @property
    def runs(self) -> int:
        return len(self.run_medians)

    @property
    def noise_source(self) -> str:
        """Where the between-run spread comes from: ``history`` or ``baseline``."""
        return "history" if len(self.history_medians) >= max(MIN_RUNS_FOR_SPREAD, self.runs + 1) else "baseline"

    @property
    def noise_runs(self) -> int:
        return len(self.history_medians) if self.noise_source == "history" else self.runs

    @property
    def between_run_spread(self) -> float | None:
        """Relative robust spread (1.4826 × MAD / |median|) of the medians the noise is learned from (the baseline's
        runs, or the history's accepted sessions when there are more of those); None below 3."""
        medians = self.history_medians if self.noise_source == "history" else self.run_medians
        return stats.relative_spread(medians) if len(medians) >= MIN_RUNS_FOR_SPREAD else None


@dataclass(frozen=True)
class Threshold:
    """A change is judged only if it is larger than ``allowed`` (relative) and than ``abs_tolerance`` (in the
    metric's unit); see the module docstring for ``tolerance`` and ``noise_k``."""

    tolerance: float = DEFAULT_TOLERANCE
    abs_tolerance: float = 0.0
    noise_k: float = DEFAULT_NOISE_K

    def __post_init__(self) -> None:
        for name in MARKER_ARGS:
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"Threshold.{name} must be >= 0, got {value}")

    def allowed(self, reference: Reference) -> tuple[float, str]:
        """The relative change allowed before a metric counts, and where its noise term came from."""
        spread = reference.between_run_spread
        if spread is not None:
            if reference.noise_source == "history":
                where = f"{reference.noise_runs} history sessions"
            else:
                sittings = "1 sitting" if reference.sittings == 1 else f"{reference.sittings} sittings"
                where = f"{reference.noise_runs} runs in {sittings}"
            return (max(self.tolerance, self.noise_k * spread), f"spread {spread * 100:.1f} % from {where}")
        plural = "run" if reference.runs == 1 else "runs"
        return (max(self.tolerance, reference.within_rel_iqr),
                f"spread from {reference.runs} {plural} (within-run IQR {reference.within_rel_iqr * 100:.1f} %)")


def _number(where: str, name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ThresholdError(f"{where}: {name} must be a number, got {value!r}") from None
    if not number >= 0 or number == float("inf"):
        raise ThresholdError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
    return number


def marker_arguments(item: pytest.Item | None) -> Mapping[str, float]:
    """The closest ``moeperf_threshold`` marker's arguments, checked; `ThresholdError` names what is wrong."""
    marker = item.get_closest_marker("moeperf_threshold") if item is not None else None
    if marker is None:
        return {}
    where = "moeperf_threshold"
    if len(marker.args) > 1:
        raise ThresholdError(f"{where}: takes at most one positional argument (tolerance), got {marker.args!r}")
    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("tolerance", marker.args[0])
    unknown = set(kwargs) - set(MARKER_ARGS)
    if unknown:
        raise ThresholdError(f"{where}: unknown argument(s) {sorted(unknown)}; expected {', '.join(MARKER_ARGS)}")
    return {name: _number(where, name, value) for name, value in kwargs.items() if value is not None}


def resolve_threshold(item: pytest.Item | None, default_tolerance: float = DEFAULT_TOLERANCE, *,
                      tolerance: float | None = None, abs_tolerance: float | None = None,
                      default_noise_k: float = DEFAULT_NOISE_K) -> Threshold:
    marker = marker_arguments(item)
    return Threshold(
        tolerance=tolerance if tolerance is not None else marker.get("tolerance", default_tolerance),
        abs_tolerance=abs_tolerance if abs_tolerance is not None else marker.get("abs_tolerance", 0.0),
        noise_k=marker.get("noise_k", default_noise_k),
    )
