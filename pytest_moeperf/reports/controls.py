"""Control characters in text from tests (Unicode's Cc: C0, DEL, C1): an ESC sequence or a CR in a terminal rewrites
what is shown (a row erases itself or fakes another), and they pass into the Markdown and the HTML as they are.

Where a test names things (`perf.record`'s metric name and unit, `perf.context`'s keys and values) they are refused
(`no_controls`), as ``::`` in a name is; what comes from elsewhere (a test id from a file name, a key of a
hand-edited baseline) is shown with each one escaped (`visible`) by the terminal table, the Markdown and the HTML
report."""

from __future__ import annotations

import re

CONTROL = re.compile("[\\x00-\\x1f\\x7f-\\x9f]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def no_controls(text: str, what: str) -> str:
    """``text``, or a ValueError naming ``what`` and the first control character in it."""
    found = CONTROL.search(text)
    if found:
        raise ValueError(f"{what} must hold no control characters (ESC, CR, LF, NUL, DEL, ...), got {text!r}: "
                         f"{found.group()!r} at index {found.start()}")
    return text


def context_text(key: object, value: object, what: str = "perf.context") -> None:
    """A context key and, when a str, its value: no control characters (`no_controls`). Context reaches the reports'
    text: a workload, a round unit, a compile-cache state, an attribution component."""
    no_controls(str(key), f"{what} key")
    if isinstance(value, str):
        no_controls(value, f"{what} {key!r}")


def visible(text: object) -> str:
    """``text`` with each control character written as its escape (``\\x1b``, ``\\r``), as pytest writes a test
    id's."""
    return CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), str(text))
