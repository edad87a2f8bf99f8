"""The result ledger: what a session measured and decided, one typed record per metric, in one shape.

Producers append to it: the test calls of this process (through the session's hook adapters), pytest-xdist
workers (their records travel in the call report), ``--moeperf-rounds`` children and ``moeperf ab`` sides (their
ledger files). Consumers read it at the end: the judge, the baseline update, every report and the history. A
record holds a metric's *rounds* — each the samples of one window with the health of that window, why the window
cannot decide (if it cannot) and the test's own outcome — and, once judged, its verdict. Nothing here imports
pytest or touches a file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pytest_moeperf.judging.thresholds import Threshold, policy_value
from pytest_moeperf.judging.verdict import Status, Verdict
from pytest_moeperf.machine.canary import Reading
from pytest_moeperf.reports.controls import context_text, no_controls

Better = Literal["lower", "higher"]
JSONScalar = str | int | float | bool | None
LEDGER_SCHEMA = 1
#: the context key that names what a test measured (e.g. a serving window's requests): part of its metrics' identity
WORKLOAD = "workload"
#: the context key that names what one round of the metric stands for when it is not one call of the test (e.g.
#: "server start": a serving window is one observation of its server's start; `render.unit_lines` counts by it)
ROUND_UNIT = "round_unit"
#: the context key that names which of several exclusive states a metric belongs to (e.g. a server start's compile
#: cache, ``cold`` or ``warm``): a test that measured one state this run is not expected to measure the other's
#: metrics, so their baselines are not MISSING (the summary notes them)
STATE = "state"
SUBFAMILY = "subfamily"  # the context key of a metric's sub-family: its moeperf_family keys' values (dtype=bf16, m=1)
#: how ``Ledger.tests`` says a test skipped, and how ``--moeperf-deadline``'s skip reason begins (a batch counts
#: the tests it skipped)
SKIPPED, DEADLINE_SKIP = "test skipped: ", "--moeperf-deadline "


@dataclass(frozen=True)
class Identity:
    """What makes two values of a metric comparable: its unit, its direction and the workload that produced it
    (``context["workload"]``; None when the test names none)."""

    unit: str
    better: str
    workload: JSONScalar = None

    @classmethod
    def of(cls, unit: str, better: str, context: Mapping[str, Any]) -> Identity:
        return cls(unit, better, context.get(WORKLOAD))

    def change(self, new: Identity, was: str = "baseline", now: str = "now") -> str:
        """What changed from this identity (``was``) to ``new`` (``now``); "" when nothing did."""
        parts = []
        if (self.unit, self.better) != (new.unit, new.better):
            parts.append(f"unit or direction changed: {was} {self.unit!r} ({self.better} is better), {now} "
                         f"{new.unit!r} ({new.better} is better)")
        if self.workload != new.workload:
            parts.append(f"workload changed: {was} {self.workload!r}, {now} {new.workload!r}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Measurement:
    """One metric of one test in one round: its samples and how to judge them.

    ``key`` (``<nodeid>::<name>``) identifies the metric in a baseline file.
    """

    test_id: str
    name: str
    samples: tuple[float, ...]
    unit: str
    better: Better
    tolerance: float | None = None
    abs_tolerance: float | None = None
    context: Mapping[str, JSONScalar] = field(default_factory=dict)
    #: one server start's window medians when ``samples`` pool several windows of that start (`Round.window`): a
    #: stored run keeps them apart, so the judge can tell the start's variance from the window's
    windows: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "::" in self.name:
            raise ValueError(f"metric name must be a non-empty str with no '::', got {self.name!r}")
        no_controls(self.name, "a metric name")
        where = f"metric {self.name!r}"
        object.__setattr__(self, "samples", as_samples(self.samples, where))  # floats, whoever built it
        if not self.samples:
            raise ValueError(f"{where}: no samples")
        if not isinstance(self.unit, str) or not self.unit.strip():
            raise ValueError(f"{where}: unit must be a non-empty str such as 'us', got {self.unit!r}")
        no_controls(self.unit, f"{where}: its unit")
        if self.better not in ("lower", "higher"):
            raise ValueError(f"{where}: better must be 'lower' or 'higher', got {self.better!r}")
        for sample in self.samples:
            if sample != sample or sample in (float("inf"), float("-inf")):
                raise ValueError(f"{where}: sample {sample} is not a finite number")
        for key, value in self.context.items():
            if not isinstance(value, (str, int, float, bool)) and value is not None:
                raise TypeError(f"{where}: context {key!r} must be a str, number, bool or None, "
                                f"got {type(value).__name__}")
            context_text(key, value, f"{where}: context")
        for name, tol in (("tolerance", self.tolerance), ("abs_tolerance", self.abs_tolerance)):
            if tol is not None:
                policy_value(f"metric {self.name!r}", name, tol)

    @property
    def key(self) -> str:
        return f"{self.test_id}::{self.name}"

    @property
    def suite(self) -> str:
        return suite_of(self.test_id)

    @property
    def identity(self) -> Identity:
        return Identity.of(self.unit, self.better, self.context)

    def to_json(self) -> dict[str, Any]:
        data = {"test_id": self.test_id, "name": self.name, "samples": list(self.samples), "unit": self.unit,
                "better": self.better, "tolerance": self.tolerance, "abs_tolerance": self.abs_tolerance,
                "context": dict(self.context)}
        return {**data, "windows": list(self.windows)} if self.windows else data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        return cls(test_id=data["test_id"], name=data["name"], samples=tuple(data["samples"]), unit=data["unit"],
                   better=data["better"], tolerance=data.get("tolerance"), abs_tolerance=data.get("abs_tolerance"),
                   context=dict(data.get("context", {})), windows=tuple(data.get("windows", ())))


def suite_of(test_id: str) -> str:
    """The test file's stem (``suites/gemm/test_gemm.py::…`` → ``test_gemm``): the baseline file name."""
    path = test_id.split("::", 1)[0]
    stem = path.rsplit("/", 1)[-1]
    return stem[:-3] if stem.endswith(".py") else stem


def as_samples(samples: float | int | Sequence[float | int], where: str = "") -> tuple[float, ...]:
    """A number, or a sequence of numbers (a list, a tuple, an array), as float samples. A str is no sequence of
    samples ("123" is not 1, 2, 3), and a bool, a mapping or a None is no number: `TypeError` names ``where``."""
    prefix = f"{where}: " if where else ""
    if isinstance(samples, (bool, str, bytes)) or isinstance(samples, Mapping) or samples is None:
        shown = f": {samples!r}" if isinstance(samples, (bool, str, bytes)) else ""
        raise TypeError(f"{prefix}samples must be a number or a sequence of numbers, got a "
                        f"{type(samples).__name__}{shown}")
    if isinstance(samples, (int, float)):
        return (float(samples),)
    try:
        items = list(samples)
    except TypeError:
        raise TypeError(f"{prefix}samples must be a number or a sequence of numbers, got a "
                        f"{type(samples).__name__}") from None
    values = []
    for i, sample in enumerate(items, 1):
        try:
            if isinstance(sample, (bool, str, bytes)) or sample is None:
                raise TypeError
            values.append(float(sample))
        except (TypeError, ValueError):
            raise TypeError(f"{prefix}sample {i} must be a number, got {sample!r}") from None
    return tuple(values)


@dataclass(frozen=True)
class Section:
    """An extra table in the reports (e.g. the decode-step budget, the draft-model comparison)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns), "rows": [list(r) for r in self.rows],
                "note": self.note}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Section:
        return cls(str(data["title"]), tuple(data["columns"]), tuple(tuple(r) for r in data["rows"]),
                   str(data.get("note", "")))


@dataclass(frozen=True)
class HealthReport:
    """What the health gate saw during one window: ok, the reasons it is not, and facts for the reports."""

    ok: bool
    reasons: tuple[str, ...] = ()
    facts: dict[str, JSONScalar] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reasons": list(self.reasons), "facts": dict(self.facts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> HealthReport | None:
        return None if data is None else cls(bool(data["ok"]), tuple(data.get("reasons", ())),
                                             dict(data.get("facts", {})))


@dataclass(frozen=True)
class Round:
    """One round of one metric: the samples of one window, where it came from, and whether it can decide.

    ``origin`` names the producer: ``call`` (the test's call), ``confirm k`` (a confirmation re-run), ``round i/N``
    (a ``--moeperf-rounds`` child), ``start j/S`` (a ``--moeperf-starts`` child), ``base k`` / ``head k`` (an A/B
    side). ``window`` numbers the windows of one server start (``--moeperf-windows``): rounds that share their
    ``origin`` and have a window number are windows of one start, a level below it (None: the round is its own
    unit). ``excluded`` says why this window cannot decide this metric (a degenerate window, declared by the
    test); ``test_passed`` is the test's own outcome in that round (a regression alone does not fail it there)."""

    samples: tuple[float, ...]
    origin: str = "call"
    test_passed: bool = True
    health: HealthReport | None = None
    excluded: tuple[str, ...] = ()
    window: int | None = None

    @property
    def label(self) -> str:
        """How reports name this round: its origin, and its window within a start."""
        return self.origin if self.window is None else f"{self.origin}, window {self.window}"

    @property
    def problems(self) -> tuple[str, ...]:
        """Why this round cannot decide anything (empty: it can)."""
        sick = (f"health: {'; '.join(self.health.reasons)}",) if self.health is not None and not self.health.ok \
            else ()
        return sick + tuple(f"window: {reason}" for reason in self.excluded)

    @property
    def usable(self) -> bool:
        return not self.problems

    @property
    def writable(self) -> bool:
        """Whether an update may store this round as a baseline run."""
        return self.usable and self.test_passed

    def to_json(self) -> dict[str, Any]:
        data = {"samples": list(self.samples), "origin": self.origin, "test_passed": self.test_passed,
                "health": None if self.health is None else self.health.to_json(), "excluded": list(self.excluded)}
        return data if self.window is None else {**data, "window": self.window}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Round:
        window = data.get("window")
        return cls(tuple(float(x) for x in data["samples"]), str(data.get("origin", "call")),
                   bool(data.get("test_passed", True)), HealthReport.from_json(data.get("health")),
                   tuple(data.get("excluded", ())), None if window is None else int(window))


@dataclass(frozen=True)
class Record:
    """One metric of one test over a session: how it is judged, its rounds (oldest first) and its verdict.

    ``metric`` carries the identity and the last round's samples; ``threshold`` is the policy resolved for its test
    (record arguments, markers, options), kept so that whoever judges the record later judges it the same way."""

    metric: Measurement
    rounds: tuple[Round, ...]
    threshold: Threshold = Threshold()
    verdict: Verdict | None = None

    @property
    def key(self) -> str:
        return self.metric.key

    def measurements(self, usable_only: bool = False) -> list[Measurement]:
        """The metric as measured in each round (only the rounds that can decide, with ``usable_only``)."""
        return [dataclasses.replace(self.metric, samples=r.samples) for r in self.rounds
                if r.usable or not usable_only]

    @property
    def problems(self) -> tuple[str, ...]:
        """Why rounds of this record cannot decide, each reason once, oldest first."""
        return tuple(dict.fromkeys(p for r in self.rounds for p in r.problems))

    def to_json(self) -> dict[str, Any]:
        metric = self.metric.to_json()
        metric.pop("samples")
        return {"metric": metric, "rounds": [r.to_json() for r in self.rounds],
                "threshold": dataclasses.asdict(self.threshold),
                "verdict": None if self.verdict is None else self.verdict.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Record:
        rounds = tuple(Round.from_json(r) for r in data["rounds"])
        if not rounds:
            raise ValueError("a ledger record needs at least one round")
        metric = Measurement.from_json({**data["metric"], "samples": rounds[-1].samples})
        verdict = data.get("verdict")
        return cls(metric, rounds, Threshold(**data.get("threshold", {})),
                   None if verdict is None else Verdict.from_json(verdict))


@dataclass
class Ledger:
    """Every record of a session, the tests that ran (and why some measured nothing), the MISSING verdicts, extra
    tables, and what the session must say: ``warnings`` (counted, and failed by ``--moeperf-strict``) and
    ``notes``."""

    records: dict[str, Record] = field(default_factory=dict)
    tests: dict[str, str] = field(default_factory=dict)  # nodeid -> why it did not measure ("" when it ran)
    missing: dict[str, Verdict] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    canary: list[Reading] = field(default_factory=list)  # the canary's readings (`machine.canary`)

    def add(self, record: Record) -> None:
        """Append a record; a metric seen before gets these rounds after its own, and its verdict is dropped
        (the judge decides on all rounds together)."""
        known = self.records.get(record.key)
        if known is None:
            self.records[record.key] = record
            return
        self.records[record.key] = dataclasses.replace(known, metric=record.metric,
                                                       rounds=known.rounds + record.rounds, verdict=None)

    def decide(self, key: str, verdict: Verdict) -> None:
        self.records[key] = dataclasses.replace(self.records[key], verdict=verdict)

    def note_test(self, nodeid: str, why: str) -> None:
        """A test ran (``why`` empty) or did not measure (``why`` says so); its first word stands."""
        if not self.tests.get(nodeid):
            self.tests[nodeid] = why

    def ran_before(self, nodeid: str) -> bool:
        """Whether an earlier round measured the test (a parent's ledger, after its children's merges)."""
        return self.tests.get(nodeid) == "" and nodeid in self.tests

    def measured_nothing(self) -> list[str]:
        """The reasons, most common first, when tests were selected but every one skipped without a metric (a
        requirement missing: vLLM not importable, too few GPUs); empty when anything was measured."""
        if self.records or not self.tests or not all(why.startswith(SKIPPED) for why in self.tests.values()):
            return []
        reasons = [why.removeprefix(SKIPPED) for why in self.tests.values()]
        return sorted(set(reasons), key=lambda r: (-reasons.count(r), r))

    def deadline_skipped(self) -> list[str]:
        """The tests ``--moeperf-deadline`` skipped (in any round), in the order they ran."""
        return [nodeid for nodeid, why in self.tests.items() if why.startswith(SKIPPED + DEADLINE_SKIP)]

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def merge(self, other: Ledger, rounds: bool = False) -> None:
        """Take everything another producer's ledger holds (a rounds child, an xdist worker, an A/B side). With
        ``rounds`` (another round of the same tests) a test an earlier round measured stays measured: a later round
        that skipped it (the deadline) leaves its verdicts on fewer rounds, which they say, not a test unmeasured."""
        for record in other.records.values():
            self.add(record)
        for nodeid, why in other.tests.items():
            if not (rounds and self.ran_before(nodeid)):
                self.note_test(nodeid, why)
        for key, verdict in other.missing.items():
            self.missing.setdefault(key, verdict)
        self.sections += [s for s in other.sections if s not in self.sections]
        for text in other.warnings:
            self.warn(text)
        self.notes += [n for n in other.notes if n not in self.notes]
        self.canary += other.canary

    @property
    def verdicts(self) -> list[Verdict]:
        """The verdicts of the judged records, then the MISSING ones not measured at all."""
        judged = [r.verdict for r in self.records.values() if r.verdict is not None]
        return judged + [v for k, v in sorted(self.missing.items()) if k not in self.records]

    def undecided(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in (Status.INCONCLUSIVE, Status.MISSING)]

    def to_json(self) -> dict[str, Any]:
        return {"schema": LEDGER_SCHEMA, "records": [r.to_json() for r in self.records.values()],
                "tests": dict(self.tests), "missing": [v.to_json() for v in self.missing.values()],
                "sections": [s.to_json() for s in self.sections], "warnings": list(self.warnings),
                "notes": list(self.notes), "canary": [r.to_json() for r in self.canary]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ledger:
        if data.get("schema") != LEDGER_SCHEMA:
            raise ValueError(f"ledger schema {data.get('schema')!r}; this version reads {LEDGER_SCHEMA}")
        ledger = cls(tests=dict(data.get("tests", {})), warnings=list(data.get("warnings", ())),
                     notes=list(data.get("notes", ())), canary=[Reading.from_json(r) for r in data.get("canary", ())])
        for record in data.get("records", ()):
            ledger.add(Record.from_json(record))
        for verdict in data.get("missing", ()):
            found = Verdict.from_json(verdict)
            ledger.missing[found.key] = found
        ledger.sections = [Section.from_json(s) for s in data.get("sections", ())]
        return ledger


def records_of(payload: Iterable[Mapping[str, Any]]) -> list[Record]:
    """Records from their JSON (what a test's call report carries to the controller)."""
    return [Record.from_json(entry) for entry in payload]
