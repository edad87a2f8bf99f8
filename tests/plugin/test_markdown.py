"""The Markdown summary (what lands in ``$GITHUB_STEP_SUMMARY``) shows test ids, metric names, units, reasons and
report sections as text: a backtick cannot end a code span, raw HTML does not pass, a newline or a pipe cannot
break a table (issue 22, item 7)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

import pytest

NASTY_TESTS = """
import os

import pytest


@pytest.mark.parametrize("case", ["x"], ids=["id`with|<b>bold</b>"])
def test_nasty(perf, case):
    perf.record("lat``ency|<i>it</i> next line", [1.0] * 5, unit="u`s|<u>")  # a newline: refused (test_controls)
    perf.record("slow", [float(os.environ.get("V", "1"))] * 5, unit="ms")


def test_undecided(perf):
    perf.record("t", [1.0] * 5, unit="us")
    perf.inconclusive("the `window` said <script>alert(1)</script> | and\\nthen more")
"""

NASTY_SECTION = """
from pytest_moeperf.ledger import Section


def pytest_moeperf_report_sections(config, measurements):
    return [Section("Title `x` <b>t</b>", ("col|1", "c<2>"), (("cell`x", "a\\nb|c"),), "note <script>n</script>\\n- x")]
"""

NASTY_ID = "test_md.py::test_nasty[id`with|<b>bold</b>]"


class _Tables(HTMLParser):
    """Cells per row of every table, the text of every ``<code>``, and every tag name the HTML holds."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []
        self.code: list[str] = []
        self.tags: set[str] = set()
        self._in_code = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1
        elif tag == "code":
            self._in_code = True
            self.code.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "code":
            self._in_code = False

    def handle_data(self, data: str) -> None:
        if self._in_code:
            self.code[-1] += data


def _summary(pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> str:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_md=NASTY_TESTS)
    pytester.makeconftest(NASTY_SECTION)
    for _ in range(3):  # a baseline decides once it holds 3 runs
        run_moeperf("--moeperf-update", "--moeperf-history", "off").assert_outcomes(passed=2)
    monkeypatch.setenv("V", "10")
    result = run_moeperf("--moeperf-history", "off", "--moeperf-markdown", "s.md")
    result.assert_outcomes(passed=1, failed=1)
    return (pytester.path / "s.md").read_text()


def test_the_summary_escapes_what_tests_metrics_and_reasons_say(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    md = _summary(pytester, run_moeperf, monkeypatch)
    for tag in ("<u>", "<script>", "</script>"):  # in a unit, a reason, a note: text, never in a code span
        assert tag not in md, md
    lines = md.splitlines()
    for folded in ("next line", "then more", "b\\|c", "- x"):
        assert not any(line.startswith(folded) for line in lines), md
    start = lines.index("| metric | unit | baseline | current | Δ | mde | rounds | verdict |")
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    rows = lines[start + 2:end]
    assert len(rows) == 3, md  # one per metric, none broken by a newline
    assert all(len(re.findall(r"(?<!\\)\|", row)) == 9 for row in rows), md  # no pipe splits a cell


def test_the_summary_renders_ids_as_code_and_nothing_as_html(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    markdown_it = pytest.importorskip("markdown_it")  # a CommonMark renderer with GFM tables
    md = _summary(pytester, run_moeperf, monkeypatch)
    rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    parsed = _Tables()
    parsed.feed(rendered)
    assert parsed.tags <= {"h2", "h3", "p", "ul", "li", "code", "table", "thead", "tbody", "tr", "th", "td",
                           "blockquote"}, rendered
    assert sorted(parsed.rows) == [2, 2, 8, 8, 8, 8], rendered  # header + 3 metrics; header + 1 section row
    assert f"{NASTY_ID}::slow" in parsed.code  # the Regressions list and the verdict table
    assert f"{NASTY_ID}::lat``ency|<i>it</i> next line" in parsed.code
    assert "test_md.py::test_undecided::t" in parsed.code
    text = html.unescape(re.sub(r"<[^>]+>", "", rendered))
    assert "u`s|<u>" in text and "Title `x` <b>t</b>" in text and "col|1" in text and "c<2>" in text
    assert "the `window` said <script>alert(1)</script> | and then more" in text
    assert "cell`x" in text and "a b|c" in text and "note <script>n</script> - x" in text


@pytest.mark.parametrize("value", ["plain", "a`b", "``x``", "`edge`", " spaced ", "a|b", "<b>&</b>", "l1\nl2",
                                   "back\\slash|pipe", ""])
def test_a_code_span_holds_any_text(value: str) -> None:
    from pytest_moeperf.reports.markdown import md_code

    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").render(f"x {md_code(value)} y")
    parsed = _Tables()
    parsed.feed(rendered)
    assert parsed.code == [value.replace("\n", " ") or " "], rendered


@pytest.mark.parametrize("value", ["*em* _em_", "snake_case _x_ a__b_", "[link](http://x)", "<img src=x>", "a & b",
                                   "#1 ~~x~~ $y$", "back\\slash", "`tick`", "l1\r\nl2"])
def test_text_is_shown_as_written(value: str) -> None:
    from pytest_moeperf.reports.markdown import md_text

    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("strikethrough").render(
        f"- {md_text(value)}")
    assert rendered == f"<ul>\n<li>{html.escape(value.replace(chr(13) + chr(10), ' '), quote=False)}</li>\n</ul>\n"
