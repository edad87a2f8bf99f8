"""Reports as lines or documents; nothing here prints or writes files."""

from __future__ import annotations

import datetime as dt
import platform
import re
from collections.abc import Iterable, Sequence
from typing import Any

from pytest_moeperf.records import Section
from pytest_moeperf.verdict import Status, Verdict

BENCHMARK_JSON_VERSION = "5.2.3"  # the pytest-benchmark report version whose schema we follow


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f} %"


def _mde(v: Verdict) -> str:
    if v.allowed is None:
        return "-"
    if v.noise_source == "history":
        return f"{v.allowed * 100:.1f} % (history)"
    return f"{v.allowed * 100:.1f} %" + (" (1 run)" if v.noise_source == "within-run" else "")


def verdict_rows(verdicts: Sequence[Verdict]) -> list[tuple[str, ...]]:
    return [
        (v.key, v.unit, _fmt(v.reference), _fmt(v.estimate), _pct(v.change), _mde(v),
         str(len(v.round_medians)) if v.round_medians else "-", v.status.value)
        for v in verdicts
    ]


#: "mde": the minimum detectable effect, the threshold actually used; "(1 run)": below 3 stored runs, the
#: between-run spread is unknown and the within-run IQR is the floor; "(history)": the spread was learned from the
#: perf history's accepted sessions (more of them than the baseline has runs).
VERDICT_COLUMNS = ("metric", "unit", "baseline", "current", "Δ", "mde", "rounds", "verdict")


def reason_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """Why each INCONCLUSIVE or MISSING metric is so, and each metric's noise source when it was judged."""
    return [f"{v.status.value} {v.key}: {v.reason}" for v in verdicts
            if v.status in (Status.INCONCLUSIVE, Status.MISSING)]


def table_lines(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int = 90) -> list[str]:
    """A plain aligned text table; over-long cells in the first column are shortened from the left."""
    cells = [[str(c) for c in row] for row in rows]
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


class Code(str):
    """A table cell shown as inline code (a test id, a metric key) rather than as text."""


_NEWLINES = re.compile(r"\r\n|\r|\n")
# ``_`` between two letters or digits cannot emphasise (CommonMark): test_gemm stays readable in the raw text
_MARKUP = re.compile(r"([\\`*\[\]|~$#]|(?<![^\W_])_|_(?![^\W_]))")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_text(value: object) -> str:
    """``value`` as Markdown that renders exactly as written, on one line: markup characters backslash-escaped,
    ``& < >`` as entities (no raw HTML), newlines folded into spaces, ``|`` escaped (safe in a table cell)."""
    text = _NEWLINES.sub(" ", str(value))
    text = "".join(_ENTITIES.get(ch, ch) for ch in text)
    return _MARKUP.sub(r"\\\1", text)


def _md_paragraph(value: object) -> str:
    """`md_text` on a line of its own: a leading ``-``, ``+``, ``=`` or ``1.`` cannot start a list or a heading."""
    return re.sub(r"^(\d*)([-+=.)])", r"\1\\\2", md_text(value).strip())


def md_code(value: object) -> str:
    """``value`` as an inline code span: fenced by one backtick more than its longest backtick run (a backtick inside
    cannot end it), newlines folded into spaces. Raw ``<``/``&`` are literal inside a code span. Not for a table
    cell: there its ``|`` needs escaping too (`markdown_table` does it for `Code` cells)."""
    text = _NEWLINES.sub(" ", str(value))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    if not text.strip(" "):
        return f"{fence}{text or ' '}{fence}"  # all spaces: CommonMark keeps them as they are
    if text[0] in "` " or text[-1] in "` ":
        text = f" {text} "  # CommonMark strips one space from each side
    return f"{fence}{text}{fence}"


def markdown_table(columns: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A GitHub-flavoured Markdown table; every header and cell is escaped (`md_text`), `Code` cells are code spans
    (whose ``|`` GitHub's tables take escaped, even inside code)."""

    def cell(value: Any) -> str:
        return md_code(value).replace("|", "\\|") if isinstance(value, Code) else md_text(value)

    return ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(cell(c) for c in row) + " |" for row in rows
    ]


_ICONS = {Status.PASS: "✅", Status.NEW: "🆕", Status.IMPROVED: "🚀", Status.REGRESSED: "❌",
          Status.INCONCLUSIVE: "❔", Status.MISSING: "⚠️"}


def markdown_lines(verdicts: Sequence[Verdict], sections: Sequence[Section], header: str,
                   warnings: Sequence[str] = ()) -> list[str]:
    """The Markdown summary. Everything a test, a metric, a reason or a section says is escaped: test ids and
    metric keys are code spans (`md_code`), the rest is text (`md_text`)."""
    lines = [f"## moeperf: {md_text(header)}", "", counts_line(verdicts), ""]
    lines += [f"> ⚠️ {md_text(w)}" for w in warnings] + ([""] if warnings else [])
    regressed = [v for v in verdicts if v.status is Status.REGRESSED]
    if regressed:
        lines += ["### Regressions", ""] + [f"- {md_code(v.key)}: {md_text(v.message())}" for v in regressed] + [""]
    undecided = [v for v in verdicts if v.status in (Status.INCONCLUSIVE, Status.MISSING)]
    if undecided:
        lines += ["### Inconclusive and missing", ""] + [f"- {v.status.value} {md_code(v.key)}: {md_text(v.reason)}"
                                                         for v in undecided] + [""]
    if verdicts:
        rows = [(Code(row[0]), *row[1:-1], f"{_ICONS[v.status]} {v.status.value}")
                for row, v in zip(verdict_rows(verdicts), verdicts, strict=True)]
        lines += markdown_table(VERDICT_COLUMNS, rows) + [""]
    for section in sections:
        lines += [f"### {md_text(section.title)}", ""] + markdown_table(section.columns, section.rows) + [""]
        if section.note:
            lines += [_md_paragraph(section.note), ""]
    return lines


def benchmark_json(verdicts: Sequence[Verdict], contexts: dict[str, dict[str, Any]], samples: dict[str, list[float]],
                   machine_info: dict[str, Any], commit_info: dict[str, Any],
                   sections: Sequence[Section]) -> dict[str, Any]:
    """A report in the pytest-benchmark JSON schema (``pytest-benchmark compare`` reads it). Values keep the
    metric's own unit (``extra_info.unit``); pytest-benchmark shows them as if they were seconds."""
    benchmarks = []
    for v in verdicts:
        s = v.current
        if s is None:
            continue  # MISSING: listed in the report's "moeperf" section
        test_id, _, metric = v.key.rpartition("::")
        data = samples.get(v.key, [])
        benchmarks.append({
            "group": test_id.split("::", 1)[0],
            "name": f"{test_id.rpartition('::')[2]}::{metric}",
            "fullname": v.key,
            "params": contexts.get(v.key, {}),
            "param": None,
            "extra_info": {
                "metric": metric, "unit": v.unit, "better": v.better, "verdict": v.status.value,
                "baseline_median": v.reference, "baseline_runs": v.runs, "change": v.change,
                "allowed": v.allowed, "mde": v.allowed, "spread": v.spread, "reason": v.reason,
                "round_medians": list(v.round_medians), **contexts.get(v.key, {}),
            },
            "options": {"disable_gc": False, "timer": "moeperf", "min_rounds": 1, "max_time": 0,
                        "min_time": 0, "warmup": False},
            "stats": {
                "min": s.min, "max": s.max, "mean": s.mean, "stddev": s.stddev, "rounds": s.n,
                "median": s.median, "iqr": s.iqr, "q1": s.q1, "q3": s.q3, "iqr_outliers": 0,
                "stddev_outliers": 0, "outliers": "0;0", "ld15iqr": s.min, "hd15iqr": s.max,
                "ops": (1.0 / s.mean) if s.mean else 0.0, "total": sum(data) if data else s.mean * s.n,
                "data": data, "iterations": 1,
            },
        })
    return {
        "machine_info": machine_info,
        "commit_info": commit_info,
        "benchmarks": benchmarks,
        "datetime": dt.datetime.now(dt.UTC).isoformat(),
        "version": BENCHMARK_JSON_VERSION,
        "moeperf": {"sections": [{"title": x.title, "columns": list(x.columns), "rows": [list(r) for r in x.rows],
                                  "note": x.note} for x in sections]},
    }


def base_machine_info() -> dict[str, Any]:
    uname = platform.uname()
    return {
        "node": uname.node, "processor": uname.processor, "machine": uname.machine,
        "python_compiler": platform.python_compiler(), "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(), "python_version": platform.python_version(),
        "python_build": list(platform.python_build()), "release": uname.release, "system": uname.system,
    }



def benchmark_metrics(document: Any) -> list[tuple[str, str, str, dict[str, Any], float]]:
    """The metrics of a parsed report written by :func:`benchmark_json`: ``(key, metric, unit, context, median)``
    each (the one reader of the format whose writer is above). ``ValueError`` when it is not one."""
    if not isinstance(document, dict) or not isinstance(document.get("benchmarks"), list):
        raise ValueError("not a moeperf JSON report (no 'benchmarks' list)")
    out = []
    for i, b in enumerate(document["benchmarks"]):
        try:
            info = b.get("extra_info", {})
            out.append((str(b.get("fullname", "")), str(info.get("metric", "")), str(info.get("unit", "")),
                        dict(b.get("params") or {}), float(b["stats"]["median"])))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"benchmarks[{i}] is malformed ({type(exc).__name__}: {exc})") from None
    return out


def junit_properties(verdicts: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """``moeperf:<metric>`` → ``<verdict> current <median> <unit>; baseline …; change …; mde …`` for --junitxml."""
    out = []
    for v in verdicts:
        parts = [v["status"]]
        if v.get("current"):
            parts.append(f"current {v['current']['median']:.6g} {v['unit']}")
        if isinstance(v.get("reference"), (int, float)):
            parts.append(f"baseline {v['reference']:.6g} {v['unit']} ({v.get('runs', 0)} run(s))")
        if isinstance(v.get("change"), (int, float)):
            parts.append(f"change {v['change'] * 100:+.2f} %")
        if isinstance(v.get("allowed"), (int, float)):
            parts.append(f"mde {v['allowed'] * 100:.2f} %")
        if v.get("reason"):
            parts.append(str(v["reason"]))
        out.append((f"moeperf:{v['name']}", "; ".join(parts)))
    return out
