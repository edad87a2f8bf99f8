"""Thresholds: how far a metric may move before it counts, and where that number comes from.

Words (see docs/ARCHITECTURE.md): the **minimum effect** (``tolerance``) is a policy, the smallest relative change
worth failing for; the **mde** (minimum detectable effect) is the bound a verdict actually uses: the minimum effect
or what the noise allows, whichever is larger. The noise term is ``noise_k`` × a robust between-run spread
(1.4826 × MAD / median of run medians: σ of one run's median), learned from one named source:

* ``baseline``: the stored runs of this host (at least 3);
* ``history``: the perf history's accepted sessions of this host, when it holds more of them than the baseline;
* ``family``: fewer than 3 stored runs, but the other cases of the same family (test file, metric name) on this
  host have a spread: their median spread stands in (the verdict says so);
* ``hosts``: the baseline comes from other hosts of the same fingerprint only; the spread *between hosts* (of the
  per-host medians, at least 3 hosts) sets the noise term through its 95 % upper confidence bound (a handful of
  hosts teaches little about it: from 3 hosts the bound is 4.4 × the estimate, from 10 1.6 ×);
* ``within-run``: none of the above; the within-run IQR is shown as a floor, but such a verdict can never be
  REGRESSED or IMPROVED (INCONCLUSIVE names why: too few stored runs, or a baseline from another host).

**Sampling floor.** A run's median carries the sampling error of its own samples: sqrt(pi/2) x (IQR / 1.349) /
sqrt(n) of the median (`stats.median_standard_error`). A spread between runs (``baseline``, ``history``) below the
median of that error over the stored runs is an estimate that came out low, and the floor stands in for it. The
MAD of 5 run medians has a third of the efficiency of a standard deviation: seen on the 2-vCPU AMD CI VM, gloo's
1 KiB eager latency stored 5 runs at 223-269 us whose MAD read 2.4 % (mde 7.3 %), while each run was the median
of 25-35 block minima with an IQR of 29-43 % (a median's error of 4.6-7.8 %, median 6.3 %); judged runs then read
it -29 % to +22 %, and two of six were REGRESSED at p = 0.048 on an unchanged checkout. Metrics of many tight
samples (a graph-timed GEMM) have a floor far below their spread, and one sample per run (a throughput) has none.

**Quiet floor.** Where the minimum effect is the default (no test, marker or option names one), the baseline's
runs come from this host in at least 2 sittings (so the box's day-to-day state is in the spread; updates less than
an hour apart on one boot are one sitting: `store.entries.sittings`) and the noise term is below the minimum
effect, the mde may go down to ``quiet_floor`` (``--moeperf-quiet-floor``, default 3 %): a graph-timed GEMM whose
runs agree to 0.3 % can detect a 3 % change, while a serving TPOT that moves 20 % between sittings keeps its noise
term. Runs of one sitting teach the spread within a sitting only: two updates 1.5 minutes apart, counted as two
sittings, let a same-box A/A read 2 of 19 GEMM cases IMPROVED at -3.6 % and -3.9 %.

``noise_k`` defaults to 3: for a normal spread, a run median lands more than 3 σ on the worse side about 1 time in
740, so a 1,000-metric GPU session sees about one false crossing per run before confirmation re-measures it.

Precedence for ``tolerance`` (first that is set wins): the ``tolerance=`` of ``perf.record``, the
``moeperf_threshold`` marker closest to the test, ``--moeperf-tolerance`` / ``moeperf_tolerance``, 5 %. For
``noise_k``: the marker, then ``--moeperf-noise-k`` / ``moeperf_noise_k``, then 3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_moeperf.judging import stats

DEFAULT_TOLERANCE = 0.05
DEFAULT_NOISE_K = 3.0
DEFAULT_QUIET_FLOOR = 0.03
MIN_RUNS_FOR_SPREAD = 3
MIN_SITTINGS_FOR_QUIET = 2
MARKER_ARGS = ("tolerance", "abs_tolerance", "noise_k")
#: the threshold arguments that are relative to the value: fractions in [0, 1) (0.05 for 5 %)
FRACTIONS = ("tolerance", "quiet_floor")


class ThresholdError(ValueError):
    """Bad ``moeperf_threshold`` marker or ``perf.record`` threshold arguments (a usage error of one test)."""


@dataclass(frozen=True)
class Reference:
    """What a baseline says about one metric on this machine: the medians of the runs its value comes from, and
    every spread a threshold may learn from (see the module docstring)."""

    run_medians: tuple[float, ...]
    within_rel_iqr: float = 0.0  # the largest IQR/median among the stored runs
    #: medians of this host's last accepted sessions in the perf history (same unit, direction and re-record)
    history_medians: tuple[float, ...] = ()
    #: how many sittings the runs came from (`store.entries.sittings`: updates an hour or a reboot apart); the
    #: rounds of one sitting share the box's state of that hour
    sittings: int = 1
    #: None: the runs are this host's; else which other host(s) they come from ("2 other hosts")
    other_hosts: str | None = None
    #: the spread between the per-host medians of this fingerprint (None: fewer than 3 hosts)
    host_spread: float | None = None
    #: a spread learned on this host from the metric's family, and what it was learned from
    family_spread: float | None = None
    family_source: str = ""
    #: per stored run of this host, the medians of the windows it pooled (a server start measured in several
    #: windows: `levels`); () for a run of one window
    windows: tuple[tuple[float, ...], ...] = ()
    #: how many sittings the runs with windows came from (`judging.levels`: one sitting cannot show what a start adds)
    window_sittings: int = 1
    #: the sampling floor: the median over the stored runs of each run median's relative standard error from its own
    #: samples (`stats.median_standard_error`; 0: unknown); a spread between runs cannot be below it
    sampling_spread: float = 0.0
    #: the median number of samples per stored run that floor comes from (for the report)
    sampling_n: int = 0

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
        """Where the noise term comes from: ``hosts``, ``history``, ``baseline``, ``family`` or ``within-run``."""
        if self.other_hosts is not None:
            return "hosts" if self.host_spread is not None else "within-run"
        if len(self.history_medians) >= max(MIN_RUNS_FOR_SPREAD, self.runs + 1):
            return "history"
        if self.runs >= MIN_RUNS_FOR_SPREAD:
            return "baseline"
        return "family" if self.family_spread is not None else "within-run"

    @property
    def noise_runs(self) -> int:
        return len(self.history_medians) if self.noise_source == "history" else self.runs

    @property
    def between_run_spread(self) -> float | None:
        """The relative spread the noise term is learned from (None: ``within-run``, no spread is known)."""
        source = self.noise_source
        if source == "hosts":
            return self.host_spread
        if source == "family":
            return self.family_spread
        if source == "within-run":
            return None
        return stats.relative_spread(self.history_medians if source == "history" else self.run_medians)


@dataclass(frozen=True)
class Bound:
    """The mde a verdict uses, what set it, and whether a change beyond it may be called at all."""

    mde: float
    spread: str  # where the noise term came from, for the report
    source: str  # `Reference.noise_source`
    decisive: bool = True
    why_not: str = ""  # when not decisive: why a change beyond the mde stays INCONCLUSIVE


@dataclass(frozen=True)
class Threshold:
    """The policy of one metric: ``tolerance`` (the minimum effect, relative), ``abs_tolerance`` (in the metric's
    unit: a smaller absolute change always passes), ``noise_k`` and ``quiet_floor`` (see the module docstring;
    None: no quiet floor)."""

    tolerance: float = DEFAULT_TOLERANCE
    abs_tolerance: float = 0.0
    noise_k: float = DEFAULT_NOISE_K
    quiet_floor: float | None = None

    def __post_init__(self) -> None:
        for name in (*MARKER_ARGS, "quiet_floor"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ThresholdError(f"Threshold.{name} must be >= 0, got {value}")

    def bound(self, reference: Reference) -> Bound:
        """The mde for ``reference`` and where its noise term came from."""
        source, spread = reference.noise_source, reference.between_run_spread
        if spread is None:
            mde = max(self.tolerance, reference.within_rel_iqr)
            text = f"no between-run spread (within-run IQR {reference.within_rel_iqr * 100:.1f} %)"
            if reference.other_hosts is not None:
                return Bound(mde, text, source, False,
                             f"baseline from another host ({reference.other_hosts}) and no spread between hosts is "
                             "known: record one here with --moeperf-update (--moeperf-rounds 3 in 2 sittings)")
            plural = "run" if reference.runs == 1 else "runs"
            return Bound(mde, text, source, False,
                         f"only {reference.runs} stored {plural}: the between-run noise is unknown; record at least "
                         f"{MIN_RUNS_FOR_SPREAD} (e.g. --moeperf-update --moeperf-rounds 3)")
        learned = spread
        floored = source in ("baseline", "history") and reference.sampling_spread > spread
        if floored:
            spread = reference.sampling_spread
        noise = self.noise_k * spread
        if source == "hosts":
            # a spread between a handful of hosts is itself uncertain (seen on 1x H200: 1.3 % between 3 sittings of
            # one case that read +12.7 % on a fourth host); its 95 % upper bound stands in
            upper = stats.spread_upper_bound(spread, reference.runs)
            noise = self.noise_k * upper
            where = (f"between hosts ({reference.other_hosts}; 95 % upper bound {upper * 100:.1f} % from "
                     f"{reference.runs} hosts)")
        elif source == "history":
            where = f"{reference.noise_runs} history sessions"
        elif source == "family":
            where = f"its family on this host ({reference.family_source})"
        else:
            sittings = "1 sitting" if reference.sittings == 1 else f"{reference.sittings} sittings"
            where = f"{reference.noise_runs} runs in {sittings}"
        text = f"spread {learned * 100:.1f} % from {where}"
        if floored:
            text += f", under its sampling floor {spread * 100:.1f} % (run medians of {reference.sampling_n} samples)"
        quiet = (self.quiet_floor is not None and source in ("baseline", "history")
                 and (source == "history" or reference.sittings >= MIN_SITTINGS_FOR_QUIET))
        if quiet and self.quiet_floor is not None and noise < self.tolerance:
            floor = min(self.tolerance, self.quiet_floor)
            return Bound(max(floor, noise), text + f"; quiet: floor {floor * 100:g} %", source)
        return Bound(max(self.tolerance, noise), text, source)

    def allowed(self, reference: Reference) -> tuple[float, str]:
        """The mde and where its noise term came from (see `bound`)."""
        found = self.bound(reference)
        return found.mde, found.spread


def fraction_hint(number: float) -> str | None:
    """Why ``number`` (finite, >= 0) is no relative threshold, or None: those are fractions in [0, 1), and 2 is
    more likely a 2 % than a 200 % (a metric that moves 100 % has halved or doubled)."""
    if number < 1:
        return None
    return (f"a fraction in [0, 1) such as 0.05 is expected: {number:g} means {number * 100:g} %; for {number:g} % "
            f"give {number / 100:g} (or {number:g}%)")


def policy_value(where: str, name: str, value: Any) -> float:
    """A threshold argument as a test gives it (``perf.record``, the marker), checked: a number (not a bool or a
    string), finite and >= 0, and for the relative ones (`FRACTIONS`) below 1; `ThresholdError` names ``where``,
    the argument and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ThresholdError(f"{where}: {name} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the largest float
        number = math.inf
    if not number >= 0 or number == math.inf:
        raise ThresholdError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
    hint = fraction_hint(number) if name in FRACTIONS else None
    if hint is not None:
        raise ThresholdError(f"{where}: {name}: {hint}")
    return number


def marker_values(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Mapping[str, float]:
    """The ``moeperf_threshold`` marker's arguments, checked; `ThresholdError` names what is wrong."""
    where = "moeperf_threshold"
    if len(args) > 1:
        raise ThresholdError(f"{where}: takes at most one positional argument (tolerance), got {args!r}")
    values = dict(kwargs)
    if args:
        values.setdefault("tolerance", args[0])
    unknown = set(values) - set(MARKER_ARGS)
    if unknown:
        raise ThresholdError(f"{where}: unknown argument(s) {sorted(unknown)}; expected {', '.join(MARKER_ARGS)}")
    return {name: policy_value(where, name, value) for name, value in values.items() if value is not None}


def resolve_threshold(marker: Mapping[str, float], option_tolerance: float | None = None, *,
                      tolerance: float | None = None, abs_tolerance: float | None = None,
                      default_noise_k: float = DEFAULT_NOISE_K, quiet_floor: float | None = None) -> Threshold:
    """The threshold policy of one metric: its record arguments, else the marker's, else the option's (None: not
    given), else the default. The quiet floor applies only to the default minimum effect: a minimum effect that
    a test, a marker or an option names is the policy as written."""
    chosen = tolerance if tolerance is not None else marker.get("tolerance", option_tolerance)
    return Threshold(
        tolerance=DEFAULT_TOLERANCE if chosen is None else chosen,
        abs_tolerance=abs_tolerance if abs_tolerance is not None else marker.get("abs_tolerance", 0.0),
        noise_k=marker.get("noise_k", default_noise_k),
        quiet_floor=quiet_floor if chosen is None else None,
    )
