"""Control characters (ESC, CR, LF, NUL, TAB, DEL, C1) in what a test names are refused where it names them, as
``::`` in a metric name is: `perf.record`'s name and unit, `perf.context`'s keys and values. They reached the terminal
table (an ESC sequence or a CR made a row erase itself or fake another), the Markdown and the HTML report raw.
A test id cannot be refused (pytest escapes a parametrize id, not a file name): the reports show it escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CONTROLS = {"ESC": "\\x1b[2K", "CR": "\\r", "LF": "\\n", "NUL": "\\x00", "TAB": "\\t", "DEL": "\\x7f", "CSI": "\\x9b"}
RULE = "must hold no control characters (ESC, CR, LF, NUL, DEL, ...), got"
CALLS = {  # what each test does -> what its failure says
    "perf.record('a{c}b', 1.0, unit='us')": f"perf.record: a metric name {RULE} 'a{{c}}b'",
    "perf.record('x', 1.0, unit='u{c}s')": f"perf.record: metric 'x': its unit {RULE} 'u{{c}}s'",
    "perf.context(shape='1{c}2')": f"perf.context 'shape' {RULE} '1{{c}}2'",
    "perf.context(**{{'sh{c}ape': 1}})": f"perf.context key {RULE} 'sh{{c}}ape'",
    "perf.record('x', 1.0, unit='us', context={{'op': 'a{c}'}})": f"perf.record: metric 'x': context 'op' {RULE} "
                                                                   "'a{c}'",
}


def _shown(escape: str) -> str:
    """How Python's repr writes the character of ``escape`` (a source-code escape such as ``\\x1b[2K``)."""
    return repr(eval(f"'{escape}'"))[1:-1]  # noqa: S307 - a literal of this file


@pytest.mark.parametrize("name", list(CONTROLS))
def test_a_control_character_in_a_name_unit_or_context_fails_that_test(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, name: str) -> None:
    escape = CONTROLS[name]
    tests = [f"def test_bad{i}(perf):\n    {call.format(c=escape)}\n    perf.record('y', 1.0, unit='us')\n"
             for i, call in enumerate(CALLS)]
    pytester.makepyfile(test_c="\n".join(tests) + "\ndef test_fine(perf):\n    perf.record('x', 1.0, unit='us')\n")
    result = run_moeperf("--moeperf-update", "--moeperf-markdown", "s.md", "--moeperf-report", "r.json")
    result.assert_outcomes(passed=1, failed=len(CALLS))
    out = result.stdout.str()
    for message in CALLS.values():
        assert message.format(c=_shown(escape)) in out, message
    stored = json.loads(next((pytester.path / "baselines").glob("*/test_c.json")).read_text())["metrics"]
    assert list(stored) == ["test_c.py::test_fine::x"]  # nothing of a failing test, not even its good metric
    section = out[out.index("=== moeperf ==="):]
    assert not any(0 <= ord(ch) < 32 and ch != "\n" or 0x7F <= ord(ch) < 0xA0 for ch in section), section
    report = json.loads((pytester.path / "r.json").read_text())
    assert [b["fullname"] for b in report["benchmarks"]] == ["test_c.py::test_fine::x"]


def test_a_test_id_with_a_control_character_is_shown_escaped(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                              run_moeperf) -> None:
    """A file name can hold an ESC (pytest passes it into the test id as it is): the terminal table, the Markdown and
    the HTML report show ``\\x1b``."""
    test = "def test_f(perf):\n    perf.record('t', [1.0, 1.1], unit='ms')\n"
    (pytester.path / "test_f\x1b[2K\r.py").write_text(test)
    result = run_moeperf("--moeperf-markdown", "s.md", "--moeperf-html", "r.html", "--moeperf-history", "h.sqlite")
    assert result.ret == 0
    out = result.stdout.str()
    section = out[out.index("=== moeperf ==="):]
    assert "test_f\\x1b[2K\\r.py::test_f::t" in section
    assert "\x1b" not in section and "\r" not in section
    markdown = (pytester.path / "s.md").read_text()  # a CR or LF folded into a space there, as in any Markdown text
    assert "test_f\\x1b[2K .py::test_f::t" in markdown and "\x1b" not in markdown and "\r" not in markdown
    page = (pytester.path / "r.html").read_text()
    assert "test_f\\x1b[2K\\r.py::test_f::t" in page and "\x1b" not in page and "\r" not in page
    assert Path(pytester.path / "h.sqlite").is_file()
