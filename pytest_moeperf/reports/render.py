"""Reports as lines: the verdict table, reasons, sections, for the terminal and Markdown; nothing here prints."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pytest_moeperf.judging.verdict import Status, Verdict
from pytest_moeperf.ledger import ROUND_UNIT, Record, Section
from pytest_moeperf.reports.controls import visible


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f} %"


#: how the mde column names a noise source other than the baseline's own runs (`thresholds.Reference.noise_source`)
_SOURCES = {"history": " (history)", "family": " (family)", "hosts": " (other hosts)", "within-run": " (no spread)"}


def _mde(v: Verdict) -> str:
    if v.mde is None:
        return "-"
    return f"{v.mde * 100:.1f} %" + _SOURCES.get(v.noise_source, "")


def verdict_rows(verdicts: Sequence[Verdict]) -> list[tuple[str, ...]]:
    return [
        (v.key, v.unit, _fmt(v.reference), _fmt(v.estimate), _pct(v.change), _mde(v),
         str(len(v.round_medians)) if v.round_medians else "-", v.status.value)
        for v in verdicts
    ]


#: "mde": the minimum detectable effect, the bound actually used, with its noise source when it is not the baseline's
#: own runs: "(history)" accepted sessions, "(family)" the metric's family on this host, "(other hosts)" the spread
#: between hosts, "(no spread)" none known (such a verdict is never REGRESSED or IMPROVED).
VERDICT_COLUMNS = ("metric", "unit", "baseline", "current", "Δ", "mde", "rounds", "verdict")


def reason_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """Why each INCONCLUSIVE or MISSING metric is so, and each metric's noise source when it was judged."""
    return [f"{v.status.value} {visible(v.key)}: {visible(v.reason)}" for v in verdicts
            if v.status in (Status.INCONCLUSIVE, Status.MISSING)]


def table_lines(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int = 90) -> list[str]:
    """A plain aligned text table; over-long cells in the first column are shortened from the left; control
    characters are shown escaped (`visible`: a test id from a file name can hold an ESC)."""
    columns = [visible(c) for c in columns]
    cells = [[visible(c) for c in row] for row in rows]
    for row in cells:
        if row and len(row[0]) > max_width:
            row[0] = "…" + row[0][-(max_width - 1):]
    widths = [max([len(columns[i])] + [len(r[i]) for r in cells]) for i in range(len(columns))]
    head = "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(columns))
    lines = [head, "-" * len(head)]
    for row in cells:
        lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
    return lines


def counts_line(verdicts: Sequence[Verdict]) -> str:
    counts = {s: sum(1 for v in verdicts if v.status is s) for s in Status}
    return ", ".join(f"{n} {s.value.lower()}" for s, n in counts.items() if n) or "no metrics"


def terminal_lines(verdicts: Sequence[Verdict], sections: Sequence[Section], header: str) -> list[str]:
    lines = [header, counts_line(verdicts)]
    if verdicts:
        lines += [""] + table_lines(VERDICT_COLUMNS, verdict_rows(verdicts))
        lines += reason_lines(verdicts)
    for section in sections:
        lines += ["", section.title] + table_lines(section.columns, section.rows)
        if section.note:
            lines.append(section.note)
    return lines


def _aside(problems: Sequence[str]) -> str:
    """A set-aside window's reason, in one word."""
    text = " ".join(problems)
    if text.startswith("health: "):
        return "health"
    for word, kind in (("start-up window", "start-up health"), ("drifted", "drift"), ("compile", "compiles"),
                       ("coalesced", "client timing"), ("held up", "client timing")):
        if word in text:
            return kind
    return "other"


def unit_lines(records: Iterable[Record]) -> list[str]:
    """Per round unit (``round_unit``: e.g. "server start"): how many the session measured its windows on, how many
    windows (a test's round) it measured, and how many of them had metrics set aside, by reason."""
    units: dict[str, tuple[int, set[tuple[str, str]], dict[tuple[str, str], str]]] = {}
    for record in records:
        unit = record.metric.context.get(ROUND_UNIT)
        if not unit:
            continue
        most, windows, aside = units.setdefault(str(unit), (0, set(), {}))
        starts = len({r.origin for r in record.rounds})  # the windows of one start share its origin
        units[str(unit)] = (max(most, starts), windows, aside)
        for r in record.rounds:
            windows.add((record.metric.test_id, r.label))
            if not r.usable:
                aside.setdefault((record.metric.test_id, r.label), _aside(r.problems))
    lines = []
    for unit, (most, windows, aside) in units.items():
        kinds: dict[str, int] = {}
        for kind in aside.values():
            kinds[kind] = kinds.get(kind, 0) + 1
        why = f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if kinds else ""
        lines.append(f"moeperf: {len(windows)} windows on up to {most} {unit}{'' if most == 1 else 's'} a test; "
                     f"{len(aside)} set aside in whole or in part{why}")
    return lines
