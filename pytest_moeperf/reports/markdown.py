"""Markdown: the summary a CI job appends to ``$GITHUB_STEP_SUMMARY``, and the tables other commands print.

Everything a test, a metric, a reason or a section says is escaped: test ids and metric keys are code spans
(`md_code`), the rest is text (`md_text`), so a backtick, raw HTML or a newline in them cannot break the page.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytest_moeperf.judging.verdict import Status, Verdict
from pytest_moeperf.ledger import Section
from pytest_moeperf.reports.controls import visible
from pytest_moeperf.reports.render import VERDICT_COLUMNS, counts_line, verdict_rows

_ICONS = {Status.PASS: "✅", Status.NEW: "🆕", Status.IMPROVED: "🚀", Status.REGRESSED: "❌",
          Status.INCONCLUSIVE: "❔", Status.MISSING: "⚠️"}


class Code(str):
    """A table cell shown as inline code (a test id, a metric key) rather than as text."""


_NEWLINES = re.compile(r"\r\n|\r|\n")
# ``_`` between two letters or digits cannot emphasise (CommonMark): test_gemm stays readable in the raw text
_MARKUP = re.compile(r"([\\`*\[\]|~$#]|(?<![^\W_])_|_(?![^\W_]))")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_text(value: object) -> str:
    """``value`` as Markdown that renders exactly as written, on one line: markup characters backslash-escaped,
    ``& < >`` as entities (no raw HTML), newlines folded into spaces, other control characters escaped (`visible`),
    ``|`` escaped (safe in a table cell)."""
    text = visible(_NEWLINES.sub(" ", str(value)))
    text = "".join(_ENTITIES.get(ch, ch) for ch in text)
    return _MARKUP.sub(r"\\\1", text)


def _md_paragraph(value: object) -> str:
    """`md_text` on a line of its own: a leading ``-``, ``+``, ``=`` or ``1.`` cannot start a list or a heading."""
    return re.sub(r"^(\d*)([-+=.)])", r"\1\\\2", md_text(value).strip())


def md_code(value: object) -> str:
    """``value`` as an inline code span: fenced by one backtick more than its longest backtick run (a backtick inside
    cannot end it), newlines folded into spaces, other control characters escaped (`visible`). Raw ``<``/``&`` are
    literal inside a code span. Not for a table cell: there its ``|`` needs escaping too (`markdown_table` does it
    for `Code` cells)."""
    text = visible(_NEWLINES.sub(" ", str(value)))
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
