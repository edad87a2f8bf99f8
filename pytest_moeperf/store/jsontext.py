"""JSON text as we read it: every object's keys unique, and where each member of one object lies in the text.

* `loads`: ``json.loads`` that refuses a key given twice in one object (`DuplicateKey`, naming it), where the
  standard library keeps the last: a hand-edited baseline with a metric twice must not be read as one of them.
* `loads_spans`: the same document, but the values of one object of the top level (a baseline file's ``metrics``)
  are each decoded, checked and dropped, and only where each lies in the text is kept: a 170 MB file of 100,000
  metrics holds 460 MB as Python objects, and a session uses a few of them (`decode_at` decodes one again). An
  update writes the metrics it did not touch back as that text, instead of encoding them again (with ``indent``
  the standard library encodes in pure Python: 20 s of CPU for that file; `docs/measurements/baseline-scale.md`).
  The two object levels are scanned here with the standard library's own string scanner and whitespace rule; every
  value is decoded by its decoder, and every error is the one ``json.loads`` gives, at the same place.

The cyclic garbage collector is paused while a document is decoded: a decode makes millions of containers and no
cycle, and the collections it set off took most of the time of a large file.
"""

from __future__ import annotations

import contextlib
import gc
import json
import json.decoder
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["DuplicateKey", "decode_at", "loads", "loads_spans"]

T = TypeVar("T")

_WS = re.compile(r"[ \t\n\r]*")  # json.decoder's own WHITESPACE
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class DuplicateKey(ValueError):
    """A JSON object that names one key twice."""


def _twice(key: str) -> DuplicateKey:
    return DuplicateKey(f"key {key!r} appears twice in one object (JSON would keep the last)")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):  # the rare case: find the key
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _twice(key)
            seen.add(key)
    return found


_DECODER = json.JSONDecoder(object_pairs_hook=_unique)


@contextlib.contextmanager
def _no_cycles_collected() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def loads(text: str) -> Any:
    """``json.loads(text)`` with unique keys: `json.JSONDecodeError` or `DuplicateKey`."""
    if text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    with _no_cycles_collected():
        return _DECODER.decode(text)


def _skip(text: str, pos: int) -> int:
    found = _WS.match(text, pos)
    assert found is not None  # it matches the empty string
    return found.end()


def _members(text: str, pos: int, value: Callable[[str, int], int]) -> int:
    """Scan the object whose ``{`` is at ``pos``, calling ``value(key, start)`` for each member (it returns where
    the value ends); returns where the object ends. Errors are json's own, at the same places."""
    seen: set[str] = set()
    pos = _skip(text, pos + 1)
    if text[pos:pos + 1] == "}":
        return pos + 1
    while True:
        if text[pos:pos + 1] != '"':
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
        key, pos = _scanstring(text, pos + 1)
        if key in seen:
            raise _twice(key)
        seen.add(key)
        pos = _skip(text, pos)
        if text[pos:pos + 1] != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", text, pos)
        pos = _skip(text, value(key, _skip(text, pos + 1)))
        if text[pos:pos + 1] == "}":
            return pos + 1
        if text[pos:pos + 1] != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
        pos = _skip(text, pos + 1)


def loads_spans(text: str, nested: str, keep: Callable[[str, Any], T]) -> tuple[Any, dict[str, tuple[int, int, T]]]:
    """`loads`, except for the members of the top-level object's member ``nested`` (when both are objects): each
    value is decoded and handed to ``keep(key, value)``, then dropped; what ``keep`` returns is kept with where the
    value lies in the text, ``{key: (start, end, kept)}``, and the document holds ``{}`` for ``nested``. A value is
    decoded again from its span when it is wanted (`decode_at`)."""
    start = _skip(text, 0)
    if text[start:start + 1] != "{":
        return loads(text), {}
    top: dict[str, Any] = {}
    spans: dict[str, tuple[int, int, T]] = {}

    def spanned(key: str, pos: int) -> int:
        value, end = _DECODER.raw_decode(text, pos)
        spans[key] = (pos, end, keep(key, value))
        return int(end)

    def member(key: str, pos: int) -> int:
        if key == nested and text[pos:pos + 1] == "{":
            top[key] = {}
            return _members(text, pos, spanned)
        top[key], end = _DECODER.raw_decode(text, pos)
        return int(end)

    with _no_cycles_collected():
        end = _skip(text, _members(text, start, member))
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return top, spans


def decode_at(text: str, start: int) -> Any:
    """The JSON value that begins at ``start`` (a span `loads_spans` gave)."""
    with _no_cycles_collected():
        return _DECODER.raw_decode(text, start)[0]
