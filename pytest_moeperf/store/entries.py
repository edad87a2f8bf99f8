"""What a baseline file stores per metric: its runs (one per round of each update, tagged with the host that
measured it) and the `Reference` a verdict is judged against on a given host.

A run without a host (recorded before hosts were told apart) counts as a host of its own per sitting: the runs of
one update shared one machine, the next update may have had another.

**Sittings** (`sittings`): the rounds of one update share the box's state of that hour, and so do updates made
back to back. Two updates are two sittings only when an hour or more lies between them, or a reboot (the boot id
each run keeps). Two update sittings 1.5 minutes apart on a 1x H200 counted as two and unlocked the quiet floor
(`thresholds`): a same-box A/A then read 2 of 19 GEMM cases IMPROVED (router M=1 -3.9 % against an mde of 3.6 %,
gate_up bf16 M=1 -3.6 % against 2.0 %).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.stats import Summary, summarize
from pytest_moeperf.judging.thresholds import MIN_RUNS_FOR_SPREAD, Reference
from pytest_moeperf.ledger import Identity, Measurement

_SIGNIFICANT = 6
#: the numbers of a stored summary besides its count ``n``
_SUMMARY_FIELDS = tuple(f.name for f in dataclasses.fields(Summary) if f.name != "n")
MIN_HOSTS_FOR_SPREAD = 3
#: updates less than this apart (on one boot) are one sitting
SITTING_GAP = dt.timedelta(hours=1)


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file."""


def _round(value: float) -> float:
    return float(f"{value:.{_SIGNIFICANT}g}")


def finite(where: str, key: str, values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise BaselineError(f"{where}: metric {key!r} has a non-finite {name} ({value}); a baseline must be "
                                "a finite number (left untouched)")


def _number(where: str, key: str, field: str, value: Any) -> float:
    """A stored number as read: a JSON number that is finite; a string ("NaN", "1e999", "100"), a bool, null or
    anything else is refused naming the file, the metric and the field."""
    try:
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:  # an integer beyond the largest float
        ok = False
    if not ok:
        raise BaselineError(f"{where}: metric {key!r}: {field} must be a finite number, got {value!r} "
                            "(left untouched)")
    return float(value)


def _count(where: str, key: str, field: str, value: Any) -> int:
    """A stored sample count: a JSON integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BaselineError(f"{where}: metric {key!r}: {field} must be an integer >= 1, got {value!r} "
                            "(left untouched)")
    return value


def _written(value: float) -> float:
    """A number to write: rounded to `_SIGNIFICANT` digits (`finite` refuses a non-finite one before)."""
    return _round(value) if isinstance(value, float) else value


def _summary_json(summary: Summary) -> dict[str, Any]:
    return {"n": summary.n, **{name: _written(getattr(summary, name)) for name in _SUMMARY_FIELDS}}


def checked(key: str, data: Any, where: str) -> tuple[int, dict[str, float], list[tuple[Any, ...]]]:
    """A stored metric checked as `BaselineEntry.from_json` reads it, without making it (a file's metrics are all
    checked when it is read, and made when used): its summary's count and numbers, and its runs' fields;
    `BaselineError` naming the file, the metric and the field."""
    try:
        raw = data["summary"]
        if len(raw) != len(_SUMMARY_FIELDS) + 1:
            raise TypeError(f"summary has {sorted(raw)}, not {sorted(('n', *_SUMMARY_FIELDS))}")
        numbers = {}
        for name in _SUMMARY_FIELDS:
            value = raw[name]
            numbers[name] = value if type(value) is float and isfinite(value) else _number(
                where, key, f"summary.{name}", value)
        runs = []
        for i, run in enumerate(data.get("runs", [])):
            median, iqr = run["median"], run["iqr"]
            if not (type(median) is float and isfinite(median)):
                median = _number(where, key, f"runs[{i}].median", median)
            if not (type(iqr) is float and isfinite(iqr)):
                iqr = _number(where, key, f"runs[{i}].iqr", iqr)
            windows = run.get("windows", [])
            if not isinstance(windows, list):
                raise BaselineError(f"{where}: metric {key!r}: runs[{i}].windows must be a list of numbers, "
                                    f"got {windows!r} (left untouched)")
            runs.append((median, _count(where, key, f"runs[{i}].n", run["n"]), iqr, run.get("date"),
                         run.get("git_commit"), run.get("host"), run.get("boot"),
                         tuple(_number(where, key, f"runs[{i}].windows[{j}]", w) for j, w in enumerate(windows)),
                         _code(where, key, i, run.get("code"))))
        absent = [name for name in ("test", "name", "unit", "better") if name not in data]
        if absent:
            raise KeyError(absent[0])
        for name in ("context", "provenance"):
            if not isinstance(data.get(name, {}), dict):
                raise TypeError(f"{name} must be an object")
        return _count(where, key, "summary.n", raw["n"]), numbers, runs
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BaselineError(f"{where}: metric {key!r} is malformed ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One update's run of a metric, as a baseline keeps it."""

    median: float
    n: int
    iqr: float
    date: str | None = None
    git_commit: str | None = None
    host: str | None = None  # the host id that measured it (None: recorded before hosts were told apart)
    boot: str | None = None  # the boot of the host it was measured in (`machine.probe.boot_id`; None: unknown)
    #: the medians of the windows this run pooled (one server start measured in several windows; `judging.levels`)
    windows: tuple[float, ...] = ()
    #: the code it ran (`machine.provenance.code_identity`; None: unknown, as in runs recorded before it was kept)
    code: str | None = None

    @classmethod
    def of(cls, summary: Summary, provenance: Mapping[str, Any], windows: Sequence[float] = ()) -> RunSummary:
        return cls(summary.median, summary.n, summary.iqr, provenance.get("date"), provenance.get("git_commit"),
                   provenance.get("host_id"), provenance.get("boot_id"), tuple(windows), provenance.get("code"))

    @property
    def host_group(self) -> str:
        """Which machine this run stands for: its host, or its sitting when the host is unknown."""
        return self.host if self.host is not None else f"sitting {self.date or '?'}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"median": _written(self.median), "n": self.n, "iqr": _written(self.iqr),
                                "date": self.date, "git_commit": self.git_commit}
        if self.host is not None:
            data["host"] = self.host
        if self.boot is not None:
            data["boot"] = self.boot
        if self.windows:
            data["windows"] = [_round(w) for w in self.windows]
        if self.code is not None:
            data["code"] = self.code
        return data


def _code(where: str, key: str, i: int, code: object) -> str | None:
    if code is None or isinstance(code, str):
        return code
    raise BaselineError(f"{where}: metric {key!r}: runs[{i}].code must be a string, got {code!r} (left untouched)")


def _when(date: str | None) -> dt.datetime | None:
    try:
        found = dt.datetime.fromisoformat(date) if date else None
    except ValueError:
        return None
    return found.replace(tzinfo=dt.UTC) if found is not None and found.tzinfo is None else found


def sittings(runs: Sequence[RunSummary]) -> int:
    """How many sittings ``runs`` come from (see the module docstring): their updates (dates) in time order, a new
    sitting wherever `SITTING_GAP` or more lies after the previous update or the boot changed. Runs without a
    readable date count as one sitting together."""
    updates = sorted({(when, run.boot) for run in runs if (when := _when(run.date)) is not None},
                     key=lambda update: update[0])
    count = int(any(_when(run.date) is None for run in runs))
    previous: tuple[dt.datetime, str | None] | None = None
    for when, boot in updates:
        if (previous is None or when - previous[0] >= SITTING_GAP
                or (boot is not None and previous[1] is not None and boot != previous[1])):
            count += 1
        previous = (when, boot)
    return count


def keep_last(runs: Sequence[RunSummary], keep: int) -> tuple[RunSummary, ...]:
    """The last ``keep`` runs of each host (runs of several hosts live side by side; those of no known host count
    as one), in their order."""
    counts: dict[str | None, int] = {}
    kept: list[RunSummary] = []
    for run in reversed(runs):
        group = run.host
        if counts.get(group, 0) < keep:
            counts[group] = counts.get(group, 0) + 1
            kept.append(run)
    return tuple(reversed(kept))


def _within_rel_iqr(runs: Sequence[RunSummary]) -> float:
    return max((r.iqr / abs(r.median) if r.median else 0.0) for r in runs)


def _sampling(runs: Sequence[RunSummary]) -> dict[str, Any]:
    """The sampling floor of ``runs`` as `Reference` takes it: the median of each run median's relative standard
    error (`stats.median_standard_error`) and the median number of samples per run; none when no run has one."""
    errors = [e for r in runs if (e := stats.median_standard_error(r.median, r.iqr, r.n)) is not None]
    if not errors:
        return {}
    return {"sampling_spread": stats.median(errors), "sampling_n": round(stats.median([r.n for r in runs]))}


@dataclass(frozen=True)
class BaselineEntry:
    key: str
    test_id: str
    name: str
    unit: str
    better: str
    summary: Summary  # the last update's run
    context: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    runs: tuple[RunSummary, ...] = ()  # oldest first; empty means "the summary is the only run"
    #: when a re-record (a changed unit, direction or workload) reset these runs: a noise source older than this is
    #: not the same measurement (None: never reset)
    since: str | None = None

    @property
    def identity(self) -> Identity:
        return Identity.of(self.unit, self.better, self.context)

    @property
    def all_runs(self) -> tuple[RunSummary, ...]:
        return self.runs or (RunSummary.of(self.summary, self.provenance),)

    def hosts(self) -> dict[str, list[RunSummary]]:
        """The runs by the machine they stand for (`RunSummary.host_group`), oldest first."""
        groups: dict[str, list[RunSummary]] = {}
        for run in self.all_runs:
            groups.setdefault(run.host_group, []).append(run)
        return groups

    def reference(self, host: str | None = None) -> Reference:
        """What a verdict on ``host`` is judged against (``host`` None: every run, as one machine's).

        This host's runs when it has at least 3, or when no spread between hosts can be learned; else the
        per-host medians of every host (this one included) with their spread: a cross-host reference."""
        runs = self.all_runs
        if host is None:
            return Reference(tuple(r.median for r in runs), _within_rel_iqr(runs), sittings=sittings(runs),
                             **_sampling(runs))
        mine = [r for r in runs if r.host == host]
        groups = self.hosts()
        others = len(groups) - (1 if mine else 0)
        if len(mine) >= MIN_RUNS_FOR_SPREAD or (mine and len(groups) < MIN_HOSTS_FOR_SPREAD):
            nested = [r for r in mine if r.windows]
            return Reference(tuple(r.median for r in mine), _within_rel_iqr(mine), sittings=sittings(mine),
                             windows=tuple(r.windows for r in nested), window_sittings=sittings(nested),
                             **_sampling(mine))
        medians = tuple(stats.median([r.median for r in g]) for g in groups.values())
        spread = stats.relative_spread(medians) if len(groups) >= MIN_HOSTS_FOR_SPREAD else None
        label = f"{others} other host{'s' if others != 1 else ''}"
        return Reference(medians, _within_rel_iqr(runs), sittings=len(groups), other_hosts=label,
                         host_spread=spread)

    def to_json(self) -> dict[str, Any]:
        summary = _summary_json(self.summary)
        runs = [r.to_json() for r in self.all_runs]
        for values in (summary, *runs):
            finite("baseline update", self.key, values)
        data = {"test": self.test_id, "name": self.name, "unit": self.unit, "better": self.better,
                "summary": summary, "runs": runs, "context": dict(self.context), "provenance": dict(self.provenance)}
        if self.since is not None:
            data["since"] = self.since
        return data

    @classmethod
    def from_json(cls, key: str, data: Mapping[str, Any], where: str,
                  shared: dict[Any, dict[str, Any]] | None = None) -> BaselineEntry:
        """One stored metric, every number checked (`checked`). ``shared``: the provenances already read from this
        file, by date and commit; an equal one is taken from it instead of kept again (the metrics of one update
        share theirs: a file of 100,000 metrics holds a handful)."""
        n, numbers, runs = checked(key, data, where)
        provenance = dict(data.get("provenance", {}))
        if shared is not None:
            seen = shared.setdefault((provenance.get("date"), provenance.get("git_commit")), provenance)
            provenance = seen if seen == provenance else provenance
        return cls(key=key, test_id=str(data["test"]), name=str(data["name"]), unit=str(data["unit"]),
                   better=str(data["better"]), summary=Summary(n=n, **numbers), context=dict(data.get("context", {})),
                   provenance=provenance, runs=tuple(RunSummary(*run) for run in runs), since=data.get("since"))

    def updated(self, m: Measurement, provenance: Mapping[str, Any], keep: int) -> BaselineEntry:
        """This entry with one more run (``m``); a changed unit, direction or workload starts the runs afresh."""
        fresh = BaselineEntry.from_measurement(m, provenance)
        if self.identity.change(m.identity):  # a re-record: older runs measured something else
            return dataclasses.replace(fresh, since=provenance.get("date"))
        return dataclasses.replace(fresh, runs=keep_last(self.all_runs + fresh.runs, keep), since=self.since)

    @classmethod
    def from_measurement(cls, m: Measurement, provenance: Mapping[str, Any]) -> BaselineEntry:
        summary = summarize(m.samples)
        return cls(key=m.key, test_id=m.test_id, name=m.name, unit=m.unit, better=m.better, summary=summary,
                   context=dict(m.context), provenance=dict(provenance),
                   runs=(RunSummary.of(summary, provenance, m.windows),))


def merge_entries(a: BaselineEntry, b: BaselineEntry, keep: int) -> BaselineEntry:
    """One metric's runs from two copies of a baseline that were updated apart (e.g. two GPU runners, or two hosts
    of one fingerprint): the union of their runs by date (a run both hold counts once), the last ``keep`` of each host;
    summary, context and provenance of the copy updated last. Copies whose unit, direction or workload differ
    cannot be merged (`BaselineError`)."""
    change = a.identity.change(b.identity)
    if change:
        raise BaselineError(f"metric {a.key!r}: cannot merge the two copies: {change}")
    runs = sorted(set(a.all_runs) | set(b.all_runs), key=lambda r: (r.date or "", r.median))
    newer = b if (b.provenance.get("date") or "") >= (a.provenance.get("date") or "") else a
    since = min((s for s in (a.since, b.since) if s is not None), default=None)
    return dataclasses.replace(newer, runs=keep_last(runs, keep), since=since)


def software_changes(baseline: BaselineEntry | None, current: Mapping[str, str]) -> str:
    """What changed in the software versions since ``baseline`` was recorded ("" when nothing did)."""
    if baseline is None:
        return ""
    before = baseline.provenance.get("software", {})
    if not isinstance(before, dict):
        return ""
    changed = [f"{k} {before.get(k, '-')} -> {current.get(k, '-')}" for k in sorted(set(before) | set(current))
               if before.get(k) != current.get(k)]
    return ("software changed since the baseline: " + ", ".join(changed)) if changed else ""
