"""`Perf`: what the ``perf`` fixture hands a test to record its metrics with."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from pytest_moeperf.judging import stats
from pytest_moeperf.ledger import (
    ROUND_UNIT,
    SUBFAMILY,
    Better,
    HealthReport,
    JSONScalar,
    Measurement,
    Round,
    as_samples,
)
from pytest_moeperf.reports.controls import context_text


class Perf:
    """Records metrics for one test. Verdicts against the baseline are decided when the test's call ends.

    >>> perf.context(model="kimi-k2.5", op="gate_up", m=1)
    >>> perf.record("latency", [12.1, 12.3, 12.2], unit="us", better="lower")
    """

    def __init__(self, test_id: str, *, simulated_from: str | None = None, round_unit: str | None = None,
                 family: tuple[str, ...] = ()) -> None:
        self.test_id = test_id
        #: the context keys whose values name this test's sub-family (the ``moeperf_family`` marker)
        self.family = family
        #: what one process's measurement of this test stands for (``pytest_moeperf_round_unit``), e.g. "server start"
        self.round_unit = round_unit
        self._context: dict[str, JSONScalar] = {} if round_unit is None else {ROUND_UNIT: round_unit}
        self._records: list[Measurement] = []
        self._earlier: list[tuple[Measurement, ...]] = []  # the records of earlier rounds (confirmation re-runs)
        self._simulated_from = simulated_from
        #: per round: why its window cannot decide anything (ordered, unique), and for which metrics (None: all)
        self._unusable: list[dict[str, frozenset[str] | None]] = [{}]
        self._once = False  # `measured_once`
        #: round index -> its window number on one server start (``--moeperf-windows``)
        self._windows: dict[int, int] = {}
        #: why calling the test again would not measure again
        self._single: str | None = None if round_unit is None else (
            f"each {round_unit} is one observation: a re-run in this process would measure the same {round_unit} "
            "again, not an independent round")

    @property
    def records(self) -> tuple[Measurement, ...]:
        """What this round recorded."""
        return tuple(self._records)

    @property
    def rounds(self) -> tuple[tuple[Measurement, ...], ...]:
        """The records of every round of this test, oldest first (the last is `records`)."""
        return (*self._earlier, self.records)

    def by_metric(self) -> dict[str, list[tuple[int, Measurement]]]:
        """Each metric's (round index, measurement) across the rounds of this test, in recording order."""
        grouped: dict[str, list[tuple[int, Measurement]]] = {}
        for index, records in enumerate(self.rounds):
            for m in records:
                grouped.setdefault(m.name, []).append((index, m))
        return grouped

    def new_round(self) -> None:
        """Start another round of the same test (a confirmation re-run): the metrics may be recorded again."""
        self._earlier.append(self.records)
        self._records = []
        self._unusable.append({})

    def first_window(self) -> None:
        """Number this test's first round window 1 of its start (``--moeperf-windows``)."""
        self._windows.setdefault(0, 1)

    def new_window(self) -> None:
        """Start another window of the same start (``--moeperf-windows``): a round a level below the start, on the
        same server; the first round becomes window 1."""
        self.first_window()
        self.new_round()
        self._windows[len(self._earlier)] = len(self._windows) + 1

    def window_of(self, round_index: int) -> int | None:
        """The window number of a round (None: the round is not one of several windows of one start)."""
        return self._windows.get(round_index)

    def origin_of(self, round_index: int) -> str:
        """Where a round came from in this process: ``call`` (its windows too) or ``confirm k``."""
        return "call" if round_index == 0 or round_index in self._windows else f"confirm {round_index}"

    def round_of(self, index: int, name: str, samples: tuple[float, ...], test_passed: bool,
                 health: HealthReport | None) -> Round:
        """Round ``index`` of metric ``name`` as the ledger keeps it."""
        return Round(samples, self.origin_of(index), test_passed, health, self.unusable_for(name, index),
                     self.window_of(index))

    @property
    def unusable(self) -> tuple[str, ...]:
        """Why some round of this test measured nothing that can decide a verdict (see `inconclusive`)."""
        return tuple(dict.fromkeys(r for found in self._unusable for r in found))

    def inconclusive(self, reason: str, only: Iterable[str] | None = None) -> None:
        """Declare this round's window degenerate (e.g. the measurement apparatus disturbed what it measured):
        every metric of the test — or only the metrics named in ``only`` — cannot decide anything in this round:
        shown, never PASS/REGRESSED on it, and not written to the baselines (another round may still decide)."""
        scope = None if only is None else frozenset(only)
        current = self._unusable[-1]
        earlier = current.get(reason, frozenset())
        current[reason] = None if scope is None or earlier is None else earlier | scope

    def unusable_for(self, name: str, round_index: int = -1) -> tuple[str, ...]:
        """The reasons that make metric ``name`` unusable in a round (the current one by default)."""
        return tuple(r for r, scope in self._unusable[round_index].items() if scope is None or name in scope)

    @property
    def single_round(self) -> str | None:
        """Why this test is not re-run to confirm a verdict (None: it may be)."""
        return self._single

    @property
    def more_rounds(self) -> str:
        """The option that gives this test more rounds when confirmation in the process cannot."""
        return "--moeperf-rounds" if self.round_unit is None else "--moeperf-starts"

    def measured_once(self, reason: str) -> None:
        """Declare that calling this test again would record the same value (it comes from a fixture, e.g. a
        server's time to start): confirmation does not re-run it, since repeated copies of one measurement would
        pass for independent rounds and let a rank test reject on one value."""
        self._single = reason
        self._once = True

    @property
    def repeats_on_start(self) -> bool:
        """Whether calling this test again measures another window of its start (``--moeperf-windows``): a test
        whose round is a start, and whose value does not come from the start itself (`measured_once`)."""
        return self.round_unit is not None and not self._once

    def context(self, **values: JSONScalar) -> None:
        """Attach facts (shape, dtype, backend, …) to every metric this test records from now on."""
        for key, value in values.items():
            if not isinstance(value, (str, int, float, bool)) and value is not None:
                raise TypeError(f"perf.context({key}=…) must be a str, number, bool or None, "
                                f"got {type(value).__name__}")
            context_text(key, value)
        self._context.update(values)

    def record(self, name: str, samples: float | int | Sequence[float | int], *, unit: str,
               better: Better = "lower", tolerance: float | None = None, abs_tolerance: float | None = None,
               context: dict[str, JSONScalar] | None = None) -> Measurement:
        """Record one metric: a number or a sequence of numbers, its samples (the median is judged); ``unit`` a
        non-empty str, ``better`` ``"lower"`` or ``"higher"``.

        ``tolerance`` (relative: the smallest change worth failing for) and ``abs_tolerance`` (in ``unit``)
        override the marker and option for this metric. A second record of the same name in one round of a test
        is an error."""
        if self._simulated_from is not None:
            pytest.skip(f"topology is simulated (from {self._simulated_from}): measurements need the real "
                        "devices, so nothing is recorded or compared")
        if any(m.name == name for m in self._records):
            raise ValueError(f"metric {name!r} recorded twice in {self.test_id}")
        facts = {**self._context, **(context or {})}
        subfamily = ", ".join(f"{k}={facts[k]}" for k in self.family if k in facts)
        try:  # a bad argument fails this test, here, naming the metric and the argument
            measurement = Measurement(
                test_id=self.test_id, name=name, samples=as_samples(samples, f"metric {name!r}"), unit=unit,
                better=better, tolerance=tolerance, abs_tolerance=abs_tolerance,
                context={**facts, SUBFAMILY: subfamily} if subfamily else facts,
            )
        except TypeError as exc:
            raise TypeError(f"perf.record: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"perf.record: {exc}") from None
        self._records.append(measurement)
        overflow = stats.non_finite(stats.summarize(measurement.samples))
        if overflow:  # this metric alone: the test's other metrics are judged and stored as usual
            self.inconclusive(f"metric {name!r}: its {' and '.join(overflow)} is beyond the largest float "
                              f"(samples from {min(measurement.samples):.4g} to {max(measurement.samples):.4g}): "
                              "it cannot be judged or stored", only=[name])
        return measurement
